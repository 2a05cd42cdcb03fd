//! The recovery worker: every `recovery.interval_ms` it claims pending charges
//! whose lease ran out (the request that owned them died, or got no answer
//! from the processor) and finishes them through the request path, with the
//! same downstream key. So every accepted charge reaches a final state
//! without any help from the client.

use tokio_util::sync::CancellationToken;

use crate::config::RecoverySettings;
use crate::service::charges::Charges;
use crate::telemetry::error_chain;

pub async fn run(charges: Charges, settings: RecoverySettings, stop: CancellationToken) {
    let interval = settings.interval;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        // A full batch suggests a backlog: go again at once.
        loop {
            match charges.recover_abandoned(settings.batch_size).await {
                Ok(claimed) if claimed as i64 >= settings.batch_size && !stop.is_cancelled() => {}
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), "recovery round failed; will retry");
                    break;
                }
            }
        }
    }
}
