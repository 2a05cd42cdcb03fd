//! Plans that do not depend on statistics. Autovacuum may be off (it is on
//! our CI machines) or not have run yet on a new table, and a generic plan
//! cached while a table was small is kept as it grows: every statement must
//! be fast whatever the planner knows.

use std::time::{Duration, Instant};

use futures_util::StreamExt;

use chargeonce::db::{charges, Statement};

use crate::helpers::{charge_body, migrated_database, skipped_on_citus, spawn_app_with};

/// The generic plan PostgreSQL caches for `statement` on an empty table that
/// was never analyzed.
pub(crate) async fn generic_plan(client: &tokio_postgres::Client, statement: &Statement) -> String {
    let types: Vec<&str> = statement.params.iter().map(|t| t.name()).collect();
    let nulls = vec!["NULL"; types.len()].join(", ");
    client
        .batch_execute(&format!(
            "SET plan_cache_mode = force_generic_plan; DEALLOCATE ALL; \
             PREPARE s({}) AS {}",
            types.join(", "),
            statement.sql
        ))
        .await
        .unwrap();
    let rows = client
        .query(&format!("EXPLAIN EXECUTE s({nulls})"), &[])
        .await
        .unwrap();
    rows.iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn key_lookups_go_through_the_unique_index_without_statistics() {
    if skipped_on_citus(
        "key_lookups_go_through_the_unique_index_without_statistics",
        "PostgreSQL's plans of a plain table; on Citus each worker plans the statement \
         for its shard, a plain table the first pass checks",
    )
    .await
    {
        return;
    }
    let database = migrated_database().await;
    let client = database.client().await;
    for (name, statement) in [
        ("INSERT_OR_FIND", &charges::INSERT_OR_FIND),
        ("FIND_BY_KEY", &charges::STATEMENTS.find_by_key),
        ("INSERT_MANY", &charges::INSERT_MANY),
    ] {
        let plan = generic_plan(&client, statement).await;
        assert!(
            plan.contains("charges_merchant_key_unique") && !plan.contains("charges_listing"),
            "{name}:\n{plan}"
        );
    }
    // A statement that names its row by id probes the primary key, never a
    // partial index whose predicate its status condition implies (the
    // listing's `status IS NOT NULL`, the pending leases' and due
    // deliveries' `status = 'pending'`): those are read whole.
    let mut by_id = 0;
    for (name, statement) in chargeonce::db::ALL_STATEMENTS {
        if statement.sql.contains("WHERE id = $1 AND")
            || statement
                .sql
                .contains("WHERE merchant_id = $1 AND id = $2 AND")
        {
            by_id += 1;
            let plan = generic_plan(&client, statement).await;
            assert!(
                !["_pending_lease", "_due"]
                    .iter()
                    .any(|partial| plan.contains(partial)),
                "{name}:\n{plan}"
            );
            // Any other index is probed on its leading columns: the
            // primary key by id, an index of held keys by id, or a
            // (merchant_id, id) index by both.
            let lines: Vec<&str> = plan.lines().collect();
            for (line, next) in lines.iter().zip(lines.iter().skip(1)) {
                if line.contains("Index Scan using") && !line.contains("_pkey") {
                    assert!(
                        next.contains("merchant_id = ") || next.contains("(id = $2)"),
                        "{name}:\n{plan}"
                    );
                }
            }
        }
    }
    assert!(by_id >= 12, "the statements by id were found ({by_id})");
    let plan = generic_plan(&client, &charges::STATEMENTS.list).await;
    assert!(plan.contains("charges_listing"), "LIST:\n{plan}");
}

/// The dispatcher's settling of many deliveries by id reads them by the
/// primary key, in the generic plan of an empty table, which a connection
/// keeps as the table grows: not the merchant's whole range of another
/// index, as a join with the endpoints made the planner choose.
#[tokio::test]
async fn settling_probes_the_ids_it_is_given() {
    if skipped_on_citus(
        "settling_probes_the_ids_it_is_given",
        "PostgreSQL's plans of a plain table; the first pass checks them",
    )
    .await
    {
        return;
    }
    let database = migrated_database().await;
    let client = database.client().await;
    use chargeonce::db::webhook_deliveries::{GIVE_UP, HOLD};
    for statement in [HOLD, GIVE_UP] {
        let plan = generic_plan(&client, &statement).await;
        let deliveries: Vec<&str> = plan
            .lines()
            .filter(|line| line.contains("Scan") && line.contains(" on webhook_deliveries"))
            .collect();
        assert_eq!(deliveries.len(), 2, "the lock and the update:\n{plan}");
        for line in deliveries {
            assert!(
                line.contains("using webhook_deliveries_pkey") || line.contains("Bitmap Heap Scan"),
                "{line}\n{plan}"
            );
        }
        assert!(
            !plan.contains("one_per_endpoint") && !plan.contains("webhook_deliveries_due"),
            "{plan}"
        );
    }
}

/// The statements of a new charge, `charges::INSERT_MANY` (a batch) and
/// `charges::RECORD_OUTCOME` (each outcome of a batch), are planned once
/// per connection: after PostgreSQL's trial plans (five, made with the
/// parameters), they run on the plan made without them, whose probes the
/// tests above check, instead of being planned again at every execution
/// (planning was 0.35 ms of a 0.85 ms insert of six charges).
#[tokio::test]
async fn batches_of_new_charges_are_planned_once_per_connection() {
    if skipped_on_citus("batches_of_new_charges_are_planned_once_per_connection", "Citus plans a parameterised statement again at every execution on the coordinator (docs/scaling.md)").await {
        return;
    }
    let database = migrated_database().await;
    let client = database.client().await;
    let merchant = uuid::Uuid::now_v7();
    client
        .execute(
            "INSERT INTO merchants (id, name) VALUES ($1, 'Plans')",
            &[&merchant],
        )
        .await
        .unwrap();
    let prepare = |statement: &'static chargeonce::db::Statement| {
        client.prepare_typed(statement.sql, statement.params)
    };
    let insert = prepare(&charges::INSERT_MANY).await.unwrap();
    let record = prepare(&charges::STATEMENTS.record_outcome).await.unwrap();
    const BATCH: usize = 6;
    const EXECUTIONS: i64 = 12;
    for execution in 0..EXECUTIONS {
        let mut ids: Vec<uuid::Uuid> = (0..BATCH).map(|_| uuid::Uuid::now_v7()).collect();
        ids.sort();
        let keys: Vec<String> = (0..BATCH)
            .map(|n| format!("plan-{execution}-{n}"))
            .collect();
        let nothing = vec![None::<&str>; BATCH];
        let empty = vec![tokio_postgres::types::Json(serde_json::json!({})); BATCH];
        let inserted = client
            .query(
                &insert,
                &[
                    &ids,
                    &merchant,
                    &keys,
                    &vec![vec![7u8; 32]; BATCH],
                    &vec![100i64; BATCH],
                    &vec!["USD"; BATCH],
                    &nothing,
                    &nothing,
                    &empty,
                    &30_000i64,
                ],
            )
            .await
            .unwrap();
        assert_eq!(
            inserted.len(),
            BATCH,
            "every charge of the batch was inserted"
        );
        for id in &ids {
            let recorded = client
                .query(
                    &record,
                    &[
                        &merchant,
                        id,
                        &"succeeded",
                        &None::<&str>,
                        &None::<&str>,
                        &"pay_plans",
                    ],
                )
                .await
                .unwrap();
            assert_eq!(recorded.len(), 1, "the outcome was recorded");
        }
    }
    for (statement, executions) in [
        (&charges::INSERT_MANY, EXECUTIONS),
        (
            &charges::STATEMENTS.record_outcome,
            EXECUTIONS * BATCH as i64,
        ),
    ] {
        let row = client
            .query_one(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
                  WHERE statement = $1",
                &[&statement.sql],
            )
            .await
            .unwrap();
        let (generic, custom): (i64, i64) = (row.get(0), row.get(1));
        assert!(
            custom <= 5 && generic == executions - custom,
            "{custom} executions were planned for their parameters, \
             {generic} ran on the plan made once:\n{}",
            statement.sql
        );
    }
    let succeeded: i64 = client
        .query_one(
            "SELECT count(*) FROM charges WHERE status = 'succeeded' AND locked_until IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(succeeded, EXECUTIONS * BATCH as i64);
}

/// Median time of 100 replays of charges `keys` (created with
/// `charge_body(100)`).
async fn replay_p50(app: &crate::helpers::TestApp, keys: &[String]) -> Duration {
    let mut took = Vec::new();
    for key in keys.iter().cycle().take(100) {
        let started = Instant::now();
        let replay = app.post_charge(key, &charge_body(100)).await;
        took.push(started.elapsed());
        assert_eq!(
            replay.header("idempotent-replayed"),
            Some("true"),
            "{}",
            replay.body
        );
    }
    took.sort();
    took[took.len() / 2]
}

/// Index scans PostgreSQL has counted on the indexes of `charges` that are
/// `index` or, with `other`, those that could serve a lookup by merchant
/// (the others that lead with `merchant_id`; the rest, such as the partial
/// index of pending leases that an outcome's update may read while the
/// table is tiny, cannot serve a replay).
/// Backends report them when they go idle (at most every 10 s), so this
/// waits for `at_least`.
async fn index_scans(
    client: &tokio_postgres::Client,
    index: &str,
    other: bool,
    at_least: i64,
) -> i64 {
    count_reaching(
        client,
        "SELECT coalesce(sum(idx_scan), 0)::bigint \
           FROM pg_stat_user_indexes JOIN pg_indexes \
                ON indexname = indexrelname AND tablename = relname \
          WHERE relname = 'charges' AND indexdef ~ 'USING btree \\(merchant_id' \
            AND (indexrelname = $1) <> $2",
        &[&index, &other],
        at_least,
        Duration::from_secs(15),
    )
    .await
}

/// The count `sql` answers, once it reaches `at_least` or `patience` has
/// passed: PostgreSQL's statistics arrive when a backend reports them, and
/// another session's waits when it gets there.
pub(crate) async fn count_reaching(
    client: &tokio_postgres::Client,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    at_least: i64,
    patience: Duration,
) -> i64 {
    let started = Instant::now();
    loop {
        let count: i64 = client.query_one(sql, params).await.unwrap().get(0);
        if count >= at_least || started.elapsed() > patience {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `count` final charges of the app's merchant, inserted in bulk as rows
/// the service writes (creating 50,000 one by one takes minutes).
async fn insert_charges_in_bulk(sql: &tokio_postgres::Client, count: usize) {
    sql.batch_execute(&format!(
        "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                              amount, currency, status) \
         SELECT gen_random_uuid(), m.id, 'bulk-' || g, sha256(g::text::bytea), 100, 'USD', \
                'succeeded' \
           FROM merchants m, generate_series(1, {count}) g"
    ))
    .await
    .unwrap();
}

/// `count` charges of the app's merchant created through the service, 64
/// requests at a time, keys `{prefix}-0` and on.
async fn create_through_the_service(app: &crate::helpers::TestApp, prefix: &str, count: usize) {
    let body = charge_body(100);
    futures_util::stream::iter(0..count)
        .map(|n| {
            let (key, body) = (format!("{prefix}-{n}"), &body);
            async move { app.post_charge(&key, body).await }
        })
        .buffer_unordered(64)
        .for_each(|reply| async move { assert_eq!(reply.status, 201, "{}", reply.body) })
        .await;
}

/// The replay statement (`charges::INSERT_OR_FIND`, which a batch's taken
/// key goes through) prepared as `name` on `client`.
async fn prepare_replay(client: &tokio_postgres::Client, name: &str) {
    let statement = &charges::INSERT_OR_FIND;
    let types: Vec<&str> = statement.params.iter().map(|t| t.name()).collect();
    client
        .batch_execute(&format!(
            "PREPARE {name}({}) AS {}",
            types.join(", "),
            statement.sql
        ))
        .await
        .unwrap();
}

/// Runs the statement prepared as `name` to replay `key` of the only
/// merchant under EXPLAIN (ANALYZE, BUFFERS), the way the service does it
/// (the key exists, so nothing is inserted; rolled back all the same); the
/// most shared buffers (hit or read) any plan node counts, its children
/// included, and the plan.
async fn replay_buffers(client: &tokio_postgres::Client, name: &str, key: &str) -> (u64, String) {
    let merchant: uuid::Uuid = client
        .query_one("SELECT id FROM merchants", &[])
        .await
        .unwrap()
        .get(0);
    client.batch_execute("BEGIN").await.unwrap();
    let rows = client
        .query(
            &format!(
                "EXPLAIN (ANALYZE, BUFFERS, SUMMARY OFF) EXECUTE {name}(\
                 gen_random_uuid(), '{merchant}'::uuid, '{key}', sha256('replay'), 100, \
                 'USD', NULL, NULL, '{{}}'::jsonb, 30000)"
            ),
            &[],
        )
        .await
        .unwrap();
    client.batch_execute("ROLLBACK").await.unwrap();
    let plan: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    let most = plan
        .iter()
        .take_while(|line| !line.trim_start().starts_with("Planning"))
        .filter_map(|line| line.split_once("Buffers:"))
        .map(|(_, counts)| {
            counts
                .split_whitespace()
                .filter_map(|count| {
                    let (kind, n) = count.split_once('=')?;
                    ["hit", "read"]
                        .contains(&kind)
                        .then(|| n.parse::<u64>().ok())?
                })
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0);
    (most, plan.join("\n"))
}

/// The finding behind it: with autovacuum off, 43,000 charges made a replay
/// take 19 ms (it read every charge of the merchant) until someone ran
/// ANALYZE. Here the service prepares its statements while the table is
/// small, then 50,000 charges arrive with no ANALYZE: CHARGES_BY_SERVICE of
/// them created through the service, the rest inserted in bulk as the rows
/// the service writes (creating all 50,000 one by one takes minutes in a
/// debug build). Replays must still find their key through the unique
/// index:
/// - PostgreSQL's own counts of index scans say which index the service's
///   replays used (through the listing index the replay median was 30
///   times the small table's);
/// - the replay statement, planned while the table was small (a generic
///   plan, as a connection caches it) and planned now (a custom plan, as a
///   new connection makes it), touches a handful of buffers on the table
///   that was never analysed: a probe of the unique index, where reading
///   the merchant's charges would touch hundreds.
///
/// The replay median is printed, not asserted: on a loaded machine times are
/// noise, and speed targets are for the benchmarks (BENCHMARKS.md); the
/// buffer counts stand for "fast" deterministically.
#[tokio::test]
async fn replays_stay_fast_without_analyze_as_the_table_grows() {
    if skipped_on_citus(
        "replays_stay_fast_without_analyze_as_the_table_grows",
        "PostgreSQL's plans of a plain table; on Citus each worker plans the statement \
         for its shard, a plain table the first pass checks",
    )
    .await
    {
        return;
    }
    /// Charges created through the service before the bulk insert.
    const CHARGES_BY_SERVICE: usize = 2_000;
    /// What a replay may touch: a few levels of two index probes and a
    /// heap page; all of a merchant's 50,000 charges are over a thousand.
    const MAX_BUFFERS: u64 = 40;
    let app = spawn_app_with(|s| {
        // One connection, so the replays below run on the one that prepared
        // its statements while the table was small.
        s.server.workers = 1;
        s.database.pool_size = 1;
        s.recovery.interval = Duration::from_secs(600);
        s.idempotency.sweep_interval = Duration::from_secs(600);
        // The replays must reach the database: their plan is under test.
        s.idempotency.replay_cache_bytes = 0;
    })
    .await;
    let sql = app.sql().await;
    sql.batch_execute("ALTER TABLE charges SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let keys: Vec<String> = (0..10).map(|i| format!("early-{i}")).collect();
    for key in &keys {
        assert_eq!(app.post_charge(key, &charge_body(100)).await.status, 201);
    }
    let small = replay_p50(&app, &keys).await;
    // The generic plan a connection caches while the table is small (made
    // at the first execution, kept as long as the table's definition).
    sql.batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    prepare_replay(&sql, "small").await;
    replay_buffers(&sql, "small", "early-0").await;

    let created = Instant::now();
    create_through_the_service(&app, "service", CHARGES_BY_SERVICE).await;
    println!(
        "{CHARGES_BY_SERVICE} charges created through the service in {:?}",
        created.elapsed()
    );
    insert_charges_in_bulk(&sql, 50_000 - CHARGES_BY_SERVICE).await;
    let analyzed: Option<bool> = sql
        .query_one(
            "SELECT last_analyze IS NOT NULL OR last_autoanalyze IS NOT NULL \
             FROM pg_stat_user_tables WHERE relname = 'charges'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(analyzed, Some(false), "nobody analyzed the table");

    const UNIQUE: &str = "charges_merchant_key_unique";
    let unique_before = index_scans(&sql, UNIQUE, false, 0).await;
    let others_before = index_scans(&sql, UNIQUE, true, 0).await;
    let large = replay_p50(&app, &keys).await;
    println!("replay p50 {small:?} at 10 charges, {large:?} at 50,010");
    // Once the replays' scans are reported, no other index may have been
    // read (the recovery worker and the sweeper are kept out of the way).
    let unique_after = index_scans(&sql, UNIQUE, false, unique_before + 100).await;
    assert!(
        unique_after >= unique_before + 100,
        "the replays' scans were reported"
    );
    assert_eq!(
        index_scans(&sql, UNIQUE, true, 0).await,
        others_before,
        "a replay read another index of charges than the unique key"
    );

    // The plan cached while small, and one made now, on both kinds of key.
    sql.batch_execute("SET plan_cache_mode = auto")
        .await
        .unwrap();
    prepare_replay(&sql, "large").await;
    for (name, key) in [
        ("small", "early-1"),
        ("small", "service-1999"),
        ("large", "early-2"),
        ("large", "service-1234"),
    ] {
        let (buffers, plan) = replay_buffers(&sql, name, key).await;
        println!("replay of {key} ({name} plan): {buffers} buffers");
        assert!(
            buffers <= MAX_BUFFERS,
            "a replay ({name} plan) touched {buffers} buffers:\n{plan}"
        );
        assert!(plan.contains(UNIQUE), "{name}:\n{plan}");
    }
    // The measure tells a probe from a scan: the same replay made to read
    // the table (no index scans) touches hundreds of buffers.
    sql.batch_execute("SET enable_indexscan = off; SET enable_bitmapscan = off")
        .await
        .unwrap();
    prepare_replay(&sql, "scan").await;
    // (The charge inserted last: a scan that stops at its row reads them all.)
    let last = format!("bulk-{}", 50_000 - CHARGES_BY_SERVICE);
    let (buffers, plan) = replay_buffers(&sql, "scan", &last).await;
    println!("replay of {last} read by a scan: {buffers} buffers");
    assert!(buffers > 10 * MAX_BUFFERS, "{buffers} buffers:\n{plan}");
}

/// Rows of `charges` read by whole-table scans or fetched through an
/// index, by PostgreSQL's counts, once they reach `at_least` or 12 s have
/// passed (a backend reports its counts when it goes idle, or up to 10 s
/// later if it reported within the last second).
async fn charges_read(client: &tokio_postgres::Client, at_least: i64) -> i64 {
    count_reaching(
        client,
        "SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_user_tables \
          WHERE relname = 'charges'",
        &[],
        at_least,
        Duration::from_secs(12),
    )
    .await
}

/// Sixteen new charges at once, keys `{round}-0` to `-15`.
async fn burst(app: &crate::helpers::TestApp, round: &str) {
    let keys: Vec<String> = (0..16).map(|i| format!("{round}-{i}")).collect();
    let body = charge_body(100);
    let replies =
        futures_util::future::join_all(keys.iter().map(|key| app.post_charge(key, &body))).await;
    for reply in replies {
        assert_eq!(reply.status, 201, "{}", reply.body);
    }
}

/// The outcome's statements are planned once per connection, so a plan
/// made while the table is small must not read all of it, or all of the
/// merchant's rows, once it has grown: an `UPDATE … FROM` a batch's ids
/// read the table whole, and one joining them as an array read the
/// merchant's range of an index (`db::records`). Here batches of outcomes
/// are recorded while the table is small (one outcome slot, many requests
/// at once), 50,000 charges of the same merchant arrive with no ANALYZE,
/// and new charges then never read them all, by PostgreSQL's own counts.
#[tokio::test]
async fn outcome_batches_stop_reading_the_table_whole_as_it_grows() {
    let app = spawn_app_with(|s| {
        s.server.workers = 1;
        // One batch of outcomes at a time (`db::batch::slots`), so the
        // requests below queue and go in batches.
        s.database.pool_size = 4;
        s.database.batch_rows = 64;
        s.processor.latency = Duration::from_millis(20);
        s.recovery.interval = Duration::from_secs(600);
        s.idempotency.sweep_interval = Duration::from_secs(600);
    })
    .await;
    let sql = app.sql().await;
    sql.batch_execute("ALTER TABLE charges SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    for round in [
        "small-1", "small-2", "small-3", "small-4", "small-5", "small-6",
    ] {
        burst(&app, round).await;
    }

    insert_charges_in_bulk(&sql, 50_000).await;
    for round in ["large-1", "large-2", "large-3", "large-4"] {
        burst(&app, round).await;
    }
    // While the table was small, its rows may have been read whole (a few
    // hundred in all), and each charge's statements fetch a few rows by
    // index; one read of the merchant's rows in the large table is 50,000.
    let read = charges_read(&sql, 50_000).await;
    assert!(
        read < 50_000,
        "a statement read all 50,000 charges ({read} rows read whole or by index)"
    );
}
