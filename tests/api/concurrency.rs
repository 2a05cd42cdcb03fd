//! Races: the unique index must decide, whatever the timing.

use std::time::Duration;

use chargeonce_testkit::PgBouncer;
use futures_util::future::join_all;

use crate::helpers::{charge_body, spawn_app, spawn_app_with, through_pgbouncer, TestApp};

#[tokio::test]
async fn fifty_concurrent_requests_with_one_key_make_one_charge() {
    // A little processor latency keeps the first request in flight while the
    // others arrive: they wait for it and answer with its result.
    let app = spawn_app_with(|s| {
        s.processor.latency = Duration::from_millis(50);
        s.database.pool_size = 20;
        s.idempotency.in_flight_wait = Duration::from_millis(5000);
    })
    .await;
    let body = charge_body(4200);
    let replies = join_all((0..50).map(|_| app.post_charge("same-key", &body))).await;

    assert_eq!(app.charge_rows().await, 1);
    assert_eq!(app.processor.calls(), 1, "the processor was called once");
    for reply in &replies {
        assert_eq!(reply.status, 201, "{}", reply.body);
        assert_eq!(
            reply.body, replies[0].body,
            "every answer has the same body"
        );
    }
    let replayed = replies
        .iter()
        .filter(|r| r.header("idempotent-replayed") == Some("true"))
        .count();
    assert_eq!(replayed, 49, "exactly one first answer");
}

#[tokio::test]
async fn two_hundred_concurrent_distinct_keys_make_two_hundred_charges() {
    let app = spawn_app().await;
    let replies = join_all((0..200).map(|i| {
        let key = format!("distinct-{i}");
        let app = &app;
        async move { app.post_charge(&key, &charge_body(1000 + i * 100)).await }
    }))
    .await;
    for reply in &replies {
        assert_eq!(reply.status, 201, "{}", reply.body);
    }
    assert_eq!(app.charge_rows().await, 200);
    assert_eq!(
        app.count("SELECT count(DISTINCT client_idempotency_key) FROM charges")
            .await,
        200
    );
    assert_eq!(app.processor.calls(), 200);
}

/// Each HTTP worker thread has its own pool; together they hold at most
/// `database.pool_size` connections, plus the background workers' own.
#[tokio::test]
async fn worker_pools_share_the_configured_pool_size() {
    const POOL_SIZE: usize = 4;
    let app = spawn_app_with(|s| {
        s.server.workers = 2;
        s.database.pool_size = POOL_SIZE;
        s.processor.latency = Duration::from_millis(5);
    })
    .await;
    let admin = match through_pgbouncer() {
        Some(pgbouncer) => Some(pgbouncer.admin().await),
        None => None,
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    let watch = async {
        let mut peak = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(service_connections(&app, admin.as_ref()).await);
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        peak
    };
    let load = async {
        // Staggered, a request every millisecond: while some are inserted,
        // others record their outcomes, so a worker needs two connections
        // at once (all at once, the inserts and then the outcomes went as
        // one batch each, on one connection per worker).
        let replies = join_all((0..120).map(|i| {
            let key = format!("pooled-{i}");
            let app = &app;
            async move {
                tokio::time::sleep(Duration::from_millis(i as u64)).await;
                app.post_charge(&key, &charge_body(1000 + i * 100)).await
            }
        }))
        .await;
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        replies
    };
    let (peak, replies) = tokio::join!(watch, load);

    for reply in &replies {
        assert_eq!(reply.status, 201, "{}", reply.body);
    }
    let limit = POOL_SIZE + chargeonce::startup::BACKGROUND_CONNECTIONS;
    assert!(
        peak <= limit,
        "{peak} connections open, more than pool_size {POOL_SIZE} + background"
    );
    // Both workers' pools were in use, or the bound above proves nothing.
    assert!(peak > 2, "only {peak} connections were ever open");
}

/// The connections the service holds to its database now: PostgreSQL's
/// backends, or through PgBouncer (transaction pooling, `admin` its admin
/// console) its client connections there. Through PgBouncer the backends
/// are PgBouncer's, shared out a transaction at a time, and say nothing of
/// the service's pools (two were seen carrying 120 staggered charges).
async fn service_connections(app: &TestApp, admin: Option<&tokio_postgres::Client>) -> usize {
    match admin {
        Some(admin) => PgBouncer::clients(admin, app.database_name(), "chargeonce").await,
        None => {
            let backends = app
                .count(
                    "SELECT count(*) FROM pg_stat_activity \
                     WHERE datname = current_database() AND application_name = 'chargeonce'",
                )
                .await;
            usize::try_from(backends).expect("a count")
        }
    }
}
