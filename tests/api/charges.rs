//! The status table of POST /v1/charges, replays, reads and lists.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::helpers::{charge_body, spawn_app, spawn_app_with, TestApp};

#[tokio::test]
async fn a_new_charge_succeeds_with_201_and_the_charge() {
    let app = spawn_app().await;
    let body = r#"{"amount":2500,"currency":"EUR","customer":"cus_42","description":"Order 42","metadata":{"order":"42"}}"#;
    let reply = app.post_charge("order-42", body).await;

    assert_eq!(reply.status, 201, "{}", reply.body);
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.header("idempotent-replayed"), None);
    let charge = reply.json();
    let id = charge["id"].as_str().unwrap();
    assert!(id.starts_with("ch_"), "{id}");
    assert_eq!(
        reply.header("location"),
        Some(format!("/v1/charges/{id}").as_str())
    );
    assert_eq!(charge["object"], "charge");
    assert_eq!(charge["amount"], 2500);
    assert_eq!(charge["currency"], "EUR");
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(charge["customer"], "cus_42");
    assert_eq!(charge["description"], "Order 42");
    assert_eq!(charge["metadata"], json!({"order": "42"}));
    assert_eq!(charge["failure_code"], json!(null));

    // Stored with its key, final, lease released, one outbox event.
    let client = app.sql().await;
    let row = client
        .query_one(
            "SELECT client_idempotency_key, status, locked_until IS NULL, processor_payment_id \
             FROM charges",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "order-42");
    assert_eq!(row.get::<_, String>(1), "succeeded");
    assert!(row.get::<_, bool>(2));
    assert!(row.get::<_, String>(3).starts_with("sim_"));
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'charge.succeeded'")
            .await,
        1
    );
    assert_eq!(app.processor.calls(), 1);
}

#[tokio::test]
async fn a_replay_has_the_same_status_and_the_same_bytes() {
    let app = spawn_app().await;
    let first = app.post_charge("k-1", &charge_body(1000)).await;
    assert_eq!(first.status, 201);

    for _ in 0..3 {
        let replay = app.post_charge("k-1", &charge_body(1000)).await;
        assert_eq!(replay.status, first.status);
        assert_eq!(replay.body, first.body, "replay must be byte-identical");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
        assert_eq!(replay.header("content-type"), first.header("content-type"));
    }
    assert_eq!(app.charge_rows().await, 1);
    assert_eq!(app.processor.calls(), 1);
}

#[tokio::test]
async fn key_order_and_whitespace_do_not_matter_but_values_do() {
    let app = spawn_app().await;
    let first = app
        .post_charge(
            "k",
            r#"{"amount":700,"currency":"USD","metadata":{"a":"1","b":"2"}}"#,
        )
        .await;
    assert_eq!(first.status, 201);

    let reordered = "{\n  \"metadata\" : { \"b\":\"2\",\"a\":\"1\" },\n  \"currency\": \"USD\",\t\"amount\" : 700\n}";
    let replay = app.post_charge("k", reordered).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    for changed in [
        r#"{"amount":701,"currency":"USD","metadata":{"a":"1","b":"2"}}"#,
        r#"{"amount":700,"currency":"EUR","metadata":{"a":"1","b":"2"}}"#,
        r#"{"amount":700,"currency":"USD","metadata":{"a":"1","b":"3"}}"#,
        r#"{"amount":700,"currency":"USD"}"#,
    ] {
        app.post_charge("k", changed)
            .await
            .assert_problem(422, "idempotency_key_reused");
    }
    assert_eq!(app.charge_rows().await, 1);
    assert_eq!(app.processor.calls(), 1);
}

#[tokio::test]
async fn the_quoted_key_form_is_the_same_key() {
    let app = spawn_app().await;
    let first = app.post_charge("\"abc-123\"", &charge_body(900)).await;
    assert_eq!(first.status, 201);
    let replay = app.post_charge("abc-123", &charge_body(900)).await;
    assert_eq!(replay.body, first.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.charge_rows().await, 1);
}

#[tokio::test]
async fn a_decline_is_402_with_its_code_and_replays_as_402() {
    let app = spawn_app().await;
    for (amount, code) in [(1002, "card_declined"), (1005, "insufficient_funds")] {
        let key = format!("decline-{amount}");
        let first = app.post_charge(&key, &charge_body(amount)).await;
        let problem = first.assert_problem(402, code);
        let charge_id = problem["charge_id"].as_str().unwrap();
        assert!(charge_id.starts_with("ch_"));
        assert_eq!(problem["charge"]["id"], charge_id);
        assert_eq!(problem["charge"]["status"], "failed");
        assert_eq!(problem["charge"]["failure_code"], code);

        let replay = app.post_charge(&key, &charge_body(amount)).await;
        assert_eq!(replay.status, 402);
        assert_eq!(replay.body, first.body);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    }
    assert_eq!(
        app.count("SELECT count(*) FROM charges WHERE status = 'failed'")
            .await,
        2
    );
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'charge.failed'")
            .await,
        2
    );
    assert_eq!(app.processor.calls(), 2);
}

#[tokio::test]
async fn an_unknown_outcome_is_202_pending_and_a_retry_finishes_it() {
    let app = spawn_app().await;
    // The simulated processor times out on the first call for amounts ending
    // in 09, after taking the payment.
    let first = app.post_charge("slow", &charge_body(1009)).await;
    assert_eq!(first.status, 202, "{}", first.body);
    let pending = first.json();
    assert_eq!(pending["status"], "pending");
    // Becoming pending is a state change too: one event.
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'charge.pending'")
            .await,
        1
    );

    let retry = app.post_charge("slow", &charge_body(1009)).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(retry.json()["id"], pending["id"]);
    assert_eq!(retry.json()["status"], "succeeded");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));

    let replay = app.post_charge("slow", &charge_body(1009)).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, retry.body);
    assert_eq!(app.count("SELECT count(*) FROM events").await, 2);
    // Two calls with one downstream key: the processor charged once.
    assert_eq!(app.processor.calls(), 2);
    assert_eq!(app.charge_rows().await, 1);
}

/// Sends one charge in the background and returns once its pending row is
/// committed, so the caller's next request finds the key in flight.
async fn start_in_background(
    app: &TestApp,
    key: &str,
) -> tokio::task::JoinHandle<reqwest::Response> {
    let first = {
        let app_address = app.address.clone();
        let api_key = app.api_key.clone();
        let key = key.to_owned();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{app_address}/v1/charges"))
                .bearer_auth(api_key)
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body(r#"{"amount":1000,"currency":"USD"}"#)
                .send()
                .await
                .unwrap()
        })
    };
    let mut waited = Duration::ZERO;
    while app.charge_rows().await == 0 {
        assert!(
            waited < Duration::from_secs(5),
            "first request never inserted"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        waited += Duration::from_millis(5);
    }
    first
}

#[tokio::test]
async fn a_concurrent_duplicate_waits_for_the_first_and_gets_its_answer() {
    let app = spawn_app_with(|s| {
        s.processor.latency = Duration::from_millis(300);
        s.idempotency.in_flight_wait = Duration::from_millis(3000);
    })
    .await;
    let first = start_in_background(&app, "double-click").await;
    let started = Instant::now();
    let second = app.post_charge("double-click", &charge_body(1000)).await;
    assert_eq!(second.status, 201, "{}", second.body);
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(second.header("idempotent-replayed"), Some("true"));
    let first = first.await.unwrap();
    assert_eq!(first.status(), 201);
    assert_eq!(first.text().await.unwrap(), second.body);
    assert_eq!(app.processor.calls(), 1);
}

#[tokio::test]
async fn a_key_still_in_flight_after_the_wait_gets_409_with_retry_after() {
    let app = spawn_app_with(|s| {
        s.processor.latency = Duration::from_millis(1500);
        s.idempotency.in_flight_wait = Duration::from_millis(100);
    })
    .await;
    let first = start_in_background(&app, "busy").await;
    let started = Instant::now();
    let second = app.post_charge("busy", &charge_body(1000)).await;
    second.assert_problem(409, "idempotency_key_in_use");
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "waited first"
    );
    let retry_after: u64 = second.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);

    let first = first.await.unwrap();
    assert_eq!(first.status(), 201);
    let first_body = first.text().await.unwrap();
    let later = app.post_charge("busy", &charge_body(1000)).await;
    assert_eq!(later.status, 201);
    assert_eq!(later.body, first_body);
    assert_eq!(app.processor.calls(), 1);
}

#[tokio::test]
async fn a_charge_can_be_read_back() {
    let app = spawn_app().await;
    let created = app.post_charge("read-me", &charge_body(1234)).await;
    let id = created.json()["id"].as_str().unwrap().to_owned();

    let read = app.get(&format!("/v1/charges/{id}")).await;
    assert_eq!(read.status, 200);
    assert_eq!(read.body, created.body, "GET shows the same charge");

    app.get("/v1/charges/ch_00000000000000000000000000000000")
        .await
        .assert_problem(404, "not_found");
    app.get("/v1/charges/not-an-id")
        .await
        .assert_problem(404, "not_found");
}

#[tokio::test]
async fn charges_are_listed_newest_first_with_a_cursor() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let reply = app
            .post_charge(&format!("list-{i}"), &charge_body(1000 + i * 10))
            .await;
        ids.push(reply.json()["id"].as_str().unwrap().to_owned());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    ids.reverse();

    let page = app.get("/v1/charges?limit=2").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let page = page.json();
    assert_eq!(page["object"], "list");
    assert_eq!(page["has_more"], true);
    let listed: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, &ids[..2]);

    let next = app
        .get(&format!("/v1/charges?limit=2&starting_after={}", ids[1]))
        .await
        .json();
    let listed: Vec<&str> = next["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, &ids[2..4]);

    let last = app
        .get(&format!("/v1/charges?starting_after={}", ids[3]))
        .await
        .json();
    assert_eq!(last["has_more"], false);
    assert_eq!(last["data"].as_array().unwrap().len(), 1);

    let all = app.get("/v1/charges").await.json();
    assert_eq!(all["data"].as_array().unwrap().len(), 5);
    assert_eq!(all["has_more"], false);

    for bad in [
        "limit=0",
        "limit=101",
        "limit=ten",
        "starting_after=nope",
        "colour=red",
    ] {
        app.get(&format!("/v1/charges?{bad}"))
            .await
            .assert_problem(400, "invalid_request");
    }
}

#[tokio::test]
async fn health_readiness_and_unknown_routes() {
    let app = spawn_app().await;
    let health = app.get("/healthz").await;
    assert_eq!(health.status, 200);
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["status"], "ready");
    assert!(ready.header("x-request-id").is_some());

    app.get("/v2/nothing")
        .await
        .assert_problem(404, "not_found");
    let delete = app
        .http
        .delete(format!("{}/v1/charges", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), 405);
}

/// By the time `/readyz` first answers 200, every connection of the worker
/// pools is open and has prepared the service's statements (the start-up's
/// warm-up), so the first requests pay for neither. A backend's last
/// statement (`pg_stat_activity.query`, cut to 1 KB) shows what it prepared.
#[tokio::test]
async fn readiness_comes_once_the_worker_pools_are_open_and_prepared() {
    // Far more than the few connections the background workers and the
    // readiness check open by themselves.
    const POOL_SIZE: usize = 10;
    let mut prepared_statements = true;
    let app = spawn_app_with(|settings| {
        settings.database.pool_size = POOL_SIZE;
        prepared_statements = settings.database.prepared_statements;
    })
    .await;
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    if !prepared_statements {
        // Through PgBouncer (transaction pooling) nothing is prepared, and
        // the backends are PgBouncer's.
        return;
    }
    let rows = app
        .sql()
        .await
        .query(
            "SELECT query FROM pg_stat_activity \
              WHERE datname = current_database() AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    let statements = chargeonce::db::ALL_STATEMENTS;
    let prepared = (rows.iter().map(|row| row.get::<_, String>(0)))
        .filter(|last| !last.is_empty() && statements.iter().any(|s| s.1.sql.starts_with(last)))
        .count();
    assert!(
        prepared >= POOL_SIZE,
        "{prepared} backends prepared the statements"
    );
}

/// `/readyz` is 200 only while the database carries every migration this
/// binary knows: a database one migration behind, or never migrated, is
/// 503, so a load balancer keeps traffic away until `chargeonce migrate`.
#[tokio::test]
async fn readiness_requires_every_migration() {
    let app = spawn_app().await;
    let latest = chargeonce::db::latest_migration();
    let ready = app.get("/readyz").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.json()["migration"], latest);

    let sql = app.sql().await;
    sql.execute(
        "DELETE FROM refinery_schema_history WHERE version = $1",
        &[&i32::try_from(latest).unwrap()],
    )
    .await
    .unwrap();
    app.get("/readyz")
        .await
        .assert_problem(503, "service_unavailable");

    sql.batch_execute("DROP TABLE refinery_schema_history")
        .await
        .unwrap();
    app.get("/readyz")
        .await
        .assert_problem(503, "service_unavailable");
    assert_eq!(app.get("/healthz").await.status, 200, "alive all along");
}

/// Keys stored before fingerprints were taken of the normalised request
/// carry the fingerprint of the raw body (SHA-256 of its canonical JSON); a
/// retry of such a request still replays instead of getting 422.
#[tokio::test]
async fn a_key_stored_with_a_body_fingerprint_still_replays() {
    let app = spawn_app().await;
    let client = app.sql().await;
    client
        .execute(
            "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, status) \
             SELECT $1, id, 'stored-before', sha256(convert_to($2, 'UTF8')), 700, 'USD', 'succeeded' \
               FROM merchants",
            &[
                &uuid::Uuid::now_v7(),
                &r#"{"amount":700,"currency":"USD","metadata":{}}"#,
            ],
        )
        .await
        .unwrap();
    let replay = app
        .post_charge(
            "stored-before",
            r#"{"metadata":{}, "currency":"USD", "amount":700}"#,
        )
        .await;
    assert_eq!(replay.status, 201, "{}", replay.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    app.post_charge("stored-before", r#"{"amount":701,"currency":"USD"}"#)
        .await
        .assert_problem(422, "idempotency_key_reused");
    assert_eq!(app.processor.calls(), 0);
}
