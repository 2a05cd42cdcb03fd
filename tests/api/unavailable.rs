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

/// A partition as a client meets it: the proxy to PostgreSQL keeps every
/// socket open and forwards nothing, so no error ever arrives. With more
/// concurrent requests than connections, every request is still answered
/// within the statement deadline plus a second, the connections that hung
/// are thrown away, and service is back within 2 s of the partition healing.
#[tokio::test]
async fn a_partition_is_answered_within_the_deadline_and_heals_quickly() {
    const QUERY_TIMEOUT_MS: u64 = 1000;
    let proxy = Proxy::start(server_address(&admin_url())).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(&s.database.url);
        s.database.pool_size = 4;
        s.database.connect_timeout_ms = 500;
        s.database.query_timeout_ms = QUERY_TIMEOUT_MS;
    })
    .await;
    let created = app.post_charge("before", &charge_body(100)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let charge_path = format!("/v1/charges/{}", created.json()["id"].as_str().unwrap());

    proxy.set_mode(ProxyMode::Stall);
    let bound = Duration::from_millis(QUERY_TIMEOUT_MS + 1000);
    for round in 0..2 {
        let mut requests = Vec::new();
        for i in 0..16 {
            let app = &app;
            let charge_path = charge_path.clone();
            requests.push(async move {
                let started = Instant::now();
                let reply = match i % 6 {
                    0 | 1 => {
                        app.post_charge(&format!("p{round}-{i}"), &charge_body(300))
                            .await
                    }
                    2 => app.get("/v1/charges").await,
                    3 => app.get(&charge_path).await,
                    4 => app.get_as("sk_unknown_key", "/v1/charges").await,
                    _ => app.get("/readyz").await,
                };
                (i, started.elapsed(), reply)
            });
        }
        // Without a deadline the requests would hang as long as the partition.
        let answered = tokio::time::timeout(bound * 2, futures_util::future::join_all(requests))
            .await
            .expect("requests hang during the partition");
        for (i, elapsed, reply) in answered {
            assert!(elapsed < bound, "request {i} took {elapsed:?}");
            reply.assert_problem(503, "service_unavailable");
            assert_eq!(reply.header("retry-after"), Some("1"), "request {i}");
        }
        let health = app.get("/healthz").await;
        assert_eq!(health.status, 200, "liveness does not need the database");
    }
    assert_eq!(app.processor.calls(), 1, "nothing reached the processor");

    proxy.set_mode(ProxyMode::Forward);
    let healed = Instant::now();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let reply = app.post_charge("after", &charge_body(200)).await;
        if reply.status == 201 {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(2),
            "still {} {} after {:?}",
            reply.status,
            reply.body,
            healed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.get("/readyz").await.status, 200);
    assert!(attempt < 40);
}
