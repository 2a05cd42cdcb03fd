//! Persistence: the pool, the embedded migrations, and one small function per
//! statement. No SQL lives outside this module.
//!
//! Every statement goes through a [`Conn`], which bounds it by a client-side
//! deadline: PostgreSQL's own `statement_timeout` cannot help when the server
//! (or the network to it) stops answering, and a request must not hang for as
//! long as a partition lasts. A connection whose statement ran out of time is
//! in an unknown state, so it is discarded, never handed out again.

pub mod batch;
pub mod charges;
pub mod citus;
mod codec;
mod conn;
mod connect;
pub mod events;
pub mod merchants;
pub mod records;
pub mod refunds;
pub mod webhook_deliveries;
pub mod webhook_endpoints;

use std::time::{Duration, Instant};

use deadpool_postgres::{
    Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime, Timeouts,
};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use secrecy::ExposeSecret;

use crate::backoff::Backoff;
use crate::config::DatabaseSettings;

pub use self::conn::{Conn, Decision};
use self::connect::Connector;

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// Any fixed number serves: it only has to be the same for every instance.
const MIGRATION_LOCK: i64 = 0x6368_6172_6765_6f6e; // "chargeon"

/// One SQL statement with the types of its parameters. The statements are
/// constants, built once, and public so the benchmark runs exactly what the
/// service runs.
///
/// Plans must not depend on statistics (autovacuum may be off, and a
/// generic plan cached while a table is small is kept as it grows). A
/// statement that names its row by id therefore says "pending" as
/// `status IS NOT DISTINCT FROM 'pending'`: `status = 'pending'` implies the
/// predicates of the partial indexes on the status (the listing's
/// `status IS NOT NULL`, the pending leases'), and the planner, rating them
/// as good as the primary key on an empty table, would read one of them
/// whole for every row. `tests/api/plans.rs` checks every such statement.
#[derive(Debug, Clone, Copy)]
pub struct Statement {
    pub sql: &'static str,
    pub params: &'static [Type],
}

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("database.url: {0}")]
    Url(#[source] tokio_postgres::Error),
    #[error("cannot connect to PostgreSQL")]
    Connect(#[source] tokio_postgres::Error),
    #[error("PostgreSQL did not answer within {0:?}")]
    Timeout(Duration),
    #[error("migration failed")]
    Migrate(#[from] refinery::Error),
    #[error("database error")]
    Query(#[from] tokio_postgres::Error),
    #[error("no database connection")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("cannot build the connection pool: {0}")]
    Build(String),
    /// A row the schema should not allow: a bug to see, not to paper over.
    #[error("a stored row does not decode: {0}")]
    Decode(String),
    /// The error of a batched statement, shared by every request it held
    /// (`batch`).
    #[error("a batched statement failed")]
    Batch(#[source] std::sync::Arc<DbError>),
    /// The task running a batch ended without answering (a panic). Whether
    /// the statement committed is unknown.
    #[error("the batch holding this statement was lost")]
    BatchLost,
}

impl DbError {
    /// Whether a statement may have taken effect although its caller got an
    /// error: it was sent, and then the deadline passed or the connection
    /// failed before the answer. (An error PostgreSQL itself reports means
    /// the statement, in its own transaction, took no effect.)
    pub fn is_ambiguous(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::BatchLost => true,
            Self::Query(error) => error.code().is_none() || citus_worker_lost(error),
            Self::Batch(error) => error.is_ambiguous(),
            _ => false,
        }
    }

    /// Whether the database could not be reached or did not answer in time
    /// (then the caller fails closed with 503), rather than a bug (500).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect(_) | Self::Timeout(_) | Self::BatchLost => true,
            Self::Batch(error) => error.is_transient(),
            Self::Pool(deadpool_postgres::PoolError::Backend(error)) | Self::Query(error) => {
                match error.code() {
                    // No SQLSTATE: the connection failed or closed, or the
                    // statement itself is wrong (a bug).
                    None => connection_lost(error),
                    Some(code) => transient_state(code) || citus_worker_lost(error),
                }
            }
            Self::Pool(_) => true,
            Self::Url(_) | Self::Migrate(_) | Self::Build(_) | Self::Decode(_) => false,
        }
    }
}

/// Whether an error without a SQLSTATE is the connection's: it closed, or
/// an IO error ended it.
fn connection_lost(error: &tokio_postgres::Error) -> bool {
    error.is_closed() || std::error::Error::source(error).is_some_and(|s| s.is::<std::io::Error>())
}

/// The SQLSTATEs that say the database was unreachable, overloaded or in
/// the way of this transaction (a 503 and a retry), rather than that the
/// statement is wrong (a bug, 500). The class `08` is a connection error.
fn transient_state(code: &SqlState) -> bool {
    *code == SqlState::QUERY_CANCELED
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || *code == SqlState::TOO_MANY_CONNECTIONS
        || *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        // A standby, or a primary fenced read-only for a switchover: the
        // write did not happen.
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION
        // The schema is behind this binary's migrations (`chargeonce
        // migrate` has not run yet): what the statement names is missing.
        || *code == SqlState::UNDEFINED_TABLE
        || *code == SqlState::UNDEFINED_COLUMN
        || *code == SqlState::UNDEFINED_FUNCTION
        || code.code().starts_with("08")
}

/// Citus lost its connection to a worker while a statement or the
/// transaction ran there: the coordinator reports it as an internal error
/// (XX000) carrying libpq's message (as it does when the worker cannot be
/// reached at all, it reports 08006). When the worker goes while it
/// commits, the coordinator has committed its own part and reports "could
/// not commit transaction for shard N on at least one active node" (also
/// XX000; our schema has no deferred constraints, the other cause). Whether
/// the worker committed is unknown, as after a lost connection of our own:
/// transient (the merchants on that worker get 503 until it is back) and
/// ambiguous. A multi-row INSERT reaches a worker as a COPY; when the worker
/// goes while the rows are sent, the coordinator says "failed to COPY to
/// shard N on host:port" as an I/O error (58030), before any commit.
fn citus_worker_lost(error: &tokio_postgres::Error) -> bool {
    const LOST: [&str; 4] = [
        "failure on connection marked as essential",
        "server closed the connection unexpectedly",
        "SSL SYSCALL error: EOF detected",
        "could not commit transaction for shard",
    ];
    error.as_db_error().is_some_and(|e| {
        let message = e.message();
        (*e.code() == SqlState::INTERNAL_ERROR && LOST.iter().any(|lost| message.contains(lost)))
            || (*e.code() == SqlState::IO_ERROR && message.starts_with("failed to COPY to shard"))
    })
}

fn pg_config(settings: &DatabaseSettings) -> Result<tokio_postgres::Config, DbError> {
    let mut config: tokio_postgres::Config =
        settings.url.expose_secret().parse().map_err(DbError::Url)?;
    connect::prefer_read_write(&mut config);
    // 0: leave statement_timeout to the server (and to PgBouncer, which
    // refuses startup options unless told to ignore them).
    if !settings.statement_timeout.is_zero() {
        let statement_timeout = format!(
            "-c statement_timeout={}",
            settings.statement_timeout.as_millis()
        );
        let options = match config.get_options() {
            Some(existing) if !existing.is_empty() => format!("{existing} {statement_timeout}"),
            _ => statement_timeout,
        };
        config.options(&options);
    }
    // TCP keepalive finds a peer that vanished while a connection sat idle
    // (about 10 + 3 × 5 s); tcp_user_timeout closes a connection whose sent
    // data stays unacknowledged past the statement deadline. A peer that
    // acknowledges but never answers (a stalled proxy) is left to the
    // statement deadline in `Conn`.
    config
        .connect_timeout(settings.connect_timeout)
        .keepalives_idle(Duration::from_secs(10))
        .keepalives_interval(Duration::from_secs(5))
        .keepalives_retries(3)
        .tcp_user_timeout(settings.query_timeout);
    if config.get_application_name().is_none() {
        config.application_name("chargeonce");
    }
    Ok(config)
}

/// A pool of connections and the deadline of each statement run on them.
#[derive(Clone)]
pub struct Database {
    pool: Pool,
    query_timeout: Duration,
    connect_timeout: Duration,
    /// Named prepared statements, or unnamed ones sent with their parameters
    /// in one message (`database.prepared_statements = false`, for PgBouncer
    /// in transaction pooling mode, where a named statement prepared in one
    /// transaction is gone in the next).
    prepared: bool,
    /// The most rows a batched statement takes (`batch`); 1: no batching.
    batch_rows: usize,
}

impl Database {
    /// A pool of at most `max_size` connections. Creating it connects to
    /// nothing; connections open on demand, bounded by `connect_timeout_ms`
    /// (for each host the URL names, see `connect`), so an unreachable
    /// database turns into a quick 503 rather than a hung request. The task
    /// that drives a connection runs on the thread that opened it.
    pub fn new(settings: &DatabaseSettings, max_size: usize) -> Result<Self, DbError> {
        let config = pg_config(settings)?;
        // Each host of the URL in turn, each within connect_timeout_ms.
        let connector = Connector::new(&config, settings.connect_timeout);
        let create = Some(connector.bound());
        let manager = Manager::from_connect(
            config,
            connector,
            // Fast: no extra round trip per checkout; a closed connection is
            // still detected and replaced, and a hung one is discarded by
            // the statement deadline.
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let timeout = Some(settings.connect_timeout);
        let pool = Pool::builder(manager)
            .max_size(max_size)
            // The connection used last is used next: at low load a request
            // finds a PostgreSQL backend whose caches are warm instead of
            // cycling through all of them (BENCHMARKS.md, "LIFO pools").
            .queue_mode(QueueMode::Lifo)
            .timeouts(Timeouts {
                wait: timeout,
                create,
                recycle: timeout,
            })
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| DbError::Build(e.to_string()))?;
        Ok(Self {
            pool,
            query_timeout: settings.query_timeout,
            connect_timeout: settings.connect_timeout,
            prepared: settings.prepared_statements,
            batch_rows: settings.batch_rows,
        })
    }

    /// A connection, waiting at most `connect_timeout_ms` for one.
    pub async fn conn(&self) -> Result<Conn, DbError> {
        Ok(Conn::new(
            self.pool.get().await?,
            self.query_timeout,
            self.prepared,
        ))
    }

    /// The longest a statement may take from the moment it is asked for,
    /// a connection's wait included: `connect_timeout_ms` +
    /// `query_timeout_ms`, the bound README's failure table gives for a 503.
    pub fn request_bound(&self) -> Duration {
        self.connect_timeout + self.query_timeout
    }

    /// A connection whose wait and statements all fit in `bound` (health
    /// checks answer within a short bound of their own; a batch within
    /// its oldest request's).
    pub async fn conn_within(&self, bound: Duration) -> Result<Conn, DbError> {
        let started = tokio::time::Instant::now();
        let client = tokio::time::timeout(bound, self.pool.get())
            .await
            .map_err(|_| DbError::Timeout(bound))??;
        let left = bound.saturating_sub(started.elapsed());
        Ok(Conn::new(
            client,
            left.min(self.query_timeout),
            self.prepared,
        ))
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The most rows a batched statement on this pool takes.
    pub fn batch_rows(&self) -> usize {
        self.batch_rows
    }

    pub fn close(&self) {
        self.pool.close();
    }
}

/// Applies the embedded migrations that are not applied yet. Several
/// instances may call this at once: a session advisory lock lets one work
/// while the others wait, and they then find nothing left to do.
pub async fn migrate(settings: &DatabaseSettings) -> Result<usize, DbError> {
    let (mut client, connection) = connect_at_start(settings).await?;
    let connection = tokio::spawn(connection);
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let applied = citus::migrate(&mut client, embedded::migrations::runner).await;
    // Closing the session would release the lock too; unlock explicitly so a
    // pooled or proxied connection never keeps it.
    let unlocked = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await;
    drop(client);
    let _ = connection.await;
    let applied = applied?;
    unlocked?;
    Ok(applied)
}

/// A connection for start-up work. A PostgreSQL that is not up yet (the
/// service and its database started together, or the database restarting)
/// is tried again, with a pause that grows to 2 s, for up to
/// `database.startup_wait_ms`; each failed try is logged. An error that
/// waiting cannot mend ends the wait at once ([`worth_waiting_for`]).
async fn connect_at_start(
    settings: &DatabaseSettings,
) -> Result<(tokio_postgres::Client, StartConnection), DbError> {
    let connector = Connector::new(&pg_config(settings)?, settings.connect_timeout);
    let deadline = Instant::now() + settings.startup_wait;
    let mut pauses = STARTUP_RETRY.pauses();
    loop {
        let error = match tokio::time::timeout(connector.bound(), connector.connect()).await {
            Ok(Ok(connected)) => return Ok(connected),
            Ok(Err(error)) => DbError::Connect(error),
            Err(_) => DbError::Timeout(connector.bound()),
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || !worth_waiting_for(&error) {
            return Err(error);
        }
        let retry_in = pauses.next_pause().min(left);
        tracing::warn!(
            error = %crate::telemetry::error_chain(&error),
            ?retry_in,
            "PostgreSQL cannot be reached yet; trying again (database.startup_wait_ms)"
        );
        tokio::time::sleep(retry_in).await;
    }
}

/// Pauses between tries to reach a PostgreSQL that is not up yet.
const STARTUP_RETRY: Backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));

type StartConnection =
    tokio_postgres::Connection<tokio_postgres::Socket, tokio_postgres::tls::NoTlsStream>;

/// Whether a failed connection attempt may succeed if tried again later:
/// nothing answered (refused, reset, no answer in time), or the server
/// answered with a state the request path also retries (`transient_state`:
/// starting up, shutting down, full, a connection error). A wrong password,
/// a password the URL lacks, or a missing database stays wrong however long
/// one waits.
fn worth_waiting_for(error: &DbError) -> bool {
    match error {
        DbError::Timeout(_) => true,
        DbError::Connect(error) => match error.code() {
            Some(code) => transient_state(code),
            None => connection_lost(error),
        },
        _ => false,
    }
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

/// The database's clock: every time rule is a rule on it (`crate::clock`).
pub const DATABASE_NOW: Statement = Statement {
    sql: "SELECT now() AS now",
    params: &[],
};

/// The time now by the database's clock.
pub async fn database_now(conn: &Conn) -> Result<chrono::DateTime<chrono::Utc>, DbError> {
    let row = conn
        .query_opt(&DATABASE_NOW, &[])
        .await?
        .ok_or_else(|| DbError::Decode("SELECT now() answered no row".to_owned()))?;
    codec::column(&row, "now")
}

pub const APPLIED_MIGRATION: Statement = Statement {
    sql: "SELECT max(version)::bigint AS version FROM refinery_schema_history",
    params: &[],
};

/// Every statement the service runs, by name: for tools that must know them
/// all (the load benchmark checks that the service runs no other) and for
/// the schema tests (every statement on a per-merchant table filters by
/// merchant).
pub const ALL_STATEMENTS: &[(&str, Statement)] = &[
    ("charges::INSERT_OR_FIND", charges::INSERT_OR_FIND),
    ("charges::INSERT_MANY", charges::INSERT_MANY),
    ("charges::FIND", charges::STATEMENTS.find),
    ("charges::FIND_BY_KEY", charges::STATEMENTS.find_by_key),
    ("charges::LIST", charges::STATEMENTS.list),
    (
        "charges::TAKE_OVER_OR_READ",
        charges::STATEMENTS.take_over_or_read,
    ),
    ("charges::ABANDONED", charges::STATEMENTS.abandoned),
    ("charges::CLAIM", charges::STATEMENTS.claim),
    (
        "charges::RECORD_UNKNOWN",
        charges::STATEMENTS.record_unknown,
    ),
    (
        "charges::RECORD_OUTCOME",
        charges::STATEMENTS.record_outcome,
    ),
    ("charges::RECORD_EVENT", charges::STATEMENTS.record_event),
    (
        "charges::FORGET_UNCONFIRMED",
        charges::STATEMENTS.forget_unconfirmed,
    ),
    ("charges::EXPIRED_KEYS", charges::STATEMENTS.expired_keys),
    ("charges::RELEASE_KEY", charges::STATEMENTS.release_key),
    ("refunds::RESERVE", refunds::RESERVE),
    ("refunds::INSERT", refunds::INSERT),
    ("refunds::REFUNDABLE", refunds::REFUNDABLE),
    ("refunds::LIST_OF_CHARGE", refunds::LIST_OF_CHARGE),
    ("refunds::FIND", refunds::STATEMENTS.find),
    ("refunds::FIND_BY_KEY", refunds::STATEMENTS.find_by_key),
    ("refunds::LIST", refunds::STATEMENTS.list),
    (
        "refunds::TAKE_OVER_OR_READ",
        refunds::STATEMENTS.take_over_or_read,
    ),
    ("refunds::ABANDONED", refunds::STATEMENTS.abandoned),
    ("refunds::CLAIM", refunds::STATEMENTS.claim),
    (
        "refunds::RECORD_UNKNOWN",
        refunds::STATEMENTS.record_unknown,
    ),
    (
        "refunds::RECORD_OUTCOME",
        refunds::STATEMENTS.record_outcome,
    ),
    ("refunds::RECORD_EVENT", refunds::STATEMENTS.record_event),
    ("refunds::LOCK_CHARGE", refunds::LOCK_CHARGE),
    (
        "refunds::FORGET_UNCONFIRMED",
        refunds::STATEMENTS.forget_unconfirmed,
    ),
    ("refunds::EXPIRED_KEYS", refunds::STATEMENTS.expired_keys),
    ("refunds::RELEASE_KEY", refunds::STATEMENTS.release_key),
    ("merchants::CREATE", merchants::CREATE),
    ("merchants::ENSURE", merchants::ENSURE),
    ("merchants::FIND_BY_DIGEST", merchants::FIND_BY_DIGEST),
    ("events::LIST", events::LIST),
    ("events::FIND", events::FIND),
    ("events::QUEUE", events::QUEUE),
    ("events::QUEUED", events::QUEUED),
    ("events::FAN_OUT", events::FAN_OUT),
    ("events::SET_ASIDE", events::SET_ASIDE),
    ("events::EXPIRED", events::EXPIRED),
    ("events::DELETE_EXPIRED", events::DELETE_EXPIRED),
    ("events::BACKLOG", events::BACKLOG),
    ("webhook_endpoints::INSERT", webhook_endpoints::INSERT),
    (
        "webhook_endpoints::FIND_BY_KEY",
        webhook_endpoints::FIND_BY_KEY,
    ),
    ("webhook_endpoints::LIST", webhook_endpoints::LIST),
    ("webhook_endpoints::DELETE", webhook_endpoints::DELETE),
    (
        "webhook_endpoints::SLOTS_TAKEN",
        webhook_endpoints::SLOTS_TAKEN,
    ),
    ("webhook_endpoints::FAILED", webhook_endpoints::FAILED),
    ("webhook_endpoints::RECOVERED", webhook_endpoints::RECOVERED),
    ("webhook_endpoints::DISABLE", webhook_endpoints::DISABLE),
    (
        "webhook_endpoints::DISABLED_EVENT",
        webhook_endpoints::DISABLED_EVENT,
    ),
    ("webhook_deliveries::DUE", webhook_deliveries::DUE),
    ("webhook_deliveries::CLAIM", webhook_deliveries::CLAIM),
    ("webhook_deliveries::HOLD", webhook_deliveries::HOLD),
    ("webhook_deliveries::GIVE_UP", webhook_deliveries::GIVE_UP),
    (
        "webhook_deliveries::RECORD_ATTEMPT",
        webhook_deliveries::RECORD_ATTEMPT,
    ),
    (
        "webhook_deliveries::INSERT_ATTEMPT",
        webhook_deliveries::INSERT_ATTEMPT,
    ),
    ("webhook_deliveries::OF_EVENT", webhook_deliveries::OF_EVENT),
    ("db::APPLIED_MIGRATION", APPLIED_MIGRATION),
    ("db::DATABASE_NOW", DATABASE_NOW),
];

/// The newest migration version applied to the database, if any.
pub async fn applied_migration(conn: &Conn) -> Result<Option<i64>, DbError> {
    let row = conn.query_opt(&APPLIED_MIGRATION, &[]).await?;
    Ok(row
        .map(|row| codec::column::<Option<i64>>(&row, "version"))
        .transpose()?
        .flatten())
}

#[cfg(test)]
mod tests {
    use super::conn::unusable_state;
    use super::*;

    fn settings(url: &str, statement_timeout_ms: u64) -> DatabaseSettings {
        DatabaseSettings {
            url: url.to_owned().into(),
            pool_size: 4,
            connect_timeout: Duration::from_millis(1500),
            statement_timeout: Duration::from_millis(statement_timeout_ms),
            query_timeout: Duration::from_millis(7000),
            prepared_statements: true,
            batch_rows: 64,
            migrate_on_start: false,
            startup_wait: Duration::ZERO,
        }
    }

    /// `database.statement_timeout_ms` joins the URL's own `options`; 0
    /// leaves them (and the server's setting) alone.
    #[test]
    fn the_statement_timeout_joins_the_options_of_the_url() {
        let options = |url: &str, timeout_ms| {
            pg_config(&settings(url, timeout_ms))
                .expect("a valid URL")
                .get_options()
                .map(str::to_owned)
        };
        let timeout = Some("-c statement_timeout=5000".to_owned());
        assert_eq!(options("postgres://u@h/db", 5000), timeout);
        assert_eq!(options("postgres://u@h/db?options=", 5000), timeout);
        assert_eq!(
            options("postgres://u@h/db?options=-c%20work_mem%3D8MB", 5000).as_deref(),
            Some("-c work_mem=8MB -c statement_timeout=5000")
        );
        assert_eq!(options("postgres://u@h/db", 0), None);
        assert_eq!(
            options("postgres://u@h/db?options=-c%20work_mem%3D8MB", 0).as_deref(),
            Some("-c work_mem=8MB")
        );
    }

    #[test]
    fn a_connection_is_bounded_and_named() {
        let config = pg_config(&settings("postgres://u@h/db", 5000)).expect("a valid URL");
        assert_eq!(
            config.get_connect_timeout(),
            Some(&Duration::from_millis(1500))
        );
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_millis(7000))
        );
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(10));
        assert_eq!(config.get_application_name(), Some("chargeonce"));
        let named = pg_config(&settings("postgres://u@h/db?application_name=mine", 0))
            .expect("a valid URL");
        assert_eq!(named.get_application_name(), Some("mine"));
        assert!(matches!(
            pg_config(&settings("postgres://u@h:port/db", 0)),
            Err(DbError::Url(_))
        ));
    }

    /// Every SQLSTATE the classification names, and some it must not.
    #[test]
    fn sqlstates_are_classified_one_by_one() {
        let transient = [
            SqlState::QUERY_CANCELED,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::CONNECTION_FAILURE,
            SqlState::CONNECTION_EXCEPTION,
            SqlState::UNDEFINED_TABLE,
            SqlState::UNDEFINED_COLUMN,
            SqlState::UNDEFINED_FUNCTION,
        ];
        let unusable = [
            SqlState::READ_ONLY_SQL_TRANSACTION,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CRASH_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::CONNECTION_FAILURE,
            SqlState::PROTOCOL_VIOLATION,
        ];
        let neither = [
            SqlState::UNIQUE_VIOLATION,
            SqlState::CHECK_VIOLATION,
            SqlState::FOREIGN_KEY_VIOLATION,
            SqlState::SYNTAX_ERROR,
            SqlState::DATATYPE_MISMATCH,
        ];
        for code in &transient {
            assert!(transient_state(code), "{} is transient", code.code());
        }
        for code in &unusable {
            assert!(unusable_state(code), "{} ends the connection", code.code());
        }
        // A statement that is merely slow, or lost a race, leaves the
        // connection usable.
        for code in [
            SqlState::QUERY_CANCELED,
            SqlState::TOO_MANY_CONNECTIONS,
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
        ] {
            assert!(
                !unusable_state(&code),
                "{} keeps the connection",
                code.code()
            );
        }
        for code in &neither {
            assert!(
                !transient_state(code),
                "{} is a bug, not transient",
                code.code()
            );
            assert!(
                !unusable_state(code),
                "{} keeps the connection",
                code.code()
            );
        }
    }

    #[test]
    fn errors_without_an_answer_are_ambiguous_and_transient() {
        let timeout = DbError::Timeout(Duration::from_secs(1));
        let decode = DbError::Decode("status".into());
        assert!(timeout.is_ambiguous() && timeout.is_transient());
        assert!(DbError::BatchLost.is_ambiguous() && DbError::BatchLost.is_transient());
        assert!(!decode.is_ambiguous() && !decode.is_transient());
        assert!(!DbError::Build("pool".into()).is_transient());
        // A batch's error is its statement's.
        let batch_of = |error| DbError::Batch(std::sync::Arc::new(error));
        assert!(batch_of(DbError::BatchLost).is_ambiguous());
        assert!(batch_of(DbError::BatchLost).is_transient());
        assert!(!batch_of(DbError::Decode("x".into())).is_ambiguous());
        assert!(!batch_of(DbError::Decode("x".into())).is_transient());
        // No connection to be had from the pool: nothing was sent.
        let closed = DbError::Pool(deadpool_postgres::PoolError::Closed);
        assert!(closed.is_transient() && !closed.is_ambiguous());
    }

    /// A tokio-postgres error without a SQLSTATE: a failed connection (an IO
    /// error underneath) is transient; a bad configuration is not.
    #[tokio::test]
    async fn an_error_without_sqlstate_is_transient_only_when_the_connection_failed() {
        let refused = tokio_postgres::connect(
            "host=127.0.0.1 port=1 user=nobody connect_timeout=2",
            tokio_postgres::NoTls,
        )
        .await
        .map(|_| ())
        .expect_err("nothing listens on port 1");
        let refused = DbError::Query(refused);
        assert!(refused.is_transient(), "{refused:?}");
        assert!(refused.is_ambiguous());
        let config = "port=not-a-number"
            .parse::<tokio_postgres::Config>()
            .map(|_| ())
            .expect_err("the port is not a number");
        let config = DbError::Query(config);
        assert!(!config.is_transient(), "{config:?}");
    }
}
