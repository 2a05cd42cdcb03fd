//! Replays answered from memory: a final answer is replayed without the
//! database, a different request with its key still gets 422, and a pending
//! charge always goes to the database. The database is cut off (a proxy
//! that closes every connection) to tell the two ways apart from outside.

use secrecy::ExposeSecret;
use std::time::Duration;

use chargeonce_testkit::{Proxy, ProxyMode};

use crate::helpers::{charge_body, database_address, spawn_app_with, TestApp, REPLAY_CACHE_BYTES};

async fn app_behind(proxy: &Proxy, cache_bytes: u64) -> TestApp {
    spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.connect_timeout = Duration::from_millis(500);
        s.idempotency.replay_cache_bytes = cache_bytes;
    })
    .await
}

#[tokio::test]
async fn final_answers_are_replayed_without_the_database() {
    let proxy = Proxy::start(database_address()).await;
    let app = app_behind(&proxy, REPLAY_CACHE_BYTES).await;
    let succeeded = app.post_charge("paid", &charge_body(1000)).await;
    assert_eq!(succeeded.status, 201, "{}", succeeded.body);
    // Amounts ending in 02 are declined by the simulated processor.
    let declined = app.post_charge("declined", &charge_body(1002)).await;
    assert_eq!(declined.status, 402, "{}", declined.body);
    let charge = succeeded.json()["id"].as_str().unwrap().to_owned();
    let refund_body = r#"{"amount": 400}"#;
    let refunded = app.post_refund(&charge, "refund-1", refund_body).await;
    assert_eq!(refunded.status, 201, "{}", refunded.body);

    proxy.set_mode(ProxyMode::Cut);
    for (key, amount, first) in [("paid", 1000, &succeeded), ("declined", 1002, &declined)] {
        let replay = app.post_charge(key, &charge_body(amount)).await;
        assert_eq!((replay.status, &replay.body), (first.status, &first.body));
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    }
    let replay = app.post_refund(&charge, "refund-1", refund_body).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, refunded.body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    // The key with another request is still refused, from memory too.
    app.post_charge("paid", &charge_body(999))
        .await
        .assert_problem(422, "idempotency_key_reused");
    app.post_refund(&charge, "refund-1", r#"{"amount": 300}"#)
        .await
        .assert_problem(422, "idempotency_key_reused");
    // A new key needs the database.
    app.post_charge("new", &charge_body(1000))
        .await
        .assert_problem(503, "service_unavailable");
    assert_eq!(app.processor.calls(), 3, "replays called nobody");
}

#[tokio::test]
async fn a_refund_key_replayed_on_another_charge_is_refused_from_memory() {
    let proxy = Proxy::start(database_address()).await;
    let app = app_behind(&proxy, REPLAY_CACHE_BYTES).await;
    let first = app.succeeded_charge("first", 1000).await;
    let second = app.succeeded_charge("second", 1000).await;
    let body = r#"{"amount": 100}"#;
    assert_eq!(app.post_refund(&first, "r", body).await.status, 201);

    proxy.set_mode(ProxyMode::Cut);
    app.post_refund(&second, "r", body)
        .await
        .assert_problem(422, "idempotency_key_reused");
}

#[tokio::test]
async fn a_pending_charge_is_never_answered_from_memory() {
    let proxy = Proxy::start(database_address()).await;
    let app = app_behind(&proxy, REPLAY_CACHE_BYTES).await;
    // Amounts ending in 09: the simulated processor takes the payment and
    // times out on the first call, so the charge stays pending.
    let pending = app.post_charge("slow", &charge_body(1009)).await;
    assert_eq!(pending.status, 202, "{}", pending.body);

    proxy.set_mode(ProxyMode::Cut);
    app.post_charge("slow", &charge_body(1009))
        .await
        .assert_problem(503, "service_unavailable");

    // Once it is final, it is.
    proxy.set_mode(ProxyMode::Forward);
    let finished = app.post_charge("slow", &charge_body(1009)).await;
    assert_eq!(finished.status, 201, "{}", finished.body);
    proxy.set_mode(ProxyMode::Cut);
    let replay = app.post_charge("slow", &charge_body(1009)).await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, finished.body);
}

#[tokio::test]
async fn with_the_cache_off_every_replay_asks_the_database() {
    let proxy = Proxy::start(database_address()).await;
    let app = app_behind(&proxy, 0).await;
    assert_eq!(
        app.post_charge("paid", &charge_body(1000)).await.status,
        201
    );
    proxy.set_mode(ProxyMode::Cut);
    app.post_charge("paid", &charge_body(1000))
        .await
        .assert_problem(503, "service_unavailable");
}
