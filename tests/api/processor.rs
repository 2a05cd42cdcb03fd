//! Processor answers are classified, and recovery backs off: a stub processor
//! started by the test answers each class in turn.

use std::time::{Duration, Instant};

use crate::helpers::{charge_body, spawn_app_with, TestApp};
use crate::processes::{start_service, Database, Process};
use crate::processor_stub::ProcessorStub;

const PAYMENTS: &str = "/v1/payments";
const REFUNDS: &str = "/v1/refunds";

/// An app on the stub with short leases and a quick, capped recovery pace;
/// the HTTP processor makes one attempt per call (no immediate repeats), so
/// stub calls count recovery rounds.
async fn app_on(stub: &ProcessorStub, interval_ms: u64, max_backoff_ms: u64) -> TestApp {
    let url = stub.url.clone();
    spawn_app_with(move |s| {
        s.processor.kind = chargeonce::config::ProcessorKind::Http;
        s.processor.url = url;
        s.processor.timeout = Duration::from_millis(300);
        s.processor.retries = 0;
        s.idempotency.lease = Duration::from_millis(1000);
        s.recovery.interval = Duration::from_millis(interval_ms);
        s.recovery.max_backoff = Duration::from_millis(max_backoff_ms);
    })
    .await
}

#[tokio::test]
async fn a_processor_400_fails_the_charge_as_processor_rejected_once_and_for_all() {
    let stub = ProcessorStub::start(400).await;
    let app = app_on(&stub, 100, 1000).await;
    let first = app.post_charge("rejected", &charge_body(1000)).await;
    let problem = first.assert_problem(402, "processor_rejected");
    assert_eq!(problem["charge"]["status"], "failed");
    let message = problem["charge"]["failure_message"].as_str().unwrap();
    assert!(message.contains("rejected"), "{message}");
    assert!(!message.chars().any(char::is_control), "{message:?}");

    // Final: not re-sent by recovery, and a retry replays.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(stub.calls().len(), 1);
    let replay = app.post_charge("rejected", &charge_body(1000)).await;
    assert_eq!(replay.status, 402);
    assert_eq!(replay.body, first.body);
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'charge.failed'")
            .await,
        1
    );
}

/// Waits 3 s after a charge (or refund: `path`) went pending on `stub` (with
/// `app_on(stub, 100, 800)`), asserts recovery backed off, and returns the
/// calls to `path`. A worker that did not back off would ask about every
/// 100 ms (about 30 times in 3 s); with 100, 200, 400, 800, 800 ms (each
/// half to all of it, at random) it asks at most about a dozen times.
async fn backs_off(stub: &ProcessorStub, path: &str) -> Vec<crate::processor_stub::Call> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let calls = stub.calls_to(path);
    assert!(
        (4..=12).contains(&calls.len()),
        "{} calls in 3 s",
        calls.len()
    );
    assert!(
        calls.iter().all(|c| c.key == calls[0].key),
        "one downstream key"
    );
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert!(
        gaps.last().unwrap() >= &Duration::from_millis(350),
        "the pace slowed: {gaps:?}"
    );
    calls
}

/// A processor 402 is a final decline: one call, the charge `failed` with
/// the processor's `decline_code`, the client 402 with it, never re-sent.
#[tokio::test]
async fn a_processor_402_fails_the_charge_with_its_decline_code_in_one_call() {
    let stub = ProcessorStub::start(402).await;
    let app = app_on(&stub, 100, 1000).await;
    let first = app.post_charge("declined", &charge_body(1000)).await;
    let problem = first.assert_problem(402, "card_declined");
    assert_eq!(problem["charge"]["status"], "failed");
    assert_eq!(problem["charge"]["failure_code"], "card_declined");

    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(stub.calls().len(), 1, "final: recovery does not ask again");
    let replay = app.post_charge("declined", &charge_body(1000)).await;
    assert_eq!(replay.status, 402);
    assert_eq!(replay.body, first.body);
    assert_eq!(stub.calls().len(), 1, "a replay does not ask again");
    assert_eq!(
        app.count("SELECT count(*) FROM charges WHERE status = 'failed'")
            .await,
        1
    );
}

/// A conflict on the processor's key (409, 422) is retried by recovery
/// with the same backoff as an outage, not at the worker's every round
/// (the finding: 22 calls in 20 s, one a second).
#[tokio::test]
async fn a_key_conflict_at_the_processor_is_retried_with_backoff() {
    for status in [409, 422] {
        let stub = ProcessorStub::start(status).await;
        let app = app_on(&stub, 100, 800).await;
        let reply = app.post_charge("conflict", &charge_body(1000)).await;
        assert_eq!(reply.status, 202, "{status}: {}", reply.body);
        backs_off(&stub, PAYMENTS).await;
        assert_eq!(
            app.count("SELECT count(*) FROM charges WHERE status = 'pending'")
                .await,
            1
        );
    }
}

#[tokio::test]
async fn unknown_outcomes_stay_pending_and_recovery_backs_off_per_charge() {
    let stub = ProcessorStub::start(503).await;
    let app = app_on(&stub, 100, 800).await;
    let reply = app.post_charge("outage", &charge_body(1000)).await;
    assert_eq!(reply.status, 202, "{}", reply.body);
    assert_eq!(reply.json()["status"], "pending");

    let calls = backs_off(&stub, PAYMENTS).await;
    // The pace is kept on the row, so a restart keeps it.
    let client = app.sql().await;
    let row = client
        .query_one(
            "SELECT status, processor_attempts, next_attempt_at > now() - interval '1 second' \
             FROM charges",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "pending");
    assert!(row.get::<_, i32>(1) >= calls.len() as i32 - 1);
    assert!(row.get::<_, bool>(2));

    // Each class that leaves the outcome unknown: 500, 429, a timeout.
    for (key, status, delay) in [
        ("five-hundred", 500, 0),
        ("too-many", 429, 0),
        ("timeout", 201, 1000),
    ] {
        stub.answer(status);
        stub.delay(Duration::from_millis(delay));
        let reply = app.post_charge(key, &charge_body(2000)).await;
        assert_eq!(reply.status, 202, "{key}: {}", reply.body);
    }

    // The processor recovers: the worker finishes every charge.
    stub.answer(201);
    stub.delay(Duration::ZERO);
    let started = Instant::now();
    while app
        .count("SELECT count(*) FROM charges WHERE status = 'pending'")
        .await
        > 0
    {
        assert!(started.elapsed() < Duration::from_secs(5), "still pending");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let replay = app.post_charge("outage", &charge_body(1000)).await;
    assert_eq!(replay.status, 201, "{}", replay.body);
}

/// A refund whose outcome stays unknown is retried by recovery with the
/// same backoff as a charge, paced by the refund's own attempts.
#[tokio::test]
async fn unknown_refund_outcomes_are_retried_with_backoff() {
    let stub = ProcessorStub::start(201).await;
    let app = app_on(&stub, 100, 800).await;
    let charge = app.post_charge("paid", &charge_body(1000)).await;
    assert_eq!(charge.status, 201, "{}", charge.body);
    let charge = charge.json()["id"].as_str().unwrap().to_owned();
    stub.answer(503);
    let refund = app
        .post_refund(&charge, "refund", r#"{"amount":400}"#)
        .await;
    assert_eq!(refund.status, 202, "{}", refund.body);
    let calls = backs_off(&stub, REFUNDS).await;
    let attempts = app
        .count("SELECT processor_attempts::bigint FROM refunds WHERE status = 'pending'")
        .await;
    assert!(
        attempts >= calls.len() as i64 - 1,
        "{attempts} attempts recorded"
    );
}

/// A conflict on the processor's key (409, 422) is not a decline: whether a
/// payment exists is unknown. The charge stays pending and an operator is
/// told, with the charge's id.
#[tokio::test]
async fn a_key_conflict_at_the_processor_stays_pending_and_asks_for_attention() {
    for status in [409, 422] {
        let stub = ProcessorStub::start(status).await;
        let (_db, secret, service) = service_on(&stub).await;
        let reply = post_charge(&service, &secret, "conflict").await;
        assert_eq!(reply.status(), 202);
        let charge: serde_json::Value = reply.json().await.unwrap();
        assert_eq!(charge["status"], "pending");
        let id = charge["id"].as_str().unwrap().to_owned();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let log = service.log();
        assert!(
            log.iter().any(|line| line.contains("ERROR")
                && line.contains("needs attention")
                && line.contains(&id)
                && line.contains(&status.to_string())),
            "{status}: {log:#?}"
        );
        // Counted as needing attention, for an alert to find.
        let metrics = scrape(&service).await;
        assert!(
            processor_calls(&metrics, "attention") >= 1.0,
            "{status}: {metrics}"
        );
        assert_eq!(processor_calls(&metrics, "unknown"), 0.0, "{status}");
    }
}

/// A processor's refusal to look at a request (400: nothing was made) and a
/// decline (402) both fail the charge, and the metrics tell them apart: an
/// alert on rejected requests points at our side of the integration, one
/// on declines at the customers'.
#[tokio::test]
async fn rejections_and_declines_are_counted_apart() {
    let stub = ProcessorStub::start(400).await;
    let (_db, secret, service) = service_on(&stub).await;
    assert_eq!(
        post_charge(&service, &secret, "rejected").await.status(),
        402
    );
    stub.answer(402);
    for key in ["declined-1", "declined-2"] {
        assert_eq!(post_charge(&service, &secret, key).await.status(), 402);
    }
    let metrics = scrape(&service).await;
    assert_eq!(processor_calls(&metrics, "rejected"), 1.0, "{metrics}");
    assert_eq!(processor_calls(&metrics, "declined"), 2.0, "{metrics}");
    assert_eq!(processor_calls(&metrics, "succeeded"), 0.0, "{metrics}");
}

/// A merchant and the real binary on a database of their own, charging
/// through `stub` with one attempt per call.
async fn service_on(stub: &ProcessorStub) -> (Database, String, Process) {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let service = start_service(
        &db.url,
        &[
            ("CHARGEONCE__PROCESSOR__KIND", "http".to_owned()),
            ("CHARGEONCE__PROCESSOR__URL", stub.url.clone()),
            ("CHARGEONCE__PROCESSOR__RETRIES", "0".to_owned()),
            ("CHARGEONCE__PROCESSOR__TIMEOUT_MS", "1000".to_owned()),
        ],
    )
    .await;
    (db, secret, service)
}

async fn scrape(service: &Process) -> String {
    reqwest::get(format!("{}/metrics", service.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The count of charge calls to the processor with `outcome` in a scrape.
fn processor_calls(metrics: &str, outcome: &str) -> f64 {
    let outcome = format!("outcome=\"{outcome}\"");
    metrics
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{}{{", chargeonce::metrics::PROCESSOR_CALLS))
                && line.contains("operation=\"charge\"")
                && line.contains(&outcome)
        })
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// The recovery pace is kept on the row, so a restart keeps it: after a few
/// rounds the service is killed and started again, and its first call is
/// no sooner than the row's `next_attempt_at`, with the attempts counted on
/// from where they were (a pace kept in memory would start over at once).
#[tokio::test]
async fn the_recovery_pace_survives_a_restart() {
    let stub = ProcessorStub::start(409).await;
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let env = [
        ("CHARGEONCE__PROCESSOR__KIND", "http".to_owned()),
        ("CHARGEONCE__PROCESSOR__URL", stub.url.clone()),
        ("CHARGEONCE__PROCESSOR__RETRIES", "0".to_owned()),
        ("CHARGEONCE__PROCESSOR__TIMEOUT_MS", "300".to_owned()),
        ("CHARGEONCE__IDEMPOTENCY__LEASE_MS", "1000".to_owned()),
        ("CHARGEONCE__RECOVERY__INTERVAL_MS", "200".to_owned()),
        ("CHARGEONCE__RECOVERY__MAX_BACKOFF_MS", "10000".to_owned()),
        // The startup's port announcement and the recovery rounds' lines.
        (
            "RUST_LOG",
            "warn,chargeonce::startup=info,chargeonce::service::lifecycle=info".to_owned(),
        ),
    ];
    let service = start_service(&db.url, &env).await;
    let reply = post_charge(&service, &secret, "restart").await;
    assert_eq!(reply.status(), 202);

    // Five attempts: the next waits 1.6 to 3.2 s (200 ms · 2^4, half to all).
    let sql = db.client().await;
    let pace = "SELECT processor_attempts,                        (extract(epoch FROM next_attempt_at - now()) * 1000)::int8                   FROM charges WHERE locked_until <= now()";
    let started = Instant::now();
    let (attempts, wait_ms) = loop {
        if let Some(row) = sql.query_opt(pace, &[]).await.unwrap() {
            let attempts: i32 = row.get(0);
            if attempts >= 5 {
                // Each recovery round says what became of the charge (the
                // line follows the row's update by a moment).
                let logged = Instant::now();
                while !service
                    .log()
                    .iter()
                    .any(|l| l.contains("still pending after recovery attempt"))
                {
                    assert!(
                        logged.elapsed() < Duration::from_secs(1),
                        "{:#?}",
                        service.log()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let log = service.log();
                assert!(!log.iter().any(|l| l.contains(" recovered")), "{log:#?}");
                drop(service);
                // The row as the killed service left it.
                let row = sql.query_one(pace, &[]).await.unwrap();
                break (row.get::<_, i32>(0), row.get::<_, i64>(1));
            }
        }
        assert!(started.elapsed() < Duration::from_secs(15), "too slow");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let due = Instant::now() + Duration::from_millis(u64::try_from(wait_ms.max(0)).unwrap());
    let before = stub.calls().len();
    assert_eq!(before, usize::try_from(attempts).unwrap());

    let restarted = start_service(&db.url, &env).await;
    let started = Instant::now();
    while stub.calls().len() == before {
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the restarted service never asked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let next = stub.calls()[before].at;
    assert!(
        next + Duration::from_millis(50) >= due,
        "asked {:?} before the recorded next attempt (wait was {wait_ms} ms)",
        due - next
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let attempts_after: i32 = sql
        .query_one("SELECT processor_attempts FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        attempts_after,
        attempts + 1,
        "counted on across the restart"
    );

    // Once the processor answers finally, the worker's round says so.
    stub.answer(201);
    let started = Instant::now();
    while !restarted.log().iter().any(|l| l.contains(" recovered")) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never logged the recovery: {:#?}",
            restarted.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status: String = sql
        .query_one("SELECT status FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "succeeded");
}

/// POST /v1/charges of 1,000 to a spawned service under `key`.
async fn post_charge(service: &Process, secret: &str, key: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/charges", service.url))
        .bearer_auth(secret)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(charge_body(1000))
        .send()
        .await
        .unwrap()
}
