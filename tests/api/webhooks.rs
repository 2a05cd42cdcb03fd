//! Webhooks end to end, against real receivers the tests start
//! (`webhook_receiver`) and the real service, in process or as binaries.
//! By subject:
//! - `endpoints`: idempotent creation, strict bodies and URLs, the secret
//!   shown at creation only (and never again once deleted), the cap on
//!   endpoints per merchant;
//! - `delivery`: deliveries that follow the endpoints' event types, retries
//!   after a 500 and a dropped connection, a hung receiver, private targets
//!   refused under the production configuration, a database away while an
//!   attempt is out;
//! - `signatures`: checked by an HMAC written here from the spec and by the
//!   `standardwebhooks` package from PyPI;
//! - `outbox`: event rows written once, and retention;
//! - `processes`: the real binary killed mid-dispatch, two instances at
//!   once, its logs, a graceful stop;
//! - `isolation`, `breaker`: no merchant slows down another's webhooks:
//!   bounded fan-out, events set aside, fair claiming, the circuit breaker.

mod breaker;
mod delivery;
mod endpoints;
mod isolation;
mod outbox;
mod processes;
mod signatures;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use chargeonce::config::Settings;
use serde_json::Value;
use uuid::Uuid;

use crate::helpers::{charge_body, TestApp};
use crate::processes::{Database, Process};
use crate::webhook_receiver::Receiver;

/// Webhook settings for in-process tests: a quick pace and quick retries.
fn fast(settings: &mut Settings) {
    settings.webhooks.interval = Duration::from_millis(20);
    settings.webhooks.timeout = Duration::from_secs(2);
    settings.webhooks.backoff_base = Duration::from_millis(50);
    settings.webhooks.max_backoff = Duration::from_millis(200);
}

/// A port nothing listens on: endpoints that must never be reached.
const NOWHERE: &str = "http://127.0.0.1:9/hooks";

async fn newest_event(app: &TestApp) -> Value {
    app.get("/v1/events?limit=1").await.json()["data"][0].clone()
}

/// Polls the deliveries of `event` until `done` holds for them.
async fn wait_for_deliveries(
    app: &TestApp,
    event: &str,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let page = app.get(&format!("/v1/events/{event}/deliveries")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let deliveries = page.json()["data"].as_array().unwrap().clone();
        if done(&deliveries) {
            return deliveries;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "waited for {what}: {deliveries:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn production_settings() -> Settings {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let vars = HashMap::from([("CHARGEONCE_ENV".to_owned(), "production".to_owned())]);
    Settings::load_from(&config, &vars).expect("config/production.toml loads")
}

// The real binary.

/// Settings (as environment) for a quick dispatcher.
fn dispatcher_env(timeout_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("CHARGEONCE__WEBHOOKS__INTERVAL_MS", "20".to_owned()),
        ("CHARGEONCE__WEBHOOKS__TIMEOUT_MS", timeout_ms.to_string()),
        ("CHARGEONCE__WEBHOOKS__BACKOFF_BASE_MS", "100".to_owned()),
        ("CHARGEONCE__WEBHOOKS__MAX_BACKOFF_MS", "500".to_owned()),
    ]
}

/// Creates `count` charges through `services` in turn, 16 at a time.
async fn create_charges(services: &[&Process], secret: &str, count: usize) {
    use futures_util::StreamExt;
    let http = reqwest::Client::new();
    let urls: Vec<String> = services.iter().map(|s| s.url.clone()).collect();
    futures_util::stream::iter(0..count)
        .map(|i| {
            let request = http
                .post(format!("{}/v1/charges", urls[i % urls.len()]))
                .bearer_auth(secret)
                .header("Idempotency-Key", format!("charge-{i}"))
                .header("Content-Type", "application/json")
                .body(charge_body(100 + 100 * i as i64));
            async move {
                let status = request.send().await.expect("charge answered").status();
                assert_eq!(status, 201);
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

async fn event_ids(db: &Database) -> HashSet<String> {
    db.client()
        .await
        .query("SELECT id FROM events", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| format!("evt_{}", row.get::<_, Uuid>(0).simple()))
        .collect()
}

async fn undelivered(db: &Database) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until every event of `db` has arrived at `receiver` and every
/// delivery is recorded as delivered.
async fn wait_all_delivered(db: &Database, receiver: &Receiver, events: usize, limit: Duration) {
    let started = Instant::now();
    loop {
        let ids = event_ids(db).await;
        let arrived = receiver.arrivals();
        if ids.len() == events
            && ids.iter().all(|id| arrived.contains_key(id))
            && undelivered(db).await == 0
        {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "after {limit:?}: {} events, {} arrived, {} not delivered",
            ids.len(),
            ids.iter().filter(|id| arrived.contains_key(*id)).count(),
            undelivered(db).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
