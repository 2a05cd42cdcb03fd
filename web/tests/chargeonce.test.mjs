// The rules of chargeonce.js in Node, with a scripted fetch and an in-memory
// storage: what is stored when, which answers are retried, how long it
// waits, when it gives up, what it resumes. tests/browser.rs runs this file;
// `npm run test:unit` in web/ does too. No dependencies, no network.

import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';

import {
  PaymentPendingError,
  forgetPending,
  lookup,
  pendingPayment,
  resumePending,
  startPayment,
} from '../chargeonce.js';

const BODY = { amount: 1999, currency: 'USD' };
const HOUR = 60 * 60 * 1000;

/** localStorage's interface over a Map. */
class MemoryStorage {
  constructor() {
    this.items = new Map();
  }
  getItem(name) {
    return this.items.has(name) ? this.items.get(name) : null;
  }
  setItem(name, value) {
    this.items.set(name, String(value));
  }
  removeItem(name) {
    this.items.delete(name);
  }
}

/**
 * A fetch that answers from `script`, one entry per request: a status, a
 * `[status, headers, body]` triple (headers and body optional), the string
 * 'network' (the request fails), 'hang' (no answer until aborted), or
 * `{lookup: charge}` for a lookup by key (a GET) that finds `charge` (null:
 * nothing). Records every request, with what was stored at the moment it
 * was sent.
 */
function scriptedFetch(script, storage, storageKey) {
  const calls = [];
  const fetch = async (url, init) => {
    calls.push({
      url,
      method: init.method,
      at: Date.now(),
      key: init.headers['Idempotency-Key'],
      body: init.body,
      stored: storage.getItem(storageKey),
    });
    const step = script[calls.length - 1];
    if (step === undefined) {
      throw new Error(`unexpected request #${calls.length}`);
    }
    if (step === 'network') {
      throw new TypeError('Failed to fetch');
    }
    if (step === 'hang') {
      return new Promise((_, reject) => {
        init.signal.addEventListener('abort', () => reject(new DOMException('aborted', 'AbortError')));
      });
    }
    if (step.lookup !== undefined) {
      assert.equal(init.method, 'GET', `request #${calls.length} is a lookup`);
      const data = step.lookup === null ? [] : [step.lookup];
      return new Response(JSON.stringify({ object: 'list', has_more: false, data }), {
        status: 200,
        headers: { 'Content-Type': 'application/json' },
      });
    }
    assert.equal(init.method, 'POST', `request #${calls.length} is a payment`);
    const [status, headers = {}, scriptedBody] = Array.isArray(step) ? step : [step];
    const body = scriptedBody ?? (status === 402
      ? { type: 'urn:chargeonce:problem:card_declined', code: 'card_declined', status }
      : { object: 'charge', id: 'ch_1', status: status === 202 ? 'pending' : 'succeeded' });
    return new Response(JSON.stringify(body), {
      status,
      headers: { 'Content-Type': status >= 400 ? 'application/problem+json' : 'application/json', ...headers },
    });
  };
  return { fetch, calls };
}

let counter = 0;

/**
 * Options for one test: its own storage key (the module keeps in-flight
 * payments per key), its own storage, a scripted fetch, and short pauses.
 */
function setUp(script, extra = {}) {
  const storage = new MemoryStorage();
  const storageKey = `test-payment-${(counter += 1)}`;
  const { fetch, calls } = scriptedFetch(script, storage, storageKey);
  const attempts = [];
  const options = {
    url: '/pay',
    storage,
    storageKey,
    fetch,
    baseDelayMs: 5,
    maxDelayMs: 20,
    onAttempt: (info) => attempts.push(info),
    ...extra,
  };
  const stored = () => JSON.parse(storage.getItem(storageKey));
  return { options, calls, attempts, storage, stored };
}

const realRandom = Math.random;
afterEach(() => {
  Math.random = realRandom;
});

test('the key and body are stored before the first request', async () => {
  const { options, calls, stored } = setUp([201]);
  const payment = startPayment(BODY, options);
  const entry = stored();
  assert.match(entry.key, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.deepEqual(entry.body, BODY);
  assert.ok(Math.abs(entry.startedAt - Date.now()) < 1000);
  assert.deepEqual(pendingPayment(options), entry);

  const result = await payment;
  assert.deepEqual(JSON.parse(calls[0].stored), entry, 'stored when the request left');
  assert.equal(calls[0].key, entry.key);
  assert.equal(calls[0].url, '/pay');
  assert.deepEqual(JSON.parse(calls[0].body), BODY);
  assert.deepEqual(result, {
    status: 201,
    body: { object: 'charge', id: 'ch_1', status: 'succeeded' },
    key: entry.key,
    final: true,
  });
  assert.equal(pendingPayment(options), null, 'cleared on the final answer');
});

test('network errors, 202, 409, 429 and 5xx are retried with the same key and body', async () => {
  const { options, calls, attempts } = setUp(['network', 202, 409, 429, 500, 503, 201]);
  const result = await startPayment(BODY, options);
  assert.equal(result.status, 201);
  assert.equal(result.final, true);
  assert.equal(calls.length, 7);
  assert.deepEqual(new Set(calls.map((c) => c.key)), new Set([result.key]));
  assert.deepEqual(new Set(calls.map((c) => c.body)), new Set([JSON.stringify(BODY)]));
  assert.deepEqual(attempts.map((a) => a.status), [0, 202, 409, 429, 500, 503, 201]);
  assert.equal(attempts.at(-1).retryInMs, null);
  assert.equal(pendingPayment(options), null);
});

for (const status of [200, 201, 400, 401, 402, 404, 422]) {
  test(`${status} is final: one request, the stored payment cleared`, async () => {
    const { options, calls } = setUp([status]);
    const result = await startPayment(BODY, options);
    assert.equal(calls.length, 1);
    assert.equal(result.status, status);
    assert.equal(result.final, true);
    assert.equal(pendingPayment(options), null);
  });
}

test('a 402 resolves with the decline, not a rejection', async () => {
  const { options } = setUp([402]);
  const result = await startPayment(BODY, options);
  assert.equal(result.body.code, 'card_declined');
});

test('backoff is exponential with full jitter, capped', async () => {
  // The largest draw shows the ceilings: base 5 doubling, capped at 20.
  Math.random = () => 1;
  const { options, attempts } = setUp([503, 503, 503, 503, 201]);
  await startPayment(BODY, options);
  assert.deepEqual(attempts.map((a) => a.retryInMs), [5, 10, 20, 20, null]);

  Math.random = () => 0.5;
  const half = setUp([503, 503, 201]);
  await startPayment(BODY, half.options);
  assert.deepEqual(half.attempts.map((a) => a.retryInMs), [3, 5, null]);
});

test('Retry-After is honoured', async () => {
  const { options, calls, attempts } = setUp([[409, { 'Retry-After': '1' }], 201]);
  const result = await startPayment(BODY, options);
  assert.equal(result.status, 201);
  assert.equal(attempts[0].retryInMs, 1000);
  const waited = calls[1].at - calls[0].at;
  assert.ok(waited >= 990, `waited ${waited} ms`);
});

test('after maxAttempts it gives up, keeps the payment, and resumePending finishes it with the same key', async () => {
  const { options, calls, stored } = setUp([503, 'network', 503, { lookup: null }, 201], {
    maxAttempts: 3,
  });
  const first = await startPayment(BODY, options);
  assert.equal(first.final, false);
  assert.equal(first.status, 503);
  assert.equal(calls.length, 3);
  assert.equal(stored().key, first.key, 'still stored');

  const second = await resumePending(options);
  assert.equal(second.final, true);
  assert.equal(second.status, 201);
  assert.equal(second.key, first.key);
  assert.equal(calls[3].method, 'GET', 'looked up first');
  assert.equal(calls[4].key, first.key);
  assert.equal(calls[4].body, calls[0].body);
  assert.equal(pendingPayment(options), null);
});

test('a network error as the last attempt is reported with status 0', async () => {
  const { options } = setUp(['network'], { maxAttempts: 1 });
  const result = await startPayment(BODY, options);
  assert.equal(result.status, 0);
  assert.equal(result.final, false);
  assert.match(result.error, /Failed to fetch/);
});

test('no retry starts after the deadline', async () => {
  const { options, calls } = setUp([[503, { 'Retry-After': '5' }], 201], { deadlineMs: 1000 });
  const started = Date.now();
  const result = await startPayment(BODY, options);
  assert.equal(result.final, false);
  assert.equal(calls.length, 1);
  assert.ok(Date.now() - started < 500, 'gave up without waiting');
});

test('a request that hangs is abandoned after requestTimeoutMs and retried with the same key', async () => {
  const { options, calls } = setUp(['hang', 201], { requestTimeoutMs: 50 });
  const result = await startPayment(BODY, options);
  assert.equal(result.status, 201);
  assert.equal(calls.length, 2);
  assert.equal(calls[1].key, calls[0].key);
});

test('a second start with the same body while one runs joins it', async () => {
  const { options, calls } = setUp([201]);
  const first = startPayment(BODY, options);
  // Key order does not make it a different payment.
  const second = startPayment({ currency: 'USD', amount: 1999 }, options);
  assert.equal(second, first);
  await first;
  assert.equal(calls.length, 1);
});

test('another payment while one is unfinished is refused', async () => {
  const { options, calls } = setUp([201]);
  const first = startPayment(BODY, options);
  await assert.rejects(startPayment({ amount: 5, currency: 'USD' }, options), PaymentPendingError);
  await first;
  assert.equal(calls.length, 1);
});

test('a stored unfinished payment is continued by a start with the same body, refused for another', async () => {
  const { options, calls, stored } = setUp([503, 201], { maxAttempts: 1 });
  const first = await startPayment(BODY, options);
  assert.equal(first.final, false);

  const other = startPayment({ amount: 1, currency: 'USD' }, options);
  await assert.rejects(other, (error) => error instanceof PaymentPendingError && error.pending.key === first.key);
  assert.equal(stored().key, first.key);

  const again = await startPayment(BODY, options);
  assert.equal(again.key, first.key, 'the same logical payment keeps its key');
  assert.equal(again.status, 201);
  assert.equal(calls.length, 2);
});

test('a new payment after a final answer gets a new key', async () => {
  const { options, calls } = setUp([201, 201]);
  const first = await startPayment(BODY, options);
  const second = await startPayment(BODY, options);
  assert.notEqual(second.key, first.key);
  assert.equal(calls.length, 2);
});

test('resumePending with nothing stored resolves with null and sends nothing', async () => {
  const { options, calls } = setUp([]);
  assert.equal(await resumePending(options), null);
  assert.equal(calls.length, 0);
});

test('a stored payment older than the retention window is looked up, reported and cleared, not sent', async () => {
  const { options, calls, storage } = setUp([{ lookup: null }]);
  const entry = { key: 'old-key', body: BODY, startedAt: Date.now() - 25 * HOUR };
  storage.setItem(options.storageKey, JSON.stringify(entry));
  assert.deepEqual(await resumePending(options), { expired: entry, charge: null });
  assert.deepEqual(calls.map((call) => call.method), ['GET']);
  assert.equal(pendingPayment(options), null);
});

test('an expired stored payment is reported with the charge its key made', async () => {
  const charge = { object: 'charge', id: 'ch_old', status: 'succeeded' };
  const { options, calls, storage } = setUp([{ lookup: charge }]);
  const entry = { key: 'old-key', body: BODY, startedAt: Date.now() - 25 * HOUR };
  storage.setItem(options.storageKey, JSON.stringify(entry));
  assert.deepEqual(await resumePending(options), { expired: entry, charge });
  assert.equal(calls.length, 1);
});

test('the retention window is an option', async () => {
  const { options, calls, storage } = setUp([{ lookup: null }, 201], { retentionMs: 2 * HOUR });
  const entry = { key: 'recent-key', body: BODY, startedAt: Date.now() - HOUR };
  storage.setItem(options.storageKey, JSON.stringify(entry));
  const result = await resumePending(options);
  assert.equal(result.key, 'recent-key');
  assert.deepEqual(calls.map((call) => call.method), ['GET', 'POST']);

  const expired = setUp([{ lookup: null }], { retentionMs: HOUR / 2 });
  expired.storage.setItem(expired.options.storageKey, JSON.stringify(entry));
  assert.deepEqual(await resumePending(expired.options), { expired: entry, charge: null });
});

test('after a reload a charge found final is reported without posting again', async () => {
  const charge = { object: 'charge', id: 'ch_9', status: 'failed', failure_code: 'card_declined' };
  const { options, calls, storage } = setUp([{ lookup: charge }]);
  const entry = { key: 'lost-answer', body: BODY, startedAt: Date.now() - HOUR };
  storage.setItem(options.storageKey, JSON.stringify(entry));
  assert.deepEqual(await resumePending(options), {
    status: 200,
    body: charge,
    key: 'lost-answer',
    final: true,
    lookedUp: true,
  });
  assert.deepEqual(calls.map((call) => call.method), ['GET']);
  assert.match(calls[0].url, /[?&]idempotency_key=lost-answer$/);
  assert.equal(pendingPayment(options), null);
});

test('after a reload a pending or unknown charge is posted again with its key', async () => {
  const pending = { object: 'charge', id: 'ch_9', status: 'pending' };
  for (const found of [{ lookup: pending }, { lookup: null }, 'network']) {
    const { options, calls, storage } = setUp([found, 201]);
    const entry = { key: 'resume-me', body: BODY, startedAt: Date.now() - HOUR };
    storage.setItem(options.storageKey, JSON.stringify(entry));
    const result = await resumePending(options);
    assert.equal(result.status, 201, JSON.stringify(found));
    assert.equal(calls[1].method, 'POST');
    assert.equal(calls[1].key, 'resume-me');
    assert.deepEqual(JSON.parse(calls[1].body), BODY);
  }
});

test('lookups can be turned off', async () => {
  const { options, calls, storage } = setUp([201], { lookupUrl: null });
  const entry = { key: 'no-lookup', body: BODY, startedAt: Date.now() - HOUR };
  storage.setItem(options.storageKey, JSON.stringify(entry));
  assert.equal((await resumePending(options)).status, 201);
  assert.deepEqual(calls.map((call) => call.method), ['POST']);
  await assert.rejects(lookup('k', options), /lookups are off/);
});

test('lookup(key) asks by key and sends nothing that could charge', async () => {
  const charge = { object: 'charge', id: 'ch_7', status: 'succeeded' };
  const { options, calls } = setUp([{ lookup: charge }, { lookup: null }], { lookupUrl: '/orders/charge' });
  assert.deepEqual(await lookup('order-1001', options), charge);
  assert.equal(await lookup('order 1002', options), null);
  assert.equal(calls[0].url, 'http://localhost/orders/charge?idempotency_key=order-1001');
  assert.equal(calls[1].url, 'http://localhost/orders/charge?idempotency_key=order+1002');
  assert.deepEqual(calls.map((call) => [call.method, call.key, call.body]), [
    ['GET', undefined, undefined],
    ['GET', undefined, undefined],
  ]);
});

test('422 idempotency_key_expired is final, never retried, and flagged', async () => {
  const expired = { code: 'idempotency_key_expired', status: 422, detail: 'window ended' };
  const { options, calls } = setUp([[422, {}, expired]]);
  const result = await startPayment(BODY, options);
  assert.equal(result.final, true);
  assert.equal(result.keyExpired, true);
  assert.equal(result.status, 422);
  assert.equal(calls.length, 1);
  assert.equal(pendingPayment(options), null);
});

test('an expired stored payment blocks startPayment until resumePending reports it', async () => {
  const { options, storage } = setUp([{ lookup: null }, 201]);
  const entry = { key: 'old-key', body: BODY, startedAt: Date.now() - 25 * HOUR };
  storage.setItem(options.storageKey, JSON.stringify(entry));
  await assert.rejects(startPayment(BODY, options), PaymentPendingError);
  assert.deepEqual(await resumePending(options), { expired: entry, charge: null });
  const result = await startPayment(BODY, options);
  assert.notEqual(result.key, 'old-key');
});

test('resumePending while the payment runs joins it', async () => {
  const { options, calls } = setUp([201]);
  const running = startPayment(BODY, options);
  assert.equal(resumePending(options), running);
  await running;
  assert.equal(calls.length, 1);
});

test('an unreadable stored entry is removed and ignored', async () => {
  const { options, storage } = setUp([]);
  storage.setItem(options.storageKey, '{not json');
  assert.equal(await resumePending(options), null);
  assert.equal(storage.getItem(options.storageKey), null);
  storage.setItem(options.storageKey, JSON.stringify({ key: 42 }));
  assert.equal(pendingPayment(options), null);
});

test('a payment that cannot be stored is not sent', async () => {
  const { options, calls } = setUp([201]);
  options.storage.setItem = () => {
    throw new DOMException('quota exceeded', 'QuotaExceededError');
  };
  await assert.rejects(startPayment(BODY, options), /quota/);
  assert.equal(calls.length, 0);
});

test('forgetPending drops a stored payment, but not one being sent', async () => {
  const { options } = setUp([503, 201], { maxAttempts: 1 });
  await startPayment(BODY, options);
  assert.notEqual(pendingPayment(options), null);
  forgetPending(options);
  assert.equal(pendingPayment(options), null);

  const running = startPayment(BODY, options);
  assert.throws(() => forgetPending(options), /being sent/);
  await running;
});

test('extra headers are sent; the key and content type cannot be overridden', async () => {
  const seen = [];
  const options = {
    url: '/pay',
    storage: new MemoryStorage(),
    storageKey: `test-payment-headers`,
    headers: { 'X-CSRF-Token': 't', 'Idempotency-Key': 'mine' },
    fetch: async (url, init) => {
      seen.push(init.headers);
      return new Response('{}', { status: 201, headers: { 'Content-Type': 'application/json' } });
    },
  };
  const result = await startPayment(BODY, options);
  assert.equal(seen[0]['X-CSRF-Token'], 't');
  assert.equal(seen[0]['Idempotency-Key'], result.key);
  assert.equal(seen[0]['Content-Type'], 'application/json');
});

test('options.url is required', async () => {
  await assert.rejects(startPayment(BODY, {}), TypeError);
  await assert.rejects(resumePending({}), TypeError);
});
