//! Charges: created exactly once per key, then finished by the lifecycle
//! engine (`super::lifecycle`). The charge's own step is the insert: the
//! unique (merchant, key) index makes it the one decision point; whoever
//! inserts owns the charge, everyone else finds the row.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::config::{IdempotencySettings, RecoverySettings};
use crate::db::batch::{BatchStatement, Batcher};
use crate::db::charges::PendingCharge;
use crate::db::{self, Conn, Database, DbError};
use crate::domain::{
    Charge, ChargeId, IdempotencyKey, MerchantId, NewCharge, Outcome, RequestFingerprint, Status,
};
use crate::processor::{PaymentProcessor, PaymentRequest, ProcessorReply};

use super::lifecycle::{Kind, Lifecycle, Record, Reply};
use super::ServiceError;

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
            same_request(&fingerprint, &cached.record)?;
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
            same_request(&fingerprint, &charge)?;
            if let Some(mut reply) = self.flow.continue_with(charge, created).await? {
                self.flow.remember(merchant, key, &mut reply);
                return Ok(reply);
            }
        }
        Err(ServiceError::KeyContended)
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
        Ok(db::charges::list(&conn, merchant, limit, starting_after).await?)
    }

    /// Finishes abandoned charges; see `Lifecycle::recover_abandoned`.
    pub async fn recover_abandoned(&self, batch: i64) -> Result<usize, ServiceError> {
        self.flow.recover_abandoned(batch).await
    }
}

/// Same key, different request: a client bug. Never execute it.
fn same_request(fingerprint: &RequestFingerprint, charge: &Charge) -> Result<(), ServiceError> {
    if fingerprint.matches(&charge.fingerprint) {
        return Ok(());
    }
    crate::metrics::idempotency("charge", "reused_mismatch");
    crate::telemetry::record("idempotency", &"reused_mismatch");
    Err(ServiceError::KeyReused)
}

impl Record for Charge {
    fn uuid(&self) -> Uuid {
        *self.id.as_uuid()
    }

    fn public_id(&self) -> String {
        self.id.to_string()
    }

    fn merchant(&self) -> MerchantId {
        self.merchant_id
    }

    fn status(&self) -> Status {
        self.status
    }

    fn processor_attempts(&self) -> i32 {
        self.processor_attempts
    }

    fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }

    fn heap_bytes(&self) -> usize {
        self.heap_bytes()
    }

    fn created_json(&self) -> Result<String, serde_json::Error> {
        self.created_json()
    }
}

/// Charges for the lifecycle engine: `db::charges` and a payment call.
pub struct ChargeKind;

#[async_trait]
impl Kind for ChargeKind {
    type Record = Charge;
    const NAME: &'static str = "charge";

    async fn find(
        &self,
        conn: &Conn,
        merchant: MerchantId,
        id: Uuid,
    ) -> Result<Option<Charge>, DbError> {
        db::charges::find(conn, merchant, ChargeId::from_uuid(id)).await
    }

    async fn take_over_or_read(
        &self,
        conn: &Conn,
        merchant: MerchantId,
        id: Uuid,
        lease: Duration,
    ) -> Result<Option<(Charge, bool)>, DbError> {
        db::charges::take_over_or_read(conn, merchant, ChargeId::from_uuid(id), lease).await
    }

    async fn claim_abandoned(
        &self,
        conn: &Conn,
        lease: Duration,
        batch: i64,
    ) -> Result<Vec<Charge>, DbError> {
        db::charges::claim_abandoned(conn, lease, batch).await
    }

    const RECORD_OUTCOMES: &'static str = "charges.record_outcomes";
    const OUTCOMES_PER_STATEMENT: usize = usize::MAX;

    async fn record_outcomes(
        &self,
        conn: &Conn,
        items: &[(Charge, Outcome)],
    ) -> Result<Vec<Option<Charge>>, DbError> {
        db::charges::record_outcomes(conn, items).await
    }

    async fn record_unknown(
        &self,
        conn: &Conn,
        charge: &Charge,
        retry_in: Duration,
    ) -> Result<Option<Charge>, DbError> {
        match charge.locked_until {
            Some(lease) => db::charges::record_unknown(conn, charge, lease, retry_in).await,
            None => Ok(None),
        }
    }

    async fn forget_unconfirmed(
        &self,
        conn: &Conn,
        merchant: MerchantId,
        id: Uuid,
    ) -> Result<bool, DbError> {
        db::charges::forget_unconfirmed(conn, merchant, ChargeId::from_uuid(id)).await
    }

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
