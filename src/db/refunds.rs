//! Statements on `refunds`, and on the charge each refund takes its amount
//! from. The refund's creation is one transaction: the amount is reserved on
//! the charge by one conditional update (`refunds_reserved + amount <=
//! amount`, decided by PostgreSQL under the charge's row lock, never by a
//! read in Rust), then the refund row is inserted under its key; a key that
//! exists rolls the reservation back.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::{Json, Type};
use tokio_postgres::Row;
use uuid::Uuid;

use super::charges::lease_ms;
use super::codec::{column, Columns};
use super::{Conn, DbError, Decision, Statement};
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
              SELECT id, merchant_id, coalesce($3, amount - refunds_reserved) AS refund_amount \
                FROM charges WHERE merchant_id = $1 AND id = $2 FOR UPDATE) \
          UPDATE charges c SET refunds_reserved = c.refunds_reserved + t.refund_amount, \
                               updated_at = now() \
            FROM target t \
           WHERE c.id = t.id AND c.merchant_id = t.merchant_id AND c.status = 'succeeded' \
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

/// Why a charge took no reservation: its status and what remains of it.
pub const REFUNDABLE: Statement = Statement {
    sql: "SELECT status, amount - refunds_reserved AS refundable \
            FROM charges WHERE merchant_id = $1 AND id = $2",
    params: &[Type::UUID, Type::UUID],
};

pub const FIND_BY_KEY: Statement = Statement {
    sql: concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refunds WHERE merchant_id = $1 AND client_idempotency_key = $2"
    ),
    params: &[Type::UUID, Type::TEXT],
};

pub const FIND: Statement = Statement {
    sql: concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refunds WHERE merchant_id = $1 AND id = $2"
    ),
    params: &[Type::UUID, Type::UUID],
};

/// Newest first after the cursor `$3`; `status IS NOT NULL` is the
/// predicate of the partial index `refunds_listing` (see migration V3).
pub const LIST: Statement = Statement {
    sql: concat!(
        "SELECT ",
        refund_columns!(),
        " FROM refunds WHERE merchant_id = $1 AND id < $3 AND status IS NOT NULL \
          ORDER BY id DESC LIMIT $2"
    ),
    params: &[Type::UUID, Type::INT8, Type::UUID],
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

pub const TAKE_OVER_OR_READ: Statement = Statement {
    sql: concat!(
        "WITH taken AS ( \
             UPDATE refunds SET locked_until = now() + $2::bigint * interval '1 millisecond', \
                                updated_at = now() \
              WHERE id = $1 AND merchant_id = $3 \
                AND status IS NOT DISTINCT FROM 'pending' AND locked_until <= now() \
              RETURNING ",
        refund_columns!(),
        ") SELECT ",
        refund_columns!(),
        ", true AS taken FROM taken \
         UNION ALL \
         SELECT ",
        refund_columns!(),
        ", false AS taken FROM refunds \
          WHERE id = $1 AND merchant_id = $3 AND NOT EXISTS (SELECT 1 FROM taken)"
    ),
    params: &[Type::UUID, Type::INT8, Type::UUID],
};

pub const CLAIM_ABANDONED: Statement = Statement {
    sql: concat!(
        "UPDATE refunds SET locked_until = now() + $1::bigint * interval '1 millisecond', \
                            updated_at = now() \
          WHERE id IN (SELECT id FROM refunds \
                        WHERE status = 'pending' AND locked_until <= now() \
                          AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
                        ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
            AND status = 'pending' AND locked_until <= now() \
            AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
          RETURNING ",
        refund_columns!()
    ),
    params: &[Type::INT8, Type::INT8],
};

/// The final outcome, its effect on the charge (a succeeded refund counts as
/// refunded; a failed one gives its reservation back) and its event, in one
/// statement.
pub const RECORD_OUTCOME: Statement = Statement {
    sql: concat!(
        "WITH updated AS ( \
             UPDATE refunds SET status = $2, failure_code = $3, failure_message = $4, \
                                processor_refund_id = $5, locked_until = NULL, \
                                updated_at = now() \
              WHERE id = $1 AND merchant_id = $8 AND status IS NOT DISTINCT FROM 'pending' \
              RETURNING ",
        refund_columns!(),
        "), charge AS ( \
             UPDATE charges c \
                SET amount_refunded = c.amount_refunded \
                        + CASE WHEN u.status = 'succeeded' THEN u.amount ELSE 0 END, \
                    refunds_reserved = c.refunds_reserved \
                        - CASE WHEN u.status = 'failed' THEN u.amount ELSE 0 END, \
                    updated_at = now() \
               FROM updated u \
              WHERE c.id = u.charge_id AND c.merchant_id = u.merchant_id), \
         event AS ( \
             INSERT INTO events (id, merchant_id, refund_id, type, data) \
             SELECT $6, merchant_id, id, 'refund.' || status, $7 FROM updated) \
         SELECT ",
        refund_columns!(),
        " FROM updated"
    ),
    params: &[
        Type::UUID,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::UUID,
        Type::JSONB,
        Type::UUID,
    ],
};

/// As for charges: count the attempt, end our lease, set the next recovery
/// time; the first unknown outcome writes one `refund.pending` event.
pub const RECORD_UNKNOWN: Statement = Statement {
    sql: concat!(
        "WITH updated AS ( \
             UPDATE refunds SET locked_until = now(), \
                                processor_attempts = processor_attempts + 1, \
                                next_attempt_at = now() + $3::bigint * interval '1 millisecond', \
                                updated_at = now() \
              WHERE id = $1 AND merchant_id = $6 \
                AND status IS NOT DISTINCT FROM 'pending' AND locked_until = $2 \
              RETURNING ",
        refund_columns!(),
        "), event AS ( \
             INSERT INTO events (id, merchant_id, refund_id, type, data) \
             SELECT $4, merchant_id, id, 'refund.pending', $5 FROM updated \
              WHERE processor_attempts = 1 \
             ON CONFLICT (merchant_id, refund_id, type) WHERE refund_id IS NOT NULL DO NOTHING) \
         SELECT ",
        refund_columns!(),
        " FROM updated"
    ),
    params: &[
        Type::UUID,
        Type::TIMESTAMPTZ,
        Type::INT8,
        Type::UUID,
        Type::JSONB,
        Type::UUID,
    ],
};

/// Deletes a refund nobody has worked on since its insert and gives its
/// reservation back to the charge, in one statement.
pub const FORGET_UNCONFIRMED: Statement = Statement {
    sql: "WITH gone AS ( \
              DELETE FROM refunds \
               WHERE merchant_id = $1 AND id = $2 AND status IS NOT DISTINCT FROM 'pending' \
                 AND processor_attempts = 0 AND updated_at = created_at \
              RETURNING charge_id, merchant_id, amount) \
          UPDATE charges c SET refunds_reserved = c.refunds_reserved - g.amount \
            FROM gone g WHERE c.id = g.charge_id AND c.merchant_id = g.merchant_id",
    params: &[Type::UUID, Type::UUID],
};

/// As for charges (`db::charges::RELEASE_EXPIRED_KEYS`).
pub const RELEASE_EXPIRED_KEYS: Statement = Statement {
    sql: "UPDATE refunds SET client_idempotency_key = NULL \
           WHERE id IN (SELECT id FROM refunds \
                         WHERE client_idempotency_key IS NOT NULL AND id < $1 \
                           AND status <> 'pending' \
                         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)",
    params: &[Type::UUID, Type::INT8],
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
                Some(row) => Decision::Commit(Some(decode(&row)?)),
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
    if let Some(existing) = find_by_key(conn, merchant, key).await? {
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

pub async fn find_by_key(
    conn: &Conn,
    merchant: MerchantId,
    key: &IdempotencyKey,
) -> Result<Option<Refund>, DbError> {
    let row = conn
        .query_opt(&FIND_BY_KEY, &[merchant.as_uuid(), &key.as_str()])
        .await?;
    row.as_ref().map(decode).transpose()
}

pub async fn find(
    conn: &Conn,
    merchant: MerchantId,
    id: RefundId,
) -> Result<Option<Refund>, DbError> {
    let row = conn
        .query_opt(&FIND, &[merchant.as_uuid(), id.as_uuid()])
        .await?;
    row.as_ref().map(decode).transpose()
}

/// Newest first, after `starting_after`; only `charge`'s refunds if given.
pub async fn list(
    conn: &Conn,
    merchant: MerchantId,
    charge: Option<ChargeId>,
    limit: i64,
    starting_after: Option<RefundId>,
) -> Result<Vec<Refund>, DbError> {
    let cursor = starting_after.map_or(Uuid::max(), |id| *id.as_uuid());
    let rows = match charge {
        None => {
            conn.query(&LIST, &[merchant.as_uuid(), &limit, &cursor])
                .await?
        }
        Some(charge) => {
            conn.query(
                &LIST_OF_CHARGE,
                &[merchant.as_uuid(), charge.as_uuid(), &limit, &cursor],
            )
            .await?
        }
    };
    rows.iter().map(decode).collect()
}

pub async fn take_over_or_read(
    conn: &Conn,
    merchant: MerchantId,
    id: RefundId,
    lease: Duration,
) -> Result<Option<(Refund, bool)>, DbError> {
    let row = conn
        .query_opt(
            &TAKE_OVER_OR_READ,
            &[id.as_uuid(), &lease_ms(lease), merchant.as_uuid()],
        )
        .await?;
    row.map(|row| {
        let mut columns = Columns::new(&row);
        Ok((decode_from(&mut columns)?, columns.next("taken")?))
    })
    .transpose()
}

pub async fn claim_abandoned(
    conn: &Conn,
    lease: Duration,
    batch: i64,
) -> Result<Vec<Refund>, DbError> {
    let rows = conn
        .query(&CLAIM_ABANDONED, &[&lease_ms(lease), &batch])
        .await?;
    rows.iter().map(decode).collect()
}

pub async fn record_outcome(
    conn: &Conn,
    refund: &Refund,
    outcome: &Outcome,
) -> Result<Option<Refund>, DbError> {
    let (processor_refund_id, code, message) = outcome.columns();
    let row = conn
        .query_opt(
            &RECORD_OUTCOME,
            &[
                refund.id.as_uuid(),
                &outcome.status().as_str(),
                &code,
                &message,
                &processor_refund_id,
                &Uuid::now_v7(),
                &Json(refund.with_outcome(outcome)),
                refund.merchant_id.as_uuid(),
            ],
        )
        .await?;
    row.as_ref().map(decode).transpose()
}

pub async fn record_unknown(
    conn: &Conn,
    refund: &Refund,
    our_lease: DateTime<Utc>,
    retry_in: Duration,
) -> Result<Option<Refund>, DbError> {
    let row = conn
        .query_opt(
            &RECORD_UNKNOWN,
            &[
                refund.id.as_uuid(),
                &our_lease,
                &lease_ms(retry_in),
                &Uuid::now_v7(),
                &Json(refund),
                refund.merchant_id.as_uuid(),
            ],
        )
        .await?;
    row.as_ref().map(decode).transpose()
}

pub async fn forget_unconfirmed(
    conn: &Conn,
    merchant: MerchantId,
    id: RefundId,
) -> Result<bool, DbError> {
    let changed = conn
        .execute(&FORGET_UNCONFIRMED, &[merchant.as_uuid(), id.as_uuid()])
        .await?;
    Ok(changed > 0)
}

/// Releases refund keys created before `cutoff` (see the charges' sweep).
pub async fn release_expired_keys(
    conn: &Conn,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    conn.execute(
        &RELEASE_EXPIRED_KEYS,
        &[&super::charges::uuid_v7_floor(cutoff), &batch],
    )
    .await
}

fn decode(row: &Row) -> Result<Refund, DbError> {
    decode_from(&mut Columns::new(row))
}

/// A refund from `refund_columns!()`, read in that order; the columns a
/// statement selects after them can be read from `columns` next.
fn decode_from(columns: &mut Columns<'_>) -> Result<Refund, DbError> {
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
        locked_until: columns.next("locked_until")?,
        processor_attempts: columns.next("processor_attempts")?,
        processor_payment_id: columns.next("processor_payment_id")?,
        created_at: columns.next("created_at")?,
    })
}
