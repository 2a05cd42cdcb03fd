//! The side-effect boundary with real processes: psp-sim as the processor,
//! the real binary killed at each crash point, faults injected at psp-sim,
//! and two instances racing for one key.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};

use crate::helpers::{charge_body, spawn_app_with, Reply};
use crate::processes::{http_processor_env, psp_payments, start_psp_sim, start_service, Database};

/// What a client does: send the same key until the answer is final, waiting
/// between tries on 202 (pending), 409 (in flight) and 503.
async fn charge_until_final(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    key: &str,
    body: &str,
) -> Reply {
    let started = Instant::now();
    loop {
        let sent = http
            .post(format!("{base}/v1/charges"))
            .bearer_auth(secret)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_owned())
            .send()
            .await;
        if let Ok(response) = sent {
            let reply = Reply {
                status: response.status(),
                headers: response.headers().clone(),
                body: response.text().await.unwrap_or_default(),
            };
            match reply.status.as_u16() {
                201 | 402 => return reply,
                202 | 409 | 503 => {}
                other => panic!("unexpected {other}: {}", reply.body),
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{key} never became final"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(feature = "crash-points")]
mod crash_points {
    use serde_json::Value;

    use super::*;

    /// The charge JSON without what differs between two charges (id, time).
    fn comparable(reply: &Reply) -> Value {
        let mut charge = reply.json();
        if charge["object"] != "charge" {
            charge = charge["charge"].clone();
        }
        let object = charge.as_object_mut().unwrap();
        object.remove("id");
        object.remove("created_at");
        charge
    }

    async fn wait_until_final(db: &Database) {
        let client = db.client().await;
        let started = Instant::now();
        loop {
            let pending: i64 = client
                .query_one("SELECT count(*) FROM charges WHERE status = 'pending'", &[])
                .await
                .unwrap()
                .get(0);
            if pending == 0 {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "charges stayed pending"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills a real service at `point` while it handles one charge, restarts
    /// it, and lets the client retry (`client_retries`) or only the recovery
    /// worker finish the charge. Either way: one payment at psp-sim, one
    /// charge row, final, and the answer a crash-free run gives.
    async fn crash_at(point: &str, client_retries: bool) {
        let db = Database::migrated().await;
        let secret = db.create_merchant().await;
        let psp = start_psp_sim(&[]).await;
        let mut env = http_processor_env(&psp);
        // The worker stays out of the way unless it is the one under test.
        let interval = if client_retries { "600000" } else { "100" };
        env.push(("CHARGEONCE__RECOVERY__INTERVAL_MS", interval.to_owned()));
        let mut crashing_env = env.clone();
        crashing_env.push(("CHARGEONCE_CRASH_AT", point.to_owned()));
        let http = reqwest::Client::new();
        let body = charge_body(1000);

        let mut crashing = start_service(&db.url, &crashing_env).await;
        let died = http
            .post(format!("{}/v1/charges", crashing.url))
            .bearer_auth(&secret)
            .header("Idempotency-Key", "crash-key")
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
            .await;
        if let Ok(response) = died {
            panic!(
                "{point}: the process answered instead of dying: {} {:?}",
                response.status(),
                response.text().await
            );
        }
        let exit = crashing
            .wait_exit(Duration::from_secs(5))
            .await
            .expect("process died");
        assert!(!exit.success(), "{point}: {exit:?}");

        let restarted = start_service(&db.url, &env).await;
        let answer = if client_retries {
            charge_until_final(&http, &restarted.url, &secret, "crash-key", &body).await
        } else {
            wait_until_final(&db).await;
            // The charge is final without the client; its retry replays it.
            let replay =
                charge_until_final(&http, &restarted.url, &secret, "crash-key", &body).await;
            assert_eq!(replay.header("idempotent-replayed"), Some("true"));
            replay
        };
        let reference =
            charge_until_final(&http, &restarted.url, &secret, "reference", &body).await;
        assert_eq!(answer.status, reference.status, "{point}: {}", answer.body);
        assert_eq!(comparable(&answer), comparable(&reference), "{point}");

        let client = db.client().await;
        let charge_id: uuid::Uuid = client
            .query_one(
                "SELECT id FROM charges WHERE client_idempotency_key = 'crash-key' AND status = 'succeeded'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(answer.json()["id"], format!("ch_{}", charge_id.simple()));
        let events: i64 = client
            .query_one(
                "SELECT count(*) FROM events WHERE charge_id = $1",
                &[&charge_id],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(events, 1, "{point}: one outbox event");
        let charges: i64 = client
            .query_one("SELECT count(*) FROM charges", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(charges, 2, "{point}: the crashed charge and the reference");

        let payments = psp_payments(&psp).await;
        let key = format!("chargeonce-{}", charge_id.simple());
        let ours: Vec<_> = payments
            .iter()
            .filter(|p| p["idempotency_key"] == key.as_str())
            .collect();
        assert_eq!(ours.len(), 1, "{point}: exactly one payment: {payments:?}");
        assert_eq!(payments.len(), 2, "{point}: {payments:?}");
        if point != "after_pending_commit" {
            // The processor saw the key before the crash and again after.
            assert!(ours[0]["requests"].as_u64().unwrap() >= 1);
        }
    }

    #[tokio::test]
    async fn crash_after_pending_commit_then_client_retry() {
        crash_at("after_pending_commit", true).await;
    }

    #[tokio::test]
    async fn crash_after_processor_reply_then_client_retry() {
        crash_at("after_processor_reply", true).await;
    }

    #[tokio::test]
    async fn crash_after_outcome_commit_then_client_retry() {
        crash_at("after_outcome_commit", true).await;
    }

    #[tokio::test]
    async fn crash_after_pending_commit_then_worker_recovers() {
        crash_at("after_pending_commit", false).await;
    }

    #[tokio::test]
    async fn crash_after_processor_reply_then_worker_recovers() {
        crash_at("after_processor_reply", false).await;
    }

    #[tokio::test]
    async fn crash_after_outcome_commit_then_worker_recovers() {
        crash_at("after_outcome_commit", false).await;
    }
}

#[tokio::test]
async fn under_injected_faults_every_logical_charge_is_made_once() {
    let psp = start_psp_sim(&[
        "--error-rate",
        "0.2",
        "--lost-response-rate",
        "0.2",
        "--timeout-rate",
        "0.2",
        "--hang-ms",
        "1000",
        "--seed",
        "42",
    ])
    .await;
    let app = spawn_app_with(|s| {
        s.processor.kind = chargeonce::config::ProcessorKind::Http;
        s.processor.url = psp.url.clone();
        s.processor.timeout = Duration::from_millis(250);
        s.processor.retries = 2;
        s.idempotency.lease = Duration::from_millis(1500);
        s.recovery.interval = Duration::from_millis(200);
    })
    .await;
    let http = reqwest::Client::new();
    let replies: Vec<(String, Reply)> = stream::iter(0..300)
        .map(|i| {
            let key = uuid::Uuid::new_v4().to_string();
            // Every tenth charge is declined by the processor's rules.
            let amount = 1000 + i * 100 + if i % 10 == 0 { 2 } else { 0 };
            let (http, app) = (&http, &app);
            async move {
                let reply = charge_until_final(
                    http,
                    &app.address,
                    &app.api_key,
                    &key,
                    &charge_body(amount),
                )
                .await;
                (key, reply)
            }
        })
        .buffer_unordered(30)
        .collect()
        .await;

    assert_eq!(app.charge_rows().await, 300);
    assert_eq!(
        app.count("SELECT count(*) FROM charges WHERE status = 'pending'")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM charges WHERE status = 'failed'")
            .await,
        30
    );
    assert_eq!(replies.iter().filter(|(_, r)| r.status == 402).count(), 30);

    let payments = psp_payments(&psp).await;
    let keys: HashSet<&str> = payments
        .iter()
        .map(|p| p["idempotency_key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys.len(),
        payments.len(),
        "no key with more than one payment"
    );
    assert_eq!(payments.len(), 300, "one payment per logical charge");
    // Each payment belongs to exactly one charge, with the same outcome.
    let client = app.sql().await;
    let rows = client
        .query("SELECT id, status, amount FROM charges", &[])
        .await
        .unwrap();
    let charges: HashMap<String, (String, i64)> = rows
        .iter()
        .map(|r| {
            let id: uuid::Uuid = r.get(0);
            (format!("chargeonce-{}", id.simple()), (r.get(1), r.get(2)))
        })
        .collect();
    for payment in &payments {
        let (status, amount) = &charges[payment["idempotency_key"].as_str().unwrap()];
        let expected = if status == "succeeded" {
            "succeeded"
        } else {
            "declined"
        };
        assert_eq!(payment["status"], expected);
        assert_eq!(payment["amount"], *amount);
    }
    // The faults really happened: many keys needed more than one request.
    let retried = payments
        .iter()
        .filter(|p| p["requests"].as_u64().unwrap() > 1)
        .count();
    assert!(retried > 100, "only {retried} keys were retried");
}

#[tokio::test]
async fn two_instances_racing_for_one_key_make_one_charge_and_one_payment() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let psp = start_psp_sim(&["--latency-ms", "200"]).await;
    let mut env = http_processor_env(&psp);
    // Room for a slow machine: the winner's call must not time out and be
    // repeated, or the count below would not tell who called.
    env.push(("CHARGEONCE__PROCESSOR__TIMEOUT_MS", "2000".to_owned()));
    env.push(("CHARGEONCE__IDEMPOTENCY__LEASE_MS", "10000".to_owned()));
    let (a, b) = tokio::join!(start_service(&db.url, &env), start_service(&db.url, &env));
    let http = reqwest::Client::new();
    let body = charge_body(5000);

    let attempts = (0..20).map(|i| {
        let base = if i % 2 == 0 { &a.url } else { &b.url };
        charge_until_final(&http, base, &secret, "one-key", &body)
    });
    let replies = futures_util::future::join_all(attempts).await;
    for reply in &replies {
        assert_eq!(reply.status, 201);
        assert_eq!(reply.body, replies[0].body);
    }
    let charges: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(charges, 1);
    let payments = psp_payments(&psp).await;
    assert_eq!(payments.len(), 1, "{payments:?}");
    assert_eq!(
        payments[0]["requests"], 1,
        "only the winner called the processor"
    );
}
