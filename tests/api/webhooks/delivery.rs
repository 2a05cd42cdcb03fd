//! Deliveries: they follow the endpoints' event types, stop when an
//! endpoint is deleted, are retried after a failure, never hold up charges
//! while a receiver hangs, never reach a private target under the
//! production configuration, and are recorded once the database is back.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chargeonce::config::ProcessorKind;
use serde_json::{json, Value};
use uuid::Uuid;

use super::{fast, newest_event, production_settings, wait_for_deliveries};
use crate::helpers::{charge_body, spawn_app, spawn_app_with};
use crate::webhook_receiver::{create_endpoint, delete_endpoint, post_endpoint, Answer, Receiver};

#[tokio::test]
async fn deliveries_follow_event_types_and_stop_when_the_endpoint_is_deleted() {
    let app = spawn_app_with(fast).await;
    let (all, failed_only, deleted) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let to_all = create_endpoint(&app.address, &app.api_key, &all.url, None).await;
    create_endpoint(
        &app.address,
        &app.api_key,
        &failed_only.url,
        Some(&["charge.failed"]),
    )
    .await;
    let gone = create_endpoint(&app.address, &app.api_key, &deleted.url, None).await;
    let gone_id = gone["id"].as_str().unwrap();
    let (status, answer) = delete_endpoint(&app.address, &app.api_key, gone_id).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], gone["id"]);
    assert_eq!(
        (&answer["deleted"], &answer["enabled"]),
        (&json!(true), &json!(false))
    );
    assert!(answer.get("secret").is_none(), "{answer}");
    // Deleting again: 404, as for any endpoint that does not exist; and
    // nobody deletes another merchant's endpoint.
    let (status, _) = delete_endpoint(&app.address, &app.api_key, gone_id).await;
    assert_eq!(status, 404);
    let other = app.create_merchant("Other").await;
    let (status, _) = delete_endpoint(&app.address, &other, to_all["id"].as_str().unwrap()).await;
    assert_eq!(status, 404);
    let (status, _) = delete_endpoint(&app.address, &app.api_key, "we_nope").await;
    assert_eq!(status, 404);

    assert_eq!(app.post_charge("ok", &charge_body(100)).await.status, 201);
    assert_eq!(app.post_charge("no", &charge_body(102)).await.status, 402);
    all.wait_until("both events", Duration::from_secs(10), |r| r.len() >= 2)
        .await;
    failed_only
        .wait_until("the failed charge's event", Duration::from_secs(10), |r| {
            !r.is_empty()
        })
        .await;
    // Time for anything that should not come to come.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let types = |r: &Receiver| -> Vec<String> {
        r.received()
            .iter()
            .map(|r| r.json()["type"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut to_all_types = types(&all);
    to_all_types.sort();
    assert_eq!(to_all_types, ["charge.failed", "charge.succeeded"]);
    assert_eq!(types(&failed_only), ["charge.failed"]);
    assert!(deleted.received().is_empty());

    // The failed charge's event went to two endpoints, once each.
    let failed_event = newest_event(&app).await;
    assert_eq!(failed_event["type"], "charge.failed");
    let deliveries = wait_for_deliveries(
        &app,
        failed_event["id"].as_str().unwrap(),
        "two delivered",
        |d| d.len() == 2 && d.iter().all(|d| d["status"] == "delivered"),
    )
    .await;
    let urls: HashSet<&str> = deliveries
        .iter()
        .map(|d| d["url"].as_str().unwrap())
        .collect();
    assert_eq!(
        urls,
        HashSet::from([all.url.as_str(), failed_only.url.as_str()])
    );

    // An endpoint deleted while its delivery waits for a retry: the
    // delivery is given up, and no attempt starts after the deletion.
    let flaky = Receiver::start().await;
    flaky.otherwise(Answer::Status(503));
    let flaky_endpoint = create_endpoint(&app.address, &app.api_key, &flaky.url, None).await;
    assert_eq!(
        app.post_charge("third", &charge_body(300)).await.status,
        201
    );
    flaky
        .wait_until("two failed attempts", Duration::from_secs(10), |r| {
            r.len() >= 2
        })
        .await;
    let given_up_total = |text: &str| {
        crate::observability::sample(
            text,
            "chargeonce_webhook_deliveries_failed_total",
            &[("reason", "endpoint_deleted")],
        )
    };
    let given_up_before = given_up_total(&crate::observability::scrape(&app).await);
    let (status, _) = delete_endpoint(
        &app.address,
        &app.api_key,
        flaky_endpoint["id"].as_str().unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let deleted_at = Instant::now();
    let third = newest_event(&app).await;
    let deliveries = wait_for_deliveries(
        &app,
        third["id"].as_str().unwrap(),
        "the deleted endpoint's delivery to be given up",
        |d| {
            d.iter()
                .any(|d| d["url"] == flaky.url.as_str() && d["status"] == "failed")
        },
    )
    .await;
    let given_up = deliveries
        .iter()
        .find(|d| d["url"] == flaky.url.as_str())
        .unwrap();
    assert_eq!(given_up["last_error"], "the endpoint was deleted");
    assert_eq!(given_up["next_attempt_at"], Value::Null);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One attempt may have been on its way when the endpoint was deleted.
    let late = flaky
        .received()
        .iter()
        .filter(|r| r.at > deleted_at + Duration::from_millis(50))
        .count();
    assert_eq!(late, 0, "attempts after the deletion");
    // Counted (the recorder is shared by the tests of this binary: only
    // the increase is asserted).
    assert!(given_up_total(&crate::observability::scrape(&app).await) >= given_up_before + 1.0);
    // And the dispatcher goes on with the other endpoints.
    let sent = all.received().len();
    assert_eq!(
        app.post_charge("fourth", &charge_body(400)).await.status,
        201
    );
    all.wait_until("the next event", Duration::from_secs(10), |r| {
        r.len() > sent
    })
    .await;
}

/// A receiver that accepts connections and never answers (a hung server):
/// the dispatcher waits `webhooks.timeout_ms` on each attempt, and holds no
/// transaction and no lock meanwhile, so charges are created at their usual
/// pace.
#[tokio::test]
async fn a_hung_receiver_never_blocks_charge_creation() {
    let app = spawn_app_with(|s| {
        fast(s);
        s.webhooks.timeout = Duration::from_secs(30);
    })
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hole = {
        let held = held.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                held.lock().unwrap().push(socket);
            }
        })
    };
    create_endpoint(&app.address, &app.api_key, &url, None).await;
    assert_eq!(
        app.post_charge("first", &charge_body(100)).await.status,
        201
    );
    let started = Instant::now();
    while held.lock().unwrap().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // While an attempt hangs: charges (each with its event) at once, and no
    // session of this database idle in a transaction.
    for n in 0..20 {
        let started = Instant::now();
        let reply = app
            .post_charge(&format!("during-{n}"), &charge_body(100))
            .await;
        assert_eq!(reply.status, 201, "{}", reply.body);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "charge {n} took {:?} while a delivery hung",
            started.elapsed()
        );
    }
    // (A transaction of several statements is idle between its last answer
    // and its COMMIT for a round trip: only one idle for longer is held.)
    let idle_in_transaction = app
        .count(
            "SELECT count(*) FROM pg_stat_activity \
              WHERE datname = current_database() AND state LIKE 'idle in transaction%' \
                AND state_change < now() - interval '500 milliseconds'",
        )
        .await;
    assert_eq!(idle_in_transaction, 0);
    assert!(!held.lock().unwrap().is_empty(), "the attempt still hangs");
    assert_eq!(app.count("SELECT count(*) FROM charges").await, 21);
    hole.abort();
}

#[tokio::test]
async fn a_receiver_failing_twice_gets_the_event_on_the_third_attempt() {
    let app = spawn_app_with(fast).await;
    let receiver = Receiver::start().await;
    receiver.script([Answer::Status(500), Answer::Drop]);
    create_endpoint(&app.address, &app.api_key, &receiver.url, None).await;
    assert_eq!(
        app.post_charge("retry", &charge_body(100)).await.status,
        201
    );

    receiver
        .wait_until("a third attempt", Duration::from_secs(10), |r| r.len() >= 3)
        .await;
    let event = newest_event(&app).await;
    let event_id = event["id"].as_str().unwrap();
    let deliveries = wait_for_deliveries(&app, event_id, "delivered", |d| {
        d.first().is_some_and(|d| d["status"] == "delivered")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let received = receiver.received();
    assert_eq!(
        received.iter().map(|r| r.answer).collect::<Vec<_>>(),
        [Answer::Status(500), Answer::Drop, Answer::Status(200)]
    );
    // Every attempt: the same id and the same body, its own signature time.
    assert!(received.iter().all(|r| r.id == event_id));
    assert!(received.iter().all(|r| r.body == received[0].body));

    assert_eq!(deliveries.len(), 1);
    let delivery = &deliveries[0];
    assert_eq!(delivery["attempts"], 3);
    assert_eq!(delivery["last_status_code"], 200);
    assert_eq!(delivery["last_error"], Value::Null);
    assert_eq!(delivery["next_attempt_at"], Value::Null);
    let log = delivery["attempt_log"].as_array().unwrap();
    assert_eq!(log.len(), 3, "{delivery:#}");
    assert_eq!(
        log.iter().map(|a| a["attempt"].clone()).collect::<Vec<_>>(),
        [json!(1), json!(2), json!(3)]
    );
    assert_eq!(
        (&log[0]["status_code"], &log[0]["error"]),
        (&json!(500), &Value::Null)
    );
    assert_eq!(log[1]["status_code"], Value::Null);
    let dropped = log[1]["error"].as_str().unwrap();
    assert!(
        !dropped.is_empty() && !dropped.contains(&receiver.url),
        "{dropped}"
    );
    assert_eq!(log[2]["status_code"], 200);
    for attempt in log {
        assert!(attempt["duration_ms"].as_i64().unwrap() >= 0);
        assert!(attempt["created_at"].is_string());
    }
}

#[tokio::test]
async fn private_targets_are_refused_under_the_production_configuration() {
    let production = production_settings();
    assert!(!production.webhooks.allow_private_targets);
    let app = spawn_app_with(move |s| {
        let (database, server) = (s.database.clone(), s.server.clone());
        *s = production;
        s.database = database;
        s.server = server;
        // Production's processor is a remote one; a charge needs one here.
        s.processor.kind = ProcessorKind::Simulated;
        fast(s);
    })
    .await;
    let receiver = Receiver::start().await;
    let by_name = receiver.url.replace("127.0.0.1", "localhost");
    for url in [
        receiver.url.as_str(),
        by_name.as_str(),
        "http://10.1.2.3/hooks",
        "https://192.168.0.10/hooks",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/",
        "http://[fe80::1]/",
        "http://[fd00::5]/",
        "http://0.0.0.0:8080/",
        "http://[::ffff:7f00:1]/",
    ] {
        let body = json!({ "url": url }).to_string();
        let (status, _, answer) = post_endpoint(&app.address, &app.api_key, url, &body).await;
        assert_eq!(status, 400, "{url}: {answer}");
        let problem: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], "invalid_request");
        assert_eq!(problem["errors"][0]["field"], "url", "{problem}");
        assert!(
            problem["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("private"),
            "{problem}"
        );
    }
    // Other spellings of a private address are refused before the address
    // is looked at, in any configuration: an endpoint's URL is stored as
    // sent, so one the URL parser would rewrite is refused, saying how it
    // reads (`endpoints::a_url_the_parser_would_repair_is_refused`).
    for (url, reads) in [
        ("http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/"),
        ("http://0x7f000001/", "http://127.0.0.1/"),
    ] {
        let body = json!({ "url": url }).to_string();
        let (status, _, answer) = post_endpoint(&app.address, &app.api_key, url, &body).await;
        assert_eq!(status, 400, "{url}: {answer}");
        let problem: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], "invalid_request");
        assert_eq!(problem["errors"][0]["field"], "url", "{problem}");
        assert!(
            problem["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("reads as {reads}")),
            "{problem}"
        );
    }
    // A public address is fine. (No event of this test is of its type, so
    // nothing is ever sent there.)
    create_endpoint(
        &app.address,
        &app.api_key,
        "http://93.184.216.34/hooks",
        Some(&["refund.failed"]),
    )
    .await;
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 1);

    // At delivery time, too: endpoints stored as if their addresses had
    // been public when they were created.
    let sql = app.sql().await;
    for url in [&receiver.url, &by_name] {
        sql.execute(
            "INSERT INTO webhook_endpoints (id, merchant_id, url, secret, request_fingerprint, \
                                            slot) \
             SELECT $1, id, $2, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', sha256('x'), \
                    (SELECT coalesce(max(slot), 0) + 1 FROM webhook_endpoints) FROM merchants",
            &[&Uuid::now_v7(), url],
        )
        .await
        .unwrap();
    }
    assert_eq!(
        app.post_charge("private", &charge_body(100)).await.status,
        201
    );
    let event = newest_event(&app).await;
    let deliveries = wait_for_deliveries(
        &app,
        event["id"].as_str().unwrap(),
        "attempts at both private targets",
        |d| d.len() == 2 && d.iter().all(|d| d["attempts"].as_i64() >= Some(1)),
    )
    .await;
    for delivery in &deliveries {
        let error = delivery["attempt_log"][0]["error"].as_str().unwrap_or("");
        assert!(error.contains("private"), "{delivery:#}");
        assert_eq!(delivery["attempt_log"][0]["status_code"], Value::Null);
    }
    assert!(receiver.received().is_empty(), "nothing reached it");

    // The development defaults allow them.
    let development = spawn_app().await;
    create_endpoint(
        &development.address,
        &development.api_key,
        &receiver.url,
        None,
    )
    .await;
    create_endpoint(&development.address, &development.api_key, &by_name, None).await;
}

/// The database goes away while a receiver holds a delivery: the attempt's
/// outcome is recorded as soon as the database is back (retried within the
/// delivery's lease), so the delivery is marked delivered at once and never
/// sent again.
#[tokio::test]
async fn an_attempt_is_recorded_once_the_database_is_back() {
    use chargeonce_testkit::{Proxy, ProxyMode};
    use secrecy::ExposeSecret;

    let proxy = Proxy::start(crate::helpers::database_address()).await;
    let app = spawn_app_with(|s| {
        fast(s);
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.connect_timeout = Duration::from_millis(300);
    })
    .await;
    let receiver = Receiver::start().await;
    receiver.delay(Duration::from_millis(800));
    create_endpoint(&app.address, &app.api_key, &receiver.url, None).await;
    assert_eq!(app.post_charge("held", &charge_body(100)).await.status, 201);

    receiver.wait_for_in_flight(Duration::from_secs(10)).await;
    // The receiver answers while the database is cut off.
    proxy.set_mode(ProxyMode::Cut);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.set_mode(ProxyMode::Forward);
    let back = Instant::now();
    // The delivery's lease is the timeout + 5 s = 7 s: recorded well before
    // it runs out, not sent again when it does.
    let sql = app.sql().await;
    loop {
        let row = sql
            .query_one("SELECT status, attempts FROM webhook_deliveries", &[])
            .await
            .unwrap();
        if row.get::<_, String>(0) == "delivered" {
            assert_eq!(row.get::<_, i32>(1), 1);
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(3),
            "not recorded within 3 s of the database coming back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.received().len(), 1);
}
