//! The dispatcher: the outbox delivered to the merchants' webhook endpoints,
//! at least once. Run by `workers::dispatcher` in every instance; the
//! instances share the work through the database alone.
//!
//! 1. **Fan-out** (`db::events::FAN_OUT`, one statement): events taken off
//!    the queue (`event_queue`) become one pending delivery per live
//!    endpoint that wants their type, atomically.
//! 2. **Claim** (`db::webhook_deliveries::CLAIM_DUE`, one statement): due
//!    pending deliveries are leased for `webhooks.timeout_ms` + 5 s. No other
//!    instance claims a delivery while its lease lasts, so a delivery is
//!    never being sent twice at the same time.
//! 3. **Attempt** (`webhooks::Sender`), holding no database connection and
//!    no transaction: the receiver's time is never the database's.
//! 4. **Record** (`db::webhook_deliveries::RECORD_ATTEMPT`, one statement):
//!    the attempt, and the delivery's new state (delivered on 2xx; else
//!    pending again after a backoff with full jitter, or failed after
//!    `webhooks.max_attempts`), matched by our exact lease.
//!
//! If the process dies between 3 and 4, the delivery comes due again when
//! its lease runs out and is sent again, with the same `webhook-id`:
//! receivers deduplicate by it. That duplicate is the price of at-least-once;
//! nothing is ever lost, since an event leaves the outbox only by retention,
//! and retention takes only events with no pending delivery.
//!
//! Nothing here touches `charges`: the dispatcher has its own pool, and the
//! fan-out's row locks are on events only, which a charge's statements
//! insert but never lock.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::backoff::{full_jitter, Backoff, RECORD_RETRY};
use crate::config::WebhookSettings;
use crate::db::webhook_deliveries::{AttemptRecord, ClaimedDelivery};
use crate::db::{self, Database};
use crate::domain::DeliveryStatus;
use crate::metrics;
use crate::telemetry::error_chain;
use crate::webhooks::Sender;

use super::ServiceError;

/// What one round did, and whether there is probably more to do at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    pub events_dispatched: i64,
    pub deliveries_created: i64,
    pub deliveries_started: usize,
    /// A full batch was fanned out or claimed: go again without waiting.
    pub busy: bool,
}

/// The fan-out and the delivery of webhooks. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    db: Database,
    sender: Sender,
    settings: WebhookSettings,
    /// One permit per delivery being attempted, `webhooks.batch_size` in
    /// all: a slow receiver holds its own permit, not a whole batch.
    in_flight: Arc<Semaphore>,
}

impl Dispatcher {
    /// `db` should be a pool of its own, so deliveries never wait for the
    /// request handlers' connections, nor they for ours.
    pub fn new(db: Database, sender: Sender, settings: WebhookSettings) -> Self {
        let permits = usize::try_from(settings.batch_size).unwrap_or(1).max(1);
        Self {
            db,
            sender,
            settings,
            in_flight: Arc::new(Semaphore::new(permits)),
        }
    }

    /// One round: fan out a batch of new events, then start attempts for as
    /// many due deliveries as there are free permits. The attempts run on in
    /// the background; `drain` waits for them.
    pub async fn round(&self) -> Result<Round, ServiceError> {
        let fanned = {
            let conn = self.db.conn().await?;
            db::events::fan_out(&conn, self.settings.batch_size).await?
        };
        let free = self.in_flight.available_permits();
        let started = if free == 0 {
            0
        } else {
            self.start_due(free).await?
        };
        Ok(Round {
            events_dispatched: fanned.events,
            deliveries_created: fanned.deliveries,
            deliveries_started: started,
            busy: more_to_do(fanned.events, self.settings.batch_size, free, started),
        })
    }

    /// Claims up to `free` due deliveries and starts an attempt of each;
    /// returns how many it took off the queue, given up ones included (a
    /// claim full of them is a full batch too).
    async fn start_due(&self, free: usize) -> Result<usize, ServiceError> {
        let lease = self.settings.lease();
        // Our clock's view of the lease ends no later than the database's.
        let lease_ends = Instant::now() + lease;
        let claim = {
            let conn = self.db.conn().await?;
            db::webhook_deliveries::claim_due(&conn, lease, i64::try_from(free).unwrap_or(1))
                .await?
        };
        if claim.dropped > 0 {
            metrics::webhook_deliveries_failed("endpoint_deleted", claim.dropped);
            tracing::info!(
                deliveries = claim.dropped,
                "gave up deliveries to deleted webhook endpoints"
            );
        }
        let taken = claim.taken();
        for delivery in claim.deliveries {
            // Only this task takes permits, and it claimed no more than
            // were free: this cannot fail. If it ever did, the delivery's
            // lease runs out and it comes due again.
            let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
                tracing::error!("no free delivery permit for a claimed delivery");
                continue;
            };
            let this = self.clone();
            tokio::spawn(async move {
                this.attempt(&delivery, lease_ends).await;
                drop(permit);
            });
        }
        Ok(taken)
    }

    /// Sends one delivery and records the attempt.
    async fn attempt(&self, delivery: &ClaimedDelivery, lease_ends: Instant) {
        let outcome = self
            .sender
            .send(&delivery.url, &delivery.secret, &delivery.event)
            .await;
        metrics::webhook_attempt(outcome.kind.as_str(), outcome.duration);
        let number = delivery.attempts + 1;
        let record = AttemptRecord {
            delivered: outcome.delivered(),
            status_code: outcome.status_code.map(i32::from),
            error: outcome.error.as_deref(),
            duration_ms: i32::try_from(outcome.duration.as_millis()).unwrap_or(i32::MAX),
            max_attempts: i32::try_from(self.settings.max_attempts).unwrap_or(i32::MAX),
            retry_in: backoff(
                number,
                self.settings.backoff_base,
                self.settings.max_backoff,
                rand::random(),
            ),
        };
        let event = delivery.event.id.to_string();
        let endpoint = delivery.endpoint_id.to_string();
        // The attempt is over; what is left is telling the database. While
        // it is away, keep trying as long as the lease lasts: after that,
        // another instance may be sending this delivery again, and our
        // record would no longer match its lease anyway.
        let mut pauses = RECORD_RETRY.pauses();
        let mut pause = pauses.next_pause();
        loop {
            let recorded = async {
                let conn = self.db.conn().await?;
                db::webhook_deliveries::record_attempt(&conn, delivery, &record).await
            }
            .await;
            match recorded {
                Ok(Some(recorded)) => {
                    match recorded.status {
                        DeliveryStatus::Delivered => {
                            tracing::debug!(%event, %endpoint, attempt = number, "webhook delivered")
                        }
                        DeliveryStatus::Pending => tracing::info!(
                            %event, %endpoint, attempt = number,
                            status = ?outcome.status_code, error = outcome.error.as_deref().unwrap_or(""),
                            next_attempt_at = %recorded.next_attempt_at,
                            "webhook attempt failed; will retry"
                        ),
                        DeliveryStatus::Failed => {
                            metrics::webhook_deliveries_failed("max_attempts", 1);
                            tracing::warn!(
                                %event, %endpoint, attempts = recorded.attempts,
                                status = ?outcome.status_code, error = outcome.error.as_deref().unwrap_or(""),
                                "webhook delivery failed for good (webhooks.max_attempts)"
                            )
                        }
                    }
                    return;
                }
                Ok(None) => {
                    tracing::warn!(%event, %endpoint, attempt = number, "webhook attempt not recorded: its lease had run out");
                    return;
                }
                Err(error) if error.is_transient() && Instant::now() + pause < lease_ends => {
                    tracing::debug!(%event, %endpoint, error = %error_chain(&error), "cannot record a webhook attempt yet; retrying");
                    tokio::time::sleep(pause).await;
                    pause = pauses.next_pause();
                }
                Err(error) => {
                    tracing::warn!(%event, %endpoint, error = %error_chain(&error), "cannot record a webhook attempt; the delivery comes due again when its lease runs out");
                    return;
                }
            }
        }
    }

    /// Waits until no attempt is in flight (on shutdown), at most one lease.
    pub async fn drain(&self) {
        let all = u32::try_from(self.settings.batch_size).unwrap_or(1).max(1);
        let _ = tokio::time::timeout(self.settings.lease(), self.in_flight.acquire_many(all)).await;
    }
}

/// Whether a round probably left work that is ready now: it fanned out a
/// full batch of events, or it started a delivery for every permit that
/// was free. With no permit free it claimed nothing, and what is due waits
/// for the next interval, when attempts in flight have given theirs back.
fn more_to_do(events: i64, batch_size: i64, free: usize, started: usize) -> bool {
    events >= batch_size || (free > 0 && started >= free)
}

/// How long to wait after failed attempt number `attempt` (1-based): a
/// random share (`jitter` in 0..1) of `base · 2^(attempt-1)`, at most
/// `cap` ("full jitter"), so deliveries that failed together, e.g. while a
/// receiver was down, do not all come back at the same moment.
pub fn backoff(attempt: i32, base: Duration, cap: Duration, jitter: f64) -> Duration {
    let failures = u32::try_from(attempt).unwrap_or(0);
    full_jitter(Backoff::new(base, cap).after(failures), jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_goes_again_at_once_only_after_a_full_batch() {
        // (events fanned out, batch size, free permits, deliveries started)
        assert!(more_to_do(10, 10, 0, 0), "a full fan-out");
        assert!(more_to_do(11, 10, 4, 0), "more than a batch");
        assert!(more_to_do(3, 10, 4, 4), "every free permit used");
        assert!(!more_to_do(9, 10, 4, 3), "fewer due than permits");
        assert!(!more_to_do(9, 10, 0, 0), "no permit free: nothing claimed");
        assert!(!more_to_do(0, 10, 4, 0), "nothing to do");
    }

    #[test]
    fn the_backoff_doubles_up_to_the_cap_with_full_jitter() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_millis(1000);
        let ceilings: Vec<_> = (1..=6).map(|n| backoff(n, base, cap, 1.0)).collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        assert_eq!(backoff(3, base, cap, 0.0), Duration::ZERO);
        assert_eq!(backoff(3, base, cap, 0.25), Duration::from_millis(100));
        assert_eq!(backoff(10_000, base, cap, 1.0), cap);
        assert_eq!(backoff(-1, base, cap, 1.0), base);
    }
}
