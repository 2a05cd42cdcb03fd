//! Statements on `refunds`, and on the charge each refund takes its amount
//! from. The refund's creation is one transaction: the amount is reserved on
//! the charge by one conditional update (`refunds_reserved + amount <=
//! amount`, decided by PostgreSQL under the charge's row lock, never by a
//! read in Rust), then the refund row is inserted under its key; a key that
//! exists rolls the reservation back.
//!
//! So the creation locks the charge before it meets the key, and every
//! other transaction that changes a refund and its charge locks the charge
//! first too ([`LOCK_CHARGE`]). The other order deadlocked: a refund's
//! outcome changes its row, which gives the key a new index entry, and then
//! its charge; a copy of the same request that holds the charge's lock
//! waits at that entry to learn whether the key is taken. PostgreSQL broke
//! each such cycle after `deadlock_timeout` (1 s) by failing one side.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::types::{Json, Type};

use super::codec::{column, Columns};
use super::records::{self, cursor, decode, lease_ms, RecordStatements, Stored};
use super::{Conn, DbError, Decision, Statement};
use crate::domain::lifecycle::Lease;
use crate::domain::{
    ChargeId, Fingerprint, IdempotencyKey, MerchantId, NewRefund, Outcome, Refund, RefundId,
    RefundReason, Status,
};

/// The columns a `Refund` is decoded from, by name.
macro_rules! refund_columns {
    () => {
        "id, merchant_id, charge_id, request_fingerprint, amount, currency, reason, metadata, \
         status, failure_code, failure_message, locked_until, processor_attempts, \
         processor_payment_id, created_at"
    };
}

/// Reserves the refund's amount on a succeeded charge: the requested `$3`,
/// or what remains when `$3` is null. The row lock taken first makes the
/// remainder the latest one; the conditions make an over-refund impossible.
pub const RESERVE: Statement = Statement {
    sql: "WITH target AS ( \
              SELECT coalesce($3, amount - refunds_reserved) AS refund_amount \
                FROM charges WHERE merchant_id = $1 AND id = $2 FOR UPDATE) \
          UPDATE charges c SET refunds_reserved = c.refunds_reserved + t.refund_amount, \
                               updated_at = now() \
            FROM target t \
           WHERE c.merchant_id = $1 AND c.id = $2 AND c.status = 'succeeded' \
             AND t.refund_amount > 0 AND c.refunds_reserved + t.refund_amount <= c.amount \
          RETURNING t.refund_amount, c.currency, c.processor_payment_id",
    params: &[Type::UUID, Type::UUID, Type::INT8],
};

/// Inserts the refund as pending with a lease, unless the key is taken.
pub const INSERT: Statement = Statement {
    sql: concat!(
        "INSERT INTO refunds (id, merchant_id, charge_id, client_idempotency_key, \
                              request_fingerprint, amount, currency, reason, metadata, status, \
                              processor_payment_id, locked_until) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10, \
                 now() + $11::bigint * interval '1 millisecond') \
         ON CONFLICT (merchant_id, client_idempotency_key) DO NOTHING \
         RETURNING ",
        refund_columns!()
    ),
    params: &[
        Type::UUID,
        Type::UUID,
        Type::UUID,
        Type::TEXT,
        Type::BYTEA,
        Type::INT8,
        Type::TEXT,
        Type::TEXT,
        Type::JSONB,
        Type::TEXT,
        Type::INT8,
    ],
};

/// Locks the charge of refund `$2` as a refund's outcome and its undo change
/// it, before they change the refund (the module doc says why).
pub const LOCK_CHARGE: Statement = Statement {
    sql: "SELECT 1 FROM charges \
           WHERE merchant_id = $1 \
             AND id = (SELECT charge_id FROM refunds WHERE merchant_id = $1 AND id = $2) \
             FOR NO KEY UPDATE",
    params: &[Type::UUID, Type::UUID],
};

/// Why a charge took no reservation: its status and what remains of it.
pub const REFUNDABLE: Statement = Statement {
    sql: "SELECT status, amount - refunds_reserved AS refundable \
            FROM charges WHERE merchant_id = $1 AND id = $2",
    params: &[Type::UUID, Type::UUID],
};

/// The statements a refund shares with a charge (`super::records`). A
/// refund's outcome also changes its charge: a succeeded refund counts as
/// refunded, a failed one gives its reservation back; and forgetting an
/// unconfirmed refund gives its reservation back.
pub const STATEMENTS: RecordStatements = crate::record_statements! {
    table: "refunds",
    object: "refund",
    columns: [refund_columns!()],
    processor_id: "processor_refund_id",
    outcome_also: ", charge AS ( \
          UPDATE charges c \
             SET amount_refunded = c.amount_refunded \
                     + CASE WHEN u.status = 'succeeded' THEN u.amount ELSE 0 END, \
                 refunds_reserved = c.refunds_reserved \
                     - CASE WHEN u.status = 'failed' THEN u.amount ELSE 0 END, \
                 updated_at = now() \
            FROM updated u \
           WHERE c.merchant_id = $1 AND c.id = u.charge_id)",
    forget_also: "UPDATE charges c SET refunds_reserved = c.refunds_reserved - g.amount \
                    FROM gone g WHERE c.merchant_id = $1 AND c.id = g.charge_id \
                  RETURNING 1",
};

/// A charge's refunds, newest first after the cursor `$4`.
pub const LIST_OF_CHARGE: Statement = Statement {
    sql: concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refunds WHERE charge_id = $2 AND merchant_id = $1 AND id < $4 \
          ORDER BY id DESC LIMIT $3"
    ),
    params: &[Type::UUID, Type::UUID, Type::INT8, Type::UUID],
};

/// What became of a refund's creation.
#[derive(Debug)]
pub enum Created {
    /// Ours: the amount is reserved and the row inserted.
    New(Refund),
    /// The key was taken: this is the refund that holds it.
    Existing(Refund),
    /// No charge with this id for this merchant.
    NoCharge,
    /// The charge is not succeeded (pending or failed).
    NotRefundable(Status),
    /// The amount is more than what remains refundable.
    Exceeds { refundable: i64 },
}

/// Creates a refund of `request` against `charge`, or finds the refund that
/// holds `key`. One transaction: reserve on the charge, then insert under
/// the key; if the key is taken, the reservation is rolled back.
#[allow(clippy::too_many_arguments)]
pub async fn create(
    conn: &Conn,
    id: RefundId,
    merchant: MerchantId,
    charge: ChargeId,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    request: &NewRefund,
    lease: Duration,
) -> Result<Created, DbError> {
    let requested = request.amount.map(|amount| amount.minor_units());
    let reason = request.reason.map(RefundReason::as_str);
    let metadata = Json(&request.metadata);
    let inserted = conn
        .transaction(async {
            let Some(reserved) = conn
                .query_opt(
                    &RESERVE,
                    &[merchant.as_uuid(), charge.as_uuid(), &requested],
                )
                .await?
            else {
                return Ok(Decision::Rollback(None));
            };
            let amount: i64 = column(&reserved, "refund_amount")?;
            let currency: String = column(&reserved, "currency")?;
            let payment: Option<String> = column(&reserved, "processor_payment_id")?;
            let row = conn
                .query_opt(
                    &INSERT,
                    &[
                        id.as_uuid(),
                        merchant.as_uuid(),
                        charge.as_uuid(),
                        &key.as_str(),
                        &fingerprint.as_bytes().as_slice(),
                        &amount,
                        &currency,
                        &reason,
                        &metadata,
                        &payment,
                        &lease_ms(lease),
                    ],
                )
                .await?;
            Ok(match row {
                Some(row) => Decision::Commit(Some(decode::<Refund>(&row)?)),
                // The key is taken: give the reservation back.
                None => Decision::Rollback(None),
            })
        })
        .await?;
    if let Some(refund) = inserted {
        return Ok(Created::New(refund));
    }
    // Nothing inserted. A replay first: a refund that took the last of the
    // charge must replay, not be told the charge is exhausted.
    if let Some(existing) = records::find_by_key(conn, merchant, key).await? {
        return Ok(Created::Existing(existing));
    }
    let Some(row) = conn
        .query_opt(&REFUNDABLE, &[merchant.as_uuid(), charge.as_uuid()])
        .await?
    else {
        return Ok(Created::NoCharge);
    };
    let status: Status = column(&row, "status")?;
    if status != Status::Succeeded {
        return Ok(Created::NotRefundable(status));
    }
    Ok(Created::Exceeds {
        refundable: column(&row, "refundable")?,
    })
}

/// Newest first, after `starting_after`; only `charge`'s refunds if given.
pub async fn list(
    conn: &Conn,
    merchant: MerchantId,
    charge: Option<ChargeId>,
    limit: i64,
    starting_after: Option<RefundId>,
) -> Result<Vec<Refund>, DbError> {
    let starting_after = starting_after.map(|id| *id.as_uuid());
    let Some(charge) = charge else {
        return records::list(conn, merchant, limit, starting_after).await;
    };
    let rows = conn
        .query(
            &LIST_OF_CHARGE,
            &[
                merchant.as_uuid(),
                charge.as_uuid(),
                &limit,
                &cursor(starting_after),
            ],
        )
        .await?;
    rows.iter().map(decode).collect()
}

impl Stored for Refund {
    const STATEMENTS: &'static RecordStatements = &STATEMENTS;

    fn decode_from(columns: &mut Columns<'_>) -> Result<Self, DbError> {
        let id = RefundId::from_uuid(columns.next("id")?);
        let merchant_id = MerchantId::from_uuid(columns.next("merchant_id")?);
        let charge_id = ChargeId::from_uuid(columns.next("charge_id")?);
        let fingerprint = columns.next("request_fingerprint")?;
        let amount = columns.next("amount")?;
        let currency = columns.next("currency")?;
        let reason = columns.next("reason")?;
        let Json(metadata): Json<BTreeMap<String, String>> = columns.next("metadata")?;
        Ok(Refund {
            id,
            merchant_id,
            charge_id,
            fingerprint,
            amount,
            currency,
            reason,
            metadata,
            status: columns.next("status")?,
            failure_code: columns.next("failure_code")?,
            failure_message: columns.next("failure_message")?,
            lease: Lease {
                locked_until: columns.next("locked_until")?,
                processor_attempts: columns.next("processor_attempts")?,
            },
            processor_payment_id: columns.next("processor_payment_id")?,
            created_at: columns.next("created_at")?,
        })
    }

    fn with_outcome(&self, outcome: &Outcome) -> Self {
        Refund::with_outcome(self, outcome)
    }

    /// A refund never changes after it is final: its form as created is its
    /// form.
    fn into_event(self) -> Self {
        self
    }

    const LOCK_FIRST: Option<&'static Statement> = Some(&LOCK_CHARGE);
}
