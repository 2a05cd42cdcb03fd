//! `chargeonce-client` against the real `chargeonce serve` binary, with
//! faults injected by the test kit's TCP proxy: replies lost after the work
//! was done, PostgreSQL cut off, a processor timeout. What must hold: one
//! logical call is one charge, whatever had to be retried, and answers that
//! will not change are returned after one request.
//!
//! Requests are counted from the service's own request log
//! (`chargeonce::http` at info), so "one request" is what the server saw,
//! not what the client believes it sent.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chargeonce_client::{
    ChargeStatus, Client, Error, IdempotencyKey, ListParams, NewCharge, RetryPolicy,
};
use chargeonce_testkit::{Proxy, ProxyMode};
use futures_util::{StreamExt, TryStreamExt};
use uuid::Uuid;

use crate::processes::{start_service, Database, Process};

/// The spawned service's log filter: its port announcement, warnings, and
/// one line per request with its method, path and status.
const REQUEST_LOG: &str = "warn,chargeonce::startup=info,chargeonce::http=info";

/// A service of its own on a migrated database, with a merchant.
struct Service {
    db: Database,
    process: Process,
    secret: String,
}

impl Service {
    /// `database_url` is how the service reaches the database (directly,
    /// or through a proxy); the merchant is made directly.
    async fn start(db: Database, database_url: &str, env: &[(&str, String)]) -> Self {
        let secret = db.create_merchant().await;
        let mut env = env.to_vec();
        env.push(("RUST_LOG", REQUEST_LOG.to_owned()));
        let process = start_service(database_url, &env).await;
        Self {
            db,
            process,
            secret,
        }
    }

    async fn plain() -> Self {
        let db = Database::migrated().await;
        let url = db.url.clone();
        Self::start(db, &url, &[]).await
    }

    fn client(&self, base_url: &str, policy: RetryPolicy) -> Client {
        Client::builder(base_url, self.secret.clone())
            .request_timeout(Duration::from_secs(5))
            .retry_policy(policy)
            .build()
            .expect("client")
    }

    /// The status of every `POST /v1/charges` the service logged, in order.
    /// The log reaches us through a buffer and a pipe, so this waits until
    /// at least `expected` requests are there and then a little longer, to
    /// catch any that should not be.
    async fn charge_posts(&self, expected: usize) -> Vec<u16> {
        let started = Instant::now();
        while charge_posts(&self.process).len() < expected
            && started.elapsed() < Duration::from_secs(5)
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        charge_posts(&self.process)
    }

    /// Every charge row: idempotency key → (public id, status, amount).
    async fn rows(&self) -> HashMap<String, (String, String, i64)> {
        let client = self.db.client().await;
        client
            .query(
                "SELECT client_idempotency_key, id, status, amount FROM charges",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let id: Uuid = row.get(1);
                (
                    row.get(0),
                    (format!("ch_{}", id.simple()), row.get(2), row.get(3)),
                )
            })
            .collect()
    }
}

fn charge_posts(process: &Process) -> Vec<u16> {
    process
        .log()
        .iter()
        // The access-log line of each request: its span names the route.
        .filter(|line| {
            line.contains("method=POST")
                && line.contains("route=\"/v1/charges\"")
                && line.contains(": request status=")
        })
        .filter_map(|line| {
            let status = line
                .split_whitespace()
                .find_map(|f| f.strip_prefix("status="))?;
            status.parse().ok()
        })
        .collect()
}

/// From the access log of POST /v1/charges: the charges created, and the
/// charges answered again as replays.
fn charge_outcomes(process: &Process) -> (HashSet<String>, HashSet<String>) {
    let (mut created, mut replayed) = (HashSet::new(), HashSet::new());
    for line in process.log().iter().filter(|line| {
        line.contains("method=POST")
            && line.contains("route=\"/v1/charges\"")
            && line.contains(": request status=")
    }) {
        let field = |name: &str| {
            line.split(|c: char| c.is_whitespace() || c == '{' || c == '}')
                .find_map(|f| f.strip_prefix(name))
                .map(|v| v.trim_matches('"').to_owned())
        };
        let (Some(id), Some(outcome)) = (field("id="), field("idempotency=")) else {
            continue;
        };
        match outcome.as_str() {
            "created" => created.insert(id),
            "replayed" => replayed.insert(id),
            _ => false,
        };
    }
    (created, replayed)
}

/// Waits short enough that the tests stay quick, and tries long enough that
/// a 30 % loss rate cannot exhaust the attempts (0.3^20).
fn patient_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 20,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(200),
        deadline: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn lost_replies_are_retried_into_exactly_one_charge_per_call() {
    const CALLS: i64 = 200;
    let service = Service::plain().await;
    let proxy = Proxy::start(
        format!("127.0.0.1:{}", service.process.port)
            .parse()
            .unwrap(),
    )
    .await;
    let client = service.client(&proxy.url_for(&service.process.url), patient_policy());
    // The server does the work, then its answer is dropped with the
    // connection: the client sees an error for a charge that was made.
    // Exactly 30 % of the first attempts lose their answer (calls 0, 1 and 2
    // of every ten), and for a third of those the first retry does too.
    let keys: Vec<IdempotencyKey> = (0..CALLS).map(|_| IdempotencyKey::new()).collect();
    let cut: HashMap<String, u32> = keys
        .iter()
        .enumerate()
        .filter(|(n, _)| n % 10 < 3)
        .map(|(n, key)| (key.as_str().to_owned(), if n % 10 == 0 { 2 } else { 1 }))
        .collect();
    let mut seen: HashMap<String, u32> = HashMap::new();
    proxy.lose_replies_to(move |request| {
        let request = String::from_utf8_lossy(request);
        let Some((key, times)) = cut.iter().find(|(key, _)| request.contains(key.as_str())) else {
            return false;
        };
        let attempt = seen.entry(key.clone()).or_default();
        *attempt += 1;
        *attempt <= *times
    });
    const FIRST_ATTEMPTS_CUT: usize = 60;
    const LOST: usize = 80;

    let calls: Vec<(i64, IdempotencyKey, Result<_, Error>)> =
        futures_util::stream::iter(keys.into_iter().zip(0..CALLS))
            .map(|(key, n)| {
                let client = client.clone();
                async move {
                    // Amounts ending in 00: the simulated processor accepts them.
                    let order =
                        NewCharge::new(10_000 + n * 100, "USD").metadata("n", n.to_string());
                    let operation = client.charge_operation_with_key(&order, key.clone());
                    (n, key, operation.send().await)
                }
            })
            .buffer_unordered(16)
            .collect()
            .await;
    assert_eq!(proxy.replies_lost() as usize, LOST);

    let rows = service.rows().await;
    assert_eq!(rows.len(), CALLS as usize, "one charge per logical call");
    let mut ids = HashSet::new();
    for (n, key, result) in calls {
        let charge = result.unwrap_or_else(|e| panic!("call {n} failed: {e}"));
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        assert_eq!(charge.amount, 10_000 + n * 100);
        assert_eq!(charge.metadata.get("n"), Some(&n.to_string()));
        let (row_id, status, amount) = &rows[key.as_str()];
        assert_eq!(&charge.id, row_id, "call {n} got the charge its key made");
        assert_eq!((status.as_str(), *amount), ("succeeded", charge.amount));
        assert!(ids.insert(charge.id), "a charge was returned to two calls");
    }
    // Every lost reply was followed by a retry the server answered from the
    // stored charge: more requests than charges, no more charges.
    let posts = service.charge_posts(CALLS as usize + LOST).await;
    assert_eq!(posts.len(), CALLS as usize + LOST, "{posts:?}");
    assert!(posts.iter().all(|&s| s == 201), "{posts:?}");
    // The server created each charge once, and answered again (a replay)
    // exactly the calls whose first answer it lost.
    let (created, replayed) = charge_outcomes(&service.process);
    assert_eq!(created.len(), CALLS as usize, "each charge created once");
    assert_eq!(replayed.len(), FIRST_ATTEMPTS_CUT);
    assert!(replayed.is_subset(&created));

    // The listing pages through all of them, each once.
    let listed: Vec<String> = client
        .list_charges(ListParams::new().limit(100))
        .map_ok(|c| c.id)
        .try_collect()
        .await
        .unwrap();
    assert_eq!(listed.len(), CALLS as usize);
    assert_eq!(listed.iter().collect::<HashSet<_>>(), ids.iter().collect());
}

#[tokio::test]
async fn a_reused_key_with_another_body_fails_at_once_without_retrying() {
    let service = Service::plain().await;
    // A first wait of up to 2 s: a retry would show in the time taken, and
    // in the service's log.
    let policy = RetryPolicy {
        initial_backoff: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    let client = service.client(&service.process.url, policy);
    let key = IdempotencyKey::new();
    let first = client
        .create_charge_with_key(&NewCharge::new(1_000, "USD"), key.clone())
        .await
        .unwrap();

    let started = Instant::now();
    let error = client
        .create_charge_with_key(&NewCharge::new(2_000, "USD"), key.clone())
        .await
        .unwrap_err();
    let elapsed = started.elapsed();

    assert!(matches!(error, Error::KeyReused { .. }), "{error:?}");
    assert_eq!(error.idempotency_key(), Some(&key));
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?}");
    assert_eq!(
        service.charge_posts(2).await,
        [201, 422],
        "one request each"
    );
    let rows = service.rows().await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[key.as_str()],
        (first.id, "succeeded".to_owned(), 1_000)
    );
}

/// The client names what differs in a reused key's request, finds what a
/// key created without sending it again, and treats an expired key as
/// final: one request, no retry, never a second charge.
#[tokio::test]
async fn the_client_finds_by_key_and_takes_an_expired_key_as_final() {
    let service = Service::plain().await;
    let policy = RetryPolicy {
        initial_backoff: Duration::from_secs(2),
        ..RetryPolicy::default()
    };
    let client = service.client(&service.process.url, policy);
    let key = IdempotencyKey::new();
    assert!(client.find_by_key(&key).await.unwrap().is_none());
    let first = client
        .create_charge_with_key(&NewCharge::new(1_000, "USD"), key.clone())
        .await
        .unwrap();
    let found = client.find_by_key(&key).await.unwrap().expect("found");
    assert_eq!(found.id, first.id);
    assert_eq!(found.idempotency_key.as_deref(), Some(key.as_str()));
    assert!(found.idempotency_key_expires_at.is_some());
    let reused = client
        .create_charge_with_key(&NewCharge::new(2_000, "USD"), key.clone())
        .await
        .unwrap_err();
    let Error::KeyReused {
        differing_fields, ..
    } = &reused
    else {
        panic!("{reused:?}")
    };
    assert_eq!(differing_fields, &["amount"]);

    // A charge whose key's window ended a day ago.
    let expired = IdempotencyKey::new();
    let two_days_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 48 * 3600;
    let old_id = Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, two_days_ago, 0));
    service
        .db
        .client()
        .await
        .execute(
            "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, status) \
             SELECT $1, id, $2, sha256('x'), 1000, 'USD', 'succeeded' FROM merchants",
            &[&old_id, &expired.as_str()],
        )
        .await
        .unwrap();
    let started = Instant::now();
    let error = client
        .create_charge_with_key(&NewCharge::new(1_000, "USD"), expired.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::KeyExpired { window_ended: Some(end), .. } if end.ends_with(" GMT")),
        "{error:?}"
    );
    assert!(!error.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(1), "not retried");
    assert_eq!(
        service.charge_posts(3).await,
        [201, 422, 422],
        "one request each"
    );
    let found = client.find_by_key(&expired).await.unwrap().expect("found");
    assert_eq!(found.id, format!("ch_{}", old_id.simple()));
    assert_eq!(service.rows().await.len(), 2, "no second charge");
}

#[tokio::test]
async fn a_declined_charge_is_returned_as_declined_after_one_request() {
    let service = Service::plain().await;
    let client = service.client(&service.process.url, RetryPolicy::default());
    let operation = client.charge_operation(&NewCharge::new(1_002, "USD"));

    let error = operation.send().await.unwrap_err();

    let Error::Declined {
        code,
        message,
        charge,
        ..
    } = &error
    else {
        panic!("not a decline: {error:?}")
    };
    assert_eq!(code, "card_declined");
    assert!(!message.is_empty());
    assert_eq!(charge.status, ChargeStatus::Failed);
    assert_eq!(charge.failure_code.as_deref(), Some("card_declined"));
    assert_eq!(error.idempotency_key(), Some(operation.key()));
    assert!(!error.is_retryable());
    assert_eq!(service.charge_posts(1).await, [402], "not retried");
    let rows = service.rows().await;
    assert_eq!(
        rows[operation.key().as_str()],
        (charge.id.clone(), "failed".to_owned(), 1_002)
    );
    assert_eq!(rows.len(), 1);
    // The failed charge reads back the same.
    assert_eq!(client.get_charge(&charge.id).await.unwrap(), **charge);
}

#[tokio::test]
async fn calls_made_while_the_database_is_unreachable_complete_when_it_returns() {
    const CALLS: i64 = 8;
    let db = Database::migrated().await;
    let postgres = Proxy::start(crate::helpers::database_address()).await;
    let through_proxy = postgres.url_for(&db.url);
    let service = Service::start(
        db,
        &through_proxy,
        &[("CHARGEONCE__DATABASE__CONNECT_TIMEOUT_MS", "300".to_owned())],
    )
    .await;
    let client = service.client(&service.process.url, RetryPolicy::default());

    // Cut before the calls start, so every attempt during the outage fails
    // at its first statement and nothing is half done.
    postgres.set_mode(ProxyMode::Cut);
    let started = Instant::now();
    let calls: Vec<_> = (0..CALLS)
        .map(|n| {
            let client = client.clone();
            tokio::spawn(async move {
                let operation = client.charge_operation(&NewCharge::new(3_000 + n * 100, "USD"));
                let key = operation.key().clone();
                (key, operation.send().await)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    postgres.set_mode(ProxyMode::Forward);

    let mut returned = HashMap::new();
    for call in calls {
        let (key, result) = call.await.unwrap();
        let charge = result.unwrap_or_else(|e| panic!("a call did not outlast the outage: {e}"));
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        returned.insert(key.as_str().to_owned(), charge.id);
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(20),
        "the calls waited the outage out: took {elapsed:?}"
    );
    let rows = service.rows().await;
    assert_eq!(rows.len(), CALLS as usize);
    for (key, id) in &returned {
        assert_eq!(&rows[key].0, id, "each call got the charge its key made");
    }
    assert_eq!(
        returned.values().collect::<HashSet<_>>().len(),
        CALLS as usize
    );
    let posts = service.charge_posts(CALLS as usize).await;
    assert!(
        posts.iter().filter(|&&s| s == 503).count() >= CALLS as usize,
        "every call met the outage first: {posts:?}"
    );
    assert_eq!(posts.iter().filter(|&&s| s == 201).count(), CALLS as usize);
}

#[tokio::test]
async fn a_pending_charge_is_finished_by_retrying_with_the_same_key() {
    let service = Service::plain().await;
    let client = service.client(&service.process.url, RetryPolicy::default());
    // Amounts ending in 09: the simulated processor times out on the first
    // call for a key, so the first answer is 202 pending.
    let operation = client.charge_operation(&NewCharge::new(1_009, "USD"));

    let charge = operation.send().await.unwrap();

    assert_eq!(charge.status, ChargeStatus::Succeeded);
    assert_eq!(service.charge_posts(2).await, [202, 201]);
    let rows = service.rows().await;
    assert_eq!(rows.len(), 1, "the retry used the same key");
    assert_eq!(
        rows[operation.key().as_str()],
        (charge.id, "succeeded".to_owned(), 1_009)
    );
}
