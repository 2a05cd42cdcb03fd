//! The promises of SECURITY.md that no other file of this suite already
//! proves: tenancy swept over every route at once (another merchant's id is
//! answered exactly like an id that never existed, and changes nothing).
//!
//! Proven elsewhere, and named in SECURITY.md: private webhook targets
//! refused under config/production.toml (`webhooks.rs`), the webhook
//! secret left out of the list and delete answers (`webhooks.rs`), unknown
//! and revoked keys (`tenancy.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, TestApp};
use crate::webhook_receiver::create_endpoint;

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
    while app
        .count("SELECT count(*) FROM events WHERE NOT dispatched")
        .await
        > 0
    {
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
