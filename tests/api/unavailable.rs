//! PostgreSQL unreachable: fail closed, quickly, with 503 + Retry-After; never
//! treat a key as new without asking the database, never call the processor.

use secrecy::ExposeSecret;
use std::time::{Duration, Instant};

use chargeonce_testkit::{Proxy, ProxyMode};

use crate::helpers::{charge_body, database_address, spawn_app_with, REPLAY_CACHE_BYTES};
use crate::processor_stub::ProcessorStub;

#[tokio::test]
async fn an_unreachable_database_gives_503_quickly_and_charges_nothing() {
    let proxy = Proxy::start(database_address()).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.connect_timeout = Duration::from_millis(500);
        s.idempotency.replay_cache_bytes = REPLAY_CACHE_BYTES;
    })
    .await;
    let before = app.post_charge("before", &charge_body(100)).await;
    assert_eq!(before.status, 201, "{}", before.body);

    proxy.set_mode(ProxyMode::Cut);
    // A replay of a final answer needs no database (the replay cache);
    // everything else does.
    let replayed = app.post_charge("before", &charge_body(100)).await;
    assert_eq!(replayed.status, 201);
    assert_eq!(replayed.body, before.body);
    assert_eq!(replayed.header("idempotent-replayed"), Some("true"));
    for (key, amount) in [("during", 200), ("during-2", 300)] {
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
    let proxy = Proxy::start(database_address()).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.pool_size = 4;
        s.database.connect_timeout = Duration::from_millis(500);
        s.database.query_timeout = Duration::from_millis(QUERY_TIMEOUT_MS);
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

/// Sends one charge in the background and waits until the processor call
/// is under way (`called`: the processor has seen it). (Waiting for the pending row to be committed is not
/// enough: the insert's answer may still be on its way to the service, and
/// a cut then loses it: the request is answered 503, truthfully, as the
/// processor was never called. Seen once through PgBouncer in CI.)
async fn charge_in_background(
    app: &crate::helpers::TestApp,
    key: &str,
    called: impl Fn() -> bool,
) -> tokio::task::JoinHandle<(Duration, crate::helpers::Reply)> {
    let (address, api_key, key) = (app.address.clone(), app.api_key.clone(), key.to_owned());
    let task = tokio::spawn(async move {
        let started = Instant::now();
        let response = reqwest::Client::new()
            .post(format!("{address}/v1/charges"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(charge_body(1000))
            .send()
            .await
            .unwrap();
        let reply = crate::helpers::Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.text().await.unwrap(),
        };
        (started.elapsed(), reply)
    });
    let started = Instant::now();
    while !called() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the processor was never called"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(app.charge_rows().await, 1, "pending before the call");
    task
}

/// The database goes away while the processor is charging the card. The
/// money moved, so the answer must not be "nothing was processed": the
/// request keeps trying to record the outcome and, once the database is
/// back, answers 201 with the charge.
#[tokio::test]
async fn an_outcome_is_recorded_once_the_database_is_back_never_503() {
    let proxy = Proxy::start(database_address()).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.connect_timeout = Duration::from_millis(300);
        s.database.query_timeout = Duration::from_millis(500);
        s.processor.latency = Duration::from_millis(1000);
        s.idempotency.lease = Duration::from_millis(6000);
    })
    .await;
    let request = charge_in_background(&app, "slow", || app.processor.calls_begun() > 0).await;
    proxy.set_mode(ProxyMode::Cut);
    // The processor answers after 1 s; the database is back after 2.5 s.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    proxy.set_mode(ProxyMode::Forward);

    let (elapsed, reply) = request.await.unwrap();
    assert_eq!(
        reply.status,
        201,
        "{} (processor calls: {})",
        reply.body,
        app.processor.calls()
    );
    assert!(
        elapsed < Duration::from_secs(6),
        "answered within the lease"
    );
    assert_eq!(reply.json()["status"], "succeeded");
    assert_eq!(
        app.count("SELECT count(*) FROM charges WHERE status = 'succeeded'")
            .await,
        1
    );
    assert_eq!(app.processor.calls(), 1);
}

/// The same, with the database away for longer than the lease: the answer is
/// 202 with the charge pending (the outcome is not recorded yet), never 503;
/// the lease has run out, so a retry after the database is back finishes the
/// charge at once instead of waiting behind a stale lease.
#[tokio::test]
async fn an_outcome_that_cannot_be_recorded_within_the_lease_is_202_pending() {
    let proxy = Proxy::start(database_address()).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.connect_timeout = Duration::from_millis(300);
        s.database.query_timeout = Duration::from_millis(500);
        s.processor.latency = Duration::from_millis(1000);
        s.idempotency.lease = Duration::from_millis(2500);
        // The worker stays out of it: the retry below must be what finishes.
        s.recovery.interval = Duration::from_millis(600_000);
    })
    .await;
    let request = charge_in_background(&app, "slower", || app.processor.calls_begun() > 0).await;
    proxy.set_mode(ProxyMode::Stall);

    let (elapsed, reply) = request.await.unwrap();
    assert_eq!(reply.status, 202, "{}", reply.body);
    assert!(elapsed < Duration::from_secs(4), "took {elapsed:?}");
    let pending = reply.json();
    assert_eq!(pending["status"], "pending");

    proxy.set_mode(ProxyMode::Forward);
    let started = Instant::now();
    let retry = app.post_charge("slower", &charge_body(1000)).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "no wait for a stale lease"
    );
    assert_eq!(retry.json()["id"], pending["id"]);
    assert_eq!(app.charge_rows().await, 1);
    // The retry asked the processor again with the charge's one downstream
    // key, unless the held-back outcome statement reached PostgreSQL when
    // the partition healed and recorded it first (it is true either way).
    assert!((1..=2).contains(&app.processor.calls()));
}

/// An insert sent just before a partition may commit although its request
/// never learns it (here: the proxy holds the statement and delivers it when
/// the partition heals). The request answered 503, "nothing was processed",
/// so that row must not be charged later by the recovery worker: it is
/// undone as soon as the database answers.
#[tokio::test]
async fn an_insert_whose_commit_was_unconfirmed_is_undone_so_503_stays_true() {
    unconfirmed_insert_is_undone("ghost", Duration::ZERO).await;
}

/// The same, with the partition lasting past half the lease: the held-back
/// insert lands 2 s after its request got 503, and the undo, which keeps
/// looking for twice the lease (6 s), still finds and deletes it before
/// the recovery worker can charge it.
#[tokio::test]
async fn an_unconfirmed_insert_that_lands_late_in_the_lease_is_still_undone() {
    unconfirmed_insert_is_undone("late-ghost", Duration::from_millis(2000)).await;
}

/// A charge under `key` whose insert is held in a partition lasting
/// `partition` after its 503 (lease 3 s): it must never be charged.
async fn unconfirmed_insert_is_undone(key: &str, partition: Duration) {
    const LEASE: Duration = Duration::from_millis(3000);
    let proxy = Proxy::start(database_address()).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.server.workers = 1;
        s.database.pool_size = 1;
        s.database.connect_timeout = Duration::from_millis(300);
        s.database.query_timeout = Duration::from_millis(500);
        s.idempotency.lease = LEASE;
        s.recovery.interval = Duration::from_millis(100);
    })
    .await;
    // Warm the one connection: the insert statement is prepared, so under the
    // partition the insert itself is what is held back.
    let warm = app.post_charge("warm", &charge_body(100)).await;
    assert_eq!(warm.status, 201);

    proxy.set_mode(ProxyMode::Stall);
    let reply = app.post_charge(key, &charge_body(200)).await;
    reply.assert_problem(503, "service_unavailable");
    tokio::time::sleep(partition).await;
    proxy.set_mode(ProxyMode::Forward);

    // Past the landed row's lease and many recovery rounds: nothing was
    // charged.
    tokio::time::sleep(LEASE + Duration::from_millis(1000)).await;
    let rows = app
        .sql()
        .await
        .query_one(
            "SELECT count(*) FROM charges WHERE client_idempotency_key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(rows, 0, "{key} was kept");
    assert_eq!(app.processor.calls(), 1, "only the warm-up charge");
    // The client's retry is a fresh charge.
    let retry = app.post_charge(key, &charge_body(200)).await;
    assert_eq!(retry.status, 201);
    assert_eq!(retry.header("idempotent-replayed"), None);
}

/// Only the database being away is worth waiting for while an outcome is
/// recorded. A statement the database refuses for good (here a trigger
/// that raises on every update of a charge) answers 500 at once, not after
/// the lease of retrying; the charge stays pending for the recovery worker,
/// its lease held, so nothing claims it never happened.
#[tokio::test]
async fn an_outcome_the_database_refuses_for_good_is_not_retried_for_the_lease() {
    let app = spawn_app_with(|s| {
        s.idempotency.lease = Duration::from_millis(5000);
        s.recovery.interval = Duration::from_secs(600);
    })
    .await;
    app.sql()
        .await
        // A check every outcome breaks: refused for good, on every shard.
        .batch_execute(
            "ALTER TABLE charges ADD CONSTRAINT refused_by_the_test \
               CHECK (status = 'pending') NOT VALID",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let reply = app.post_charge("refused", &charge_body(100)).await;
    let elapsed = started.elapsed();
    reply.assert_problem(500, "internal_error");
    assert!(
        elapsed < Duration::from_millis(2000),
        "retried a refusal for {elapsed:?}"
    );
    assert_eq!(app.processor.calls(), 1);
    assert_eq!(
        app.count("SELECT count(*) FROM charges WHERE status = 'pending' AND locked_until > now()")
            .await,
        1
    );
}

/// An app behind `proxy` that charges through `stub` (one attempt per call)
/// with a lease of `lease_ms`. The recovery worker stays out of the way: what
/// finishes a charge below is the client's retry.
async fn app_on_stub_behind(
    proxy: &Proxy,
    stub: &ProcessorStub,
    lease_ms: u64,
) -> crate::helpers::TestApp {
    let url = stub.url.clone();
    spawn_app_with(move |s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.connect_timeout = Duration::from_millis(300);
        s.database.query_timeout = Duration::from_millis(500);
        s.processor.kind = chargeonce::config::ProcessorKind::Http;
        s.processor.url = url;
        s.processor.timeout = Duration::from_millis(3000);
        s.processor.retries = 0;
        s.idempotency.lease = Duration::from_millis(lease_ms);
        s.idempotency.in_flight_wait = Duration::from_millis(200);
        s.recovery.interval = Duration::from_millis(600_000);
    })
    .await
}

/// The database is cut while the processor is working and stays away past
/// the lease, for an answer the processor gives (201) and for one that
/// leaves the outcome unknown (503). The request keeps trying to record it
/// until the lease has run out by the database's clock too, not just about:
/// the 202 comes no sooner than the lease, and a retry sent right after it,
/// with the database back, takes the charge over at once and finishes it,
/// never 409 behind the lease of a request that already gave up.
#[tokio::test]
async fn a_retry_right_after_a_202_takes_the_charge_over_at_once() {
    const LEASE_MS: u64 = 3000;
    for status in [201, 503] {
        let proxy = Proxy::start(database_address()).await;
        let stub = ProcessorStub::start(status).await;
        stub.delay(Duration::from_millis(1000));
        let app = app_on_stub_behind(&proxy, &stub, LEASE_MS).await;
        let request = charge_in_background(&app, "cut", || !stub.calls().is_empty()).await;
        proxy.set_mode(ProxyMode::Cut);

        let (elapsed, reply) = request.await.unwrap();
        assert_eq!(reply.status, 202, "{status}: {}", reply.body);
        assert_eq!(reply.json()["status"], "pending");

        proxy.set_mode(ProxyMode::Forward);
        stub.answer(201);
        stub.delay(Duration::ZERO);
        let started = Instant::now();
        let retry = app.post_charge("cut", &charge_body(1000)).await;
        assert_eq!(retry.status, 201, "{status}: {}", retry.body);
        assert!(
            started.elapsed() < Duration::from_millis(1000),
            "{status}: no wait for a stale lease"
        );
        assert!(
            elapsed >= Duration::from_millis(LEASE_MS),
            "{status}: answered 202 after {elapsed:?}, before the lease ran out"
        );
        assert_eq!(retry.json()["id"], reply.json()["id"]);
        assert_eq!(stub.calls().len(), 2, "{status}: the retry asked again");
        assert!(stub.calls().iter().all(|c| c.key == stub.calls()[0].key));
        assert_eq!(app.charge_rows().await, 1);
    }
}

/// The processor's outcome is unknown (503 after a second) and the database
/// is cut meanwhile, back after 2.5 s. The request keeps trying to record the
/// unknown outcome, which ends its lease, instead of leaving the lease held
/// for its whole length (6 s here, 30 s by default) after one try: it
/// answers 202 once the database is back, and a retry then asks the
/// processor again at once.
#[tokio::test]
async fn an_unknown_outcome_is_recorded_once_the_database_is_back_and_frees_the_lease() {
    const LEASE_MS: u64 = 6000;
    let proxy = Proxy::start(database_address()).await;
    let stub = ProcessorStub::start(503).await;
    stub.delay(Duration::from_millis(1000));
    let app = app_on_stub_behind(&proxy, &stub, LEASE_MS).await;
    let request = charge_in_background(&app, "unknown", || !stub.calls().is_empty()).await;
    proxy.set_mode(ProxyMode::Cut);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    proxy.set_mode(ProxyMode::Forward);

    let (elapsed, reply) = request.await.unwrap();
    assert_eq!(reply.status, 202, "{}", reply.body);
    assert_eq!(reply.json()["status"], "pending");
    assert!(
        elapsed >= Duration::from_millis(2000) && elapsed < Duration::from_millis(LEASE_MS),
        "recorded once the database was back, within the lease: {elapsed:?}"
    );
    // Recorded: the attempt is counted, the lease ended, the pace is set.
    let row = app
        .sql()
        .await
        .query_one(
            "SELECT processor_attempts, locked_until <= now(), next_attempt_at > now() \
             FROM charges",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    assert!(row.get::<_, bool>(1), "the lease was released");
    assert!(row.get::<_, bool>(2));

    stub.answer(201);
    stub.delay(Duration::ZERO);
    let started = Instant::now();
    let retry = app.post_charge("unknown", &charge_body(1000)).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "no wait for a lease nobody uses"
    );
    assert_eq!(retry.json()["id"], reply.json()["id"]);
    assert_eq!(stub.calls().len(), 2);
}

/// A database that stops answering in the middle of the readiness check
/// is reported as unavailable, not as a schema behind this binary: both
/// are 503, and the log's cause is what the on-call engineer reads.
#[tokio::test]
async fn readiness_tells_a_stalled_database_from_a_schema_behind() {
    use crate::processes::{start_service, Database};

    let db = Database::migrated().await;
    let proxy = Proxy::start(database_address()).await;
    let service = start_service(
        &proxy.url_for(&db.url),
        &[("CHARGEONCE__SERVER__WORKERS", "1".to_owned())],
    )
    .await;
    let readyz = || reqwest::get(format!("{}/readyz", service.url));
    // The one worker's pool holds a connection: the check gets as far as
    // asking for the schema version.
    assert_eq!(readyz().await.unwrap().status(), 200);

    proxy.set_mode(ProxyMode::Stall);
    assert_eq!(readyz().await.unwrap().status(), 503);
    let cause = service
        .wait_for_line(Duration::from_secs(5), |line| {
            line.contains("failing closed")
        })
        .await;
    assert!(cause.contains("did not answer"), "{cause}");
    assert!(!cause.contains("schema"), "{cause}");
}

/// The errors a Citus coordinator gives when a worker goes in the middle of
/// a statement are transient (503 and a retry), raised here by a real
/// PostgreSQL with Citus's SQLSTATE and words; the same codes with other
/// words stay errors (500). "failed to COPY to shard" is how a multi-row
/// INSERT's rows fail to reach the worker: a chaos run on Citus met it as a
/// 500 when a worker stopped.
#[tokio::test]
async fn a_citus_worker_lost_mid_statement_is_transient_and_other_errors_are_not() {
    let app = crate::helpers::spawn_app().await;
    let sql = app.sql().await;
    for (code, message, transient) in [
        ("58030", "failed to COPY to shard 102008 on 127.0.0.1:31934", true),
        ("XX000", "could not commit transaction for shard 102008 on at least one active node", true),
        ("XX000", "connection to the remote node postgres@127.0.0.1:31934 failed with the following error: server closed the connection unexpectedly", true),
        ("58030", "could not read block 0 in file \"base/1/2\"", false),
        ("XX000", "unexpected state", false),
    ] {
        let statement =
            format!("DO $$ BEGIN RAISE EXCEPTION '{message}' USING ERRCODE = '{code}'; END $$");
        let error = chargeonce::db::DbError::Query(sql.batch_execute(&statement).await.unwrap_err());
        assert_eq!(error.is_transient(), transient, "{code} {message}: {error:?}");
    }
}

/// Requests queued behind a batch that a stalled database holds up are
/// answered within their own bound (connect + query timeout from their
/// arrival), not after the stalled batch's deadline and then their own on
/// another stalled connection of the pool (two statement deadlines: 3.8 s
/// here before, against a bound of 2.5 s).
#[tokio::test]
async fn requests_queued_behind_a_stalled_batch_are_answered_within_their_bound() {
    const QUERY_TIMEOUT_MS: u64 = 2000;
    const CONNECT_TIMEOUT_MS: u64 = 500;
    let proxy = Proxy::start(database_address()).await;
    let app = spawn_app_with(|s| {
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        // One worker, one batch at a time, and idle connections in its pool
        // for the queued batch to take.
        s.server.workers = 1;
        s.database.pool_size = 8;
        s.database.connect_timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
        s.database.query_timeout = Duration::from_millis(QUERY_TIMEOUT_MS);
    })
    .await;
    let warm = app.post_charge("warm", &charge_body(100)).await;
    assert_eq!(warm.status, 201, "{}", warm.body);

    proxy.set_mode(ProxyMode::Stall);
    let timed = |key: String| {
        let app = &app;
        async move {
            let started = Instant::now();
            let reply = app.post_charge(&key, &charge_body(300)).await;
            (key, started.elapsed(), reply)
        }
    };
    let first = timed("first".to_owned());
    let queued = async {
        // The first request's batch holds the worker's one slot by now.
        tokio::time::sleep(Duration::from_millis(200)).await;
        futures_util::future::join_all((0..5).map(|i| timed(format!("queued-{i}")))).await
    };
    let (first, queued) = tokio::join!(first, queued);
    let bound = Duration::from_millis(QUERY_TIMEOUT_MS + CONNECT_TIMEOUT_MS);
    for (key, elapsed, reply) in std::iter::once(first).chain(queued) {
        reply.assert_problem(503, "service_unavailable");
        assert!(
            elapsed < bound + Duration::from_millis(500),
            "{key} answered after {elapsed:?}"
        );
    }
}

/// A database behind this version's migrations (the binary started with
/// `database.migrate_on_start = false` before `chargeonce migrate` ran):
/// requests are 503 and a retry, as docs/api.md says, not 500. The tables
/// the request path names do not exist yet.
#[tokio::test]
async fn a_database_behind_on_migrations_gives_503_not_500() {
    let db = crate::processes::Database::new().await;
    let mut settings = crate::helpers::test_settings(&db.url);
    settings.database.migrate_on_start = false;
    let app = chargeonce::startup::Application::build(&settings)
        .await
        .expect("build application");
    let address = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    let http = reqwest::Client::new();
    let charge = http
        .post(format!("{address}/v1/charges"))
        .bearer_auth("sk_test_not_yet")
        .header("Idempotency-Key", "k")
        .header("Content-Type", "application/json")
        .body(charge_body(100))
        .send()
        .await
        .unwrap();
    assert_eq!(charge.status(), 503);
    assert_eq!(charge.headers()["retry-after"], "1");
    let problem: serde_json::Value = charge.json().await.unwrap();
    assert_eq!(problem["code"], "service_unavailable", "{problem}");
    let readyz = reqwest::get(format!("{address}/readyz")).await.unwrap();
    assert_eq!(readyz.status(), 503);
}
