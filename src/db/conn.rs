//! A connection taken from a pool, whose every statement runs under the
//! statement deadline and in a debug-level span named after it; one that
//! ran out of time, failed or was abandoned half-way is closed, never
//! pooled again.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use deadpool_postgres::Object;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;
use tracing::Instrument;

use super::{DbError, Statement, ALL_STATEMENTS};

/// A pooled connection whose statements run under a deadline. Dropping it
/// returns it to the pool, unless a statement ran out of time, the
/// connection broke, or a statement was abandoned half-way (its caller was
/// cancelled): then it is closed, since what it will answer next is unknown.
pub struct Conn {
    client: Option<Object>,
    deadline: Duration,
    prepared: bool,
    /// Statements sent and not answered yet. Statements may run together
    /// (pipelined); one that never ends cleanly (a deadline, a cancelled
    /// caller) leaves the count above zero for good.
    running: AtomicUsize,
    /// Set when the connection failed or the server became unusable.
    broken: AtomicBool,
}

impl Conn {
    pub(super) fn new(client: Object, deadline: Duration, prepared: bool) -> Self {
        Self {
            client: Some(client),
            deadline,
            prepared,
            running: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
        }
    }

    fn client(&self) -> &Object {
        // Only `Drop` takes the client out.
        self.client.as_ref().unwrap_or_else(|| unreachable!())
    }

    /// Runs `work`, the statement `sql` (prepared once per connection, or
    /// sent unnamed), within the deadline, in its `db` span (`statement_span`).
    async fn bounded<T, F>(&self, sql: &'static str, work: F) -> Result<T, DbError>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let span = statement_span(sql);
        if span.is_disabled() {
            return self.within_deadline(work).await;
        }
        let started = std::time::Instant::now();
        let result = self.within_deadline(work).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(DbError::Timeout(_)) => "timeout",
            Err(_) => "error",
        };
        span.in_scope(|| {
            tracing::debug!(
                outcome,
                elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
                "statement"
            )
        });
        result
    }

    async fn within_deadline<T, F>(&self, work: F) -> Result<T, DbError>
    where
        F: std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    {
        self.running.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(self.deadline, work).await {
            Ok(Ok(value)) => {
                self.running.fetch_sub(1, Ordering::Relaxed);
                Ok(value)
            }
            Ok(Err(error)) => {
                self.running.fetch_sub(1, Ordering::Relaxed);
                // A statement PostgreSQL rejected leaves the connection as
                // good as before; a closed or failing socket does not, nor
                // a server that cannot take writes any more.
                if connection_unusable(&error) {
                    self.broken.store(true, Ordering::Relaxed);
                }
                Err(DbError::Query(error))
            }
            Err(_) => Err(DbError::Timeout(self.deadline)),
        }
    }

    async fn prepared(
        &self,
        statement: &Statement,
    ) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        self.client()
            .prepare_typed_cached(statement.sql, statement.params)
            .await
    }

    /// Runs `statement` as an unnamed statement: parse, bind and execute in
    /// one message, nothing left on the server between transactions.
    async fn unnamed(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.client()
            .query_typed(statement.sql, &typed(statement, params))
            .await
    }

    /// Prepares `statements` on this connection now (each once: they are
    /// kept). Statements sent together (pipelined) reach the server in the
    /// order they were started only if none of them must be prepared first,
    /// so work whose statements depend on each other's effects prepares them
    /// before it starts them. Unnamed statements (no preparing) are always
    /// sent in order.
    pub async fn prepare(&self, statements: &[&Statement]) -> Result<(), DbError> {
        if !self.prepared {
            return Ok(());
        }
        let each = statements.iter().map(|statement| {
            self.bounded(statement.sql, async {
                self.prepared(statement).await.map(|_| ())
            })
        });
        futures_util::future::try_join_all(each).await?;
        Ok(())
    }

    pub async fn query(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, DbError> {
        self.bounded(statement.sql, async {
            if !self.prepared {
                return self.unnamed(statement, params).await;
            }
            let prepared = self.prepared(statement).await?;
            self.client().query(&prepared, params).await
        })
        .await
    }

    /// At most one row (statements written to return zero or one).
    pub async fn query_opt(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, DbError> {
        self.bounded(statement.sql, async {
            if !self.prepared {
                return Ok(self.unnamed(statement, params).await?.into_iter().next());
            }
            let prepared = self.prepared(statement).await?;
            self.client().query_opt(&prepared, params).await
        })
        .await
    }

    pub async fn execute(
        &self,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, DbError> {
        self.bounded(statement.sql, async {
            if !self.prepared {
                return self
                    .client()
                    .execute_typed(statement.sql, &typed(statement, params))
                    .await;
            }
            let prepared = self.prepared(statement).await?;
            self.client().execute(&prepared, params).await
        })
        .await
    }
}

/// The span a statement runs in, for finding slow ones: `db`, at debug
/// level, with `statement`, its name in `ALL_STATEMENTS`
/// (`charges::INSERT_OR_FIND`), else its SQL (`BEGIN`, `COMMIT`,
/// `ROLLBACK`). It ends with a debug line `statement` with `outcome` (`ok`,
/// `error`, `timeout`) and `elapsed_ms`; never the parameters, some of
/// which are secrets. With debug filtered out for this module (the default)
/// the span is disabled: nothing is looked up, timed or allocated.
fn statement_span(sql: &'static str) -> tracing::Span {
    tracing::debug_span!("db", statement = statement_name(sql))
}

fn statement_name(sql: &'static str) -> &'static str {
    ALL_STATEMENTS
        .iter()
        .find(|(_, statement)| statement.sql == sql)
        .map_or(sql, |(name, _)| name)
}

/// Each parameter with the type its statement declares.
fn typed<'a>(
    statement: &Statement,
    params: &[&'a (dyn ToSql + Sync)],
) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params
        .iter()
        .copied()
        .zip(statement.params.iter().cloned())
        .collect()
}

/// What a transaction's work decided.
pub enum Decision<T> {
    Commit(T),
    Rollback(T),
}

impl Conn {
    /// Runs `work` (statements on this connection) in one transaction: it
    /// commits or rolls back as `work` decides, and rolls back on an error.
    /// A connection left mid-transaction (a deadline, a cancelled caller) is
    /// closed rather than pooled, which rolls it back on the server.
    pub async fn transaction<T, F>(&self, work: F) -> Result<T, DbError>
    where
        F: std::future::Future<Output = Result<Decision<T>, DbError>>,
    {
        // BEGIN goes out with the work's first statements instead of a round
        // trip ahead of them: the connection sends requests in the order they
        // are made, so the server runs BEGIN first whatever the client waits
        // for. BEGIN fails only with the connection, which then fails the
        // work too and is not pooled again.
        let (begun, result) = futures_util::join!(self.batch("BEGIN"), work);
        if let Err(error) = begun {
            self.broken.store(true, Ordering::Relaxed);
            return Err(error);
        }
        match result {
            Ok(Decision::Commit(value)) => {
                self.batch("COMMIT").await?;
                Ok(value)
            }
            Ok(Decision::Rollback(value)) => {
                self.batch("ROLLBACK").await?;
                Ok(value)
            }
            Err(error) => {
                if self.batch("ROLLBACK").await.is_err() {
                    self.broken.store(true, Ordering::Relaxed);
                }
                Err(error)
            }
        }
    }

    async fn batch(&self, sql: &'static str) -> Result<(), DbError> {
        self.bounded(sql, self.client().batch_execute(sql)).await
    }
}

/// Whether a connection that got `error` must not be used again: it failed
/// (no SQLSTATE), its server is going away, or the server is read-only (a
/// standby, or a primary fenced for a switchover; it refuses our writes on
/// this connection for good, while a new one, with
/// `target_session_attrs=read-write`, finds the new primary).
fn connection_unusable(error: &tokio_postgres::Error) -> bool {
    error.code().is_none_or(unusable_state)
}

/// The SQLSTATEs after which a connection is not used again (see
/// `connection_unusable`).
pub(super) fn unusable_state(code: &SqlState) -> bool {
    *code == SqlState::READ_ONLY_SQL_TRANSACTION
        || *code == SqlState::ADMIN_SHUTDOWN
        || *code == SqlState::CRASH_SHUTDOWN
        || *code == SqlState::CANNOT_CONNECT_NOW
        || code.code().starts_with("08")
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            if self.broken.load(Ordering::Relaxed) || self.running.load(Ordering::Relaxed) > 0 {
                // Detached from the pool and dropped: the connection closes
                // and the pool opens a fresh one when it needs it.
                drop(Object::take(client));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{charges, APPLIED_MIGRATION};

    #[test]
    fn a_statement_span_is_named_after_the_statement() {
        assert_eq!(
            statement_name(charges::INSERT_OR_FIND.sql),
            "charges::INSERT_OR_FIND"
        );
        assert_eq!(
            statement_name(APPLIED_MIGRATION.sql),
            "db::APPLIED_MIGRATION"
        );
        assert_eq!(statement_name("COMMIT"), "COMMIT");
    }

    #[test]
    fn a_statement_span_costs_nothing_when_debug_is_filtered_out() {
        let info = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(info, || {
            assert!(statement_span("COMMIT").is_disabled());
        });
        let debug = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(debug, || {
            assert!(!statement_span("COMMIT").is_disabled());
        });
    }
}
