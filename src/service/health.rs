//! Readiness: the database answers and carries every migration this binary
//! knows.

use crate::db::{self, Database};

use super::ServiceError;

/// The schema version, if the database is ready for this binary.
pub async fn ready(db: &Database) -> Result<i64, ServiceError> {
    let conn = db.conn().await?;
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
