//! A key reused with another request is 422 `idempotency_key_reused`,
//! never executed, and says which fields differ (names, never values),
//! worked out from the stored row. Equivalent bodies still replay.

use serde_json::json;

use crate::helpers::spawn_app;
use crate::observability::{sample, scrape};

#[tokio::test]
async fn a_reused_charge_key_names_the_fields_that_differ() {
    let app = spawn_app().await;
    let first = json!({"amount": 1000, "currency": "usd", "customer": "cus_1",
                       "metadata": {"order": "1042", "note": "gift"}});
    assert_eq!(
        app.post_charge("order-1042", &first.to_string())
            .await
            .status,
        201
    );

    // The same request written differently replays.
    let same = json!({"metadata": {"note": "gift", "order": "1042"}, "currency": "USD",
                      "customer": "cus_1", "description": null, "amount": 1000});
    let replay = app.post_charge("order-1042", &same.to_string()).await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    let before = scrape(&app).await;
    let changed = json!({"amount": 1200, "currency": "USD", "customer": "cus_1",
                         "description": "late edit", "metadata": {"order": "1043"}});
    let reused = app.post_charge("order-1042", &changed.to_string()).await;
    let problem = reused.assert_problem(422, "idempotency_key_reused");
    assert_eq!(
        problem["differing_fields"],
        json!(["amount", "description", "metadata.note", "metadata.order"])
    );
    assert!(
        !reused.body.contains("1043") && !reused.body.contains("late edit"),
        "values never appear: {}",
        reused.body
    );
    assert!(problem["detail"]
        .as_str()
        .unwrap()
        .contains("amount, description"));
    assert_eq!(app.charge_rows().await, 1, "nothing executed");

    // Counted by field (the app's metrics are the process's: other tests
    // count too, so each must have moved).
    let after = scrape(&app).await;
    let family = "chargeonce_idempotency_mismatched_fields_total";
    for field in ["amount", "description", "metadata"] {
        let labels = [("kind", "charge"), ("field", field)];
        let (was, is) = (
            sample(&before, family, &labels),
            sample(&after, family, &labels),
        );
        assert!(is > was, "{field}: {was} -> {is}");
    }
}

#[tokio::test]
async fn a_reused_refund_key_names_the_fields_and_the_charge_that_differ() {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("charge", 1000).await;
    let other = app.succeeded_charge("other", 1000).await;
    // "The rest of the charge": stored as the amount it came to.
    assert_eq!(app.post_refund(&charge, "refund-1", "{}").await.status, 201);
    let replay = app
        .post_refund(&charge, "refund-1", r#"{"amount":null}"#)
        .await;
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    // Naming the amount the rest came to is still another request.
    let explicit = app
        .post_refund(&charge, "refund-1", r#"{"amount":1000}"#)
        .await;
    let problem = explicit.assert_problem(422, "idempotency_key_reused");
    assert_eq!(problem["differing_fields"], json!(["amount"]));

    let elsewhere = app
        .post_refund(&other, "refund-1", r#"{"reason":"duplicate"}"#)
        .await;
    let problem = elsewhere.assert_problem(422, "idempotency_key_reused");
    assert_eq!(problem["differing_fields"], json!(["charge", "reason"]));
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 1);
}

#[tokio::test]
async fn a_reused_webhook_endpoint_key_names_the_fields_that_differ() {
    use crate::webhook_receiver::post_endpoint;
    let app = spawn_app().await;
    let first = r#"{"url": "http://127.0.0.1:9/hooks", "event_types": ["charge.succeeded"]}"#;
    let (status, _, body) = post_endpoint(&app.address, &app.api_key, "endpoint-1", first).await;
    assert_eq!(status, 201, "{body}");
    // The same endpoint asked for again, written differently, replays.
    let same = r#"{"event_types": ["charge.succeeded"], "url": "HTTP://127.0.0.1:9/hooks"}"#;
    let (status, replayed, _) = post_endpoint(&app.address, &app.api_key, "endpoint-1", same).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));

    for (body, differing) in [
        (
            r#"{"url": "http://127.0.0.1:9/other", "event_types": ["charge.succeeded"]}"#,
            json!(["url"]),
        ),
        (
            r#"{"url": "http://127.0.0.1:9/hooks"}"#,
            json!(["event_types"]),
        ),
    ] {
        let (status, _, answer) =
            post_endpoint(&app.address, &app.api_key, "endpoint-1", body).await;
        assert_eq!(status, 422, "{answer}");
        let problem: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], "idempotency_key_reused");
        assert_eq!(problem["differing_fields"], differing, "{body}");
    }
}
