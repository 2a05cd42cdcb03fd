//! Charges: created exactly once per key, then finished by the lifecycle
//! engine (`super::lifecycle`). The charge's own step is the insert: the
//! unique (merchant, key) index makes it the one decision point; whoever
//! inserts owns the charge, everyone else finds the row.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::config::{IdempotencySettings, RecoverySettings};
use crate::db::batch::{BatchStatement, Batcher};
use crate::db::charges::PendingCharge;
use crate::db::{self, Conn, Database, DbError};
use crate::domain::{Charge, ChargeId, IdempotencyKey, MerchantId, NewCharge, RequestFingerprint};
use crate::processor::{PaymentProcessor, PaymentRequest, ProcessorReply};

use super::lifecycle::{Kind, Lifecycle, Reply};
use super::ServiceError;
use crate::domain::differences::differing_fields;

pub use super::lifecycle::IN_USE_RETRY_AFTER;

/// A charge to answer with (see `lifecycle::Reply`).
pub type ChargeReply = Reply<Charge>;

/// How often a key may vanish under a request (the sweeper released it, or an
/// unconfirmed insert was undone) before it gives up with 503.
const MAX_KEY_ROUNDS: usize = 3;

/// The charge flows. Cheap to clone.
#[derive(Clone)]
pub struct Charges {
    flow: Lifecycle<ChargeKind>,
    /// Pending inserts, batched per pool (`db::batch`).
    inserts: Batcher<InsertCharges>,
}

/// The insert of pending charges, for the batcher.
struct InsertCharges {
    lease: Duration,
}

#[async_trait]
impl BatchStatement for InsertCharges {
    type Item = PendingCharge;
    type Output = Option<(Charge, bool)>;

    fn name(&self) -> &'static str {
        "charges.insert_or_find"
    }

    fn merchant(&self, item: &PendingCharge) -> MerchantId {
        item.merchant
    }

    async fn run(
        &self,
        conn: &Conn,
        items: &[PendingCharge],
    ) -> Result<Vec<Self::Output>, DbError> {
        db::charges::insert_or_find_many(conn, items, self.lease).await
    }
}

impl Charges {
    pub fn new(
        db: Database,
        processor: Arc<dyn PaymentProcessor>,
        idempotency: &IdempotencySettings,
        recovery: &RecoverySettings,
    ) -> Self {
        let inserts = Batcher::new(
            db.clone(),
            InsertCharges {
                lease: idempotency.lease,
            },
        );
        Self {
            flow: Lifecycle::new(ChargeKind, db, processor, idempotency, recovery),
            inserts,
        }
    }

    /// The same flows on another pool (each HTTP worker thread has its own).
    pub fn with_database(&self, db: Database) -> Self {
        Self {
            inserts: Batcher::new(
                db.clone(),
                InsertCharges {
                    lease: self.flow.lease,
                },
            ),
            flow: self.flow.with_database(db),
        }
    }

    pub async fn create(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
        fingerprint: RequestFingerprint,
        request: &NewCharge,
    ) -> Result<ChargeReply, ServiceError> {
        if let Some(cached) = self.flow.cached(merchant, key) {
            self.same_request(&fingerprint, request, &cached.record)?;
            return Ok(self.flow.replay(cached));
        }
        for _ in 0..MAX_KEY_ROUNDS {
            let id = ChargeId::new();
            let inserted = self
                .inserts
                .run(PendingCharge {
                    id,
                    merchant,
                    key: key.clone(),
                    fingerprint: fingerprint.current,
                    request: request.clone(),
                })
                .await;
            let (charge, created) = match inserted {
                Ok(Some(found)) => found,
                Ok(None) => continue,
                Err(error) => {
                    if error.is_ambiguous() {
                        self.flow
                            .forget_unconfirmed(merchant, *id.as_uuid(), id.to_string());
                    }
                    return Err(error.into());
                }
            };
            if !created {
                self.flow.refuse_if_expired(&charge)?;
            }
            self.same_request(&fingerprint, request, &charge)?;
            if let Some(mut reply) = self.flow.continue_with(charge, created).await? {
                self.flow.remember(merchant, key, &mut reply);
                return Ok(reply);
            }
        }
        Err(ServiceError::KeyContended)
    }

    /// Same key, different request: a client bug, never executed. The 422
    /// names the fields that differ from the request the charge was made
    /// from.
    fn same_request(
        &self,
        fingerprint: &RequestFingerprint,
        request: &NewCharge,
        charge: &Charge,
    ) -> Result<(), ServiceError> {
        if fingerprint.matches(&charge.fingerprint) {
            return Ok(());
        }
        let differing = charge
            .first_request()
            .map(|first| differing_fields(&first, &request.normalised()));
        Err(self.flow.reused(differing))
    }

    /// The charge `key` created, as it is now (see `Lifecycle::find_by_key`).
    pub async fn find_by_key(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
    ) -> Result<Option<Charge>, ServiceError> {
        self.flow.find_by_key(merchant, key).await
    }

    /// When the replay window of the key that created `charge` ends.
    pub fn window_end(&self, charge: &Charge) -> chrono::DateTime<chrono::Utc> {
        self.flow.window_end(charge)
    }

    pub async fn get(&self, merchant: MerchantId, id: ChargeId) -> Result<Charge, ServiceError> {
        self.flow.find(merchant, *id.as_uuid()).await
    }

    /// Up to `limit` charges, newest first, after `starting_after`.
    pub async fn list(
        &self,
        merchant: MerchantId,
        limit: i64,
        starting_after: Option<ChargeId>,
    ) -> Result<Vec<Charge>, ServiceError> {
        let conn = self.flow.db.conn().await?;
        let starting_after = starting_after.map(|id| *id.as_uuid());
        Ok(db::records::list(&conn, merchant, limit, starting_after).await?)
    }

    /// Finishes abandoned charges; see `Lifecycle::recover_abandoned`.
    pub async fn recover_abandoned(&self, batch: i64) -> Result<usize, ServiceError> {
        self.flow.recover_abandoned(batch).await
    }
}

/// Charges for the lifecycle engine: a payment call, and outcomes in
/// batches.
pub struct ChargeKind;

#[async_trait]
impl Kind for ChargeKind {
    type Record = Charge;
    const NAME: &'static str = "charge";
    const RECORD_OUTCOMES: &'static str = "charges.record_outcomes";
    const OUTCOMES_PER_TRANSACTION: usize = usize::MAX;

    async fn call_processor(
        &self,
        processor: &dyn PaymentProcessor,
        charge: &Charge,
    ) -> ProcessorReply {
        processor
            .charge(&PaymentRequest {
                idempotency_key: &charge.id.processor_idempotency_key(),
                amount: charge.amount,
                currency: &charge.currency,
                customer: charge.customer.as_deref(),
                description: charge.description.as_deref(),
            })
            .await
    }
}
