//! Citus: where each table lives when the database has the `citus`
//! extension (docs/scaling.md). Every per-merchant table is distributed on
//! `merchant_id`, co-located with `charges`, so one merchant's rows share a
//! node and each request stays a single-node transaction; the tenant tables
//! are reference tables, copied to every node.
//!
//! Migrating distributes the tables right after migration V8
//! ([`DISTRIBUTED_FROM`]), so on Citus every later migration runs on a
//! distributed database, the test suite's as much as production's, and
//! places the tables it creates itself (`place_table`, V8). On PostgreSQL
//! without Citus nothing here changes anything.

use refinery::{Runner, Target};
use tokio_postgres::Client;

use super::DbError;

/// How a table is placed on a Citus cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Distributed on `merchant_id`, co-located with `charges`.
    ByMerchant,
    /// Copied whole to every node.
    Reference,
}

impl Placement {
    /// The name `place_table` (migration V8) takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ByMerchant => "by_merchant",
            Self::Reference => "reference",
        }
    }
}

/// Every table of the schema and its placement, except refinery's history,
/// which stays a plain table on the coordinator, where migrations run.
/// `charges` comes first: the others are co-located with it. A table a
/// migration creates goes here too (it places a database that gets Citus
/// after it was migrated); `tests/api/schema.rs` fails when one is missing.
/// `api_keys` has a `merchant_id` but is looked up by the key alone,
/// before the merchant is known.
pub const TABLES: [(&str, Placement); 9] = [
    ("charges", Placement::ByMerchant),
    ("refunds", Placement::ByMerchant),
    ("events", Placement::ByMerchant),
    ("event_queue", Placement::ByMerchant),
    ("webhook_endpoints", Placement::ByMerchant),
    ("webhook_deliveries", Placement::ByMerchant),
    ("webhook_attempts", Placement::ByMerchant),
    ("merchants", Placement::Reference),
    ("api_keys", Placement::Reference),
];

/// The migration after which a Citus database is distributed: V8 creates
/// `place_table`, and V7 has removed V6's statement trigger with a
/// transition table on `events`, which Citus refuses on a distributed table
/// ("cannot distribute relation "events" because it has triggers").
const DISTRIBUTED_FROM: u32 = 8;

/// Applies the migrations up to [`DISTRIBUTED_FROM`], distributes the
/// tables when the database has Citus, then applies the rest. Returns how
/// many migrations were applied. The caller holds the migration lock.
pub(super) async fn migrate(client: &mut Client, runner: fn() -> Runner) -> Result<usize, DbError> {
    let mut applied = runner()
        .set_target(Target::Version(DISTRIBUTED_FROM))
        .run_async(client)
        .await?
        .applied_migrations()
        .len();
    distribute(client).await?;
    applied += runner().run_async(client).await?.applied_migrations().len();
    Ok(applied)
}

/// With the citus extension, places every table of [`TABLES`] that exists
/// and is neither distributed nor a reference table yet; returns how many.
/// One transaction: Citus will not distribute a table that a plain table
/// references by a foreign key, and a plain table that references a
/// reference table becomes a "Citus local" table that cannot take a
/// foreign key to a distributed one; so the foreign keys that touch these
/// tables are dropped first and added back once every table is placed.
pub async fn distribute(client: &mut Client) -> Result<usize, DbError> {
    let citus: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await?
        .get(0);
    if !citus {
        return Ok(0);
    }
    let names: Vec<&str> = TABLES.iter().map(|(name, _)| *name).collect();
    let unplaced: Vec<String> = client
        .query(
            "SELECT t.name FROM unnest($1::text[]) WITH ORDINALITY AS t (name, n) \
              WHERE to_regclass(t.name) IS NOT NULL \
                AND NOT EXISTS (SELECT 1 FROM pg_dist_partition p \
                                 WHERE p.logicalrelid = to_regclass(t.name) \
                                   AND (p.partmethod = 'h' OR p.repmodel = 't')) \
              ORDER BY t.n",
            &[&names],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if unplaced.is_empty() {
        return Ok(0);
    }

    let transaction = client.transaction().await?;
    // One connection per node: the foreign keys added at the end follow
    // shards and reference tables created in the same transaction.
    transaction
        .batch_execute("SET LOCAL citus.multi_shard_modify_mode TO 'sequential'")
        .await?;
    let keys: Vec<(String, String)> = transaction
        .query(
            "SELECT format('ALTER TABLE %s DROP CONSTRAINT %I', conrelid::regclass, conname), \
                    format('ALTER TABLE %s ADD CONSTRAINT %I %s', conrelid::regclass, conname, \
                           pg_get_constraintdef(oid)) \
               FROM pg_constraint \
              WHERE contype = 'f' \
                AND (conrelid = ANY($1::text[]::regclass[]) \
                     OR confrelid = ANY($1::text[]::regclass[])) \
              ORDER BY conrelid, conname",
            &[&unplaced],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for (drop, _) in &keys {
        transaction.batch_execute(drop).await?;
    }
    for (name, placement) in TABLES
        .iter()
        .filter(|(name, _)| unplaced.iter().any(|u| u == name))
    {
        transaction
            .execute(
                "SELECT place_table($1::text::regclass, $2)",
                &[name, &placement.as_str()],
            )
            .await?;
    }
    for (_, add) in &keys {
        transaction.batch_execute(add).await?;
    }
    transaction.commit().await?;
    tracing::info!(tables = ?unplaced, "distributed the tables on the Citus cluster");
    Ok(unplaced.len())
}
