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

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::IdempotencySettings;
use crate::crash;
use crate::db::{self, Database};
use crate::domain::{
    Charge, ChargeId, ChargeStatus, Fingerprint, IdempotencyKey, MerchantId, NewCharge,
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

/// A charge to answer with. `replayed` is true when the key already existed,
/// so the answer belongs to an earlier request.
#[derive(Debug)]
pub struct ChargeReply {
    pub charge: Charge,
    pub replayed: bool,
}

/// The charge flows and what they need: the database (an HTTP worker's own
/// pool), the processor, and the lease rules. Cheap to clone.
#[derive(Clone)]
pub struct Charges {
    db: Database,
    processor: Arc<dyn PaymentProcessor>,
    /// How long a request owns a pending charge before others may take over.
    lease: Duration,
    /// How long a request waits for a concurrent one with the same key to
    /// finish before answering 409.
    in_flight_wait: Duration,
}

impl Charges {
    pub fn new(
        db: Database,
        processor: Arc<dyn PaymentProcessor>,
        settings: &IdempotencySettings,
    ) -> Self {
        Self {
            db,
            processor,
            lease: settings.lease(),
            in_flight_wait: Duration::from_millis(settings.in_flight_wait_ms),
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
        fingerprint: Fingerprint,
        request: &NewCharge,
    ) -> Result<ChargeReply, ServiceError> {
        let (charge, created) = {
            let conn = self.db.conn().await?;
            db::charges::insert_or_find(
                &conn,
                ChargeId::new(),
                merchant,
                key,
                &fingerprint,
                request,
                self.lease,
            )
            .await?
            .ok_or(ServiceError::KeyContended)?
        };
        // Same key, different request: a client bug. Never execute it.
        if charge.fingerprint != fingerprint {
            return Err(ServiceError::KeyReused);
        }
        if created {
            return self.process(charge, false).await;
        }
        if charge.status != ChargeStatus::Pending {
            return Ok(ChargeReply {
                charge,
                replayed: true,
            });
        }
        self.resume(charge).await
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
    async fn resume(&self, charge: Charge) -> Result<ChargeReply, ServiceError> {
        let deadline = Instant::now() + self.in_flight_wait;
        let mut pause = Duration::from_millis(1);
        loop {
            let (current, taken) = {
                let conn = self.db.conn().await?;
                db::charges::take_over_or_read(&conn, charge.id, self.lease)
                    .await?
                    .ok_or(ServiceError::NotFound)?
            };
            if taken {
                return self.process(current, true).await;
            }
            if current.status != ChargeStatus::Pending {
                return Ok(ChargeReply {
                    charge: current,
                    replayed: true,
                });
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
    async fn process(&self, charge: Charge, replayed: bool) -> Result<ChargeReply, ServiceError> {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let charge = this.call_processor_and_record(charge).await?;
            Ok(ChargeReply { charge, replayed })
        });
        task.await.map_err(ServiceError::TaskFailed)?
    }

    /// Finishes abandoned charges (pending, lease run out) through the same
    /// path a request takes; returns how many it claimed. Used by the
    /// recovery worker.
    pub async fn recover_abandoned(&self, batch: i64) -> Result<usize, ServiceError> {
        let claimed = {
            let conn = self.db.conn().await?;
            db::charges::claim_abandoned(&conn, self.lease, batch).await?
        };
        let count = claimed.len();
        let results = futures_util::future::join_all(
            claimed
                .into_iter()
                .map(|charge| self.call_processor_and_record(charge)),
        )
        .await;
        for result in results {
            match result {
                Ok(charge) if charge.status == ChargeStatus::Pending => {
                    tracing::info!(charge = %charge.id, "still pending after recovery attempt")
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
    async fn call_processor_and_record(&self, charge: Charge) -> Result<Charge, ServiceError> {
        crash::point("after_pending_commit");
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
        let conn = self.db.conn().await?;
        let recorded = match reply {
            ProcessorReply::Final(outcome) => {
                db::charges::record_outcome(&conn, &charge, &outcome).await?
            }
            ProcessorReply::Unknown { reason } => {
                tracing::warn!(charge = %charge.id, %reason, "processor outcome unknown; charge stays pending");
                match charge.locked_until {
                    Some(lease) => db::charges::release_lease(&conn, charge.id, lease).await?,
                    None => None,
                }
            }
        };
        match recorded {
            Some(charge) => {
                crash::point("after_outcome_commit");
                Ok(charge)
            }
            // Another request recorded the outcome (or took the lease) first.
            None => db::charges::find(&conn, charge.merchant_id, charge.id)
                .await?
                .ok_or(ServiceError::NotFound),
        }
    }
}
