//! The retention contract: a key replays for `retention_hours` after its
//! first use (every answer says until when, in `Idempotency-Key-Expires`);
//! then it stays held for `expired_key_hold_days`, answering 422
//! `idempotency_key_expired`; then the sweeper releases it and it names a
//! new request. Ages are planted through the UUIDv7 time of the ids.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chargeonce::domain::{Fingerprint, NewCharge, NewRefund};
use uuid::{NoContext, Timestamp, Uuid};

use crate::helpers::{charge_body, spawn_app_with, Reply, TestApp};

const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// A UUIDv7 of `age` ago, and its time as an HTTP date plus `window`.
fn aged_id(age: u64, window: u64) -> (Uuid, String) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let id = Uuid::new_v7(Timestamp::from_unix(NoContext, now - age, 0));
    let window_end =
        chrono::DateTime::from_timestamp(i64::try_from(now - age + window).unwrap(), 0)
            .unwrap()
            .format("%a, %d %b %Y %H:%M:%S GMT")
            .to_string();
    (id, window_end)
}

fn fingerprint_of_charge(body: &str) -> Vec<u8> {
    let request = NewCharge::parse(&serde_json::from_str(body).unwrap()).unwrap();
    Fingerprint::of(&request.normalised()).as_bytes().to_vec()
}

fn fingerprint_of_refund(body: &str) -> Vec<u8> {
    let request = NewRefund::parse(&serde_json::from_str(body).unwrap()).unwrap();
    Fingerprint::of(&request.normalised()).as_bytes().to_vec()
}

/// Waits until `sql` counts 0.
async fn until_none(app: &TestApp, sql: &str, what: &str) {
    let started = std::time::Instant::now();
    while app.count(sql).await > 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a key of each age answers: a replay within the window, 422
/// expired during the hold (naming what it created and when its window
/// ended, and processing nothing), a new object once released.
async fn assert_ages_answer(
    planted: &[(&str, Uuid, String)],
    post: impl AsyncFn(&str) -> Reply,
    prefix: &str,
) {
    let [(young, young_id, young_end), (_, _, _), (_, _, _), (released, released_id, _)] = planted
    else {
        panic!("four planted keys")
    };
    let replay = post(young).await;
    assert_eq!(replay.status, 201, "{}", replay.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(
        replay.json()["id"],
        format!("{prefix}{}", young_id.simple())
    );
    assert_eq!(
        replay.header("idempotency-key-expires"),
        Some(young_end.as_str())
    );

    for (key, id, window_end) in &planted[1..3] {
        let expired = post(key).await;
        let problem = expired.assert_problem(422, "idempotency_key_expired");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("{prefix}{}", id.simple())),
            "{key}: {detail}"
        );
        assert_eq!(
            expired.header("idempotency-key-expires"),
            Some(window_end.as_str()),
            "{key}"
        );
    }

    let new = post(released).await;
    assert_eq!(new.status, 201, "{}", new.body);
    assert_eq!(new.header("idempotent-replayed"), None);
    assert_ne!(
        new.json()["id"],
        format!("{prefix}{}", released_id.simple())
    );
}

#[tokio::test]
async fn a_charge_key_replays_then_answers_expired_then_names_a_new_charge() {
    let app = spawn_app_with(|s| s.idempotency.sweep_interval = Duration::from_millis(100)).await;
    let body = charge_body(300);
    let sql = app.sql().await;
    let mut planted = Vec::new();
    for (key, age) in [
        ("23h", 23 * HOUR),
        ("25h", 25 * HOUR),
        ("29d", 29 * DAY),
        ("31d", 31 * DAY),
    ] {
        let (id, window_end) = aged_id(age, DAY);
        sql.execute(
            "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, status, processor_payment_id) \
             SELECT $1, id, $2, $3, 300, 'USD', 'succeeded', 'pay_old' FROM merchants",
            &[&id, &key, &fingerprint_of_charge(&body)],
        )
        .await
        .unwrap();
        planted.push((key, id, window_end));
    }
    // The sweeper releases the key past the window and the hold only.
    until_none(
        &app,
        "SELECT count(*) FROM charges WHERE client_idempotency_key = '31d'",
        "the key past its hold was not released",
    )
    .await;
    assert_eq!(
        app.count("SELECT count(*) FROM charges WHERE client_idempotency_key IS NOT NULL")
            .await,
        3
    );

    let post = async |key: &str| app.post_charge(key, &body).await;
    assert_ages_answer(&planted, post, "ch_").await;
    assert_eq!(
        app.charge_rows().await,
        5,
        "nothing but the released key made a charge"
    );
}

#[tokio::test]
async fn a_refund_key_replays_then_answers_expired_then_names_a_new_refund() {
    let app = spawn_app_with(|s| s.idempotency.sweep_interval = Duration::from_millis(100)).await;
    let charge = app.succeeded_charge("charge", 10_000).await;
    let body = r#"{"amount":100}"#;
    let sql = app.sql().await;
    let mut planted = Vec::new();
    for (key, age) in [
        ("23h", 23 * HOUR),
        ("25h", 25 * HOUR),
        ("29d", 29 * DAY),
        ("31d", 31 * DAY),
    ] {
        let (id, window_end) = aged_id(age, DAY);
        sql.execute(
            "WITH reserved AS ( \
                 UPDATE charges SET refunds_reserved = refunds_reserved + 100, \
                                    amount_refunded = amount_refunded + 100 \
                 RETURNING id, merchant_id, processor_payment_id) \
             INSERT INTO refunds (id, merchant_id, charge_id, client_idempotency_key, \
                                  request_fingerprint, amount, currency, status, \
                                  processor_payment_id) \
             SELECT $1, merchant_id, id, $2, $3, 100, 'USD', 'succeeded', processor_payment_id \
               FROM reserved",
            &[&id, &key, &fingerprint_of_refund(body)],
        )
        .await
        .unwrap();
        planted.push((key, id, window_end));
    }
    until_none(
        &app,
        "SELECT count(*) FROM refunds WHERE client_idempotency_key = '31d'",
        "the refund key past its hold was not released",
    )
    .await;

    let post = async |key: &str| app.post_refund(&charge, key, body).await;
    assert_ages_answer(&planted, post, "re_").await;
    assert_eq!(
        app.count("SELECT count(*) FROM refunds").await,
        5,
        "nothing but the released key made a refund"
    );
}

/// With no hold (`expired_key_hold_days = 0`) a key is released as soon as
/// its window ends, and names a new request.
#[tokio::test]
async fn without_a_hold_a_key_is_released_when_its_window_ends() {
    let app = spawn_app_with(|s| {
        s.idempotency.sweep_interval = Duration::from_millis(100);
        s.idempotency.expired_key_hold_days = 0;
    })
    .await;
    let body = charge_body(300);
    let recent = app.post_charge("recent", &body).await;
    assert_eq!(recent.status, 201);
    let (old_id, _) = aged_id(25 * HOUR, DAY);
    app.sql()
        .await
        .execute(
            "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, status) \
             SELECT $1, id, 'old', sha256('x'), 300, 'USD', 'succeeded' FROM merchants",
            &[&old_id],
        )
        .await
        .unwrap();
    until_none(
        &app,
        "SELECT count(*) FROM charges WHERE client_idempotency_key = 'old'",
        "the sweeper never released the old key",
    )
    .await;
    let reused = app.post_charge("old", &body).await;
    assert_eq!(reused.status, 201);
    assert_eq!(reused.header("idempotent-replayed"), None);
    // The recent key is still held: a retry replays, with the same expiry.
    let replay = app.post_charge("recent", &body).await;
    assert_eq!(replay.body, recent.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    let expires = recent.header("idempotency-key-expires");
    assert!(expires.is_some_and(|e| e.ends_with(" GMT")), "{expires:?}");
    assert_eq!(replay.header("idempotency-key-expires"), expires);
}
