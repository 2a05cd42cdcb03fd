//! Every resource belongs to one merchant; keys are scoped per merchant.

use secrecy::ExposeSecret;
use std::time::{Duration, Instant};

use crate::helpers::{charge_body, database_address, spawn_app, spawn_app_with};

#[tokio::test]
async fn another_merchants_charge_is_404_and_not_listed() {
    let app = spawn_app().await;
    let other = app.create_merchant("Other").await;
    let mine = app.post_charge("mine", &charge_body(500)).await.json();

    app.get_as(
        &other,
        &format!("/v1/charges/{}", mine["id"].as_str().unwrap()),
    )
    .await
    .assert_problem(404, "not_found");
    let listed = app.get_as(&other, "/v1/charges").await.json();
    assert_eq!(listed["data"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn the_same_key_at_two_merchants_makes_two_independent_charges() {
    let app = spawn_app().await;
    let other = app.create_merchant("Other").await;
    let a = app.post_charge("shared-key", &charge_body(500)).await;
    // Even a different body: the other merchant's key space is its own.
    let b = app
        .post_charge_as(&other, "shared-key", &charge_body(777))
        .await;
    assert_eq!(a.status, 201);
    assert_eq!(b.status, 201);
    assert_eq!(b.header("idempotent-replayed"), None);
    assert_ne!(a.json()["id"], b.json()["id"]);
    assert_eq!(b.json()["amount"], 777);
    assert_eq!(app.charge_rows().await, 2);
}

#[tokio::test]
async fn a_missing_or_wrong_api_key_is_401_and_writes_nothing() {
    let app = spawn_app().await;
    let body = charge_body(500).into_bytes();
    let cases: [&[(&str, &str)]; 4] = [
        &[
            ("Idempotency-Key", "k"),
            ("Content-Type", "application/json"),
        ],
        &[
            ("Authorization", "Bearer sk_wrong"),
            ("Idempotency-Key", "k"),
            ("Content-Type", "application/json"),
        ],
        &[
            ("Authorization", "Basic dXNlcjpwYXNz"),
            ("Idempotency-Key", "k"),
            ("Content-Type", "application/json"),
        ],
        &[
            ("Authorization", "Bearer "),
            ("Idempotency-Key", "k"),
            ("Content-Type", "application/json"),
        ],
    ];
    for headers in cases {
        let reply = app.post_charge_raw(headers, body.clone()).await;
        reply.assert_problem(401, "unauthenticated");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
    }
    app.get_as("sk_wrong", "/v1/charges")
        .await
        .assert_problem(401, "unauthenticated");

    assert_eq!(app.charge_rows().await, 0);
}

#[tokio::test]
async fn a_revoked_key_stops_working_within_the_cache_ttl() {
    let app = spawn_app_with(|s| s.auth.cache_ttl = Duration::from_millis(300)).await;
    assert_eq!(app.get("/v1/charges").await.status, 200);
    app.sql()
        .await
        .execute("UPDATE api_keys SET revoked_at = now()", &[])
        .await
        .unwrap();
    let revoked = Instant::now();
    loop {
        let reply = app.get("/v1/charges").await;
        if reply.status == 401 {
            break;
        }
        assert_eq!(reply.status, 200);
        assert!(
            revoked.elapsed() < Duration::from_millis(300 + 500),
            "still accepted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.post_charge("k", &charge_body(500))
        .await
        .assert_problem(401, "unauthenticated");
    assert_eq!(app.charge_rows().await, 0);
}

/// Unknown keys are remembered briefly too: a flood of requests with one
/// bogus key costs one lookup per `auth.unknown_key_ttl_ms`, not one each.
/// Shown by stopping the database after the first lookup: the flood is
/// still answered 401 at once, so it asked nothing.
#[tokio::test]
async fn a_flood_of_one_bogus_key_costs_one_lookup() {
    use chargeonce_testkit::{Proxy, ProxyMode};
    let proxy = Proxy::start(database_address()).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.query_timeout = Duration::from_millis(500);
        s.auth.unknown_key_ttl = Duration::from_millis(10_000);
    })
    .await;
    app.get_as("sk_not_a_real_key", "/v1/charges")
        .await
        .assert_problem(401, "unauthenticated");

    proxy.set_mode(ProxyMode::Stall);
    // A lookup now would wait for the deadline and answer 503: every 401
    // below was answered from memory.
    let replies = futures_util::future::join_all(
        (0..200).map(|_| app.get_as("sk_not_a_real_key", "/v1/charges")),
    )
    .await;
    for reply in &replies {
        reply.assert_problem(401, "unauthenticated");
    }
    // Another bogus key still has to be asked about (and fails closed).
    app.get_as("sk_another_unknown_key", "/v1/charges")
        .await
        .assert_problem(503, "service_unavailable");
}
