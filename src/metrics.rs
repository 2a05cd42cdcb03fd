//! Metrics, in the Prometheus text format at `GET /metrics`: the `metrics`
//! facade records, `metrics-exporter-prometheus` renders. Every family is
//! named and described here, and recorded through the small functions below,
//! so a name is written once and the call sites stay one line.
//!
//! Recording costs an atomic add on a handle looked up by name and labels;
//! the request path's handles are looked up once per thread and kept
//! (`handles`). BENCHMARKS.md has the measured cost on the request path.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use deadpool_postgres::Pool;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub const HTTP_REQUESTS: &str = "chargeonce_http_requests_total";
pub const HTTP_DURATION: &str = "chargeonce_http_request_duration_seconds";
pub const IDEMPOTENCY: &str = "chargeonce_idempotency_outcomes_total";
pub const PROCESSOR_CALLS: &str = "chargeonce_processor_calls_total";
pub const PROCESSOR_DURATION: &str = "chargeonce_processor_call_duration_seconds";
pub const LEASE_TAKEOVERS: &str = "chargeonce_lease_takeovers_total";
pub const RECOVERY_CLAIMS: &str = "chargeonce_recovery_claims_total";
pub const KEYS_RELEASED: &str = "chargeonce_keys_released_total";
pub const API_KEY_CACHE: &str = "chargeonce_api_key_cache_total";
pub const REPLAY_CACHE: &str = "chargeonce_replay_cache_total";
pub const BATCH_ROWS: &str = "chargeonce_db_batch_rows";
pub const POOL_SIZE: &str = "chargeonce_db_pool_connections";
pub const POOL_IN_USE: &str = "chargeonce_db_pool_in_use";
pub const POOL_WAITERS: &str = "chargeonce_db_pool_waiters";
pub const POOL_MAX: &str = "chargeonce_db_pool_max_size";
pub const WEBHOOK_UNDISPATCHED: &str = "chargeonce_webhook_undispatched_events";
pub const WEBHOOK_PENDING: &str = "chargeonce_webhook_pending_deliveries";
pub const WEBHOOK_OLDEST_AGE: &str = "chargeonce_webhook_oldest_undelivered_age_seconds";
pub const WEBHOOK_ATTEMPTS: &str = "chargeonce_webhook_attempts_total";
pub const WEBHOOK_ATTEMPT_DURATION: &str = "chargeonce_webhook_attempt_duration_seconds";
pub const WEBHOOK_GIVEN_UP: &str = "chargeonce_webhook_deliveries_failed_total";
pub const WEBHOOK_SET_ASIDE: &str = "chargeonce_webhook_events_set_aside_total";
pub const WEBHOOK_SET_ASIDE_NOW: &str = "chargeonce_webhook_set_aside_events";
pub const WEBHOOK_HELD: &str = "chargeonce_webhook_deliveries_held_total";
pub const WEBHOOK_TRIPPED: &str = "chargeonce_webhook_endpoints_tripped_total";
pub const WEBHOOK_DISABLED: &str = "chargeonce_webhook_endpoints_disabled_total";
pub const CLOCK_OFFSET: &str = "chargeonce_clock_offset_seconds";
pub const KEY_LOOKUPS: &str = "chargeonce_idempotency_key_lookups_total";
pub const MISMATCHED_FIELDS: &str = "chargeonce_idempotency_mismatched_fields_total";

/// Latency buckets, seconds: a millisecond to half a minute.
const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Rows-per-batch buckets.
const ROWS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// The process-wide recorder's handle, set when `handle()` installs it.
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide recorder, installed on first use (tests start several
/// applications in one process; they share it).
pub fn handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), BUCKETS)
                .and_then(|builder| {
                    builder.set_buckets_for_metric(Matcher::Full(BATCH_ROWS.to_owned()), ROWS)
                })
                .map(PrometheusBuilder::build_recorder);
            let recorder = match recorder {
                Ok(recorder) => recorder,
                // Only a bucket list that is empty fails; ours is not. Fall
                // back to summaries rather than no metrics at all.
                Err(_) => PrometheusBuilder::new().build_recorder(),
            };
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!("a metrics recorder was already installed; /metrics may be empty");
            }
            describe();
            keep_up(handle.clone());
            handle
        })
        .clone()
}

/// How often recorded histogram samples are folded into their buckets.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// Folds histogram samples into their buckets every `UPKEEP_EVERY`, on a
/// thread of its own for the life of the process. The recorder keeps every
/// sample it is given until a scrape renders it (or this upkeep runs): with
/// nobody scraping `/metrics`, memory grew by about 50 bytes a request,
/// 7 MB a minute at 2,400 requests per second (RELIABILITY.md, the
/// sustained run). The recorder built alone does not start an upkeep of its
/// own; `PrometheusBuilder::install` would, but it also starts an HTTP
/// listener we do not want. A thread rather than a task: the recorder is
/// process-wide, and a test process runs many tokio runtimes.
fn keep_up(handle: PrometheusHandle) {
    let started = std::thread::Builder::new()
        .name("metrics-upkeep".to_owned())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            handle.run_upkeep();
        });
    if let Err(error) = started {
        tracing::warn!(%error, "cannot start the metrics upkeep: unscraped histograms will grow");
    }
}

fn describe() {
    describe_counter!(
        HTTP_REQUESTS,
        "HTTP requests by route template, method and status."
    );
    describe_histogram!(
        HTTP_DURATION,
        "HTTP request latency by route template, method and status."
    );
    describe_counter!(
        IDEMPOTENCY,
        "What an idempotency key led to, by kind (charge, refund): created, replayed, \
         in_flight_waited, in_use, reused_mismatch, key_missing, key_invalid."
    );
    describe_counter!(
        PROCESSOR_CALLS,
        "Processor calls by operation (charge, refund) and outcome (succeeded, declined, \
         rejected, unknown, attention)."
    );
    describe_histogram!(PROCESSOR_DURATION, "Processor call latency by operation.");
    describe_counter!(
        LEASE_TAKEOVERS,
        "Pending records a request took over after their lease ran out."
    );
    describe_counter!(
        RECOVERY_CLAIMS,
        "Abandoned records the recovery worker claimed."
    );
    describe_counter!(KEYS_RELEASED, "Idempotency keys released after retention.");
    describe_counter!(
        API_KEY_CACHE,
        "API-key lookups by result: hit, negative_hit, miss."
    );
    describe_counter!(
        REPLAY_CACHE,
        "Replay-cache lookups of idempotency keys by kind and result: hit (answered \
         without the database), miss."
    );
    describe_histogram!(
        BATCH_ROWS,
        "Rows per batch, by statement (charges.insert_or_find, charges.record_outcomes, \
         refunds.record_outcome)."
    );
    describe_gauge!(POOL_SIZE, "Open database connections per pool.");
    describe_gauge!(POOL_IN_USE, "Database connections in use per pool.");
    describe_gauge!(
        POOL_WAITERS,
        "Requests waiting for a database connection per pool."
    );
    describe_gauge!(POOL_MAX, "The most connections a pool may open.");
    describe_gauge!(
        WEBHOOK_UNDISPATCHED,
        "Events in the outbox not yet fanned out to webhook deliveries (still in the event queue), \
         counted up to 10000. Measured every second by each instance's dispatcher: the same \
         database-wide number from every instance."
    );
    describe_counter!(
        KEY_LOOKUPS,
        "Lookups by idempotency key (GET /v1/charges or /v1/refunds ?idempotency_key=), by kind \
         and result (found, none)."
    );
    describe_counter!(
        MISMATCHED_FIELDS,
        "Keys reused with another request, by kind and by field that differed (a metadata \
         entry counts as metadata; unknown when the fields cannot be told). Expired keys are \
         chargeonce_idempotency_outcomes_total{outcome=\"expired\"}."
    );
    describe_gauge!(
        CLOCK_OFFSET,
        "The database's clock minus this instance's, in seconds, measured every 30 s. Ids and \
         the replay cache use the database's time whatever it is; beyond 60 s either way an \
         error is logged: fix the machine's clock."
    );
    describe_gauge!(
        WEBHOOK_PENDING,
        "Webhook deliveries pending (status = 'pending': not yet attempted, being attempted, \
         or waiting for a retry), counted up to 10000. Measured like the undispatched events."
    );
    describe_gauge!(
        WEBHOOK_OLDEST_AGE,
        "Seconds since the oldest event not yet delivered was created: the oldest \
         undispatched event or the oldest event with a pending delivery, whichever is older \
         (of the pending deliveries, the 10000 due first are looked at); 0 when none. \
         Measured like the undispatched events."
    );
    describe_counter!(
        WEBHOOK_ATTEMPTS,
        "Webhook delivery attempts by outcome: delivered (2xx), failed_status (any other \
         answer, 3xx included), timeout (no answer within webhooks.timeout_ms), failed_connect \
         (no connection: DNS, refused, unreachable, TLS), failed_no_answer (connected, but the \
         connection closed or broke before an answer), refused_target (a private address under \
         webhooks.allow_private_targets = false), unsendable (the stored URL, secret or event \
         could not be used; not sent)."
    );
    describe_histogram!(
        WEBHOOK_ATTEMPT_DURATION,
        "Webhook delivery attempt latency: resolving, connecting, sending and the answer \
         (as the attempt's duration_ms in the API)."
    );
    describe_counter!(
        WEBHOOK_GIVEN_UP,
        "Webhook deliveries given up for good (status failed), by reason: max_attempts (the \
         last of webhooks.max_attempts failed), endpoint_deleted, endpoint_disabled (the \
         circuit breaker disabled it)."
    );
    describe_counter!(
        WEBHOOK_SET_ASIDE,
        "Queued events set aside by this instance after their fan-out failed on its own (each \
         logged with its id): tried again after a backoff, while the events behind them go on."
    );
    describe_gauge!(
        WEBHOOK_SET_ASIDE_NOW,
        "Of the undispatched events, those set aside right now, waiting for their next try. \
         Measured like the undispatched events."
    );
    describe_counter!(
        WEBHOOK_HELD,
        "Due webhook deliveries held back by this instance because their endpoint's circuit \
         breaker is open (webhooks.trip_after_failures failures in a row): they wait for the \
         breaker's pause, which is not an attempt."
    );
    describe_counter!(
        WEBHOOK_TRIPPED,
        "Webhook endpoints whose circuit breaker tripped (reached webhooks.trip_after_failures \
         failed attempts in a row) on this instance: their attempts are spaced out."
    );
    describe_counter!(
        WEBHOOK_DISABLED,
        "Webhook endpoints this instance disabled after they kept failing for \
         webhooks.disable_after_ms; each is also a webhook_endpoint.disabled event."
    );
}

/// The request path's counters and histograms, one lookup in the
/// recorder's registry per label set and thread, then kept: a lookup by
/// name and labels costs more than the rest of recording (it hashes and
/// compares the labels, and `http_request` allocated six strings for it),
/// about 5 % of a cached replay's instructions (BENCHMARKS.md, "The access
/// log's cost").
/// Nothing is kept until the recorder is installed: a handle taken before
/// would stay the no-op one.
mod handles {
    use std::cell::RefCell;
    use std::thread::LocalKey;

    use metrics::{Counter, Histogram};
    // Not SipHash: the keys are our own names and labels, no client chooses
    // them, so a hash that resists flooding buys nothing here.
    use rustc_hash::FxHashMap as HashMap;

    /// A family's name and up to two static label values.
    type HandleKey = (&'static str, &'static str, &'static str);

    /// The HTTP families' handles by (status, method), then route: looked
    /// up with the route as `&str`, so a hit allocates nothing.
    type HttpHandles = HashMap<(u16, &'static str), HashMap<String, (Counter, Histogram)>>;

    thread_local! {
        static COUNTERS: RefCell<HashMap<HandleKey, Counter>> = RefCell::new(HashMap::default());
        static HISTOGRAMS: RefCell<HashMap<HandleKey, Histogram>> = RefCell::new(HashMap::default());
        static HTTP: RefCell<HttpHandles> = RefCell::new(HashMap::default());
    }

    pub fn counter(key: HandleKey, register: impl FnOnce() -> Counter) -> Counter {
        kept(&COUNTERS, key, register)
    }

    pub fn histogram(key: HandleKey, register: impl FnOnce() -> Histogram) -> Histogram {
        kept(&HISTOGRAMS, key, register)
    }

    /// The handle `map` keeps for `key`, registered on first use.
    fn kept<H: Clone>(
        map: &'static LocalKey<RefCell<HashMap<HandleKey, H>>>,
        key: HandleKey,
        register: impl FnOnce() -> H,
    ) -> H {
        if !super::installed() {
            return register();
        }
        map.with(|handles| {
            handles
                .borrow_mut()
                .entry(key)
                .or_insert_with(register)
                .clone()
        })
    }

    pub fn http(
        status: u16,
        method: &'static str,
        route: &str,
        register: impl FnOnce() -> (Counter, Histogram),
    ) -> (Counter, Histogram) {
        if !super::installed() {
            return register();
        }
        HTTP.with(|http| {
            let mut http = http.borrow_mut();
            let routes = http.entry((status, method)).or_default();
            if let Some(handles) = routes.get(route) {
                return handles.clone();
            }
            let handles = register();
            routes.insert(route.to_owned(), handles.clone());
            handles
        })
    }
}

/// Whether `handle()` has installed the recorder.
fn installed() -> bool {
    HANDLE.get().is_some()
}

/// The method as a label: the standard ones by name, any other `OTHER`. A
/// client may send any token as a method (actix-web answers it 404 or 405),
/// and each new label value would be a new series kept for the life of the
/// process.
pub fn method_label(method: &actix_web::http::Method) -> &'static str {
    use actix_web::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "OTHER",
    }
}

pub fn http_request(route: &str, method: &'static str, status: u16, took: Duration) {
    let (requests, duration) = handles::http(status, method, route, || {
        let status = status.to_string();
        (
            counter!(HTTP_REQUESTS, "route" => route.to_owned(), "method" => method, "status" => status.clone()),
            histogram!(HTTP_DURATION, "route" => route.to_owned(), "method" => method, "status" => status),
        )
    });
    requests.increment(1);
    duration.record(took.as_secs_f64());
}

pub fn idempotency(kind: &'static str, outcome: &'static str) {
    handles::counter(
        (IDEMPOTENCY, kind, outcome),
        || counter!(IDEMPOTENCY, "kind" => kind, "outcome" => outcome),
    )
    .increment(1);
}

pub fn processor_call(operation: &'static str, outcome: &'static str, took: Duration) {
    handles::counter(
        (PROCESSOR_CALLS, operation, outcome),
        || counter!(PROCESSOR_CALLS, "operation" => operation, "outcome" => outcome),
    )
    .increment(1);
    handles::histogram(
        (PROCESSOR_DURATION, operation, ""),
        || histogram!(PROCESSOR_DURATION, "operation" => operation),
    )
    .record(took.as_secs_f64());
}

pub fn lease_takeover(kind: &'static str) {
    counter!(LEASE_TAKEOVERS, "kind" => kind).increment(1);
}

pub fn recovery_claims(kind: &'static str, claimed: usize) {
    counter!(RECOVERY_CLAIMS, "kind" => kind).increment(claimed as u64);
}

pub fn keys_released(released: u64) {
    counter!(KEYS_RELEASED).increment(released);
}

pub fn api_key_cache(result: &'static str) {
    handles::counter(
        (API_KEY_CACHE, result, ""),
        || counter!(API_KEY_CACHE, "result" => result),
    )
    .increment(1);
}

pub fn replay_cache(kind: &'static str, result: &'static str) {
    handles::counter(
        (REPLAY_CACHE, kind, result),
        || counter!(REPLAY_CACHE, "kind" => kind, "result" => result),
    )
    .increment(1);
}

pub fn batch_rows(statement: &'static str, rows: usize) {
    histogram!(BATCH_ROWS, "statement" => statement).record(rows as f64);
}

/// The outbox backlog as one measurement saw it (see `WEBHOOK_UNDISPATCHED`
/// and the next two).
pub fn webhook_backlog(
    undispatched_events: i64,
    set_aside_events: i64,
    pending_deliveries: i64,
    oldest_age_secs: f64,
) {
    gauge!(WEBHOOK_UNDISPATCHED).set(undispatched_events as f64);
    gauge!(WEBHOOK_SET_ASIDE_NOW).set(set_aside_events as f64);
    gauge!(WEBHOOK_PENDING).set(pending_deliveries as f64);
    gauge!(WEBHOOK_OLDEST_AGE).set(oldest_age_secs);
}

/// A lookup by key (`GET /v1/charges?idempotency_key=`): whether it found
/// the record.
pub fn key_lookup(kind: &'static str, found: bool) {
    counter!(KEY_LOOKUPS, "kind" => kind, "result" => if found { "found" } else { "none" })
        .increment(1);
}

/// The fields of a reused key's request that differ, each counted once; a
/// metadata entry counts as `metadata` (its key would be an unbounded
/// label), fields that cannot be told as `unknown`.
pub fn mismatched_fields(kind: &'static str, fields: &[String]) {
    const KNOWN: [&str; 8] = [
        "amount",
        "currency",
        "customer",
        "description",
        "reason",
        "charge",
        "url",
        "event_types",
    ];
    let labels = fields.iter().map(|field| {
        let name = field.split('.').next().unwrap_or_default();
        if name == "metadata" {
            "metadata"
        } else {
            KNOWN
                .into_iter()
                .find(|known| *known == name)
                .unwrap_or("unknown")
        }
    });
    let mut counted: Vec<&'static str> = Vec::new();
    for label in labels {
        if !counted.contains(&label) {
            counted.push(label);
            counter!(MISMATCHED_FIELDS, "kind" => kind, "field" => label).increment(1);
        }
    }
    if fields.is_empty() {
        counter!(MISMATCHED_FIELDS, "kind" => kind, "field" => "unknown").increment(1);
    }
}

pub fn clock_offset(seconds: f64) {
    gauge!(CLOCK_OFFSET).set(seconds);
}

pub fn webhook_attempt(outcome: &'static str, took: Duration) {
    counter!(WEBHOOK_ATTEMPTS, "outcome" => outcome).increment(1);
    histogram!(WEBHOOK_ATTEMPT_DURATION).record(took.as_secs_f64());
}

pub fn webhook_deliveries_failed(reason: &'static str, deliveries: usize) {
    counter!(WEBHOOK_GIVEN_UP, "reason" => reason).increment(deliveries as u64);
}

pub fn webhook_events_set_aside(events: usize) {
    counter!(WEBHOOK_SET_ASIDE).increment(events as u64);
}

pub fn webhook_deliveries_held(deliveries: usize) {
    counter!(WEBHOOK_HELD).increment(deliveries as u64);
}

pub fn webhook_endpoints_tripped(endpoints: usize) {
    counter!(WEBHOOK_TRIPPED).increment(endpoints as u64);
}

pub fn webhook_endpoints_disabled(endpoints: usize) {
    counter!(WEBHOOK_DISABLED).increment(endpoints as u64);
}

/// The pools of one application, named, so their state can be read when
/// `/metrics` is scraped (a pool's numbers are only known by asking it).
#[derive(Clone, Default)]
pub struct Pools(Arc<Mutex<Vec<(String, Pool)>>>);

impl Pools {
    pub fn register(&self, name: impl Into<String>, pool: Pool) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((name.into(), pool));
    }

    /// Sets the pool gauges from the pools as they are now.
    pub fn observe(&self) {
        for (name, pool) in self.0.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let status = pool.status();
            let in_use = status.size.saturating_sub(status.available);
            gauge!(POOL_SIZE, "pool" => name.clone()).set(status.size as f64);
            gauge!(POOL_IN_USE, "pool" => name.clone()).set(in_use as f64);
            gauge!(POOL_WAITERS, "pool" => name.clone()).set(status.waiting as f64);
            gauge!(POOL_MAX, "pool" => name.clone()).set(status.max_size as f64);
        }
    }
}
