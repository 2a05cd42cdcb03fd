//! The outbox backlog for the metrics: every second, one statement
//! (`db::events::BACKLOG`, a bounded read across merchants) on the
//! dispatcher's pool, its result set as the `chargeonce_webhook_*` backlog
//! gauges. A loop of its own rather than a step of the dispatcher's rounds,
//! so the gauges keep telling the truth when rounds are far apart
//! (`webhooks.interval_ms`) or stuck: a backlog that grows because the
//! dispatcher does not move is the one to see.
//!
//! Every instance measures the same database-wide numbers; add them up
//! across instances with `max`, not `sum`.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::{self, Database};
use crate::telemetry::error_chain;

/// How often the backlog is measured.
pub const EVERY: Duration = Duration::from_secs(1);

/// Most undispatched events and most pending deliveries counted (and read)
/// per measurement; the metrics' descriptions name this number. At both
/// limits a measurement reads about 20,000 index entries and their rows
/// (20 ms on a development machine, with 50,000 undispatched events and
/// 30,000 pending deliveries); with no backlog, a few pages.
pub const COUNT_LIMIT: i64 = 10_000;

pub async fn run(db: Database, stop: CancellationToken) {
    loop {
        let measured = async {
            let conn = db.conn().await?;
            db::events::backlog(&conn, COUNT_LIMIT).await
        }
        .await;
        match measured {
            Ok(backlog) => crate::metrics::webhook_backlog(
                backlog.undispatched_events,
                backlog.set_aside_events,
                backlog.pending_deliveries,
                backlog.oldest_age_seconds,
            ),
            // The gauges keep their last values; the warning says why.
            Err(error) => {
                tracing::warn!(error = %error_chain(&error), "cannot measure the webhook backlog; will retry")
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(EVERY) => {}
        }
    }
}
