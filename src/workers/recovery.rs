//! The recovery worker: every `recovery.interval_ms` it claims pending
//! charges and refunds whose lease ran out (the request that owned them died,
//! or got no answer from the processor) and whose backoff has passed, and
//! finishes them through the request path, with the same downstream key. So
//! every accepted charge and refund reaches a final state without any help
//! from the client.

use tokio_util::sync::CancellationToken;

use crate::config::RecoverySettings;
use crate::service::charges::Charges;
use crate::service::refunds::Refunds;
use crate::service::ServiceError;
use crate::telemetry::error_chain;

pub async fn run(
    charges: Charges,
    refunds: Refunds,
    settings: RecoverySettings,
    stop: CancellationToken,
) {
    let interval = settings.interval;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        drain(&stop, settings.batch_size, "charges", || {
            charges.recover_abandoned(settings.batch_size)
        })
        .await;
        drain(&stop, settings.batch_size, "refunds", || {
            refunds.recover_abandoned(settings.batch_size)
        })
        .await;
    }
}

/// Runs `round` while it claims full batches (a backlog), else once.
async fn drain<F, Fut>(stop: &CancellationToken, batch: i64, what: &str, round: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<usize, ServiceError>>,
{
    loop {
        match round().await {
            Ok(claimed) if claimed as i64 >= batch && !stop.is_cancelled() => {}
            Ok(_) => break,
            Err(error) => {
                tracing::warn!(what, error = %error_chain(&error), "recovery round failed; will retry");
                break;
            }
        }
    }
}
