//! Readiness: the database answers and carries every migration this binary
//! knows.

use std::time::Duration;

use crate::db::{self, Database};

use super::ServiceError;

/// The schema version, if the database is ready for this binary; the whole
/// check takes at most `bound`.
pub async fn ready(db: &Database, bound: Duration) -> Result<i64, ServiceError> {
    let conn = db.conn_within(bound).await?;
    let applied = match db::applied_migration(&conn).await {
        Ok(version) => version,
        // Not migrated at all: no history table yet.
        Err(error) if !error.is_transient() => None,
        Err(error) => return Err(error.into()),
    };
    let expected = db::latest_migration();
    if applied.is_some_and(|version| version >= expected) {
        Ok(expected)
    } else {
        Err(ServiceError::SchemaBehind { applied, expected })
    }
}
