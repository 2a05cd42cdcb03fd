//! The demo checkout's routes (`demo.enabled`): the embedded page and module,
//! and `POST /demo/charges`, the same charge flow for the server-held demo
//! merchant. Disabled, they are unknown routes. tests/browser.rs drives the
//! page itself in Chromium.

use std::collections::HashMap;
use std::path::Path;

use chargeonce::config::{LogFormat, ProcessorKind, Settings};

use crate::helpers::{charge_body, spawn_app_with, Reply, TestApp};

/// The demo merchant's id (src/http/demo.rs), as stored.
const DEMO_MERCHANT: &str = "00000000-0000-7000-8000-000000000de0";

async fn send(request: reqwest::RequestBuilder) -> Reply {
    let response = request.send().await.expect("request sent");
    Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.text().await.expect("body"),
    }
}

async fn get(app: &TestApp, path: &str) -> Reply {
    send(app.http.get(format!("{}{path}", app.address))).await
}

/// The real application with the demo on, as in development.
async fn spawn_demo_app() -> TestApp {
    spawn_app_with(|s| s.demo.enabled = true).await
}

/// `POST /demo/charges` as the page sends it: no API key.
async fn post_demo_charge(app: &TestApp, key: &str, body: &str) -> Reply {
    send(
        app.http
            .post(format!("{}/demo/charges", app.address))
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_owned()),
    )
    .await
}

#[tokio::test]
async fn the_page_and_the_module_are_served_from_the_binary() {
    let app = spawn_demo_app().await;

    let page = get(&app, "/demo").await;
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.body.contains("from '/demo/chargeonce.js'"),
        "{}",
        page.body
    );
    assert!(page.body.contains("resumePending"));
    assert!(!page.body.contains("sk_"), "no secret key in the page");
    assert!(
        page.body.contains(r#"content="86400000""#),
        "24 h by default"
    );

    let module = get(&app, "/demo/chargeonce.js").await;
    assert_eq!(module.status, 200);
    assert_eq!(
        module.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("web/chargeonce.js");
    assert_eq!(module.body, std::fs::read_to_string(source).unwrap());

    let wrong_method = send(app.http.post(format!("{}/demo", app.address))).await;
    wrong_method.assert_problem(405, "method_not_allowed");
}

#[tokio::test]
async fn demo_charges_run_the_normal_flow_for_the_demo_merchant() {
    let app = spawn_demo_app().await;

    let created = post_demo_charge(&app, "demo-1", &charge_body(1000)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let charge = created.json();
    assert_eq!(charge["status"], "succeeded");
    assert_eq!(created.header("idempotent-replayed"), None);

    // Same key, same body: the first answer again, byte for byte.
    let replay = post_demo_charge(&app, "demo-1", &charge_body(1000)).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, created.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    post_demo_charge(&app, "demo-1", &charge_body(2000))
        .await
        .assert_problem(422, "idempotency_key_reused");
    let declined = post_demo_charge(&app, "demo-2", &charge_body(1002))
        .await
        .assert_problem(402, "card_declined");
    assert!(declined["charge_id"].is_string());
    post_demo_charge(&app, "demo-3", r#"{"amount":0,"currency":"USD"}"#)
        .await
        .assert_problem(400, "invalid_request");
    let missing_key = send(
        app.http
            .post(format!("{}/demo/charges", app.address))
            .header("Content-Type", "application/json")
            .body(charge_body(1000)),
    )
    .await;
    missing_key.assert_problem(400, "idempotency_key_missing");

    // Two charges, both the demo merchant's, invisible to other merchants.
    assert_eq!(app.charge_rows().await, 2);
    let demo_rows = app
        .count(&format!(
            "SELECT count(*) FROM charges WHERE merchant_id = '{DEMO_MERCHANT}'"
        ))
        .await;
    assert_eq!(demo_rows, 2);
    app.get(&format!("/v1/charges/{}", charge["id"].as_str().unwrap()))
        .await
        .assert_problem(404, "not_found");
}

#[tokio::test]
async fn the_demo_merchant_is_created_once_and_has_no_api_key() {
    let app = spawn_demo_app().await;
    let merchants = format!("SELECT count(*) FROM merchants WHERE id = '{DEMO_MERCHANT}'");
    assert_eq!(app.count(&merchants).await, 1);
    // Another start (or another instance) finds it and changes nothing.
    chargeonce::http::demo::ensure_demo_merchant(&app.db)
        .await
        .unwrap();
    assert_eq!(app.count(&merchants).await, 1);
    let keys = format!("SELECT count(*) FROM api_keys WHERE merchant_id = '{DEMO_MERCHANT}'");
    assert_eq!(app.count(&keys).await, 0);
}

#[tokio::test]
async fn with_the_demo_disabled_its_routes_are_unknown() {
    let app = spawn_app_with(|s| s.demo.enabled = false).await;
    for path in ["/demo", "/demo/chargeonce.js"] {
        get(&app, path).await.assert_problem(404, "not_found");
    }
    post_demo_charge(&app, "demo-1", &charge_body(1000))
        .await
        .assert_problem(404, "not_found");
    assert_eq!(app.charge_rows().await, 0);
    let merchants = format!("SELECT count(*) FROM merchants WHERE id = '{DEMO_MERCHANT}'");
    assert_eq!(app.count(&merchants).await, 0, "no demo merchant either");
}

#[tokio::test]
async fn the_production_configuration_turns_the_demo_off() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let load = |vars: &[(&str, &str)]| {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load_from(&config, &vars).expect("the repository's configuration loads")
    };

    let development = load(&[]);
    assert!(development.demo.enabled);

    let production = load(&[("CHARGEONCE_ENV", "production")]);
    assert!(!production.demo.enabled);
    assert_eq!(production.processor.kind, ProcessorKind::Http);
    assert_eq!(production.log.format, LogFormat::Json);
}

/// The page passes the server's retention window to the module, so a stored
/// payment whose key the server may have released is reported, not resumed.
#[tokio::test]
async fn the_page_carries_the_configured_retention_window() {
    let app = spawn_app_with(|s| {
        s.demo.enabled = true;
        s.idempotency.retention_hours = std::num::NonZeroU64::new(2).unwrap();
    })
    .await;
    let page = get(&app, "/demo").await;
    assert!(
        page.body
            .contains(r#"<meta name="chargeonce-retention-ms" content="7200000">"#),
        "{}",
        page.body
    );
    assert!(page.body.contains("retentionMs: Number("));
}
