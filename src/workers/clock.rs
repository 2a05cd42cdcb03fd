//! Keeps `crate::clock` on the database's time: measures the offset between
//! this process's clock and PostgreSQL's every `clock::MEASURE_EVERY`,
//! exposes it (`chargeonce_clock_offset_seconds`) and logs an error while it
//! is beyond `clock::OFFSET_WARNING` either way.

use tokio_util::sync::CancellationToken;

use crate::clock;
use crate::db::{self, Database, DbError};
use crate::telemetry::error_chain;

pub async fn run(db: Database, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(clock::MEASURE_EVERY) => {}
        }
        if let Err(error) = measure(&db).await {
            tracing::warn!(error = %error_chain(&error), "cannot read the database's clock; keeping the last offset");
        }
    }
}

/// Reads the database's clock once and sets the offset from it.
pub async fn measure(db: &Database) -> Result<chrono::Duration, DbError> {
    let conn = db.conn().await?;
    let asked = chrono::Utc::now();
    let database = db::database_now(&conn).await?;
    let offset = clock::set_from(database, asked, chrono::Utc::now());
    let seconds = offset.num_milliseconds() as f64 / 1000.0;
    crate::metrics::clock_offset(seconds);
    if offset.abs().to_std().unwrap_or_default() > clock::OFFSET_WARNING {
        tracing::error!(
            offset_seconds = seconds,
            "this machine's clock differs from the database's; ids, replay windows and \
             webhook timestamps use the database's time, but fix the clock (NTP)"
        );
    }
    Ok(offset)
}
