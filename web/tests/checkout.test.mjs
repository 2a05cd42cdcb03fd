// The demo checkout page (/demo) and chargeonce.js in headless Chromium,
// against a running chargeonce with the demo enabled and a slow simulated
// processor (tests/browser.rs starts both and runs this file):
//
//   CHARGEONCE_URL  the service, e.g. http://127.0.0.1:41234
//   DATABASE_URL    its database, to count charges and keys
//   CHROMIUM_PATH   the browser (default /usr/bin/chromium)
//
// Every case checks the page and the database. Each uses a fresh browser
// context, so its localStorage starts empty.

import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';

import pg from 'pg';
import { chromium } from 'playwright-core';

const SERVICE_URL = required('CHARGEONCE_URL');
const DATABASE_URL = required('DATABASE_URL');
const CHROMIUM_PATH = process.env.CHROMIUM_PATH || '/usr/bin/chromium';

// Where the page's chargeonce.js keeps its payment (the module's default).
const STORAGE_KEY = 'chargeonce.payment';
// A charge takes the processor latency (1.5 s) plus retries after a reload.
const SETTLE_MS = 20_000;

// This network is closed: without the background-networking flags Chromium's
// own connections (updates, sync, field trials) are refused and slow it
// down. Playwright starts every browser with a new, empty user-data-dir.
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

let browser;
let db;

before(async () => {
  if (!existsSync(CHROMIUM_PATH)) {
    throw new Error(`no Chromium at ${CHROMIUM_PATH}: apt-get install -y chromium`);
  }
  browser = await chromium.launch({
    executablePath: CHROMIUM_PATH,
    args: CHROMIUM_ARGS,
    timeout: 30_000,
  });
  db = new pg.Client({ connectionString: DATABASE_URL });
  await db.connect();
});

after(async () => {
  await browser?.close();
  await db?.end();
});

test('a double click on Pay makes one request and one charge', async () => {
  const before = await chargeCount();
  const { page, posts, close } = await openCheckout();
  await page.fill('#amount', '10.00');
  await page.dblclick('#pay');
  const shown = await settled(page);

  assert.equal(shown.state, 'done');
  assert.equal(shown.status, 'succeeded');
  assert.deepEqual(posts, [shown.key], 'the second click joined the first request');
  assert.equal(shown.stored, null, 'a final answer clears the stored payment');

  const charges = await chargesWithKey(shown.key);
  assert.equal(charges.length, 1);
  assert.equal(charges[0].status, 'succeeded');
  assert.equal(charges[0].id, shown.chargeId);
  assert.equal(await chargeCount(), before + 1);
  await close();
});

test('a reload while the charge is in flight finishes the same charge', async () => {
  const before = await chargeCount();
  const { page, posts, close } = await openCheckout();
  await page.fill('#amount', '20.00');
  await page.click('#pay');
  const key = (await read(page)).key;
  assert.match(key, /^[0-9a-f-]{36}$/);

  // The request reached the service (the charge is stored, pending, while
  // the processor takes 1.5 s): now reload in the middle of it.
  await waitFor(async () => (await chargesWithKey(key))[0]?.status === 'pending');
  await page.reload();
  const shown = await settled(page);

  assert.equal(shown.key, key, 'the reloaded page resumed with the same key');
  assert.equal(shown.state, 'done');
  assert.equal(shown.status, 'succeeded');
  assert.equal(shown.stored, null);
  assert.ok(posts.length >= 2, `the reloaded page sent the payment again (${posts.length})`);
  assert.deepEqual(new Set(posts), new Set([key]), 'every request carried the same key');

  const charges = await chargesWithKey(key);
  assert.equal(charges.length, 1);
  assert.equal(charges[0].status, 'succeeded');
  assert.equal(charges[0].amount, 2000);
  assert.equal(charges[0].id, shown.chargeId);
  assert.equal(await chargeCount(), before + 1);
  await close();
});

test('a new payment after a success gets a new key', async () => {
  const before = await chargeCount();
  const { page, close } = await openCheckout();
  await page.fill('#amount', '10.00');
  await page.click('#pay');
  const first = await settled(page);
  await page.click('#pay');
  // The key on the page changes as soon as the second payment starts.
  await page.waitForFunction((key) => document.getElementById('key').textContent !== key, first.key);
  const second = await settled(page);

  assert.equal(first.status, 'succeeded');
  assert.equal(second.status, 'succeeded');
  assert.notEqual(second.key, first.key);
  assert.notEqual(second.chargeId, first.chargeId);

  assert.equal((await chargesWithKey(first.key)).length, 1);
  assert.equal((await chargesWithKey(second.key)).length, 1);
  assert.equal(await chargeCount(), before + 2);
  await close();
});

test('a decline (402) is shown and clears the stored key', async () => {
  const before = await chargeCount();
  const { page, close } = await openCheckout();
  await page.fill('#amount', '10.02');
  await page.click('#pay');
  // Stored before the first request, while the processor is still deciding.
  assert.equal(JSON.parse(await storedPayment(page)).key, (await read(page)).key);
  const shown = await settled(page);

  assert.equal(shown.state, 'done');
  assert.equal(shown.status, 'declined');
  assert.equal(shown.httpStatus, '402');
  assert.equal(shown.declineCode, 'card_declined');
  assert.equal(shown.stored, null, 'localStorage holds no payment after the decline');

  const charges = await chargesWithKey(shown.key);
  assert.equal(charges.length, 1);
  assert.equal(charges[0].status, 'failed');
  assert.equal(charges[0].failure_code, 'card_declined');
  assert.equal(charges[0].id, shown.chargeId);
  assert.equal(await chargeCount(), before + 1);
  await close();
});

test('a reload after the answer was lost finds the charge by its key and pays nothing again', async () => {
  const key = crypto.randomUUID();
  const body = { amount: 2500, currency: 'USD', description: 'Demo checkout' };
  // The payment reached the server, but its answer never reached the page.
  const answer = await fetch(`${SERVICE_URL}/demo/charges`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'Idempotency-Key': key },
    body: JSON.stringify(body),
  });
  assert.equal(answer.status, 201);
  const made = await answer.json();
  const before = await chargeCount();

  const { page, posts, close } = await openCheckout();
  await page.evaluate(([name, value]) => localStorage.setItem(name, value), [
    STORAGE_KEY,
    JSON.stringify({ key, body, startedAt: Date.now() - 60_000 }),
  ]);
  await page.reload();
  const shown = await settled(page);

  assert.equal(shown.state, 'done');
  assert.equal(shown.status, 'succeeded');
  assert.equal(shown.chargeId, made.id);
  assert.equal(shown.stored, null);
  assert.deepEqual(posts, [], 'nothing posted after the lookup');
  assert.equal(await chargeCount(), before);
  await close();
});

test('a stored payment older than the retention window is reported, not sent', async () => {
  const before = await chargeCount();
  const { page, posts, close } = await openCheckout();
  const old = {
    key: crypto.randomUUID(),
    body: { amount: 3000, currency: 'USD', description: 'Demo checkout' },
    startedAt: Date.now() - 25 * 60 * 60 * 1000,
  };
  await page.evaluate(([name, value]) => localStorage.setItem(name, value), [
    STORAGE_KEY,
    JSON.stringify(old),
  ]);
  await page.reload();
  await page.waitForSelector('#result[data-state="expired"]', { timeout: SETTLE_MS });
  const shown = await read(page);

  assert.equal(shown.key, old.key);
  assert.equal(shown.stored, null);
  assert.deepEqual(posts, []);
  assert.equal((await chargesWithKey(old.key)).length, 0);
  assert.equal(await chargeCount(), before);
  await close();
});

// ---------------------------------------------------------------------------

function required(name) {
  const value = process.env[name];
  if (!value) {
    throw new Error(`${name} is not set (tests/browser.rs sets it)`);
  }
  return value;
}

/**
 * The page in a new browser context, and the Idempotency-Key of every POST
 * it sends to /demo/charges, across reloads.
 */
async function openCheckout() {
  const context = await browser.newContext();
  const page = await context.newPage();
  const posts = [];
  page.on('request', (request) => {
    if (request.method() === 'POST' && new URL(request.url()).pathname === '/demo/charges') {
      posts.push(request.headers()['idempotency-key']);
    }
  });
  page.on('pageerror', (error) => console.error('page error:', error));
  await page.goto(`${SERVICE_URL}/demo`);
  await page.waitForSelector('#result[data-state="idle"]');
  return { page, posts, close: () => context.close() };
}

/** Waits until the page shows a final result, then reads it. */
async function settled(page) {
  await page.waitForSelector('#result:is([data-state="done"], [data-state="error"], [data-state="unconfirmed"])', {
    timeout: SETTLE_MS,
  });
  return read(page);
}

/** What the page shows, and what it has stored. */
async function read(page) {
  return page.evaluate((storageKey) => {
    const text = (id) => document.getElementById(id).textContent;
    return {
      state: document.getElementById('result').dataset.state,
      status: text('status'),
      httpStatus: text('http-status'),
      chargeId: text('charge-id'),
      declineCode: text('decline-code'),
      key: text('key'),
      stored: localStorage.getItem(storageKey),
    };
  }, STORAGE_KEY);
}

function storedPayment(page) {
  return page.evaluate((name) => localStorage.getItem(name), STORAGE_KEY);
}

async function chargeCount() {
  const { rows } = await db.query('SELECT count(*)::int AS n FROM charges');
  return rows[0].n;
}

/** The charges with this idempotency key, ids in their external form. */
async function chargesWithKey(key) {
  const { rows } = await db.query(
    `SELECT 'ch_' || replace(id::text, '-', '') AS id, status, amount::int AS amount, failure_code
       FROM charges WHERE client_idempotency_key = $1`,
    [key],
  );
  return rows;
}

async function waitFor(condition, limitMs = 5_000) {
  const deadline = Date.now() + limitMs;
  while (!(await condition())) {
    if (Date.now() > deadline) {
      throw new Error(`condition not met within ${limitMs} ms`);
    }
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}
