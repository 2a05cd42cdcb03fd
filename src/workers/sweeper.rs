//! The key sweeper: releases the idempotency keys of charges and refunds
//! once their replay window (`idempotency.retention_hours`) and the hold
//! after it (`idempotency.expired_key_hold_days`) have passed, by the
//! database's clock, in bounded batches, so the unique index stays small and
//! a key may name a new request. The charges and refunds themselves stay.

use tokio_util::sync::CancellationToken;

use crate::config::IdempotencySettings;
use crate::db::{self, Database};
use crate::domain::{Charge, Refund};
use crate::service::ServiceError;
use crate::telemetry::error_chain;

/// Most batches one round may release, so a backlog never monopolises a
/// connection; the next round continues.
const MAX_BATCHES_PER_ROUND: usize = 100;

pub async fn run(db: Database, settings: IdempotencySettings, stop: CancellationToken) {
    let interval = settings.sweep_interval;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        match sweep(&db, &settings).await {
            Ok(0) => {}
            Ok(released) => {
                crate::metrics::keys_released(released);
                tracing::info!(released, "released expired idempotency keys")
            }
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "key sweep failed; will retry")
            }
        }
    }
}

/// One round: releases expired keys batch by batch; returns how many.
pub async fn sweep(db: &Database, settings: &IdempotencySettings) -> Result<u64, ServiceError> {
    let release_after =
        chrono::Duration::from_std(settings.release_after()).unwrap_or(chrono::Duration::MAX);
    let conn = db.conn().await?;
    // The database's clock, as for every time rule (`crate::clock`).
    let cutoff = db::database_now(&conn).await? - release_after;
    let batch = settings.sweep_batch_size;
    let mut total = 0;
    for _ in 0..MAX_BATCHES_PER_ROUND {
        let released = db::records::release_expired_keys::<Charge>(&conn, cutoff, batch).await?;
        total += released;
        if released < batch as u64 {
            break;
        }
    }
    for _ in 0..MAX_BATCHES_PER_ROUND {
        let released = db::records::release_expired_keys::<Refund>(&conn, cutoff, batch).await?;
        total += released;
        if released < batch as u64 {
            break;
        }
    }
    Ok(total)
}
