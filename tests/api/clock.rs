//! Every time rule is a rule on the database's clock. Three real instances
//! share one database: one on the machine's time, one whose clock runs 32
//! days ahead and one a day behind (libfaketime, Debian's `faketime`). Keys
//! are neither released nor events deleted early by the instance that
//! thinks a month has passed, ids carry the database's time whichever
//! instance made them, and a retry on any instance replays: no second
//! charge or refund.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

use crate::processes::{start_service, Database, Process};

/// Debian's libfaketime (package `faketime`), as scripts/dev installs it.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// An instance of the binary whose clock is off by `offset` (libfaketime's
/// form: "+32d", "-1d"), or on time; sweeping every 100 ms.
async fn instance(db: &Database, offset: Option<&str>) -> Process {
    let mut env = vec![
        (
            "CHARGEONCE__IDEMPOTENCY__SWEEP_INTERVAL_MS",
            "100".to_owned(),
        ),
        ("CHARGEONCE__EVENTS__SWEEP_INTERVAL_MS", "100".to_owned()),
        ("CHARGEONCE__EVENTS__RETENTION_DAYS", "1".to_owned()),
    ];
    if let Some(offset) = offset {
        env.extend([
            ("LD_PRELOAD", LIBFAKETIME.to_owned()),
            ("FAKETIME", offset.to_owned()),
            // Only the wall clock: timers and timeouts run on the monotonic
            // one, which a constant offset leaves as it is anyway.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
            ("FAKETIME_NO_CACHE", "1".to_owned()),
        ]);
    }
    start_service(&db.url, &env).await
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    secret: &str,
    key: &str,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let reply = http
        .post(url)
        .bearer_auth(secret)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = reply.status().as_u16();
    let replayed = reply
        .headers()
        .get("idempotent-replayed")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, replayed, reply.json().await.unwrap())
}

#[tokio::test]
async fn instances_with_wrong_clocks_keep_every_time_rule_on_the_databases() {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: apt-get install faketime (scripts/dev test installs it)"
    );
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let instances = [
        instance(&db, None).await,
        instance(&db, Some("+32d")).await,
        instance(&db, Some("-1d")).await,
    ];
    let http = reqwest::Client::new();

    // A charge and a refund of it made on each instance.
    let mut made = Vec::new();
    for (n, made_on) in instances.iter().enumerate() {
        let charge_key = format!("charge-{n}");
        let (status, _, charge) = post(
            &http,
            &format!("{}/v1/charges", made_on.url),
            &secret,
            &charge_key,
            &json!({"amount": 1000, "currency": "EUR"}),
        )
        .await;
        assert_eq!(status, 201, "{charge}");
        let charge_id = charge["id"].as_str().unwrap().to_owned();
        let refunds = format!("/v1/charges/{charge_id}/refunds");
        let refund_key = format!("refund-{n}");
        let (status, _, refund) = post(
            &http,
            &format!("{}{refunds}", made_on.url),
            &secret,
            &refund_key,
            &json!({"amount": 100}),
        )
        .await;
        assert_eq!(status, 201, "{refund}");
        made.push((charge_key, charge, refunds, refund_key, refund));
    }

    // Many sweeps of every instance later (every 100 ms each)...
    tokio::time::sleep(Duration::from_secs(2)).await;
    let client = db.client().await;
    let count = |sql: &'static str| {
        let client = &client;
        async move { client.query_one(sql, &[]).await.unwrap().get::<_, i64>(0) }
    };
    assert_eq!(
        count("SELECT count(*) FROM charges WHERE client_idempotency_key IS NULL").await,
        0,
        "a charge's key was released early"
    );
    assert_eq!(
        count("SELECT count(*) FROM refunds WHERE client_idempotency_key IS NULL").await,
        0,
        "a refund's key was released early"
    );
    let events = count("SELECT count(*) FROM events").await;
    assert_eq!(events, 6, "an event was deleted early (or never written)");

    // Every id carries the database's time, whoever made it.
    let off_by: f64 = client
        .query_one(
            "SELECT max(abs(extract(epoch FROM now())::float8 - ( \
                 ('x' || substr(replace(id::text, '-', ''), 1, 12))::bit(48)::bigint / 1000.0)))::float8 \
               FROM (SELECT id FROM charges UNION ALL SELECT id FROM refunds \
                     UNION ALL SELECT id FROM events) AS ids",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(off_by < 60.0, "an id is {off_by} s off the database's time");

    // A retry of each, on every instance, replays.
    for (charge_key, charge, refunds, refund_key, refund) in &made {
        for retried_on in &instances {
            let (status, replayed, again) = post(
                &http,
                &format!("{}/v1/charges", retried_on.url),
                &secret,
                charge_key,
                &json!({"amount": 1000, "currency": "EUR"}),
            )
            .await;
            assert_eq!(
                (status, replayed.as_deref(), &again["id"]),
                (201, Some("true"), &charge["id"])
            );
            let (status, replayed, again) = post(
                &http,
                &format!("{}{refunds}", retried_on.url),
                &secret,
                refund_key,
                &json!({"amount": 100}),
            )
            .await;
            assert_eq!(
                (status, replayed.as_deref(), &again["id"]),
                (201, Some("true"), &refund["id"])
            );
        }
    }
    assert_eq!(count("SELECT count(*) FROM charges").await, 3);
    assert_eq!(count("SELECT count(*) FROM refunds").await, 3);
    assert_eq!(
        count("SELECT sum(amount_refunded)::bigint FROM charges").await,
        300,
        "one refund of 100 per charge"
    );
    assert_eq!(count("SELECT count(*) FROM events").await, events);
}
