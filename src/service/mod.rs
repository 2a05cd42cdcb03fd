//! Core flows: what a request does, independent of HTTP. Each service takes
//! its dependencies explicitly (a `Database`, the processor, settings) and
//! returns a `ServiceError`; `crate::error` is the one bridge to HTTP.

pub mod api_keys;
pub mod charges;
pub mod dispatch;
pub mod events;
pub mod health;
pub mod lifecycle;
pub mod refunds;
pub mod replay_cache;
pub mod webhook_endpoints;

use std::time::Duration;

use crate::db::DbError;
use crate::domain::FieldError;

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// PostgreSQL could not be reached or did not answer in time; nothing
    /// was done by this call.
    #[error("the database is unavailable")]
    Unavailable(#[source] DbError),
    /// A database error that retrying will not fix: a bug.
    #[error("database failure")]
    Database(#[source] DbError),
    #[error("the database schema is at version {applied:?}, this binary needs {expected}")]
    SchemaBehind { applied: Option<i64>, expected: i64 },
    /// The key was used with another request: a client bug, never executed.
    /// `differing_fields` names the fields of the normalised request that
    /// differ from the first one's (`domain::differences`), when they can
    /// be told.
    #[error("this idempotency key was already used with a different request")]
    KeyReused {
        differing_fields: Option<Vec<String>>,
    },
    /// The key's replay window ended: the request is not executed, and
    /// nothing is replayed. `object` is the public id of what the key
    /// created.
    #[error("the replay window of this idempotency key ended at {window_ended}")]
    KeyExpired {
        object: String,
        window_ended: chrono::DateTime<chrono::Utc>,
    },
    #[error("a request with this idempotency key is still in flight")]
    KeyInUse { retry_after: Duration },
    /// The key was released and taken again while this request looked it up,
    /// repeatedly; retrying is safe.
    #[error("the idempotency key kept changing hands")]
    KeyContended,
    #[error("no such resource")]
    NotFound,
    /// Only a succeeded charge can be refunded.
    #[error("the charge is {} and cannot be refunded", status.as_str())]
    ChargeNotRefundable { status: crate::domain::Status },
    #[error("the refund is more than what remains refundable ({refundable})")]
    RefundExceedsCharge { refundable: i64 },
    #[error("a charge task failed")]
    TaskFailed(#[source] tokio::task::JoinError),
    /// A request that parsed but cannot be carried out as asked (a webhook
    /// URL that leads to a private address).
    #[error("{detail}")]
    Invalid {
        detail: String,
        errors: Vec<FieldError>,
    },
}

impl From<DbError> for ServiceError {
    fn from(error: DbError) -> Self {
        if error.is_transient() {
            Self::Unavailable(error)
        } else {
            Self::Database(error)
        }
    }
}
