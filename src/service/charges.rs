//! Creating a charge exactly once.
//!
//! 1. Insert the charge as `pending` with a lease and commit, before any side
//!    effect. The unique (merchant, key) index makes this the one decision
//!    point: whoever inserts owns the charge; everyone else finds the row.
//! 2. Call the processor with the charge's stable downstream key, holding no
//!    database connection.
//! 3. Record the outcome and its outbox event in one statement.
//!
//! A request that finds a pending charge whose lease ran out (its owner died
//! or got no answer) takes the lease over and repeats step 2 with the same
//! downstream key; the processor answers as it did the first time.
//!
//! What a client is told never claims less than happened:
//! - 503 (`ServiceError::Unavailable`) only before the processor was called.
//!   If the insert of step 1 may have committed although its answer was
//!   lost, a background task deletes the row again once the database
//!   answers, as long as nobody has worked on it (`forget_unconfirmed`).
//! - After the processor answered, the outcome is recorded, retrying while
//!   the database is away, for as long as our lease lasts; then the answer is
//!   202 with the charge still pending, and whoever comes next finishes it.

use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::config::{IdempotencySettings, RecoverySettings};
use crate::crash;
use crate::db::{self, Database};
use crate::domain::{
    Charge, ChargeId, ChargeStatus, IdempotencyKey, MerchantId, NewCharge, RequestFingerprint,
};
use crate::processor::{PaymentProcessor, PaymentRequest, ProcessorReply};
use crate::telemetry::error_chain;

use super::ServiceError;

/// What a client is told to wait before retrying a key that is in flight.
/// Requests normally finish in milliseconds, so a second is a fair hint even
/// though the lease itself may run longer.
pub const IN_USE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Longest pause between two looks at a charge in flight elsewhere.
const MAX_IN_FLIGHT_POLL: Duration = Duration::from_millis(20);

/// Longest pause between two tries to reach the database while holding an
/// answer it must record.
const MAX_RECORD_PAUSE: Duration = Duration::from_secs(1);

/// A charge to answer with. `replayed` is true when the key already existed,
/// so the answer belongs to an earlier request.
#[derive(Debug)]
pub struct ChargeReply {
    pub charge: Charge,
    pub replayed: bool,
}

/// A pending charge whose lease we hold, and when the lease ends by this
/// process's clock (measured from before the statement that took it, so it
/// never ends later than the database thinks).
struct Leased {
    charge: Charge,
    until: Instant,
}

/// How often a key may vanish under a request (the sweeper released it, or an
/// unconfirmed insert was undone) before it gives up with 503.
const MAX_KEY_ROUNDS: usize = 3;

/// The charge flows and what they need: the database (an HTTP worker's own
/// pool), the processor, and the lease and retry rules. Cheap to clone.
#[derive(Clone)]
pub struct Charges {
    db: Database,
    processor: Arc<dyn PaymentProcessor>,
    /// How long a request owns a pending charge before others may take over.
    lease: Duration,
    /// How long a request waits for a concurrent one with the same key to
    /// finish before answering 409.
    in_flight_wait: Duration,
    /// The recovery worker's pace after unknown outcomes.
    retry_base: Duration,
    retry_cap: Duration,
}

impl Charges {
    pub fn new(
        db: Database,
        processor: Arc<dyn PaymentProcessor>,
        idempotency: &IdempotencySettings,
        recovery: &RecoverySettings,
    ) -> Self {
        Self {
            db,
            processor,
            lease: idempotency.lease,
            in_flight_wait: idempotency.in_flight_wait,
            retry_base: recovery.interval,
            retry_cap: recovery.max_backoff,
        }
    }

    /// The same flows on another pool (each HTTP worker thread has its own).
    pub fn with_database(&self, db: Database) -> Self {
        Self { db, ..self.clone() }
    }

    pub async fn create(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
        fingerprint: RequestFingerprint,
        request: &NewCharge,
    ) -> Result<ChargeReply, ServiceError> {
        for _ in 0..MAX_KEY_ROUNDS {
            let id = ChargeId::new();
            let started = Instant::now();
            let inserted = async {
                let conn = self.db.conn().await?;
                db::charges::insert_or_find(
                    &conn,
                    id,
                    merchant,
                    key,
                    &fingerprint.current,
                    request,
                    self.lease,
                )
                .await
            }
            .await;
            let (charge, created) = match inserted {
                Ok(Some(found)) => found,
                Ok(None) => continue,
                Err(error) => {
                    if error.is_ambiguous() {
                        self.forget_unconfirmed(merchant, id);
                    }
                    return Err(error.into());
                }
            };
            // Same key, different request: a client bug. Never execute it.
            if !fingerprint.matches(&charge.fingerprint) {
                return Err(ServiceError::KeyReused);
            }
            if created {
                let leased = Leased {
                    charge,
                    until: started + self.lease,
                };
                return self.process(leased, false).await;
            }
            if charge.status != ChargeStatus::Pending {
                return Ok(ChargeReply {
                    charge,
                    replayed: true,
                });
            }
            // `None`: the charge disappeared while we looked: start over.
            if let Some(reply) = self.resume(charge).await? {
                return Ok(reply);
            }
        }
        Err(ServiceError::KeyContended)
    }

    pub async fn get(&self, merchant: MerchantId, id: ChargeId) -> Result<Charge, ServiceError> {
        let conn = self.db.conn().await?;
        db::charges::find(&conn, merchant, id)
            .await?
            .ok_or(ServiceError::NotFound)
    }

    /// Up to `limit` charges, newest first, after `starting_after`.
    pub async fn list(
        &self,
        merchant: MerchantId,
        limit: i64,
        starting_after: Option<ChargeId>,
    ) -> Result<Vec<Charge>, ServiceError> {
        let conn = self.db.conn().await?;
        Ok(db::charges::list(&conn, merchant, limit, starting_after).await?)
    }

    /// A pending charge found by a retry or a concurrent duplicate. If its
    /// lease ran out, take it over and finish it. If it is in flight
    /// elsewhere, wait up to `in_flight_wait` for that request to finish and
    /// answer with its result; only then give up with 409.
    /// `None` if the charge vanished meanwhile (its insert was undone).
    async fn resume(&self, charge: Charge) -> Result<Option<ChargeReply>, ServiceError> {
        let deadline = Instant::now() + self.in_flight_wait;
        let mut pause = Duration::from_millis(1);
        loop {
            let started = Instant::now();
            let found = {
                let conn = self.db.conn().await?;
                db::charges::take_over_or_read(&conn, charge.id, self.lease).await?
            };
            let Some((current, taken)) = found else {
                return Ok(None);
            };
            if taken {
                let leased = Leased {
                    charge: current,
                    until: started + self.lease,
                };
                return self.process(leased, true).await.map(Some);
            }
            if current.status != ChargeStatus::Pending {
                return Ok(Some(ChargeReply {
                    charge: current,
                    replayed: true,
                }));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(ServiceError::KeyInUse {
                    retry_after: IN_USE_RETRY_AFTER,
                });
            }
            tokio::time::sleep(pause.min(remaining)).await;
            pause = (pause * 2).min(MAX_IN_FLIGHT_POLL);
        }
    }

    /// Steps 2 and 3 for a charge whose lease we hold. Runs as its own task
    /// so a client that hangs up mid-request cannot cancel it between the
    /// processor's answer and the outcome's commit.
    async fn process(&self, leased: Leased, replayed: bool) -> Result<ChargeReply, ServiceError> {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let charge = this.call_processor_and_record(leased).await?;
            Ok(ChargeReply { charge, replayed })
        });
        task.await.map_err(ServiceError::TaskFailed)?
    }

    /// Undoes, in the background, an insert whose commit was not confirmed,
    /// so the 503 its request gets stays true: the row goes unless someone
    /// has started to work on it.
    ///
    /// The insert may still be on its way (held in a stalled network, it
    /// executes when the partition heals), so not finding the row proves
    /// nothing: the task keeps looking for twice the lease. A row that lands
    /// within that window is deleted long before its own lease lets the
    /// recovery worker claim it. One that lands later still (a partition of
    /// more than two leases with this insert in flight) is finished by the
    /// worker like any abandoned charge; the README says so.
    fn forget_unconfirmed(&self, merchant: MerchantId, id: ChargeId) {
        let this = self.clone();
        let until = Instant::now() + self.lease * 2;
        tokio::spawn(async move {
            let mut pause = Duration::from_millis(50);
            while Instant::now() < until {
                let forgotten = async {
                    let conn = this.db.conn().await?;
                    db::charges::forget_unconfirmed(&conn, merchant, id).await
                }
                .await;
                match forgotten {
                    Ok(true) => {
                        tracing::warn!(charge = %id, "undid a charge insert whose commit was unconfirmed");
                        return;
                    }
                    Ok(false) => {}
                    Err(error) => {
                        tracing::debug!(charge = %id, error = %error_chain(&error), "cannot undo an unconfirmed insert yet");
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RECORD_PAUSE);
            }
        });
    }

    /// Finishes abandoned charges (pending, lease run out, backoff passed)
    /// through the same path a request takes; returns how many it claimed.
    /// Used by the recovery worker.
    pub async fn recover_abandoned(&self, batch: i64) -> Result<usize, ServiceError> {
        let started = Instant::now();
        let claimed = {
            let conn = self.db.conn().await?;
            db::charges::claim_abandoned(&conn, self.lease, batch).await?
        };
        let count = claimed.len();
        let results = futures_util::future::join_all(claimed.into_iter().map(|charge| {
            self.call_processor_and_record(Leased {
                charge,
                until: started + self.lease,
            })
        }))
        .await;
        for result in results {
            match result {
                Ok(charge) if charge.status == ChargeStatus::Pending => {
                    tracing::info!(charge = %charge.id, attempts = charge.processor_attempts, "still pending after recovery attempt")
                }
                Ok(charge) => {
                    tracing::info!(charge = %charge.id, status = charge.status.as_str(), "recovered")
                }
                Err(error) => {
                    tracing::warn!(error = %error_chain(&error), "recovery attempt failed")
                }
            }
        }
        Ok(count)
    }

    /// Steps 2 and 3, for a charge whose lease the caller holds.
    async fn call_processor_and_record(&self, leased: Leased) -> Result<Charge, ServiceError> {
        crash::point("after_pending_commit");
        let charge = &leased.charge;
        let processor_key = charge.id.processor_idempotency_key();
        let reply = self
            .processor
            .charge(&PaymentRequest {
                idempotency_key: &processor_key,
                amount: charge.amount,
                currency: &charge.currency,
                customer: charge.customer.as_deref(),
                description: charge.description.as_deref(),
            })
            .await;
        crash::point("after_processor_reply");
        match reply {
            ProcessorReply::Final(outcome) => {
                // The outcome is known and must not be lost: keep trying to
                // record it while the lease lasts. Never call the processor
                // again for it.
                let mut pause = Duration::from_millis(50);
                loop {
                    let recorded = async {
                        let conn = self.db.conn().await?;
                        match db::charges::record_outcome(&conn, charge, &outcome).await? {
                            Some(recorded) => Ok(Some(recorded)),
                            // Someone else recorded it first (the processor
                            // gave them the same answer) or took the lease
                            // over: show the charge as it is now.
                            None => db::charges::find(&conn, charge.merchant_id, charge.id).await,
                        }
                    }
                    .await;
                    match recorded {
                        Ok(recorded) => {
                            crash::point("after_outcome_commit");
                            return recorded.ok_or(ServiceError::NotFound);
                        }
                        Err(error) if error.is_transient() => {
                            if Instant::now() + pause >= leased.until {
                                tracing::error!(charge = %charge.id, error = %error_chain(&error), "processor answered but the outcome could not be recorded within the lease; answering pending");
                                return Ok(leased.charge);
                            }
                            tracing::warn!(charge = %charge.id, error = %error_chain(&error), "cannot record the processor's answer yet; retrying");
                            tokio::time::sleep(pause).await;
                            pause = (pause * 2).min(MAX_RECORD_PAUSE);
                        }
                        Err(error) => return Err(error.into()),
                    }
                }
            }
            ProcessorReply::Unknown { reason, attention } => {
                let retry_in = retry_delay(
                    charge.processor_attempts,
                    self.retry_base,
                    self.retry_cap,
                    rand::thread_rng().gen(),
                );
                if attention {
                    tracing::error!(charge = %charge.id, %reason, "processor outcome unknown and needs attention; charge stays pending");
                } else {
                    tracing::warn!(charge = %charge.id, %reason, "processor outcome unknown; charge stays pending");
                }
                // One try: if the database is away too, the lease simply
                // runs out and the next request or the worker goes on.
                let recorded = async {
                    let conn = self.db.conn().await?;
                    match charge.locked_until {
                        Some(lease) => {
                            db::charges::record_unknown(&conn, charge.id, lease, retry_in).await
                        }
                        None => Ok(None),
                    }
                }
                .await;
                match recorded {
                    Ok(Some(recorded)) => Ok(recorded),
                    Ok(None) => Ok(leased.charge),
                    Err(error) => {
                        tracing::warn!(charge = %charge.id, error = %error_chain(&error), "cannot record an unknown outcome; the lease will run out");
                        Ok(leased.charge)
                    }
                }
            }
        }
    }
}

/// How long the recovery worker waits after the `attempts + 1`-th call
/// without a final answer: `base · 2^attempts`, capped, then a random share
/// of it between a half and all (`jitter` in 0..1), so charges that failed
/// together do not come back together.
pub fn retry_delay(attempts: i32, base: Duration, cap: Duration, jitter: f64) -> Duration {
    let exponent = u32::try_from(attempts.clamp(0, 30)).unwrap_or(0);
    let full = base.saturating_mul(1 << exponent).min(cap);
    full.mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_delay_doubles_up_to_the_cap_with_jitter() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_millis(1000);
        let delays: Vec<_> = (0..6).map(|n| retry_delay(n, base, cap, 1.0)).collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        assert_eq!(retry_delay(2, base, cap, 0.0), Duration::from_millis(200));
        assert_eq!(retry_delay(2, base, cap, 0.5), Duration::from_millis(300));
        assert_eq!(retry_delay(1000, base, cap, 1.0), cap);
        assert_eq!(retry_delay(-3, base, cap, 1.0), base);
    }
}
