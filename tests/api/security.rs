//! The promises of SECURITY.md that no other file of this suite already
//! proves: tenancy swept over every route at once (another merchant's id is
//! answered exactly like an id that never existed, and changes nothing),
//! and no secret in any log line or answer over a whole session of the
//! real binary at the most verbose log level.
//!
//! Proven elsewhere, and named in SECURITY.md: private webhook targets
//! refused under config/production.toml (`webhooks.rs`), the webhook
//! secret left out of the list and delete answers (`webhooks.rs`), unknown
//! and revoked keys (`tenancy.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{charge_body, spawn_app, TestApp};
use crate::processes::{start_service, Database};
use crate::webhook_receiver::{create_endpoint, Receiver};

/// Every row of every table, as text, in a fixed order: what "nothing
/// changed" is checked against.
async fn everything(app: &TestApp) -> BTreeMap<&'static str, Vec<String>> {
    let sql = app.sql().await;
    let mut tables = BTreeMap::new();
    for table in [
        "merchants",
        "api_keys",
        "charges",
        "refunds",
        "events",
        "event_queue",
        "webhook_endpoints",
        "webhook_deliveries",
        "webhook_attempts",
    ] {
        let rows = sql
            .query(
                &format!("SELECT t::text FROM {table} t ORDER BY t::text"),
                &[],
            )
            .await
            .expect(table);
        tables.insert(table, rows.iter().map(|row| row.get(0)).collect());
    }
    tables
}

/// Waits until the dispatcher has fanned out every event, so the only
/// background write that follows a charge is over before a snapshot.
async fn all_events_dispatched(app: &TestApp) {
    let started = Instant::now();
    while app.count("SELECT count(*) FROM event_queue").await > 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "undispatched");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A request as `api_key`: (status, problem code or "", body).
async fn call(
    app: &TestApp,
    api_key: &str,
    method: Method,
    path: &str,
    body: Option<&str>,
) -> (u16, String, String) {
    let mut request = app
        .http
        .request(method, format!("{}{path}", app.address))
        .bearer_auth(api_key);
    if let Some(body) = body {
        request = request
            .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
            .header("Content-Type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.expect("request sent");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let code = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (status, code, text)
}

/// Merchant B, with its own valid key, tries every route on merchant A's
/// charge, refund, event and webhook endpoint. Each answer is the answer
/// for an id that never existed (404 for the routes that exist, the same
/// 405 for methods no route has), no list shows A's objects even with
/// A's ids as cursors, no answer contains any of A's ids, the processor is
/// never called, and not one row of the database changes. A's own view is
/// the same afterwards.
#[tokio::test]
async fn another_merchant_gets_what_an_unknown_id_gets_on_every_route_and_changes_nothing() {
    let app = spawn_app().await;
    let b = app.create_merchant("Merchant B").await;

    // Merchant A: a charge with a refund, so every kind of object exists.
    let charge = app.succeeded_charge("a-charge", 1000).await;
    let refund = app
        .post_refund(&charge, "a-refund", r#"{"amount":100}"#)
        .await;
    assert_eq!(refund.status, 201, "{}", refund.body);
    let refund = refund.json()["id"].as_str().unwrap().to_owned();
    // Of a type no event of this test has: nothing is ever sent to it.
    let endpoint = create_endpoint(
        &app.address,
        &app.api_key,
        "http://127.0.0.1:9/hooks",
        Some(&["refund.failed"]),
    )
    .await;
    let endpoint = endpoint["id"].as_str().unwrap().to_owned();
    let events: Vec<String> = app.get("/v1/events").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(events.len(), 2, "charge.succeeded and refund.succeeded");
    let event = events[0].clone();
    all_events_dispatched(&app).await;

    let a_paths = [
        format!("/v1/charges/{charge}"),
        format!("/v1/charges/{charge}/refunds"),
        format!("/v1/refunds/{refund}"),
        format!("/v1/events/{event}"),
        format!("/v1/events/{event}/deliveries"),
        "/v1/charges".to_owned(),
        "/v1/refunds".to_owned(),
        "/v1/events".to_owned(),
        "/v1/webhook_endpoints".to_owned(),
    ];
    let mut a_view = Vec::new();
    for path in &a_paths {
        let reply = app.get(path).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.body);
        a_view.push(reply.body);
    }
    let before = everything(&app).await;
    let calls_before = app.processor.calls();
    let a_ids = [&charge, &refund, &event, &endpoint];

    // Ids of each kind that name nothing at all.
    let nothing = [
        ("ch_", "ch_0192a0b0c0d07e0f8000000000000000"),
        ("re_", "re_0192a0b0c0d07e0f8000000000000000"),
        ("evt_", "evt_0192a0b0c0d07e0f8000000000000000"),
        ("we_", "we_0192a0b0c0d07e0f8000000000000000"),
    ];
    let unknown = |id: &str| {
        nothing
            .iter()
            .find(|(prefix, _)| id.starts_with(prefix))
            .unwrap()
            .1
    };
    let full_refund = "{}";
    let partial_refund = r#"{"amount":10}"#;
    // Every route of src/http (mod.rs, events.rs, webhook_endpoints.rs)
    // that takes an id, with every method: (method, path template, id,
    // body, the status the route answers for an id that is not yours).
    let mut attempts: Vec<(Method, String, &str, Option<&str>, u16)> = Vec::new();
    for (template, id) in [
        ("/v1/charges/{}", &charge),
        ("/v1/charges/{}/refunds", &charge),
        ("/v1/refunds/{}", &refund),
        ("/v1/events/{}", &event),
        ("/v1/events/{}/deliveries", &event),
        ("/v1/webhook_endpoints/{}", &endpoint),
    ] {
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ] {
            let routed = [
                ("/v1/charges/{}", Method::GET),
                ("/v1/charges/{}/refunds", Method::GET),
                ("/v1/charges/{}/refunds", Method::POST),
                ("/v1/refunds/{}", Method::GET),
                ("/v1/events/{}", Method::GET),
                ("/v1/events/{}/deliveries", Method::GET),
                ("/v1/webhook_endpoints/{}", Method::DELETE),
            ]
            .contains(&(template, method.clone()));
            let expected = if routed { 404 } else { 405 };
            let bodies: &[Option<&str>] = if method == Method::POST && routed {
                &[Some(full_refund), Some(partial_refund)]
            } else if method == Method::POST || method == Method::PUT || method == Method::PATCH {
                &[Some(partial_refund)]
            } else {
                &[None]
            };
            for body in bodies {
                attempts.push((method.clone(), template.to_owned(), id, *body, expected));
            }
        }
    }
    assert_eq!(
        attempts.iter().filter(|a| a.4 == 404).count(),
        8,
        "the routes that take an id: GET x5, POST refund x2, DELETE endpoint"
    );
    for (method, template, id, body, expected) in &attempts {
        let theirs = template.replace("{}", id);
        let (status, code, text) = call(&app, &b, method.clone(), &theirs, *body).await;
        assert_eq!(status, *expected, "{method} {theirs} as B: {text}");
        let never = template.replace("{}", unknown(id));
        let (status_never, code_never, _) = call(&app, &b, method.clone(), &never, *body).await;
        assert_eq!(
            (status, &code),
            (status_never, &code_never),
            "{method} {template}: A's id is told apart from one that never existed"
        );
        for a_id in a_ids {
            assert!(!text.contains(a_id.as_str()), "{method} {theirs}: {text}");
        }
    }

    // The lists: empty for B, even with A's ids as cursors.
    for (path, cursor) in [
        ("/v1/charges", &charge),
        ("/v1/refunds", &refund),
        (&format!("/v1/charges/{charge}/refunds"), &refund),
        ("/v1/events", &event),
        ("/v1/webhook_endpoints", &endpoint),
    ] {
        for query in [String::new(), format!("?starting_after={cursor}")] {
            let (status, _, text) =
                call(&app, &b, Method::GET, &format!("{path}{query}"), None).await;
            if path.starts_with("/v1/charges/") {
                // A charge's refunds: the charge is A's, so 404 as above.
                assert_eq!(status, 404, "{path}{query}: {text}");
                continue;
            }
            assert_eq!(status, 200, "{path}{query}: {text}");
            let page: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(page["data"], json!([]), "{path}{query}: {text}");
            for a_id in a_ids {
                assert!(!text.contains(a_id.as_str()), "{path}{query}: {text}");
            }
        }
    }

    assert_eq!(app.processor.calls(), calls_before, "no processor call");
    assert!(
        everything(&app).await == before,
        "a request of merchant B changed the database"
    );
    for (path, seen) in a_paths.iter().zip(&a_view) {
        assert_eq!(&app.get(path).await.body, seen, "A's {path} changed");
    }
}

/// Every answer of a session: (what, its headers and body as text).
#[derive(Default)]
struct Answers(Vec<(String, String)>);

impl Answers {
    async fn send(&mut self, what: &str, request: reqwest::RequestBuilder) -> (u16, String) {
        let response = request.send().await.expect("request sent");
        let status = response.status().as_u16();
        let headers = format!("{:?}", response.headers());
        let body = response.text().await.expect("body");
        self.0
            .push((format!("{what} ({status})"), format!("{headers}\n{body}")));
        (status, body)
    }
}

/// A whole session against the real binary at the most verbose log level
/// (`RUST_LOG=trace`: every line the service and its libraries write, the
/// database driver's debug lines among them): charges, a replay, a refund, a webhook endpoint (created,
/// replayed, listed, deleted) whose deliveries really go out, events and
/// deliveries read back, and the errors a careless or hostile client
/// causes. Afterwards no log line holds an API key (valid, another
/// merchant's, or a wrong one), the webhook signing secret or the database
/// password; no answer holds an API key; the webhook secret is in the
/// creation answer and its replay and nowhere else (no other answer, no
/// header, no delivered webhook).
#[tokio::test]
async fn no_secret_in_any_log_line_and_the_webhook_secret_only_in_its_creation_answer() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let other = db.create_merchant().await;
    let wrong = "sk_wrong_but_well_formed_0123456789abcdef0123456789ab";
    let mut with_password = url::Url::parse(&db.url).unwrap();
    with_password
        .set_password(Some("hunter2-db-password"))
        .unwrap();
    let service = start_service(
        with_password.as_str(),
        &[
            ("RUST_LOG", "trace".to_owned()),
            ("CHARGEONCE__LOG__FORMAT", "json".to_owned()),
            ("CHARGEONCE__WEBHOOKS__INTERVAL_MS", "50".to_owned()),
        ],
    )
    .await;
    let receiver = Receiver::start().await;
    let http = reqwest::Client::new();
    let mut answers = Answers::default();
    let url = |path: &str| format!("{}{path}", service.url);
    let post = |key: &str, path: &str, idempotency: &str, body: &str| {
        http.post(url(path))
            .bearer_auth(key)
            .header("Idempotency-Key", idempotency)
            .header("Content-Type", "application/json")
            .body(body.to_owned())
    };
    let get = |key: &str, path: &str| http.get(url(path)).bearer_auth(key);

    // The webhook endpoint first, so the charge's events are delivered.
    let endpoint_body = json!({ "url": receiver.url }).to_string();
    let (status, created) = answers
        .send(
            "endpoint created",
            post(&secret, "/v1/webhook_endpoints", "we-1", &endpoint_body),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let created: Value = serde_json::from_str(&created).unwrap();
    let hook_secret = created["secret"].as_str().unwrap().to_owned();
    let hook_key = hook_secret.strip_prefix("whsec_").unwrap().to_owned();
    let endpoint = created["id"].as_str().unwrap().to_owned();
    let (status, _) = answers
        .send(
            "endpoint replayed",
            post(&secret, "/v1/webhook_endpoints", "we-1", &endpoint_body),
        )
        .await;
    assert_eq!(status, 201);

    let (status, charge) = answers
        .send(
            "charge",
            post(&secret, "/v1/charges", "c-1", &charge_body(1000)),
        )
        .await;
    assert_eq!(status, 201, "{charge}");
    let charge = serde_json::from_str::<Value>(&charge).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    answers
        .send(
            "charge replayed",
            post(&secret, "/v1/charges", "c-1", &charge_body(1000)),
        )
        .await;
    answers
        .send(
            "charge declined",
            post(&secret, "/v1/charges", "c-2", &charge_body(1002)),
        )
        .await;
    let (status, refund) = answers
        .send(
            "refund",
            post(
                &secret,
                &format!("/v1/charges/{charge}/refunds"),
                "r-1",
                r#"{"amount":100}"#,
            ),
        )
        .await;
    assert_eq!(status, 201, "{refund}");
    let refund = serde_json::from_str::<Value>(&refund).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Wait for the deliveries, so the signing path has run.
    receiver
        .wait_until(
            "charge.succeeded, charge.failed and refund.succeeded",
            Duration::from_secs(15),
            |r| r.len() >= 3,
        )
        .await;
    let (_, events) = answers.send("events", get(&secret, "/v1/events")).await;
    let events: Value = serde_json::from_str(&events).unwrap();
    let event = events["data"][0]["id"].as_str().unwrap().to_owned();
    for path in [
        format!("/v1/charges/{charge}"),
        "/v1/charges".to_owned(),
        format!("/v1/charges/{charge}/refunds"),
        format!("/v1/refunds/{refund}"),
        "/v1/refunds".to_owned(),
        format!("/v1/events/{event}"),
        format!("/v1/events/{event}/deliveries"),
        "/v1/webhook_endpoints".to_owned(),
    ] {
        let (status, body) = answers.send(&path, get(&secret, &path)).await;
        assert_eq!(status, 200, "{path}: {body}");
    }

    // What careless or hostile clients cause.
    for (what, request) in [
        ("wrong key", get(wrong, "/v1/charges")),
        ("wrong key again", get(wrong, "/v1/charges")),
        (
            "wrong key on a write",
            post(wrong, "/v1/charges", "x-1", &charge_body(500)),
        ),
        (
            "key as another scheme",
            http.get(url("/v1/charges"))
                .header("Authorization", format!("Basic {secret}")),
        ),
        (
            "key twice",
            http.get(url("/v1/charges"))
                .header("Authorization", format!("Bearer {secret}"))
                .header("Authorization", format!("Bearer {other}")),
        ),
        (
            "key in the path",
            get(&secret, &format!("/v1/charges/{secret}")),
        ),
        (
            "key in the query",
            get(&secret, &format!("/v1/charges?starting_after={secret}")),
        ),
        (
            "key reused with another body",
            post(&secret, "/v1/charges", "c-1", &charge_body(999)),
        ),
        (
            "endpoint key reused with another body",
            post(
                &secret,
                "/v1/webhook_endpoints",
                "we-1",
                r#"{"url":"http://127.0.0.1:9/"}"#,
            ),
        ),
        (
            "secret in an endpoint body",
            post(
                &secret,
                "/v1/webhook_endpoints",
                "we-2",
                &json!({ "url": receiver.url, "secret": hook_secret }).to_string(),
            ),
        ),
        (
            "invalid body",
            post(&secret, "/v1/charges", "x-2", r#"{"amount":"ten"}"#),
        ),
        (
            "another merchant's charge",
            get(&other, &format!("/v1/charges/{charge}")),
        ),
        (
            "another merchant's endpoint",
            http.delete(url(&format!("/v1/webhook_endpoints/{endpoint}")))
                .bearer_auth(&other),
        ),
        (
            "no route for this method",
            http.put(url(&format!("/v1/charges/{charge}")))
                .bearer_auth(&secret),
        ),
        (
            "endpoint deleted",
            http.delete(url(&format!("/v1/webhook_endpoints/{endpoint}")))
                .bearer_auth(&secret),
        ),
    ] {
        let (status, body) = answers.send(what, request).await;
        assert!(status >= 200, "{what}: {body}");
    }
    let (_, replay_after_delete) = answers
        .send(
            "endpoint replayed after its deletion",
            post(&secret, "/v1/webhook_endpoints", "we-1", &endpoint_body),
        )
        .await;
    // A deleted endpoint's secret is not handed out again.
    assert!(
        replay_after_delete.contains("webhook_endpoint_deleted"),
        "{replay_after_delete}"
    );

    // The answers: the secret key in none; the webhook secret in the
    // creation answer and its replays while the endpoint lives only.
    let mut holding_secret = Vec::new();
    for (what, text) in &answers.0 {
        for key in [secret.as_str(), other.as_str(), wrong] {
            assert!(!text.contains(key), "{what} holds an API key: {text}");
        }
        if text.contains(&hook_key) {
            holding_secret.push(what.as_str());
        }
    }
    assert_eq!(
        holding_secret,
        ["endpoint created (201)", "endpoint replayed (201)",],
        "the webhook secret is in these answers"
    );
    // The webhooks themselves carry a signature, never the secret.
    for delivered in receiver.received() {
        let seen = format!(
            "{} {} {}",
            delivered.headers(),
            delivered.content_type,
            String::from_utf8_lossy(&delivered.body)
        );
        assert!(!seen.contains(&hook_key), "{seen}");
    }

    // The log, once the last lines are out.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = service.log();
    assert!(
        log.iter().any(|line| line.contains("\"level\":\"TRACE\"")),
        "the log was captured at trace level"
    );
    assert!(
        log.iter()
            .any(|line| line.contains("tokio_postgres") && line.contains("DEBUG")),
        "the driver's debug lines are in the log"
    );
    for (name, leaked) in [
        ("the API key", secret.as_str()),
        ("the other merchant's API key", other.as_str()),
        ("a wrong API key", wrong),
        ("the webhook secret", hook_key.as_str()),
        ("the database password", "hunter2-db-password"),
    ] {
        let lines: Vec<&String> = log.iter().filter(|line| line.contains(leaked)).collect();
        assert!(lines.is_empty(), "{name} is in the log: {lines:#?}");
    }
}
