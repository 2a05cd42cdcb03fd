//! Persistence: the pool, the embedded migrations, and one small function per
//! statement. No SQL lives outside this module.

pub mod charges;
pub mod merchants;

use std::time::Duration;

use deadpool_postgres::{
    Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime, Timeouts,
};
use tokio_postgres::NoTls;

use crate::config::DatabaseSettings;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Any fixed number serves: it only has to be the same for every instance.
const MIGRATION_LOCK: i64 = 0x6368_6172_6765_6f6e; // "chargeon"

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database.url: {0}")]
    Url(#[source] tokio_postgres::Error),
    #[error("cannot connect to PostgreSQL: {0}")]
    Connect(#[source] tokio_postgres::Error),
    #[error("PostgreSQL did not answer within {0:?}")]
    Timeout(Duration),
    #[error("migration failed: {0}")]
    Migrate(#[from] refinery::Error),
    #[error("database error: {0}")]
    Query(#[from] tokio_postgres::Error),
    #[error("database pool: {0}")]
    Pool(String),
}

fn pg_config(settings: &DatabaseSettings) -> Result<tokio_postgres::Config, DbError> {
    let mut config: tokio_postgres::Config = settings.url.parse().map_err(DbError::Url)?;
    let statement_timeout = format!("-c statement_timeout={}", settings.statement_timeout_ms);
    let options = match config.get_options() {
        Some(existing) if !existing.is_empty() => format!("{existing} {statement_timeout}"),
        _ => statement_timeout,
    };
    config
        .options(&options)
        .connect_timeout(settings.connect_timeout())
        .keepalives_idle(Duration::from_secs(30));
    if config.get_application_name().is_none() {
        config.application_name("chargeonce");
    }
    Ok(config)
}

/// A connection pool of at most `max_size` connections. Creating it connects
/// to nothing; connections open on demand, bounded by `connect_timeout_ms`,
/// so an unreachable database turns into a quick 503 rather than a hung
/// request. The task that drives a connection runs on the thread that opened
/// it.
pub fn build_pool(settings: &DatabaseSettings, max_size: usize) -> Result<Pool, DbError> {
    let manager = Manager::from_config(
        pg_config(settings)?,
        NoTls,
        // Fast: no extra round trip per checkout; a closed connection is
        // still detected and replaced.
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let timeout = Some(settings.connect_timeout());
    Pool::builder(manager)
        .max_size(max_size)
        // The connection used last is used next: at low load a request finds
        // a PostgreSQL backend whose caches are warm instead of cycling
        // through all of them (BENCHMARKS.md, history).
        .queue_mode(QueueMode::Lifo)
        .timeouts(Timeouts {
            wait: timeout,
            create: timeout,
            recycle: timeout,
        })
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| DbError::Pool(e.to_string()))
}

/// Applies the embedded migrations that are not applied yet. Several
/// instances may call this at once: a session advisory lock lets one work
/// while the others wait, and they then find nothing left to do.
pub async fn migrate(settings: &DatabaseSettings) -> Result<usize, DbError> {
    let config = pg_config(settings)?;
    let connect = config.connect(NoTls);
    let (mut client, connection) = tokio::time::timeout(settings.connect_timeout(), connect)
        .await
        .map_err(|_| DbError::Timeout(settings.connect_timeout()))?
        .map_err(DbError::Connect)?;
    let connection = tokio::spawn(connection);
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let report = embedded::migrations::runner().run_async(&mut client).await;
    // Closing the session would release the lock too; unlock explicitly so a
    // pooled or proxied connection never keeps it.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    drop(client);
    let _ = connection.await;
    let applied = report?.applied_migrations().len();
    unlocked?;
    Ok(applied)
}

/// The newest migration version this binary carries.
pub fn latest_migration() -> i64 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| i64::from(m.version()))
        .max()
        .unwrap_or(0)
}

/// The newest migration version applied to the database, if any.
pub async fn applied_migration(
    client: &impl deadpool_postgres::GenericClient,
) -> Result<Option<i64>, tokio_postgres::Error> {
    let row = client
        .query_opt(
            "SELECT max(version)::bigint FROM refinery_schema_history",
            &[],
        )
        .await?;
    Ok(row.and_then(|row| row.get::<_, Option<i64>>(0)))
}
