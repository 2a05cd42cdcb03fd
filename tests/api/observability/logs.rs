//! Logs: every line about a request carries its request id, statements run
//! in spans at debug level, and no secret reaches a log.

use std::time::{Duration, Instant};

use crate::helpers::charge_body;
use crate::processes::{start_service, Database};

/// The fields of the `request` span a JSON log line was written in.
fn request_span(line: &str) -> serde_json::Value {
    let parsed: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
    parsed["spans"]
        .as_array()
        .and_then(|spans| spans.iter().find(|span| span["name"] == "request"))
        .cloned()
        .unwrap_or_else(|| panic!("no request span: {line}"))
}

/// A charge whose processor outcome is unknown: every log line written
/// while it is served, including the processor call's and the outcome's
/// deep in the charge flow, carries the request id the client sent and the
/// route, as does any later line about the charge its request id; the
/// access-log line also carries the merchant, the charge and what the key
/// led to.
#[tokio::test]
async fn every_log_line_about_a_request_carries_its_request_id() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let service = start_service(
        &db.url,
        &[
            ("CHARGEONCE__LOG__FORMAT", "json".to_owned()),
            ("RUST_LOG", "info".to_owned()),
            // The recovery worker, the only other one with something to say
            // about a pending charge, stays away: every line written while
            // the request is served is the request's.
            ("CHARGEONCE__RECOVERY__INTERVAL_MS", "600000".to_owned()),
        ],
    )
    .await;
    // The start-up lines and the readiness probes' requests come before:
    // the probe that found the service ready has been logged (a request's
    // access line is written before its answer is sent).
    let started = Instant::now();
    let earlier = loop {
        let log = service.log();
        if log
            .iter()
            .any(|line| line.contains("\"route\":\"/readyz\"") && line.contains("\"status\":200"))
        {
            break log.len();
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{log:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let reply = reqwest::Client::new()
        .post(format!("{}/v1/charges", service.url))
        .bearer_auth(&secret)
        .header("Idempotency-Key", "traced")
        .header("X-Request-Id", "req-trace-42")
        .header("Content-Type", "application/json")
        .body(charge_body(1009))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 202);
    assert_eq!(
        reply
            .headers()
            .get("x-request-id")
            .unwrap()
            .to_str()
            .unwrap(),
        "req-trace-42"
    );
    let charge: serde_json::Value = reply.json().await.unwrap();
    let id = charge["id"].as_str().unwrap().to_owned();

    // Every line since, up to the request's access line.
    let is_access = |line: &String| line.contains("\"message\":\"request\"");
    let started = Instant::now();
    let lines = loop {
        let lines = service.log().split_off(earlier);
        if let Some(end) = lines.iter().position(is_access) {
            break lines[..=end].to_vec();
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{lines:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(lines.len() >= 2, "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|line| line.contains("processor outcome unknown")),
        "the unknown outcome, deep in the charge flow, is among them: {lines:#?}"
    );
    for line in &lines {
        let request = request_span(line);
        assert_eq!(request["request_id"], "req-trace-42", "{line}");
        assert_eq!(request["route"], "/v1/charges", "{line}");
    }
    let access = lines.last().unwrap();
    for field in [
        "\"route\":\"/v1/charges\"",
        "\"merchant\":\"mer_",
        &format!("\"id\":\"{id}\""),
        "\"idempotency\":\"created\"",
        "\"status\":202",
    ] {
        assert!(access.contains(field), "{field} missing: {access}");
    }
    // Nothing written about the charge afterwards goes without its request.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for line in service.log().split_off(earlier + lines.len()) {
        if line.contains(&id) {
            assert_eq!(request_span(&line)["request_id"], "req-trace-42", "{line}");
        }
    }

    // An unacceptable request id is replaced, not logged as sent.
    let replaced = reqwest::Client::new()
        .get(format!("{}/healthz", service.url))
        .header("X-Request-Id", "bad id with spaces")
        .send()
        .await
        .unwrap();
    let echoed = replaced
        .headers()
        .get("x-request-id")
        .unwrap()
        .to_str()
        .unwrap();
    assert_ne!(echoed, "bad id with spaces");
    assert_eq!(echoed.len(), 32);
}

/// A refund's access line names the refund (`re_…`), as a charge's names
/// the charge.
#[tokio::test]
async fn a_refunds_access_line_carries_the_refund_id() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let service = start_service(
        &db.url,
        &[
            ("CHARGEONCE__LOG__FORMAT", "json".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let post = |path: String, key: &'static str, body: String| {
        http.post(format!("{}{path}", service.url))
            .bearer_auth(&secret)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let charge = post("/v1/charges".into(), "c", charge_body(1000))
        .await
        .unwrap();
    assert_eq!(charge.status(), 201);
    let charge: serde_json::Value = charge.json().await.unwrap();
    let path = format!("/v1/charges/{}/refunds", charge["id"].as_str().unwrap());
    let refund = post(path, "r", r#"{"amount":400}"#.into()).await.unwrap();
    assert_eq!(refund.status(), 201);
    let refund: serde_json::Value = refund.json().await.unwrap();
    let id = refund["id"].as_str().unwrap();
    assert!(id.starts_with("re_"), "{refund}");

    let access = service
        .wait_for_line(Duration::from_secs(5), |line| {
            line.contains("\"message\":\"request\"")
                && line.contains("/refunds")
                && line.contains("\"status\":201")
        })
        .await;
    assert!(access.contains(&format!("\"id\":\"{id}\"")), "{access}");
    assert!(access.contains("\"idempotency\":\"created\""), "{access}");
}

/// With `chargeonce::db` at debug, every statement runs in a `db` span
/// named after it and ends with a `statement` line (outcome, elapsed time):
/// a statement of a request under the request's span, a batched one (its
/// own task, for many requests) on its own. At the default level, none.
#[tokio::test]
async fn database_statements_run_in_spans_at_debug_level() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let service = start_service(
        &db.url,
        &[
            ("CHARGEONCE__LOG__FORMAT", "json".to_owned()),
            ("RUST_LOG", "info,chargeonce::db=debug".to_owned()),
        ],
    )
    .await;
    let reply = reqwest::Client::new()
        .post(format!("{}/v1/charges", service.url))
        .bearer_auth(&secret)
        .header("Idempotency-Key", "spanned")
        .header("X-Request-Id", "req-db-7")
        .header("Content-Type", "application/json")
        .body(charge_body(100))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 201);
    let started = Instant::now();
    let statements: Vec<serde_json::Value> = loop {
        let log = service.log();
        if log
            .iter()
            .any(|line| line.contains("\"message\":\"request\"") && line.contains("req-db-7"))
        {
            break log
                .iter()
                .filter(|line| line.contains("\"message\":\"statement\""))
                .map(|line| serde_json::from_str(line).expect("a JSON line"))
                .collect();
        }
        assert!(started.elapsed() < Duration::from_secs(5), "{log:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let span = |line: &serde_json::Value, name: &str| {
        line["spans"]
            .as_array()
            .and_then(|spans| spans.iter().find(|span| span["name"] == name))
            .cloned()
    };
    let of = |statement: &str| {
        statements
            .iter()
            .find(|line| {
                span(line, "db").is_some_and(|db| db["statement"] == statement)
                    && span(line, "request").is_some_and(|r| r["request_id"] == "req-db-7")
            })
            .unwrap_or_else(|| panic!("no line of {statement}: {statements:#?}"))
    };
    // The API key's lookup, in the request.
    let lookup = of("merchants::FIND_BY_DIGEST");
    assert_eq!(lookup["level"], "DEBUG");
    assert_eq!(lookup["fields"]["outcome"], "ok");
    assert!(lookup["fields"]["elapsed_ms"].is_number(), "{lookup}");
    assert_eq!(span(lookup, "request").unwrap()["route"], "/v1/charges");
    // The insert, through the batcher (a charge alone).
    assert!(
        statements
            .iter()
            .any(|line| span(line, "db").is_some_and(|db| db["statement"]
                .as_str()
                .is_some_and(|name| name == "charges::INSERT_OR_FIND"))),
        "{statements:#?}"
    );

    // At the default level: no statement lines.
    let quiet = start_service(
        &db.url,
        &[
            ("CHARGEONCE__LOG__FORMAT", "json".to_owned()),
            ("RUST_LOG", "info".to_owned()),
        ],
    )
    .await;
    let reply = reqwest::Client::new()
        .get(format!("{}/v1/charges", quiet.url))
        .bearer_auth(&secret)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let log = quiet.log();
    assert!(log
        .iter()
        .any(|line| line.contains("\"message\":\"request\"")));
    assert!(
        !log.iter().any(|line| line.contains("\"name\":\"db\"")),
        "{log:#?}"
    );
}

/// Secrets never reach a log: the API key (valid or not), the database
/// password, at every level the service logs by default and at debug.
#[tokio::test]
async fn secrets_never_appear_in_logs() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    // Trust authentication ignores the password; the service still holds it.
    let mut with_password = url::Url::parse(&db.url).unwrap();
    with_password
        .set_password(Some("hunter2-db-password"))
        .unwrap();
    let service = start_service(
        with_password.as_str(),
        &[
            ("RUST_LOG", "debug".to_owned()),
            ("CHARGEONCE__LOG__FORMAT", "json".to_owned()),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    for key in [secret.as_str(), "sk_wrong_secret_value"] {
        let _ = http
            .post(format!("{}/v1/charges", service.url))
            .bearer_auth(key)
            .header("Idempotency-Key", "s")
            .header("Content-Type", "application/json")
            .body(charge_body(1009))
            .send()
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = service.log().join("\n");
    assert!(log.contains("request"), "the log was captured");
    for leaked in [
        secret.as_str(),
        "sk_wrong_secret_value",
        "hunter2-db-password",
    ] {
        assert!(!log.contains(leaked), "{leaked} appears in the log");
    }
}
