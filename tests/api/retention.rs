//! The retention contract: a key is kept at least `retention_hours`; after
//! that the sweeper releases it and the key names a new request.

use std::time::Duration;

use uuid::{NoContext, Timestamp, Uuid};

use crate::helpers::{charge_body, spawn_app_with};

#[tokio::test]
async fn the_sweeper_releases_only_expired_keys() {
    let app = spawn_app_with(|s| s.idempotency.sweep_interval = Duration::from_millis(100)).await;
    let recent = app.post_charge("recent", &charge_body(300)).await;
    assert_eq!(recent.status, 201);

    // A charge created two days ago (ids are time-ordered UUIDv7).
    let two_days_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 48 * 3600;
    let old_id = Uuid::new_v7(Timestamp::from_unix(NoContext, two_days_ago, 0));
    let client = app.sql().await;
    client
        .execute(
            "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, status, created_at) \
             SELECT $1, id, 'old', sha256('x'), 300, 'USD', 'succeeded', now() - interval '2 days' \
               FROM merchants",
            &[&old_id],
        )
        .await
        .unwrap();

    let mut waited = Duration::ZERO;
    while app
        .count("SELECT count(*) FROM charges WHERE client_idempotency_key = 'old'")
        .await
        > 0
    {
        assert!(
            waited < Duration::from_secs(5),
            "the sweeper never released the old key"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    // The charge itself stays; the key is free for a new request.
    assert_eq!(app.charge_rows().await, 2);
    let reused = app.post_charge("old", &charge_body(300)).await;
    assert_eq!(reused.status, 201);
    assert_eq!(reused.header("idempotent-replayed"), None);
    assert_ne!(
        reused.json()["id"].as_str().unwrap(),
        format!("ch_{}", old_id.simple())
    );

    // The recent key is still held: a retry replays.
    let replay = app.post_charge("recent", &charge_body(300)).await;
    assert_eq!(replay.body, recent.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
}

#[tokio::test]
async fn refund_keys_are_released_after_retention_too() {
    let app = spawn_app_with(|s| s.idempotency.sweep_interval = Duration::from_millis(100)).await;
    let charge = app.succeeded_charge("charge", 1000).await;
    let recent = app
        .post_refund(&charge, "recent", r#"{"amount":100}"#)
        .await;
    assert_eq!(recent.status, 201);
    let two_days_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 48 * 3600;
    let old_id = Uuid::new_v7(Timestamp::from_unix(NoContext, two_days_ago, 0));
    app.sql()
        .await
        .execute(
            "INSERT INTO refunds (id, merchant_id, charge_id, client_idempotency_key, \
                                  request_fingerprint, amount, currency, status, \
                                  processor_payment_id) \
             SELECT $1, merchant_id, id, 'old', sha256('x'), 100, 'USD', 'succeeded', 'pay_x' \
               FROM charges",
            &[&old_id],
        )
        .await
        .unwrap();
    let mut waited = Duration::ZERO;
    while app
        .count("SELECT count(*) FROM refunds WHERE client_idempotency_key = 'old'")
        .await
        > 0
    {
        assert!(
            waited < Duration::from_secs(5),
            "the old refund key was kept"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
    let replay = app
        .post_refund(&charge, "recent", r#"{"amount":100}"#)
        .await;
    assert_eq!(replay.body, recent.body, "the recent key is still held");
}
