//! The webhook dispatcher: every `webhooks.interval_ms` a round of
//! `service::dispatch` (fan out new events, start due deliveries), and
//! another at once while rounds find full batches. On stop it starts
//! nothing new and waits for the attempts in flight (at most a lease), so
//! a graceful shutdown leaves no delivery to be sent twice.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::service::dispatch::Dispatcher;
use crate::telemetry::error_chain;

pub async fn run(dispatcher: Dispatcher, interval: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(interval) => {}
        }
        loop {
            match dispatcher.round().await {
                Ok(round) if round.busy && !stop.is_cancelled() => {}
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), "webhook dispatch round failed; will retry");
                    break;
                }
            }
        }
    }
    dispatcher.drain().await;
}
