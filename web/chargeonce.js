// chargeonce.js: pay exactly once from a browser page.
//
// A plain ES module, no build step, no dependencies. It posts to a URL the
// page names, normally the merchant's own backend route, which adds the
// secret API key and forwards the `Idempotency-Key` header and the body to
// chargeonce. A secret key never belongs in a browser.
//
// The rules it follows (docs/clients.md):
// - One idempotency key per logical payment, made when the user starts it,
//   and written to localStorage with the body *before* the first request, so
//   a reload or a crashed tab can finish the same payment with the same key
//   and the same body instead of starting a second one.
// - Network errors, 202 (pending), 409 (in flight), 429 and 5xx are retried
//   with that key and body, with exponential backoff and full jitter, after
//   Retry-After when the server sends it, within a number of attempts and a
//   deadline.
// - Any other answer is final: the stored payment is cleared. That includes
//   422 idempotency_key_expired: the key's replay window has ended, nothing
//   was processed, and the result says so (`keyExpired`).
// - After a reload, the stored payment is first looked up by its key
//   (`lookup`, a GET that sends nothing that could charge): a charge that
//   reached its outcome is reported without posting again; a pending or
//   unknown one is posted again with the same key and body.
// - A stored payment older than the server's retention window is never sent
//   again (past its window the key no longer replays); it is looked up,
//   reported to the page with the charge it made, if any, and cleared.

/** Defaults of {@link PaymentOptions}. */
export const DEFAULTS = Object.freeze({
  storageKey: 'chargeonce.payment',
  maxAttempts: 8,
  deadlineMs: 60_000,
  baseDelayMs: 500,
  maxDelayMs: 8_000,
  requestTimeoutMs: 20_000,
  // chargeonce's idempotency.retention_hours (24) in milliseconds.
  retentionMs: 24 * 60 * 60 * 1000,
});

/** The problem code of a key whose replay window has ended. */
export const KEY_EXPIRED = 'idempotency_key_expired';

/**
 * A payment written to storage before its first request.
 *
 * @typedef {object} PendingPayment
 * @property {string} key        The idempotency key (a random UUID).
 * @property {unknown} body      The JSON body, sent unchanged on every attempt.
 * @property {number} startedAt  When the user started it (ms since the epoch).
 */

/**
 * How a payment ended, as far as this page knows.
 *
 * @typedef {object} PaymentResult
 * @property {number} status   HTTP status of the last answer; 0 if the last
 *                             attempt got none (network error, timeout).
 * @property {unknown} body    The last answer's body: parsed JSON (a charge,
 *                             or a problem document), text, or null.
 * @property {string} key      The idempotency key used.
 * @property {boolean} final   true: the answer is final and the stored payment
 *                             was cleared. false: retries ran out (attempts or
 *                             deadline) before a final answer; the payment is
 *                             still stored, and {@link resumePending} finishes
 *                             it later with the same key.
 * @property {string} [error]  The last network error, when status is 0.
 * @property {boolean} [keyExpired]  true: the answer was 422
 *                             `idempotency_key_expired` (final, never retried):
 *                             look the charge up with {@link lookup}.
 * @property {boolean} [lookedUp]  true: the stored payment's charge was
 *                             found final by {@link lookup} after a reload;
 *                             `body` is that charge and nothing was posted.
 */

/**
 * One attempt, for pages that show progress.
 *
 * @typedef {object} AttemptInfo
 * @property {string} key
 * @property {number} attempt         1 for the first request.
 * @property {number} status          0 for a network error.
 * @property {number|null} retryInMs  The pause before the next attempt, or
 *                                    null when this attempt was the last.
 */

/**
 * @typedef {object} PaymentOptions
 * @property {string} url  Where to POST the payment: the merchant backend's
 *   route that forwards `Idempotency-Key` and the body to chargeonce.
 * @property {string|null} [lookupUrl=url]  Where to GET
 *   `?idempotency_key=KEY`: the merchant backend's route that forwards it to
 *   chargeonce's `GET /v1/charges?idempotency_key=`. null: never look up.
 * @property {Record<string, string>} [headers]  Extra request headers, e.g.
 *   a CSRF token the merchant backend wants.
 * @property {string} [storageKey='chargeonce.payment']  The storage entry;
 *   one stored payment at a time per entry.
 * @property {Storage} [storage=localStorage]  Where payments are stored.
 * @property {number} [maxAttempts=8]  Most requests for one call.
 * @property {number} [deadlineMs=60000]  No retry starts later than this
 *   after the call.
 * @property {number} [baseDelayMs=500]  First backoff ceiling; it doubles
 *   per attempt.
 * @property {number} [maxDelayMs=8000]  Largest backoff ceiling.
 * @property {number} [requestTimeoutMs=20000]  One request's bound; a
 *   request that takes longer is abandoned and retried with the same key.
 * @property {number} [retentionMs=86400000]  The server's key retention
 *   (`idempotency.retention_hours`); older stored payments are not resumed.
 * @property {(info: AttemptInfo) => void} [onAttempt]  Called after every
 *   attempt.
 * @property {typeof fetch} [fetch]  The fetch to use (tests).
 */

/**
 * Thrown (as a rejection) by {@link startPayment} when another payment is
 * stored or in flight under the same storage key: finish it first with
 * {@link resumePending}, or give it up with {@link forgetPending}.
 */
export class PaymentPendingError extends Error {
  /** @param {PendingPayment} pending */
  constructor(pending) {
    super(
      `another payment (key ${pending.key}) is not finished yet; ` +
        'resume it with resumePending() before starting a new one',
    );
    this.name = 'PaymentPendingError';
    this.code = 'payment_pending';
    /** The unfinished payment. */
    this.pending = pending;
  }
}

// Runs in progress in this page, by storage key: { entry, promise }. A second
// startPayment for the same payment (a double click on Pay) or a
// resumePending while it runs joins the run instead of sending requests of
// its own.
const inFlight = new Map();

/**
 * Starts a payment: makes its idempotency key, stores `{key, body,
 * startedAt}`, then posts `body` with that key until a final answer or until
 * the retries run out.
 *
 * While a payment with the same body runs in this page, the call returns the
 * same promise (one key, one charge). If an unfinished payment with the same
 * body is stored (its retries ran out earlier), it is continued with its key
 * rather than charged again. Any other stored or running payment makes the
 * call reject with {@link PaymentPendingError}.
 *
 * The payment is stored synchronously, before this function returns: a page
 * reloaded right after the call still finds it. If it cannot be stored
 * (storage disabled or full) the call rejects and sends nothing.
 *
 * @param {unknown} body  The charge request, e.g.
 *   `{amount: 1999, currency: 'USD'}`; sent as JSON.
 * @param {PaymentOptions} options
 * @returns {Promise<PaymentResult>}
 */
export function startPayment(body, options) {
  try {
    const opts = withDefaults(options);
    const running = inFlight.get(opts.storageKey);
    if (running) {
      return sameJson(running.entry.body, body)
        ? running.promise
        : Promise.reject(new PaymentPendingError(running.entry));
    }
    let entry = readEntry(opts);
    if (entry && (isExpired(entry, opts) || !sameJson(entry.body, body))) {
      return Promise.reject(new PaymentPendingError(entry));
    }
    if (!entry) {
      entry = { key: crypto.randomUUID(), body, startedAt: Date.now() };
      // Throws if storage refuses: then nothing has been sent.
      opts.storage.setItem(opts.storageKey, JSON.stringify(entry));
    }
    return run(opts, entry);
  } catch (error) {
    return Promise.reject(error);
  }
}

/**
 * Finishes the stored payment, if any; call it when the page loads. It first
 * looks the payment up by its key (see {@link lookup}). Resolves with:
 * - `null` when nothing is stored;
 * - `{expired: entry, charge}` when the stored payment is older than
 *   `retentionMs`: it is cleared and not sent; `charge` is what its key
 *   made (null if nothing, or if the lookup failed): show it, or tell the
 *   user to check their orders before paying again;
 * - a {@link PaymentResult} with `lookedUp: true` when the lookup found the
 *   charge final: nothing is posted;
 * - otherwise (pending, not found, or the lookup failed) a
 *   {@link PaymentResult} of posting it again with its key and body, as
 *   from {@link startPayment}.
 *
 * @param {PaymentOptions} options
 * @returns {Promise<PaymentResult | {expired: PendingPayment, charge: object|null} | null>}
 */
export function resumePending(options) {
  try {
    const opts = withDefaults(options);
    const running = inFlight.get(opts.storageKey);
    if (running) {
      return running.promise;
    }
    const entry = readEntry(opts);
    if (!entry) {
      return Promise.resolve(null);
    }
    return resume(opts, entry);
  } catch (error) {
    return Promise.reject(error);
  }
}

/**
 * What the payment with idempotency key `key` became, asked without sending
 * it again: the charge as it is now (pending included), or null if the
 * server has no charge with this key (never received, or released long
 * after its window). Rejects when the lookup gets no answer or an error.
 *
 * @param {string} key
 * @param {Pick<PaymentOptions, 'url' | 'lookupUrl' | 'headers' | 'fetch' | 'requestTimeoutMs'>} options
 * @returns {Promise<object|null>}
 */
export async function lookup(key, options) {
  const opts = withDefaults(options);
  if (opts.lookupUrl === null) {
    throw new Error('chargeonce: lookups are off (options.lookupUrl is null)');
  }
  const url = new URL(opts.lookupUrl, globalThis.location?.href ?? 'http://localhost/');
  url.searchParams.set('idempotency_key', key);
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), opts.requestTimeoutMs);
  try {
    const response = await opts.fetch(url.href, {
      method: 'GET',
      headers: { ...opts.headers },
      signal: abort.signal,
    });
    const body = await readBody(response);
    if (response.status !== 200 || !Array.isArray(body?.data)) {
      throw new Error(`chargeonce: the lookup answered ${response.status}`);
    }
    return body.data[0] ?? null;
  } finally {
    clearTimeout(timer);
  }
}

/** The stored payment after a reload: looked up first, posted only if needed. */
async function resume(opts, entry) {
  const charge = opts.lookupUrl === null ? null : await lookup(entry.key, opts).catch(() => null);
  if (isExpired(entry, opts)) {
    removeEntry(opts, entry.key);
    return { expired: entry, charge };
  }
  if (charge && charge.status !== 'pending') {
    removeEntry(opts, entry.key);
    return { status: 200, body: charge, key: entry.key, final: true, lookedUp: true };
  }
  // Joined by a start or resume that comes meanwhile, as any run is.
  return inFlight.get(opts.storageKey)?.promise ?? run(opts, entry);
}

/**
 * The stored, unfinished payment, or null. Sends nothing.
 *
 * @param {Pick<PaymentOptions, 'storageKey' | 'storage'>} [options]
 * @returns {PendingPayment | null}
 */
export function pendingPayment(options = {}) {
  return readEntry(withDefaults({ url: '', ...options }));
}

/**
 * Gives up the stored payment without finishing it. Its outcome stays
 * unknown to this page: the charge may have been made. Only for a page that
 * has told the user so; the normal way out is {@link resumePending}.
 *
 * @param {Pick<PaymentOptions, 'storageKey' | 'storage'>} [options]
 */
export function forgetPending(options = {}) {
  const opts = withDefaults({ url: '', ...options });
  if (inFlight.has(opts.storageKey)) {
    throw new Error('the payment is being sent right now; wait for its result');
  }
  opts.storage.removeItem(opts.storageKey);
}

// ---------------------------------------------------------------------------

function withDefaults(options) {
  const opts = { ...DEFAULTS, ...options };
  if (typeof opts.url !== 'string') {
    throw new TypeError('chargeonce: options.url (the merchant backend route) is required');
  }
  if (opts.lookupUrl === undefined) {
    opts.lookupUrl = opts.url;
  }
  // Reading `localStorage` itself throws where storage is disabled.
  opts.storage ??= globalThis.localStorage;
  if (!opts.storage) {
    throw new Error('chargeonce: no storage (localStorage) available');
  }
  // Called through a wrapper: a bare `fetch` stored on an object and called
  // as a method throws "Illegal invocation" in browsers.
  const fetchFn = opts.fetch ?? globalThis.fetch;
  opts.fetch = (...args) => fetchFn(...args);
  return opts;
}

/** Runs the payment and registers the run so duplicates can join it. */
function run(opts, entry) {
  const promise = send(opts, entry).finally(() => {
    inFlight.delete(opts.storageKey);
  });
  inFlight.set(opts.storageKey, { entry, promise });
  return promise;
}

async function send(opts, entry) {
  const deadline = Date.now() + opts.deadlineMs;
  for (let attempt = 1; ; attempt += 1) {
    const answer = await post(opts, entry);
    if (answer.status !== 0 && !isRetryable(answer.status)) {
      notify(opts, { key: entry.key, attempt, status: answer.status, retryInMs: null });
      removeEntry(opts, entry.key);
      const result = { status: answer.status, body: answer.body, key: entry.key, final: true };
      if (answer.status === 422 && answer.body?.code === KEY_EXPIRED) {
        result.keyExpired = true;
      }
      return result;
    }
    const delay = answer.retryAfterMs ?? backoff(attempt, opts);
    const last = attempt >= opts.maxAttempts || Date.now() + delay > deadline;
    notify(opts, {
      key: entry.key,
      attempt,
      status: answer.status,
      retryInMs: last ? null : delay,
    });
    if (last) {
      // The entry stays: the charge may exist (or be pending); a later
      // resumePending() finishes it with the same key.
      const result = { status: answer.status, body: answer.body, key: entry.key, final: false };
      if (answer.error !== undefined) {
        result.error = answer.error;
      }
      return result;
    }
    await sleep(delay);
  }
}

/** Tells the page about an attempt; a failing callback must not stop the payment. */
function notify(opts, info) {
  try {
    opts.onAttempt?.(info);
  } catch (error) {
    console.error('chargeonce: onAttempt failed', error);
  }
}

/**
 * One request. Resolves with `{status, body, retryAfterMs}`, or with status 0
 * and `error` when no complete answer came (network error, timeout, a body
 * cut short): the request may or may not have reached the server, which the
 * same key makes safe to find out by retrying.
 */
async function post(opts, entry) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), opts.requestTimeoutMs);
  try {
    const response = await opts.fetch(opts.url, {
      method: 'POST',
      headers: {
        ...opts.headers,
        'Content-Type': 'application/json',
        'Idempotency-Key': entry.key,
      },
      body: JSON.stringify(entry.body),
      signal: abort.signal,
    });
    const body = await readBody(response);
    return {
      status: response.status,
      body,
      retryAfterMs: retryAfterMs(response.headers.get('Retry-After')),
    };
  } catch (error) {
    return { status: 0, body: null, error: String(error?.message ?? error) };
  } finally {
    clearTimeout(timer);
  }
}

async function readBody(response) {
  const text = await response.text();
  const type = response.headers.get('Content-Type') ?? '';
  if (text !== '' && /[/+]json\b/i.test(type)) {
    try {
      return JSON.parse(text);
    } catch {
      return text;
    }
  }
  return text === '' ? null : text;
}

/**
 * 202: the processor's answer is not known yet; 409: the same key is still
 * being worked on; 429 and 5xx: try again later. Everything else (2xx, 402
 * declined, the other 4xx) is final: repeating it gives the same answer.
 */
function isRetryable(status) {
  return status === 202 || status === 409 || status === 429 || status >= 500;
}

/** `Retry-After` in delay-seconds or HTTP-date form, in ms; null if absent. */
function retryAfterMs(value) {
  if (value === null || value.trim() === '') {
    return null;
  }
  if (/^\d+$/.test(value.trim())) {
    return Number(value.trim()) * 1000;
  }
  const date = Date.parse(value);
  return Number.isNaN(date) ? null : Math.max(0, date - Date.now());
}

/**
 * Full jitter: a random pause between 0 and a ceiling that doubles with each
 * attempt, so many pages retrying after the same outage spread out instead
 * of arriving together.
 */
function backoff(attempt, opts) {
  const ceiling = Math.min(opts.maxDelayMs, opts.baseDelayMs * 2 ** (attempt - 1));
  return Math.round(Math.random() * ceiling);
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * The key is held at least `retentionMs` after the charge was created, and
 * the charge is created after `startedAt`, so until `startedAt +
 * retentionMs` a retry still meets it. Only elapsed time on this browser's
 * clock is compared, so a clock that is off by hours does not matter.
 */
function isExpired(entry, opts) {
  return Date.now() - entry.startedAt >= opts.retentionMs;
}

/** The stored payment; anything unreadable is removed and ignored. */
function readEntry(opts) {
  const text = opts.storage.getItem(opts.storageKey);
  if (text === null) {
    return null;
  }
  try {
    const entry = JSON.parse(text);
    if (
      typeof entry?.key === 'string' &&
      entry.key !== '' &&
      Number.isFinite(entry.startedAt) &&
      'body' in entry
    ) {
      return { key: entry.key, body: entry.body, startedAt: entry.startedAt };
    }
  } catch {
    // Not ours, or damaged: fall through.
  }
  opts.storage.removeItem(opts.storageKey);
  return null;
}

/**
 * Removes the stored payment if it is still the one with `key` (another tab
 * may share the storage entry).
 */
function removeEntry(opts, key) {
  try {
    if (readEntry(opts)?.key === key) {
      opts.storage.removeItem(opts.storageKey);
    }
  } catch {
    // Storage became unavailable; the result itself is still right.
  }
}

/** Whether two JSON values are equal, ignoring the order of object keys. */
function sameJson(a, b) {
  return canonical(a) === canonical(b);
}

function canonical(value) {
  if (Array.isArray(value)) {
    return `[${value.map(canonical).join(',')}]`;
  }
  if (value !== null && typeof value === 'object') {
    const members = Object.keys(value)
      .filter((name) => value[name] !== undefined)
      .sort()
      .map((name) => `${JSON.stringify(name)}:${canonical(value[name])}`);
    return `{${members.join(',')}}`;
  }
  return JSON.stringify(value) ?? 'null';
}
