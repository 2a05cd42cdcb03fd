//! Statements on `charges` (and the outbox rows written with them). Each
//! function is one statement, prepared once per connection.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use deadpool_postgres::GenericClient;
use serde_json::Value;
use tokio_postgres::{Error, Row};
use uuid::Uuid;

use crate::domain::{
    Charge, ChargeId, ChargeStatus, Fingerprint, IdempotencyKey, MerchantId, NewCharge, Outcome,
};

const COLUMNS: &str = "id, merchant_id, request_fingerprint, amount, currency, customer, \
                       description, metadata, status, failure_code, failure_message, \
                       locked_until, created_at";

fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Inserts the charge as `pending` with a lease, unless the merchant already
/// has a charge with this key; then returns that one. The unique index
/// decides: a concurrent request with the same key waits for our commit and
/// then conflicts, so there is no window in which both think they are first.
/// Returns the charge and whether this call created it.
///
/// One round trip in the common cases. When the conflicting row was committed
/// after this statement's snapshot began it is not visible to the statement's
/// own SELECT, and a second read (with a fresh snapshot) finds it. If the row
/// vanished in between (the sweeper released the key), the key is free and
/// the insert is tried again; `None` only if that keeps happening.
pub async fn insert_or_find(
    client: &impl GenericClient,
    id: ChargeId,
    merchant: MerchantId,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    request: &NewCharge,
    lease: Duration,
) -> Result<Option<(Charge, bool)>, Error> {
    let sql = format!(
        "WITH inserted AS ( \
             INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, customer, description, metadata, status, \
                                  locked_until) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', \
                     now() + $10::bigint * interval '1 millisecond') \
             ON CONFLICT (merchant_id, client_idempotency_key) DO NOTHING \
             RETURNING {COLUMNS}) \
         SELECT {COLUMNS}, true FROM inserted \
         UNION ALL \
         SELECT {COLUMNS}, false FROM charges \
          WHERE merchant_id = $2 AND client_idempotency_key = $3 \
            AND NOT EXISTS (SELECT 1 FROM inserted)"
    );
    let statement = client.prepare_cached(&sql).await?;
    let metadata = serde_json::to_value(&request.metadata).unwrap_or(Value::Null);
    for _ in 0..3 {
        let row = client
            .query_opt(
                &statement,
                &[
                    id.as_uuid(),
                    merchant.as_uuid(),
                    &key.as_str(),
                    &fingerprint.as_bytes().as_slice(),
                    &request.amount.minor_units(),
                    &request.currency.as_str(),
                    &request.customer,
                    &request.description,
                    &metadata,
                    &lease_ms(lease),
                ],
            )
            .await?;
        if let Some(row) = row {
            return Ok(Some((charge_from_row(&row)?, row.try_get(13)?)));
        }
        if let Some(charge) = find_by_key(client, merchant, key).await? {
            return Ok(Some((charge, false)));
        }
    }
    Ok(None)
}

pub async fn find_by_key(
    client: &impl GenericClient,
    merchant: MerchantId,
    key: &IdempotencyKey,
) -> Result<Option<Charge>, Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM charges WHERE merchant_id = $1 AND client_idempotency_key = $2"
    );
    let statement = client.prepare_cached(&sql).await?;
    let row = client
        .query_opt(&statement, &[merchant.as_uuid(), &key.as_str()])
        .await?;
    row.as_ref().map(charge_from_row).transpose()
}

pub async fn find(
    client: &impl GenericClient,
    merchant: MerchantId,
    id: ChargeId,
) -> Result<Option<Charge>, Error> {
    let sql = format!("SELECT {COLUMNS} FROM charges WHERE merchant_id = $1 AND id = $2");
    let statement = client.prepare_cached(&sql).await?;
    let row = client
        .query_opt(&statement, &[merchant.as_uuid(), id.as_uuid()])
        .await?;
    row.as_ref().map(charge_from_row).transpose()
}

/// Newest first; `starting_after` continues after that charge.
pub async fn list(
    client: &impl GenericClient,
    merchant: MerchantId,
    limit: i64,
    starting_after: Option<ChargeId>,
) -> Result<Vec<Charge>, Error> {
    let rows = match starting_after {
        None => {
            let sql = format!(
                "SELECT {COLUMNS} FROM charges WHERE merchant_id = $1 ORDER BY id DESC LIMIT $2"
            );
            let statement = client.prepare_cached(&sql).await?;
            client
                .query(&statement, &[merchant.as_uuid(), &limit])
                .await?
        }
        Some(cursor) => {
            let sql = format!(
                "SELECT {COLUMNS} FROM charges WHERE merchant_id = $1 AND id < $3 \
                 ORDER BY id DESC LIMIT $2"
            );
            let statement = client.prepare_cached(&sql).await?;
            client
                .query(&statement, &[merchant.as_uuid(), &limit, cursor.as_uuid()])
                .await?
        }
    };
    rows.iter().map(charge_from_row).collect()
}

/// Takes over the lease of a pending charge whose lease has run out (its
/// owner died or got no answer), or else reads the charge as it is. Row
/// locking makes the takeover a single winner: a second taker waits for the
/// first, re-checks `locked_until`, and matches nothing. Returns the charge and
/// whether the lease is now ours.
pub async fn take_over_or_read(
    client: &impl GenericClient,
    id: ChargeId,
    lease: Duration,
) -> Result<Option<(Charge, bool)>, Error> {
    let sql = format!(
        "WITH taken AS ( \
             UPDATE charges SET locked_until = now() + $2::bigint * interval '1 millisecond', \
                                updated_at = now() \
              WHERE id = $1 AND status = 'pending' AND locked_until <= now() \
              RETURNING {COLUMNS}) \
         SELECT {COLUMNS}, true FROM taken \
         UNION ALL \
         SELECT {COLUMNS}, false FROM charges \
          WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM taken)"
    );
    let statement = client.prepare_cached(&sql).await?;
    let row = client
        .query_opt(&statement, &[id.as_uuid(), &lease_ms(lease)])
        .await?;
    row.map(|row| Ok((charge_from_row(&row)?, row.try_get(13)?)))
        .transpose()
}

/// Claims up to `batch` pending charges whose lease ran out, taking a fresh
/// lease on each, for the recovery worker. SKIP LOCKED lets several instances
/// claim at once without waiting on, or claiming, each other's rows; the
/// outer condition repeats the test so a row finished meanwhile is skipped.
pub async fn claim_abandoned(
    client: &impl GenericClient,
    lease: Duration,
    batch: i64,
) -> Result<Vec<Charge>, Error> {
    let sql = format!(
        "UPDATE charges SET locked_until = now() + $1::bigint * interval '1 millisecond', \
                            updated_at = now() \
          WHERE id IN (SELECT id FROM charges \
                        WHERE status = 'pending' AND locked_until <= now() \
                        ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
            AND status = 'pending' AND locked_until <= now() \
          RETURNING {COLUMNS}"
    );
    let statement = client.prepare_cached(&sql).await?;
    let rows = client
        .query(&statement, &[&lease_ms(lease), &batch])
        .await?;
    rows.iter().map(charge_from_row).collect()
}

/// Ends our lease early after an unknown processor outcome, so the next retry
/// can ask the processor again at once. Only our own lease (matched by its
/// exact expiry) is released, never one another request took over since.
pub async fn release_lease(
    client: &impl GenericClient,
    id: ChargeId,
    our_lease: DateTime<Utc>,
) -> Result<Option<Charge>, Error> {
    let sql = format!(
        "UPDATE charges SET locked_until = now(), updated_at = now() \
          WHERE id = $1 AND status = 'pending' AND locked_until = $2 \
          RETURNING {COLUMNS}"
    );
    let statement = client.prepare_cached(&sql).await?;
    let row = client
        .query_opt(&statement, &[id.as_uuid(), &our_lease])
        .await?;
    row.as_ref().map(charge_from_row).transpose()
}

/// Records the final outcome and its outbox event in one statement, hence one
/// transaction. Only a pending charge changes: if another request recorded
/// the outcome first (the processor gave it the same answer), `None`.
pub async fn record_outcome(
    client: &impl GenericClient,
    charge: &Charge,
    outcome: &Outcome,
) -> Result<Option<Charge>, Error> {
    let sql = format!(
        "WITH updated AS ( \
             UPDATE charges SET status = $2, failure_code = $3, failure_message = $4, \
                                processor_payment_id = $5, locked_until = NULL, \
                                updated_at = now() \
              WHERE id = $1 AND status = 'pending' \
              RETURNING {COLUMNS}), \
         event AS ( \
             INSERT INTO events (id, merchant_id, charge_id, type, payload) \
             SELECT $6, merchant_id, id, 'charge.' || status, $7 FROM updated) \
         SELECT {COLUMNS} FROM updated"
    );
    let statement = client.prepare_cached(&sql).await?;
    let (payment_id, code, message) = match outcome {
        Outcome::Succeeded { payment_id } => (Some(payment_id.as_str()), None, None),
        Outcome::Declined {
            payment_id,
            code,
            message,
        } => (
            payment_id.as_deref(),
            Some(code.as_str()),
            Some(message.as_str()),
        ),
    };
    let payload = serde_json::to_value(charge.with_outcome(outcome)).unwrap_or(Value::Null);
    let row = client
        .query_opt(
            &statement,
            &[
                charge.id.as_uuid(),
                &outcome.status().as_str(),
                &code,
                &message,
                &payment_id,
                &Uuid::now_v7(),
                &payload,
            ],
        )
        .await?;
    row.as_ref().map(charge_from_row).transpose()
}

/// Releases the idempotency keys of final charges created before `cutoff`,
/// at most `batch` of them; returns how many. The charges stay. Pending
/// charges keep their key until they are final. Ids are time-ordered, so the
/// cutoff is an id bound and the scan is an index range.
pub async fn release_expired_keys(
    client: &impl GenericClient,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, Error> {
    let statement = client
        .prepare_cached(
            "UPDATE charges SET client_idempotency_key = NULL \
              WHERE id IN (SELECT id FROM charges \
                            WHERE client_idempotency_key IS NOT NULL AND id < $1 \
                              AND status <> 'pending' \
                            ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)",
        )
        .await?;
    client
        .execute(&statement, &[&uuid_v7_floor(cutoff), &batch])
        .await
}

/// The smallest UUIDv7 of the millisecond `at`: every id created before that
/// millisecond sorts below it.
fn uuid_v7_floor(at: DateTime<Utc>) -> Uuid {
    let millis = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

fn charge_from_row(row: &Row) -> Result<Charge, Error> {
    let fingerprint: &[u8] = row.try_get("request_fingerprint")?;
    let status: &str = row.try_get("status")?;
    let metadata: Value = row.try_get("metadata")?;
    Ok(Charge {
        id: ChargeId::from_uuid(row.try_get("id")?),
        merchant_id: MerchantId::from_uuid(row.try_get("merchant_id")?),
        // The schema's CHECK constraints guarantee both forms.
        fingerprint: Fingerprint::from_bytes(fingerprint).unwrap_or(Fingerprint::ZERO),
        status: ChargeStatus::parse(status).unwrap_or(ChargeStatus::Pending),
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        customer: row.try_get("customer")?,
        description: row.try_get("description")?,
        metadata: serde_json::from_value::<BTreeMap<String, String>>(metadata).unwrap_or_default(),
        failure_code: row.try_get("failure_code")?,
        failure_message: row.try_get("failure_message")?,
        locked_until: row.try_get("locked_until")?,
        created_at: row.try_get("created_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v7_floor_orders_between_milliseconds() {
        let now = Utc::now();
        let floor = uuid_v7_floor(now);
        let earlier = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            u64::try_from(now.timestamp() - 1).unwrap_or(0),
            0,
        ));
        assert!(earlier < floor);
        assert!(ChargeId::new().as_uuid() >= &floor);
    }
}
