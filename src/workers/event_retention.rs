//! Event retention: every `events.sweep_interval_ms`, deletes events older
//! than `events.retention_days` that are done with (dispatched, no delivery
//! pending), in batches of `events.sweep_batch_size`; their deliveries and
//! attempts go with them. An event still being delivered stays, however old.

use tokio_util::sync::CancellationToken;

use crate::config::EventSettings;
use crate::db::{self, Database};
use crate::service::ServiceError;
use crate::telemetry::error_chain;

/// Most batches one round may delete, so a backlog never monopolises a
/// connection; the next round continues.
const MAX_BATCHES_PER_ROUND: usize = 100;

pub async fn run(db: Database, settings: EventSettings, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(settings.sweep_interval) => {}
        }
        match sweep(&db, &settings).await {
            Ok(0) => {}
            Ok(deleted) => tracing::info!(deleted, "deleted events past retention"),
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "event retention sweep failed; will retry")
            }
        }
    }
}

/// One round: deletes expired, delivered events batch by batch; returns how
/// many.
pub async fn sweep(db: &Database, settings: &EventSettings) -> Result<u64, ServiceError> {
    let retention =
        chrono::Duration::from_std(settings.retention()).unwrap_or(chrono::Duration::MAX);
    let conn = db.conn().await?;
    // The database's clock, as for every time rule (`crate::clock`).
    let cutoff = db::database_now(&conn).await? - retention;
    let mut total = 0;
    for _ in 0..MAX_BATCHES_PER_ROUND {
        let deleted = db::events::delete_expired(&conn, cutoff, settings.sweep_batch_size).await?;
        total += deleted;
        if deleted < settings.sweep_batch_size as u64 {
            break;
        }
    }
    Ok(total)
}
