//! Metrics: every family moves when its event happens, the webhook backlog
//! is exact on a process of its own, methods cannot grow the series, and the
//! metrics listener can be moved or turned off.

use std::time::{Duration, Instant};

use super::{sample, scrape};
use crate::helpers::{charge_body, spawn_app_with};
use crate::processes::{start_service, Database};
use crate::webhook_receiver::{create_endpoint, Answer, Receiver};

/// Each family moves when its event happens. The recorder is shared by
/// every app in this test binary, so only increases are asserted.
#[tokio::test]
async fn every_metric_family_moves_when_its_event_happens() {
    let app = spawn_app_with(|s| {
        // The processor slow enough that a duplicate sent 20 ms after the
        // first request finds it in flight even on a loaded machine (at 50
        // ms, the first had often finished: a replay, not in_use), and the
        // lease well beyond it.
        s.idempotency.lease = Duration::from_millis(1000);
        s.idempotency.in_flight_wait = Duration::from_millis(10);
        s.processor.latency = Duration::from_millis(200);
        s.recovery.interval = Duration::from_millis(100);
        s.idempotency.sweep_interval = Duration::from_millis(100);
    })
    .await;
    let before = scrape(&app).await;

    let charge = app.succeeded_charge("m-1", 1000).await;
    app.post_charge("m-1", &charge_body(1000)).await; // replayed
    app.post_charge("m-1", &charge_body(1001)).await; // reused_mismatch
    app.post_charge("m-2", &charge_body(1002)).await; // declined
    app.post_charge("m-3", &charge_body(1009)).await; // unknown
    app.post_charge_raw(
        &[
            ("Authorization", &format!("Bearer {}", app.api_key)),
            ("Content-Type", "application/json"),
        ],
        charge_body(1).into_bytes(),
    )
    .await; // key_missing
    app.post_charge("bad key", &charge_body(1)).await; // key_invalid
    let body = charge_body(1000);
    let (first, second) = tokio::join!(app.post_charge("m-4", &body), async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        app.post_charge("m-4", &body).await
    });
    // One creates, the other finds it in flight (in_use); on a loaded
    // machine the second may be the one that gets to the database first.
    let mut statuses = [first.status.as_u16(), second.status.as_u16()];
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 409], "{} / {}", first.body, second.body);
    app.post_refund(&charge, "m-r", r#"{"amount":10}"#).await;
    app.get_as("sk_unknown", "/v1/charges").await; // miss
    app.get_as("sk_unknown", "/v1/charges").await; // negative hit
                                                   // An old key for the sweeper; a pending charge whose owner died (its
                                                   // lease ran out, the worker's turn is an hour away) for a takeover; the
                                                   // unknown outcome above is the recovery worker's.
    let sql = app.sql().await;
    sql.execute(
        "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                              amount, currency, status) \
         SELECT '00000001-0000-7000-8000-000000000000', id, 'ancient', sha256('x'), 1, 'USD', \
                'succeeded' FROM merchants",
        &[],
    )
    .await
    .unwrap();
    sql.execute(
        "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                              amount, currency, status, locked_until, next_attempt_at) \
         SELECT $1, id, 'orphan', sha256(convert_to($2, 'UTF8')), 1000, 'USD', 'pending', \
                now() - interval '1 second', now() + interval '1 hour' FROM merchants",
        &[&uuid::Uuid::now_v7(), &charge_body(1000)],
    )
    .await
    .unwrap();
    let taken = app.post_charge("orphan", &charge_body(1000)).await;
    assert_eq!(taken.status, 201, "{}", taken.body);
    let busy = busy_pools_and_a_waiting_duplicate().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = scrape(&app).await;

    let moved = |family: &str, labels: &[(&str, &str)]| {
        let (b, a) = (
            sample(&before, family, labels),
            sample(&after, family, labels),
        );
        assert!(a > b, "{family} {labels:?} did not move ({b} -> {a})");
    };
    moved(
        "chargeonce_http_requests_total",
        &[
            ("route", "/v1/charges"),
            ("method", "POST"),
            ("status", "201"),
        ],
    );
    moved(
        "chargeonce_http_request_duration_seconds_count",
        &[
            ("route", "/v1/charges/{id}/refunds"),
            ("method", "POST"),
            ("status", "201"),
        ],
    );
    for outcome in [
        "created",
        "replayed",
        "in_use",
        "in_flight_waited",
        "reused_mismatch",
        "key_missing",
        "key_invalid",
        "taken_over",
    ] {
        moved(
            "chargeonce_idempotency_outcomes_total",
            &[("kind", "charge"), ("outcome", outcome)],
        );
    }
    moved(
        "chargeonce_idempotency_outcomes_total",
        &[("kind", "refund"), ("outcome", "created")],
    );
    for outcome in ["succeeded", "declined", "unknown"] {
        moved(
            "chargeonce_processor_calls_total",
            &[("operation", "charge"), ("outcome", outcome)],
        );
    }
    moved(
        "chargeonce_processor_call_duration_seconds_count",
        &[("operation", "refund")],
    );
    // Batch sizes by statement (every statement goes through a batcher, a
    // request alone as a batch of one).
    for statement in [
        "charges.insert_or_find",
        "charges.record_outcomes",
        "refunds.record_outcome",
    ] {
        moved(
            "chargeonce_db_batch_rows_count",
            &[("statement", statement)],
        );
    }
    moved("chargeonce_lease_takeovers_total", &[("kind", "charge")]);
    moved("chargeonce_recovery_claims_total", &[("kind", "charge")]);
    moved("chargeonce_keys_released_total", &[]);
    for result in ["hit", "miss", "negative_hit"] {
        moved("chargeonce_api_key_cache_total", &[("result", result)]);
    }
    // Pool gauges, one series per pool; while busy, connections in use
    // and requests waiting for one.
    for (family, pool) in [
        ("chargeonce_db_pool_connections", "worker-0"),
        ("chargeonce_db_pool_in_use", "worker-0"),
        ("chargeonce_db_pool_waiters", "worker-0"),
        ("chargeonce_db_pool_in_use", "background"),
    ] {
        let value = sample(&busy, family, &[("pool", pool)]);
        assert!(value >= 1.0, "{family} {pool}: {value} while busy");
    }
    for family in [
        "chargeonce_db_pool_connections",
        "chargeonce_db_pool_in_use",
        "chargeonce_db_pool_waiters",
        "chargeonce_db_pool_max_size",
    ] {
        assert!(
            after.contains(&format!("{family}{{pool=\"background\"}}")),
            "{family}"
        );
        assert!(
            after.contains(&format!("{family}{{pool=\"worker-")),
            "{family}"
        );
    }
    assert!(after.contains("# HELP chargeonce_idempotency_outcomes_total"));
}

/// An app of its own, one HTTP worker whose pool has one connection, and a
/// slow processor: a duplicate sent while the first request is at the processor
/// waits for its answer (`in_flight_waited`); then, with the charges table
/// locked, one listing holds the worker's connection while a second waits
/// for it and the recovery worker's claim holds a background connection.
/// The scrape that saw all of it.
async fn busy_pools_and_a_waiting_duplicate() -> String {
    let app = spawn_app_with(|s| {
        s.server.workers = 1;
        s.database.pool_size = 1;
        s.database.connect_timeout = Duration::from_secs(10);
        s.database.query_timeout = Duration::from_secs(10);
        s.idempotency.in_flight_wait = Duration::from_secs(10);
        s.processor.latency = Duration::from_millis(500);
        s.recovery.interval = Duration::from_millis(50);
    })
    .await;
    let body = charge_body(700);
    let (first, second) = tokio::join!(app.post_charge("w-1", &body), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        app.post_charge("w-1", &body).await
    });
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(second.status, 201, "{}", second.body);
    assert_eq!(first.json()["id"], second.json()["id"]);
    let replayed = [&first, &second].map(|r| r.header("idempotent-replayed") == Some("true"));
    assert_eq!(replayed.iter().filter(|r| **r).count(), 1, "{replayed:?}");

    let locker = app.sql().await;
    locker
        .batch_execute("BEGIN; LOCK TABLE charges IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let listings = [0, 1].map(|_| {
        let http = app.http.clone();
        let url = format!("{}/v1/charges", app.address);
        let key = app.api_key.clone();
        tokio::spawn(async move { http.get(url).bearer_auth(key).send().await })
    });
    let seen = wait_for_metrics(&app.address, "busy pools", "chargeonce_db_pool", |text| {
        let at_least_one =
            |family: &str, pool: &str| sample(text, family, &[("pool", pool)]) >= 1.0;
        at_least_one("chargeonce_db_pool_in_use", "worker-0")
            && at_least_one("chargeonce_db_pool_waiters", "worker-0")
            && at_least_one("chargeonce_db_pool_in_use", "background")
    })
    .await;
    locker.batch_execute("ROLLBACK").await.unwrap();
    for listing in listings {
        let reply = listing.await.unwrap().unwrap();
        assert_eq!(reply.status(), 200);
    }
    seen
}

/// The value of the unlabelled series `family` of a real service, if it has
/// one yet.
fn gauge(text: &str, family: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(family)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes the service at `base_url` until `done` holds for its metrics; the
/// last scrape. On timeout it shows the series whose names start with
/// `family_prefix`.
async fn wait_for_metrics(
    base_url: &str,
    what: &str,
    family_prefix: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let started = Instant::now();
    loop {
        let text = reqwest::get(format!("{base_url}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if done(&text) {
            return text;
        }
        let family: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(family_prefix))
            .collect();
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "waited for {what}:\n{}",
            family.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const UNDISPATCHED: &str = "chargeonce_webhook_undispatched_events";
const PENDING: &str = "chargeonce_webhook_pending_deliveries";
const OLDEST: &str = "chargeonce_webhook_oldest_undelivered_age_seconds";
const ATTEMPTS: &str = "chargeonce_webhook_attempts_total";

/// The webhook families, on real processes (each has a recorder of its own,
/// so the values are exact): the backlog while the dispatcher is held back
/// and while a delivery is pending, back to 0 once everything is delivered
/// or given up; attempts by outcome, their latency, deliveries given up.
#[tokio::test]
async fn webhook_metrics_follow_the_backlog_and_every_attempt() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    // Each request held 1.5 s, so a pending delivery outlasts a measurement
    // (every second); the first answer a failure, then success.
    receiver.delay(Duration::from_millis(1500));
    receiver.script([Answer::Status(500)]);
    let types = Some(&["charge.succeeded"][..]);

    // Held back: the dispatcher's first round is an hour away. The backlog
    // is measured all the same.
    let held = start_service(
        &db.url,
        &[("CHARGEONCE__WEBHOOKS__INTERVAL_MS", "3600000".to_owned())],
    )
    .await;
    create_endpoint(&held.url, &secret, &receiver.url, types).await;
    // Nothing listens there: every attempt fails to connect.
    create_endpoint(&held.url, &secret, "http://127.0.0.1:9/hooks", types).await;
    let charge = reqwest::Client::new()
        .post(format!("{}/v1/charges", held.url))
        .bearer_auth(&secret)
        .header("Idempotency-Key", "metered")
        .header("Content-Type", "application/json")
        .body(charge_body(100))
        .send()
        .await
        .unwrap();
    assert_eq!(charge.status(), 201);
    let text = wait_for_metrics(
        &held.url,
        "an undispatched event",
        "chargeonce_webhook",
        |text| gauge(text, UNDISPATCHED) >= Some(1.0) && gauge(text, OLDEST) > Some(0.0),
    )
    .await;
    assert_eq!(gauge(&text, PENDING), Some(0.0));
    assert_eq!(sample(&text, ATTEMPTS, &[]), 0.0);
    drop(held);

    // Let go: two attempts to the receiver (500, then 200), three failed
    // connections to the other endpoint, which is then given up.
    let service = start_service(
        &db.url,
        &[
            ("CHARGEONCE__WEBHOOKS__INTERVAL_MS", "20".to_owned()),
            ("CHARGEONCE__WEBHOOKS__TIMEOUT_MS", "3000".to_owned()),
            ("CHARGEONCE__WEBHOOKS__MAX_ATTEMPTS", "3".to_owned()),
            ("CHARGEONCE__WEBHOOKS__BACKOFF_BASE_MS", "100".to_owned()),
            ("CHARGEONCE__WEBHOOKS__MAX_BACKOFF_MS", "200".to_owned()),
        ],
    )
    .await;
    wait_for_metrics(
        &service.url,
        "a pending delivery",
        "chargeonce_webhook",
        |text| gauge(text, PENDING) >= Some(1.0) && gauge(text, UNDISPATCHED) == Some(0.0),
    )
    .await;
    let text = wait_for_metrics(
        &service.url,
        "an empty backlog",
        "chargeonce_webhook",
        |text| {
            sample(text, ATTEMPTS, &[("outcome", "delivered")]) >= 1.0
                && sample(text, "chargeonce_webhook_deliveries_failed_total", &[]) >= 1.0
                && [UNDISPATCHED, PENDING, OLDEST]
                    .iter()
                    .all(|family| gauge(text, family) == Some(0.0))
        },
    )
    .await;
    for (outcome, attempts) in [
        ("delivered", 1.0),
        ("failed_status", 1.0),
        ("failed_connect", 3.0),
        ("timeout", 0.0),
    ] {
        assert_eq!(
            sample(&text, ATTEMPTS, &[("outcome", outcome)]),
            attempts,
            "{outcome}"
        );
    }
    assert_eq!(
        sample(
            &text,
            "chargeonce_webhook_attempt_duration_seconds_count",
            &[]
        ),
        5.0
    );
    assert_eq!(
        sample(
            &text,
            "chargeonce_webhook_deliveries_failed_total",
            &[("reason", "max_attempts")]
        ),
        1.0
    );
    for family in [UNDISPATCHED, PENDING, OLDEST, ATTEMPTS] {
        assert!(text.contains(&format!("# HELP {family}")), "{family}");
    }
    assert_eq!(receiver.received().len(), 2);
}

/// `metrics.port`: a listener of its own, and none on the API's port.
/// A client may send any token as the method. Each one a label value of
/// its own would be a new series (a histogram of 14 buckets among them)
/// kept for the life of the process: memory that any client could grow
/// without bound. Methods outside the standard ones count as `OTHER`.
#[tokio::test]
async fn made_up_methods_do_not_make_new_series() {
    let app = spawn_app_with(|_| {}).await;
    let before = scrape(&app).await;
    let other = [
        ("route", "/v1/charges"),
        ("method", "OTHER"),
        ("status", "405"),
    ];
    let made_up: Vec<String> = (0..3)
        .map(|n| format!("MADEUP{}X{n}", uuid::Uuid::new_v4().simple()))
        .collect();
    for method in &made_up {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let reply = app
            .http
            .request(method, format!("{}/v1/charges", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 405);
    }
    let after = scrape(&app).await;
    for method in &made_up {
        assert!(!after.contains(method.as_str()), "a series for {method}");
    }
    // Other tests in this process share the recorder: at least ours.
    assert!(
        sample(&after, "chargeonce_http_requests_total", &other)
            - sample(&before, "chargeonce_http_requests_total", &other)
            >= 3.0
    );
}

#[tokio::test]
async fn metrics_can_have_a_port_of_their_own_or_none() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let app = spawn_app_with(|s| s.metrics.port = port).await;
    app.get("/metrics").await.assert_problem(404, "not_found");
    let own = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .unwrap();
    assert_eq!(own.status(), 200);
    assert!(own.text().await.unwrap().contains("chargeonce_"));

    let off = spawn_app_with(|s| s.metrics.enabled = false).await;
    off.get("/metrics").await.assert_problem(404, "not_found");
}
