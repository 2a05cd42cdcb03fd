//! Refunds: created exactly once per key and never beyond their charge,
//! then finished by the lifecycle engine (`super::lifecycle`) like charges.
//! The refund's own step is its creation (`db::refunds::create`): the amount
//! is reserved on the charge and the row inserted in one transaction, so two
//! clients racing for the same money with different keys cannot both have
//! it; PostgreSQL decides, under the charge's row lock.

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{IdempotencySettings, RecoverySettings};
use crate::db::refunds::Created;
use crate::db::{self, Database};
use crate::domain::{
    ChargeId, IdempotencyKey, MerchantId, NewRefund, Refund, RefundId, RequestFingerprint,
};
use crate::processor::{PaymentProcessor, ProcessorReply, RefundRequest};

use super::lifecycle::{Kind, Lifecycle, Reply};
use super::ServiceError;
use crate::domain::differences::differing_fields;

/// A refund to answer with (see `lifecycle::Reply`).
pub type RefundReply = Reply<Refund>;

/// How often a key may vanish under a request before it gives up with 503.
const MAX_KEY_ROUNDS: usize = 3;

/// The refund flows. Cheap to clone.
#[derive(Clone)]
pub struct Refunds {
    flow: Lifecycle<RefundKind>,
}

impl Refunds {
    pub fn new(
        db: Database,
        processor: Arc<dyn PaymentProcessor>,
        idempotency: &IdempotencySettings,
        recovery: &RecoverySettings,
    ) -> Self {
        Self {
            flow: Lifecycle::new(RefundKind, db, processor, idempotency, recovery),
        }
    }

    /// The same flows on another pool (each HTTP worker thread has its own).
    pub fn with_database(&self, db: Database) -> Self {
        Self {
            flow: self.flow.with_database(db),
        }
    }

    pub async fn create(
        &self,
        merchant: MerchantId,
        charge: ChargeId,
        key: &IdempotencyKey,
        fingerprint: RequestFingerprint,
        request: &NewRefund,
    ) -> Result<RefundReply, ServiceError> {
        if let Some(cached) = self.flow.cached(merchant, key) {
            self.same_request(&fingerprint, charge, request, &cached.record)?;
            return Ok(self.flow.replay(cached));
        }
        for _ in 0..MAX_KEY_ROUNDS {
            let id = RefundId::new();
            let created = async {
                let conn = self.flow.db.conn().await?;
                db::refunds::create(
                    &conn,
                    id,
                    merchant,
                    charge,
                    key,
                    &fingerprint.current,
                    request,
                    self.flow.lease,
                )
                .await
            }
            .await;
            let (refund, created) = match created {
                Ok(Created::New(refund)) => (refund, true),
                Ok(Created::Existing(refund)) => (refund, false),
                Ok(Created::NoCharge) => return Err(ServiceError::NotFound),
                Ok(Created::NotRefundable(status)) => {
                    return Err(ServiceError::ChargeNotRefundable { status })
                }
                Ok(Created::Exceeds { refundable }) => {
                    return Err(ServiceError::RefundExceedsCharge { refundable })
                }
                Err(error) => {
                    if error.is_ambiguous() {
                        self.flow
                            .forget_unconfirmed(merchant, *id.as_uuid(), id.to_string());
                    }
                    return Err(error.into());
                }
            };
            if !created {
                self.flow.refuse_if_expired(&refund)?;
            }
            self.same_request(&fingerprint, charge, request, &refund)?;
            if let Some(mut reply) = self.flow.continue_with(refund, created).await? {
                self.flow.remember(merchant, key, &mut reply);
                return Ok(reply);
            }
        }
        Err(ServiceError::KeyContended)
    }

    pub async fn get(&self, merchant: MerchantId, id: RefundId) -> Result<Refund, ServiceError> {
        self.flow.find(merchant, *id.as_uuid()).await
    }

    /// Up to `limit` refunds, newest first, after `starting_after`; of one
    /// charge if `charge` is given (which must be the merchant's).
    pub async fn list(
        &self,
        merchant: MerchantId,
        charge: Option<ChargeId>,
        limit: i64,
        starting_after: Option<RefundId>,
    ) -> Result<Vec<Refund>, ServiceError> {
        let conn = self.flow.db.conn().await?;
        if let Some(charge) = charge {
            db::records::find::<crate::domain::Charge>(&conn, merchant, *charge.as_uuid())
                .await?
                .ok_or(ServiceError::NotFound)?;
        }
        Ok(db::refunds::list(&conn, merchant, charge, limit, starting_after).await?)
    }

    /// The key belongs to another refund request (or to a refund of
    /// another charge): a client bug, never executed. The 422 names the
    /// fields that differ (`charge` for another charge).
    fn same_request(
        &self,
        fingerprint: &RequestFingerprint,
        charge: ChargeId,
        request: &NewRefund,
        refund: &Refund,
    ) -> Result<(), ServiceError> {
        let same_charge = refund.charge_id == charge;
        if same_charge && fingerprint.matches(&refund.fingerprint) {
            return Ok(());
        }
        let differing = refund.first_request().map(|first| {
            let mut fields = differing_fields(&first, &request.normalised());
            if !same_charge {
                fields.insert(0, "charge".to_owned());
            }
            fields
        });
        Err(self.flow.reused(differing))
    }

    /// The refund `key` created, as it is now (see `Lifecycle::find_by_key`).
    pub async fn find_by_key(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
    ) -> Result<Option<Refund>, ServiceError> {
        self.flow.find_by_key(merchant, key).await
    }

    /// When the replay window of the key that created `refund` ends.
    pub fn window_end(&self, refund: &Refund) -> chrono::DateTime<chrono::Utc> {
        self.flow.window_end(refund)
    }

    /// Finishes abandoned refunds; see `Lifecycle::recover_abandoned`.
    pub async fn recover_abandoned(&self, batch: i64) -> Result<usize, ServiceError> {
        self.flow.recover_abandoned(batch).await
    }
}

/// Refunds for the lifecycle engine: a refund call, and outcomes one at a
/// time.
pub struct RefundKind;

#[async_trait]
impl Kind for RefundKind {
    type Record = Refund;
    const NAME: &'static str = "refund";

    const RECORD_OUTCOMES: &'static str = "refunds.record_outcome";
    /// A refund's outcome also updates its charge's totals, and refunds of
    /// one charge would meet on that row: each is recorded alone.
    const OUTCOMES_PER_TRANSACTION: usize = 1;

    async fn call_processor(
        &self,
        processor: &dyn PaymentProcessor,
        refund: &Refund,
    ) -> ProcessorReply {
        processor
            .refund(&RefundRequest {
                idempotency_key: &refund.id.processor_idempotency_key(),
                payment_id: &refund.processor_payment_id,
                amount: refund.amount,
                currency: &refund.currency,
            })
            .await
    }
}
