//! PostgreSQL unreachable: fail closed, quickly, with 503 + Retry-After; never
//! treat a key as new without asking the database, never call the processor.

use std::time::{Duration, Instant};

use chargeonce_testkit::{admin_url, server_address, Proxy, ProxyMode};

use crate::helpers::{charge_body, spawn_app_with};

#[tokio::test]
async fn an_unreachable_database_gives_503_quickly_and_charges_nothing() {
    let proxy = Proxy::start(server_address(&admin_url())).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(&s.database.url);
        s.database.connect_timeout_ms = 500;
    })
    .await;
    let before = app.post_charge("before", &charge_body(100)).await;
    assert_eq!(before.status, 201, "{}", before.body);

    proxy.set_mode(ProxyMode::Cut);
    for (key, amount) in [("during", 200), ("before", 100)] {
        let started = Instant::now();
        let reply = app.post_charge(key, &charge_body(amount)).await;
        let elapsed = started.elapsed();
        reply.assert_problem(503, "service_unavailable");
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    }
    assert_eq!(app.get("/readyz").await.status, 503);
    assert_eq!(app.processor.calls(), 1, "nothing reached the processor");

    // The database comes back: the service recovers by itself.
    proxy.set_mode(ProxyMode::Forward);
    let after = app.post_charge("during", &charge_body(200)).await;
    assert_eq!(after.status, 201, "{}", after.body);
    assert_eq!(
        after.header("idempotent-replayed"),
        None,
        "the 503 stored nothing"
    );
    let replay = app.post_charge("before", &charge_body(100)).await;
    assert_eq!(replay.body, before.body);
    assert_eq!(app.charge_rows().await, 2);
}
