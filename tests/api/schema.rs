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

/// The outbox's queue row is written by the statement that writes the
/// event (a trigger cannot do it on a database distributed by merchant):
/// every statement that inserts into `events` inserts into `event_queue`
/// too, from what it inserted.
#[test]
fn every_statement_that_writes_an_event_queues_it() {
    let mut writers = 0;
    for (name, statement) in chargeonce::db::ALL_STATEMENTS {
        if statement.sql.contains("INSERT INTO events") {
            writers += 1;
            assert!(
                statement.sql.contains("INSERT INTO event_queue")
                    && statement.sql.contains("FROM event)"),
                "{name} writes an event without queueing it"
            );
        }
    }
    assert!(writers >= 4, "the statements that write events ({writers})");
}
