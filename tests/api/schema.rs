//! The schema enforces what the service validates: a row the service would
//! refuse cannot be written by anything else either (migration V5 rewrote
//! the key check in a cheaper form; it must mean the same).

use chargeonce::domain::IdempotencyKey;

use crate::helpers::migrated_database;

/// Every key the service accepts is a key the database accepts, and the
/// other way round, for all three tables that hold keys.
#[tokio::test]
async fn the_key_check_accepts_exactly_the_keys_the_service_accepts() {
    let database = migrated_database().await;
    let client = database.client().await;
    client
        .batch_execute(
            "INSERT INTO merchants (id, name) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'm')",
        )
        .await
        .unwrap();

    // Every character up to U+00FF (NUL cannot be stored in text), alone
    // and inside a key, and the lengths around the limit.
    let mut keys: Vec<String> = (1u8..=255)
        .flat_map(|byte| {
            let c = char::from(byte);
            [c.to_string(), format!("key-{c}-end")]
        })
        .collect();
    keys.extend(["", "a", "€", "key\u{2028}"].map(str::to_owned));
    for len in [254, 255, 256, 1000] {
        keys.push("k".repeat(len));
    }

    let statements = [
        "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                              amount, currency, status) \
         VALUES (gen_random_uuid(), '00000000-0000-7000-8000-000000000001', $1, \
                 sha256('x'), 100, 'USD', 'succeeded')",
        "UPDATE charges SET client_idempotency_key = $1 \
          WHERE id = (SELECT id FROM charges LIMIT 1)",
    ];
    let mut checked = 0;
    for key in &keys {
        // parse also takes a key in quotes and drops them; the column holds
        // what parse returns, so a key it changes is not one to store.
        let service_accepts = IdempotencyKey::parse(key).is_ok_and(|k| k.as_str() == key);
        for statement in statements {
            // One row, for the UPDATE to change.
            client.batch_execute("DELETE FROM charges").await.unwrap();
            client.execute(statements[0], &[&"seed"]).await.unwrap();
            let stored = client.execute(statement, &[key]).await;
            assert_eq!(
                stored.is_ok(),
                service_accepts,
                "{key:?} ({} bytes): {stored:?}",
                key.len()
            );
            checked += 1;
        }
    }
    assert!(checked > 1000);

    // The other tables that hold keys check them with the same expression.
    let definitions: Vec<String> = client
        .query(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
              WHERE conname IN ('charges_key_format', 'refunds_key_format', \
                                'webhook_endpoints_key_format')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(definitions.len(), 3);
    assert!(
        definitions.iter().all(|d| *d == definitions[0]),
        "{definitions:#?}"
    );
}

/// Tables that are not distributed by merchant: the tenant table itself,
/// the key lookup (found by digest before the merchant is known) and
/// refinery's history. docs/scaling.md: reference tables on Citus.
const NOT_PER_MERCHANT: [&str; 3] = ["merchants", "api_keys", "refinery_schema_history"];

/// Statements that work for every merchant by design (the background
/// workers' scans, docs/scaling.md "Background workers"), or that read only
/// the tables above. The workers' scans only read: what they find is
/// claimed, released, fanned out or deleted merchant by merchant.
const ACROSS_MERCHANTS: [&str; 13] = [
    "charges::ABANDONED",
    "charges::EXPIRED_KEYS",
    "refunds::ABANDONED",
    "refunds::EXPIRED_KEYS",
    "events::QUEUED",
    "events::EXPIRED",
    "events::BACKLOG",
    "webhook_deliveries::DUE",
    "merchants::CREATE",
    "merchants::ENSURE",
    "merchants::FIND_BY_DIGEST",
    "db::APPLIED_MIGRATION",
    "db::DATABASE_NOW",
];

/// Ready for distribution on `merchant_id` (Citus requires it of a
/// distributed table): every primary key, unique constraint and unique
/// index of a per-merchant table includes `merchant_id`, and so does every
/// foreign key between two of them. A table without `merchant_id` must be
/// one of the known exceptions, so a new table cannot slip past.
#[tokio::test]
async fn every_key_of_a_per_merchant_table_includes_merchant_id() {
    let database = migrated_database().await;
    let client = database.client().await;
    let tables: Vec<(String, bool)> = client
        .query(
            "SELECT c.relname::text, \
                    EXISTS (SELECT 1 FROM pg_attribute a \
                             WHERE a.attrelid = c.oid AND a.attname = 'merchant_id' \
                               AND NOT a.attisdropped) \
               FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') \
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let per_merchant: Vec<&str> = tables
        .iter()
        .filter(|(name, _)| !NOT_PER_MERCHANT.contains(&name.as_str()))
        .map(|(name, _)| name.as_str())
        .collect();
    for (name, has_merchant) in &tables {
        assert!(
            *has_merchant || NOT_PER_MERCHANT.contains(&name.as_str()),
            "table {name} has no merchant_id and is not a known exception"
        );
    }
    assert_eq!(
        per_merchant,
        [
            "charges",
            "event_queue",
            "events",
            "refunds",
            "webhook_attempts",
            "webhook_deliveries",
            "webhook_endpoints"
        ]
    );

    // Unique indexes cover primary keys and unique constraints too.
    let unique: Vec<(String, String, String)> = client
        .query(
            "SELECT t.relname::text, i.relname::text, pg_get_indexdef(i.oid) \
               FROM pg_index x \
               JOIN pg_class i ON i.oid = x.indexrelid \
               JOIN pg_class t ON t.oid = x.indrelid \
               JOIN pg_namespace n ON n.oid = t.relnamespace \
              WHERE n.nspname = 'public' AND x.indisunique \
                AND t.relname = ANY($1) \
                AND NOT EXISTS (SELECT 1 FROM pg_attribute a \
                                 WHERE a.attrelid = t.oid AND a.attname = 'merchant_id' \
                                   AND a.attnum = ANY(x.indkey))",
            &[&per_merchant],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    assert!(unique.is_empty(), "unique without merchant_id: {unique:#?}");
    let counted: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_index x JOIN pg_class t ON t.oid = x.indrelid \
              WHERE x.indisunique AND t.relname = ANY($1)",
            &[&per_merchant],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        counted >= 13,
        "primary keys and uniques were found ({counted})"
    );

    let foreign: Vec<(String, String)> = client
        .query(
            "SELECT conname::text, pg_get_constraintdef(c.oid) \
               FROM pg_constraint c \
               JOIN pg_class t ON t.oid = c.conrelid \
               JOIN pg_class r ON r.oid = c.confrelid \
              WHERE c.contype = 'f' AND t.relname = ANY($1) AND r.relname = ANY($1) \
                AND NOT (EXISTS (SELECT 1 FROM pg_attribute a \
                                  WHERE a.attrelid = t.oid AND a.attname = 'merchant_id' \
                                    AND a.attnum = ANY(c.conkey)) \
                     AND EXISTS (SELECT 1 FROM pg_attribute a \
                                  WHERE a.attrelid = r.oid AND a.attname = 'merchant_id' \
                                    AND a.attnum = ANY(c.confkey)))",
            &[&per_merchant],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    assert!(
        foreign.is_empty(),
        "foreign keys without merchant_id: {foreign:#?}"
    );
}

/// A table scan in an EXPLAIN text: the relation it reads (after " on ")
/// and its own detail lines.
struct Scan {
    relation: String,
    conditions: Vec<String>,
}

fn scans(plan: &str) -> Vec<Scan> {
    // Every node with its detail lines.
    let mut nodes: Vec<(String, Vec<String>)> = Vec::new();
    for line in plan.lines() {
        let trimmed = line.trim_start();
        let text = trimmed.trim_start_matches("-> ").trim_start();
        if trimmed.starts_with("->") || !line.starts_with(' ') {
            nodes.push((text.to_owned(), Vec::new()));
        } else if let Some(node) = nodes.last_mut() {
            node.1.push(text.to_owned());
        }
    }
    // "Index Scan using charges_pkey on charges c  (cost=…)"; a bitmap index
    // scan names an index, its heap scan the table; CTE, function and
    // subquery scans read no table.
    const TABLE_SCANS: [&str; 5] = [
        "Seq Scan",
        "Index Scan",
        "Index Only Scan",
        "Bitmap Heap Scan",
        "Tid Scan",
    ];
    let mut scans = Vec::new();
    for (text, conditions) in nodes {
        if !TABLE_SCANS.iter().any(|scan| text.starts_with(scan)) {
            continue;
        }
        if let Some((_, after)) = text.split_once(" on ") {
            scans.push(Scan {
                relation: after.split_whitespace().next().unwrap_or("").to_owned(),
                conditions,
            });
        }
    }
    scans
}

/// Ready for routing to one node: every statement the request path runs
/// reads a per-merchant table only by conditions that include the merchant
/// (a parameter, or the merchant of a row the same statement found by it),
/// checked in the generic plans PostgreSQL makes for them. Before, six
/// statements (the takeover, the unknown and the final outcome of charges
/// and refunds) found their row by `id` alone. Inserts carry their
/// merchant as a value; the workers' scans are the listed exceptions.
#[tokio::test]
async fn every_request_path_statement_filters_by_merchant() {
    if crate::helpers::skipped_on_citus(
        "every_request_path_statement_filters_by_merchant",
        "it reads PostgreSQL's plans of plain tables; on Citus \
         on_citus_every_request_path_statement_contacts_one_worker checks the routing",
    )
    .await
    {
        return;
    }
    let database = migrated_database().await;
    let client = database.client().await;
    let mut checked = 0;
    let mut unpinned = Vec::new();
    for (name, statement) in chargeonce::db::ALL_STATEMENTS {
        if ACROSS_MERCHANTS.contains(name) {
            continue;
        }
        let plan = crate::plans::generic_plan(&client, statement).await;
        for Scan {
            relation,
            conditions,
        } in scans(&plan)
        {
            if NOT_PER_MERCHANT.contains(&relation.as_str()) {
                continue;
            }
            checked += 1;
            let own = conditions
                .iter()
                .any(|c| c.contains("Cond:") || c.starts_with("Filter:"))
                && conditions.iter().any(|c| c.contains("merchant_id = "));
            if !own {
                unpinned.push(format!("{name} reads {relation}:\n{plan}"));
            }
        }
    }
    assert!(unpinned.is_empty(), "{}", unpinned.join("\n\n"));
    assert!(checked >= 30, "scans were found ({checked})");

    // The exceptions are exactly the statements that do not pin a
    // merchant: one that does belongs above.
    for name in ACROSS_MERCHANTS {
        let (_, statement) = chargeonce::db::ALL_STATEMENTS
            .iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name} is not a statement"));
        assert!(
            !statement.sql.contains("merchant_id = $"),
            "{name} filters by merchant: it is not an exception"
        );
    }
}

/// An event is written by a statement of its own, in the transaction of
/// the state change it records, and queued by `events::QUEUE` after it (an
/// INSERT inside a CTE would make Citus send its result to every worker).
/// So that a request that lost the race to record a change adds nothing,
/// each such statement reads its row by merchant and id as the transaction
/// left it and adds at most one event per row and type.
#[test]
fn every_statement_that_writes_an_event_adds_one_per_change() {
    let mut writers = 0;
    for (name, statement) in chargeonce::db::ALL_STATEMENTS {
        let sql = statement.sql;
        if !sql.contains("INSERT INTO events") {
            continue;
        }
        writers += 1;
        assert!(
            name.ends_with("_EVENT")
                && !sql.contains("WITH ")
                && !sql.contains("event_queue")
                && sql.contains("WHERE merchant_id = $1 AND id = $2")
                && sql.contains("_id IS NOT NULL DO NOTHING"),
            "{name} does not add at most one event per row and type on its own: {sql}"
        );
    }
    assert_eq!(writers, 3, "the statements that write events");
}

/// Every table of the schema states where it lives on Citus
/// (`chargeonce::db::citus::TABLES`): a table a migration adds without a
/// placement fails here, on plain PostgreSQL too. The per-merchant ones are
/// exactly those distributed by merchant.
#[tokio::test]
async fn every_table_has_a_placement_on_citus() {
    use chargeonce::db::citus::{Placement, TABLES};
    let database = migrated_database().await;
    let client = database.client().await;
    let mut tables: Vec<String> = client
        .query(
            "SELECT c.relname::text FROM pg_class c \
               JOIN pg_namespace n ON n.oid = c.relnamespace \
              WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') \
                AND c.relname <> 'refinery_schema_history'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    tables.sort();
    let mut placed: Vec<&str> = TABLES.iter().map(|(name, _)| *name).collect();
    placed.sort_unstable();
    assert_eq!(
        tables, placed,
        "a table without a placement, or a placement without a table"
    );
    assert_eq!(
        TABLES[0],
        ("charges", Placement::ByMerchant),
        "the co-location anchor comes first"
    );
    for (name, placement) in TABLES {
        assert_eq!(
            placement == Placement::Reference,
            NOT_PER_MERCHANT.contains(&name),
            "{name}: {placement:?}"
        );
    }
}

/// Whether the database is on a Citus cluster; if not, says why the test
/// calling it checks less.
async fn on_citus(client: &tokio_postgres::Client, test: &str) -> bool {
    let citus: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if !citus {
        eprintln!(
            "{test}: the Citus checks are skipped: this is plain PostgreSQL (no citus \
             extension); the Citus pass of scripts/dev test runs them"
        );
    }
    citus
}

/// On Citus, migrating distributed every per-merchant table on
/// `merchant_id`, all co-located with `charges`, with shards on more than
/// one node, and made the tenant tables reference tables; refinery's history
/// stayed a plain table. Migrating again changes nothing.
#[tokio::test]
async fn on_citus_every_table_is_placed_as_intended() {
    use chargeonce::db::citus::{Placement, TABLES};
    let database = migrated_database().await;
    let mut client = database.client().await;
    // Placing again finds nothing left to place, with Citus or without.
    let placed = chargeonce::db::citus::distribute(&mut client)
        .await
        .unwrap();
    assert_eq!(placed, 0);
    if !on_citus(&client, "on_citus_every_table_is_placed_as_intended").await {
        return;
    }
    let rows = client
        .query(
            "SELECT logicalrelid::text, partmethod::text, repmodel::text, colocationid, \
                    CASE WHEN partmethod = 'h' \
                         THEN column_to_column_name(logicalrelid, partkey) END, \
                    (SELECT count(DISTINCT nodeport) FROM pg_dist_shard s \
                       JOIN pg_dist_shard_placement p USING (shardid) \
                      WHERE s.logicalrelid = d.logicalrelid) \
               FROM pg_dist_partition d",
            &[],
        )
        .await
        .unwrap();
    let found: std::collections::HashMap<String, (String, String, i32, Option<String>, i64)> = rows
        .iter()
        .map(|row| {
            (
                row.get(0),
                (row.get(1), row.get(2), row.get(3), row.get(4), row.get(5)),
            )
        })
        .collect();
    assert!(
        !found.contains_key("refinery_schema_history"),
        "refinery's history is a Citus table: {found:#?}"
    );
    let anchor = found.get("charges").map(|c| c.2);
    for (name, placement) in TABLES {
        let (method, model, colocation, column, nodes) = found
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not placed: {found:#?}"));
        match placement {
            Placement::ByMerchant => {
                assert_eq!(method, "h", "{name} is not hash-distributed");
                assert_eq!(column.as_deref(), Some("merchant_id"), "{name}");
                assert_eq!(
                    Some(*colocation),
                    anchor,
                    "{name} is not co-located with charges"
                );
                assert!(*nodes >= 2, "{name}'s shards are on {nodes} node(s)");
            }
            Placement::Reference => {
                assert_eq!(
                    (method.as_str(), model.as_str()),
                    ("n", "t"),
                    "{name} is not a reference table"
                );
            }
        }
    }
    assert_eq!(
        found.len(),
        TABLES.len(),
        "Citus knows other tables: {found:#?}"
    );
}

/// The convention for a table added by a later migration
/// (migrations/V8__table_placement.sql), run the way the migration runner
/// runs a file: one query string in a transaction. The statements are in a
/// DO block; the table is created without foreign keys, placed with
/// `place_table`, then given its keys. On Citus it ends up distributed and
/// co-located; on plain PostgreSQL `place_table` does nothing. Either way
/// it is idempotent and refuses an unknown placement.
#[tokio::test]
async fn a_new_table_is_placed_by_its_migration() {
    const MIGRATION: &str = "\
        -- Version N: disputes.
        DO $$ BEGIN
        CREATE TABLE disputes (id uuid NOT NULL, merchant_id uuid NOT NULL,
                               charge_id uuid NOT NULL, PRIMARY KEY (id, merchant_id));
        PERFORM place_table('disputes', 'by_merchant');
        PERFORM place_table('disputes', 'by_merchant');
        ALTER TABLE disputes ADD CONSTRAINT disputes_charge_fkey
            FOREIGN KEY (charge_id, merchant_id) REFERENCES charges (id, merchant_id);
        ALTER TABLE disputes ADD CONSTRAINT disputes_merchant_fkey
            FOREIGN KEY (merchant_id) REFERENCES merchants (id);
        CREATE INDEX disputes_of_charge ON disputes (charge_id, merchant_id);
        END $$;";
    let database = migrated_database().await;
    let mut client = database.client().await;
    let citus = on_citus(&client, "a_new_table_is_placed_by_its_migration").await;
    let transaction = client.transaction().await.unwrap();
    transaction.batch_execute(MIGRATION).await.unwrap();
    transaction.commit().await.unwrap();
    let refused = client
        .batch_execute("SELECT place_table('disputes', 'somewhere')")
        .await
        .unwrap_err();
    let message = refused.as_db_error().map(|e| e.message().to_owned());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("by_merchant or reference")),
        "{refused:?}"
    );
    if citus {
        let co_located: bool = client
            .query_one(
                "SELECT (SELECT colocationid FROM pg_dist_partition \
                          WHERE logicalrelid = 'disputes'::regclass AND partmethod = 'h') \
                        = (SELECT colocationid FROM pg_dist_partition \
                            WHERE logicalrelid = 'charges'::regclass)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(co_located, "disputes is not distributed with charges");
    }
}

/// Every migration after V8 keeps its statements in one DO block
/// (migrations/V8__table_placement.sql says why: on Citus, most DDL sent
/// in a multi-statement query string fails on the workers).
#[test]
fn migrations_after_v8_run_in_one_do_block() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let version: u32 = name
            .strip_prefix('V')
            .and_then(|rest| rest.split("__").next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} is not named V<version>__<name>.sql"));
        if version <= 8 {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with("--"))
            .collect();
        let (first, last) = (code.first().copied(), code.last().copied());
        assert!(
            first.is_some_and(|line| line.starts_with("DO $$"))
                && last.is_some_and(|line| line.ends_with("$$;"))
                && code.iter().filter(|line| line.contains("$$")).count() == 2,
            "{name}: its statements are not in one DO $$ ... $$; block"
        );
        checked.push(name);
    }
    eprintln!("migrations after V8: {checked:?}");
}

/// On Citus every statement of the request path is carried out by the one
/// worker that holds its merchant's shards: each is run (with sample
/// values, one merchant throughout, in a transaction rolled back) with
/// `citus.log_remote_commands` on, and the commands the coordinator sends
/// name one worker at most. A plan's task count is not enough: an INSERT
/// inside a CTE runs as a step of its own whose result Citus sends to every
/// worker, so one worker down would fail every merchant's request. The
/// workers' reads across merchants are the listed exceptions.
#[tokio::test]
async fn on_citus_every_request_path_statement_contacts_one_worker() {
    let database = migrated_database().await;
    let client = database.client().await;
    if !on_citus(
        &client,
        "on_citus_every_request_path_statement_contacts_one_worker",
    )
    .await
    {
        return;
    }
    let workers: Vec<String> = client
        .query(
            "SELECT nodename || ':' || nodeport FROM pg_dist_node WHERE groupid <> 0",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(workers.len(), 2, "the test cluster has two workers");
    let (client, mut notices) = connect_with_notices(&database.url).await;
    let merchant = uuid::Uuid::now_v7();
    let mut spread = Vec::new();
    let mut routed = 0;
    for (name, statement) in chargeonce::db::ALL_STATEMENTS {
        if ACROSS_MERCHANTS.contains(name) {
            continue;
        }
        // The values written into the statement, `$10` before `$1`.
        let mut sql = statement.sql.to_owned();
        for (n, kind) in statement.params.iter().enumerate().rev() {
            sql = sql.replace(
                &format!("${}", n + 1),
                &format!("({})", sample(kind, merchant)),
            );
        }
        client
            .batch_execute(
                "BEGIN; SET LOCAL citus.log_remote_commands = on; \
                 SET LOCAL client_min_messages = log",
            )
            .await
            .unwrap();
        while notices.try_recv().is_ok() {}
        // A sample value may break a constraint: the commands sent up to
        // that point are what counts.
        if let Err(e) = client.batch_execute(&sql).await {
            let message = e.as_db_error().map(|e| e.message().to_owned());
            assert!(
                message.as_deref().is_some_and(|m| m.contains("violates")),
                "{name}: {e:?}"
            );
        }
        client.batch_execute("ROLLBACK").await.unwrap();
        let mut contacted = std::collections::BTreeSet::new();
        while let Ok(notice) = notices.try_recv() {
            for worker in &workers {
                if notice.contains(worker.as_str()) {
                    contacted.insert(worker.clone());
                }
            }
        }
        match contacted.len() {
            0 => {}
            1 => routed += 1,
            _ => spread.push(format!("{name} contacts {contacted:?}")),
        }
    }
    assert!(spread.is_empty(), "{}", spread.join("\n"));
    // Every statement on a per-merchant table reaches its worker: the
    // notices were seen (the merchant tables' ones only read the
    // coordinator's reference tables).
    assert!(
        routed >= 30,
        "the request path's statements were seen reaching one worker ({routed})"
    );
}

/// A literal of `kind` for a statement run with written-in values.
fn sample(kind: &tokio_postgres::types::Type, merchant: uuid::Uuid) -> String {
    use tokio_postgres::types::Type;
    let value = match *kind {
        Type::UUID => format!("'{merchant}'"),
        Type::UUID_ARRAY => format!("ARRAY['{merchant}']"),
        Type::TEXT => "'x'".to_owned(),
        Type::TEXT_ARRAY => "ARRAY['x']".to_owned(),
        Type::INT8 | Type::INT4 => "1".to_owned(),
        Type::INT8_ARRAY => "ARRAY[1]".to_owned(),
        Type::BYTEA => "'\\x00'".to_owned(),
        Type::BYTEA_ARRAY => "ARRAY['\\x00'::bytea]".to_owned(),
        Type::JSONB => "'{}'".to_owned(),
        Type::JSONB_ARRAY => "ARRAY['{}'::jsonb]".to_owned(),
        Type::TIMESTAMPTZ => "now()".to_owned(),
        Type::BOOL => "true".to_owned(),
        ref other => panic!("no sample value for {other}"),
    };
    // An array type's name is its element's with a leading `_`.
    let cast = match kind.name().strip_prefix('_') {
        Some(element) => format!("{element}[]"),
        None => kind.name().to_owned(),
    };
    format!("{value}::{cast}")
}

/// A connection whose notices (message and detail) arrive on the receiver.
async fn connect_with_notices(
    url: &str,
) -> (
    tokio_postgres::Client,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (client, mut connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test database");
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(message) = std::future::poll_fn(|cx| connection.poll_message(cx)).await {
            if let Ok(tokio_postgres::AsyncMessage::Notice(notice)) = message {
                let detail = notice.detail().unwrap_or_default();
                let _ = sender.send(format!("{} {detail}", notice.message()));
            }
        }
    });
    (client, receiver)
}
