//! Finding out what an idempotency key did without sending the mutation
//! again: `GET /v1/charges?idempotency_key=` and `GET /v1/refunds?…` list
//! the one object the key created, as it is now, with the key and the end
//! of its replay window; or nothing. No lease, no processor call, nothing
//! created.

use std::time::Duration;

use serde_json::Value;

use crate::helpers::{charge_body, spawn_app_with, TestApp};
use crate::observability::{sample, scrape};

/// The lookup's list, after checking its shape.
async fn lookup(app: &TestApp, path: &str, key: &str) -> Vec<Value> {
    let reply = app.get(&format!("{path}?idempotency_key={key}")).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    let list = reply.json();
    assert_eq!(list["object"], "list");
    assert_eq!(list["has_more"], false);
    assert_eq!(list["url"], path);
    list["data"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_key_finds_its_charge_in_every_state_and_nothing_else() {
    let app = spawn_app_with(|s| s.processor.latency = Duration::from_millis(600)).await;

    // Pending: looked up while the processor is still at work.
    let in_flight = tokio::spawn({
        let (address, api_key) = (app.address.clone(), app.api_key.clone());
        async move {
            reqwest::Client::new()
                .post(format!("{address}/v1/charges"))
                .bearer_auth(api_key)
                .header("Idempotency-Key", "slow")
                .header("Content-Type", "application/json")
                .body(charge_body(1000))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    tokio::time::sleep(Duration::from_millis(250)).await;
    let calls = app.processor.calls_begun();
    let pending = lookup(&app, "/v1/charges", "slow").await;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["status"], "pending");
    assert_eq!(pending[0]["idempotency_key"], "slow");
    assert_eq!(
        app.processor.calls_begun(),
        calls,
        "a lookup never calls the processor"
    );
    assert_eq!(in_flight.await.unwrap(), 201);

    // Succeeded and failed, as they are now, with when the window ends.
    let succeeded = lookup(&app, "/v1/charges", "slow").await;
    assert_eq!(succeeded[0]["status"], "succeeded");
    assert_eq!(succeeded[0]["id"], pending[0]["id"]);
    let created_at =
        chrono::DateTime::parse_from_rfc3339(succeeded[0]["created_at"].as_str().unwrap()).unwrap();
    let expires = chrono::DateTime::parse_from_rfc3339(
        succeeded[0]["idempotency_key_expires_at"].as_str().unwrap(),
    )
    .unwrap();
    let window = expires - created_at;
    assert!(
        (window - chrono::Duration::hours(24)).num_seconds().abs() <= 5,
        "the window ends a day after the key's first use: {window}"
    );
    let declined = app.post_charge("declined", &charge_body(1002)).await;
    assert_eq!(declined.status, 402);
    let failed = lookup(&app, "/v1/charges", "declined").await;
    assert_eq!(failed[0]["status"], "failed");
    assert_eq!(failed[0]["failure_code"], "card_declined");
    // A key in quotes is the same key, as on a creation.
    assert_eq!(lookup(&app, "/v1/charges", "%22declined%22").await, failed);

    // Another merchant's key, and a key never used: nothing.
    let other = app.create_merchant("Other").await;
    let theirs = app
        .get_as(&other, "/v1/charges?idempotency_key=slow")
        .await
        .json();
    assert_eq!(theirs["data"], serde_json::json!([]));
    assert!(lookup(&app, "/v1/charges", "never-used").await.is_empty());

    // A released key: nothing, though the charge stays.
    // (Released as the sweeper releases it.)
    let rows = app.charge_rows().await;
    let sql = app.sql().await;
    sql.execute(
        "UPDATE charges SET client_idempotency_key = NULL WHERE client_idempotency_key = 'declined'",
        &[],
    )
    .await
    .unwrap();
    assert!(lookup(&app, "/v1/charges", "declined").await.is_empty());
    assert_eq!(app.charge_rows().await, rows, "a lookup creates nothing");

    // Malformed keys as on a creation; a page's parameters do not mix.
    app.get("/v1/charges?idempotency_key=two%20words")
        .await
        .assert_problem(400, "idempotency_key_invalid");
    let mixed = app.get("/v1/charges?idempotency_key=slow&limit=5").await;
    let problem = mixed.assert_problem(400, "invalid_request");
    assert_eq!(problem["errors"][0]["field"], "limit");
}

#[tokio::test]
async fn a_key_finds_its_refund() {
    let app = spawn_app_with(|_| {}).await;
    let charge = app.succeeded_charge("charge", 1000).await;
    let refund = app
        .post_refund(&charge, "refund-1", r#"{"amount":300}"#)
        .await;
    assert_eq!(refund.status, 201);
    let before = scrape(&app).await;
    let found = lookup(&app, "/v1/refunds", "refund-1").await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0]["id"], refund.json()["id"]);
    assert_eq!(found[0]["idempotency_key"], "refund-1");
    assert!(found[0]["idempotency_key_expires_at"].is_string());
    // Charge and refund keys are apart: a charge's key finds no refund.
    assert!(lookup(&app, "/v1/refunds", "charge").await.is_empty());
    let other = app.create_merchant("Other").await;
    let theirs = app
        .get_as(&other, "/v1/refunds?idempotency_key=refund-1")
        .await
        .json();
    assert_eq!(theirs["data"], serde_json::json!([]));
    let after = scrape(&app).await;
    let family = "chargeonce_idempotency_key_lookups_total";
    for result in ["found", "none"] {
        let labels = [("kind", "refund"), ("result", result)];
        let (was, is) = (
            sample(&before, family, &labels),
            sample(&after, family, &labels),
        );
        assert!(is > was, "lookups {result}: {was} -> {is}");
    }
    // Only a lookup shows the key: the creation's answer and a read do not.
    assert!(refund.json().get("idempotency_key").is_none());
    let read = app
        .get(&format!("/v1/refunds/{}", found[0]["id"].as_str().unwrap()))
        .await;
    assert!(read.json().get("idempotency_key").is_none());
}
