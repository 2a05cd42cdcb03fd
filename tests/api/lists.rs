//! Every list parses its query one way (src/http/query.rs): a parameter
//! given twice is refused with 400 `invalid_request` naming it, since which
//! of the values would count is ambiguous; an unknown one too; once is fine.

use serde_json::Value;

use crate::helpers::{spawn_app, TestApp};

/// The fields a 400 names, each once.
fn named(problem: &Value) -> Vec<String> {
    let mut fields: Vec<String> = problem["errors"]
        .as_array()
        .expect("errors")
        .iter()
        .map(|error| error["field"].as_str().expect("field").to_owned())
        .collect();
    fields.dedup();
    fields
}

/// `path` lists `id` (among others, newest first) and parses its query as
/// every list does.
async fn parses_its_query_like_every_list(app: &TestApp, path: &str, id: &str) {
    let page = app.get(&format!("{path}?limit=1")).await;
    assert_eq!(page.status, 200, "{path}: {}", page.body);
    assert_eq!(page.json()["data"].as_array().map(Vec::len), Some(1));
    for (query, field) in [
        ("limit=1&limit=2".to_owned(), "limit"),
        ("limit=2&limit=2".to_owned(), "limit"),
        (
            format!("starting_after={id}&limit=1&starting_after={id}"),
            "starting_after",
        ),
        ("limit=1&colour=red".to_owned(), "colour"),
    ] {
        let problem = app
            .get(&format!("{path}?{query}"))
            .await
            .assert_problem(400, "invalid_request");
        assert_eq!(named(&problem), [field], "{path}?{query}: {problem}");
    }
}

async fn app_with_a_refund() -> (TestApp, String, String) {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("lists-charge", 1_000).await;
    let refund = app.post_refund(&charge, "lists-refund", "{}").await;
    assert_eq!(refund.status, 201, "{}", refund.body);
    let refund = refund.json()["id"].as_str().expect("id").to_owned();
    (app, charge, refund)
}

#[tokio::test]
async fn charges_refuse_a_repeated_parameter() {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("lists-charge", 1_000).await;
    parses_its_query_like_every_list(&app, "/v1/charges", &charge).await;
}

#[tokio::test]
async fn refunds_refuse_a_repeated_parameter() {
    let (app, _, refund) = app_with_a_refund().await;
    parses_its_query_like_every_list(&app, "/v1/refunds", &refund).await;
}

#[tokio::test]
async fn a_charges_refunds_refuse_a_repeated_parameter() {
    let (app, charge, refund) = app_with_a_refund().await;
    let path = format!("/v1/charges/{charge}/refunds");
    parses_its_query_like_every_list(&app, &path, &refund).await;
}

#[tokio::test]
async fn events_refuse_a_repeated_parameter() {
    let app = spawn_app().await;
    app.succeeded_charge("lists-charge", 1_000).await;
    let events = app.get("/v1/events").await.json();
    let event = events["data"][0]["id"].as_str().expect("an event");
    parses_its_query_like_every_list(&app, "/v1/events", event).await;
    let problem = app
        .get("/v1/events?type=charge.succeeded&type=charge.failed")
        .await
        .assert_problem(400, "invalid_request");
    assert_eq!(named(&problem), ["type"]);
}

#[tokio::test]
async fn webhook_endpoints_refuse_a_repeated_parameter() {
    let app = spawn_app().await;
    let created = app
        .http
        .post(format!("{}/v1/webhook_endpoints", app.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", "lists-endpoint")
        .header("Content-Type", "application/json")
        .body(r#"{"url": "http://127.0.0.1:9/hooks"}"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.expect("JSON");
    let endpoint = created["id"].as_str().expect("id");
    parses_its_query_like_every_list(&app, "/v1/webhook_endpoints", endpoint).await;
}

/// An event's deliveries are all on one page: any parameter is unknown.
#[tokio::test]
async fn an_events_deliveries_take_no_parameter() {
    let app = spawn_app().await;
    app.succeeded_charge("lists-charge", 1_000).await;
    let events = app.get("/v1/events").await.json();
    let event = events["data"][0]["id"].as_str().expect("an event");
    let path = format!("/v1/events/{event}/deliveries");
    assert_eq!(app.get(&path).await.status, 200);
    for (query, field) in [("limit=1", "limit"), ("x=1&x=2", "x")] {
        let problem = app
            .get(&format!("{path}?{query}"))
            .await
            .assert_problem(400, "invalid_request");
        assert_eq!(named(&problem), [field], "{query}: {problem}");
    }
}
