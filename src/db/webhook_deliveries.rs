//! Statements on `webhook_deliveries` and `webhook_attempts`: the
//! dispatcher's claim and record, and the API's view of an event's
//! deliveries. Deliveries are created by the fan-out (`events::FAN_OUT`).
//!
//! A delivery being attempted holds a lease (`locked_until`), taken by the
//! claim and matched exactly by the record, like a charge's: while it lies
//! in the future no other dispatcher claims the delivery, so one delivery is
//! never sent twice at the same time. The claim also moves `next_attempt_at`
//! to the end of the lease: if the dispatcher dies mid-attempt, the
//! delivery simply comes due again when the lease runs out.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::column;
use super::events::event_type;
use super::{Conn, DbError, Statement};
use crate::domain::{
    Delivery, DeliveryAttempt, DeliveryStatus, Event, EventId, MerchantId, WebhookEndpointId,
    WebhookSecret,
};

/// Claims up to `$2` due pending deliveries (`SKIP LOCKED`: instances
/// claiming at once take disjoint sets, and a row another instance claimed
/// meanwhile is re-checked when locked and skipped), leasing each for `$1`
/// ms, and returns them with what sending takes: the endpoint's URL and
/// secret, and the event. A due delivery whose endpoint was deleted is
/// failed here instead of claimed.
///
/// Each table is reached through its key from the few rows claimed, so no
/// plan reads more than the batch whatever the statistics say.
pub const CLAIM_DUE: Statement = Statement {
    sql: "WITH due AS MATERIALIZED ( \
              SELECT d.id, d.merchant_id, e.deleted_at IS NOT NULL AS endpoint_deleted \
                FROM webhook_deliveries d \
                JOIN webhook_endpoints e ON e.id = d.endpoint_id AND e.merchant_id = d.merchant_id \
               WHERE d.status = 'pending' AND d.next_attempt_at <= now() \
               ORDER BY d.next_attempt_at LIMIT $2 \
               FOR UPDATE OF d SKIP LOCKED \
          ), claimed AS ( \
              UPDATE webhook_deliveries d \
                 SET status = CASE WHEN due.endpoint_deleted THEN 'failed' ELSE 'pending' END, \
                     locked_until = CASE WHEN due.endpoint_deleted THEN NULL \
                                         ELSE now() + $1::bigint * interval '1 millisecond' END, \
                     next_attempt_at = CASE WHEN due.endpoint_deleted THEN d.next_attempt_at \
                                            ELSE now() + $1::bigint * interval '1 millisecond' END, \
                     last_error = CASE WHEN due.endpoint_deleted THEN 'the endpoint was deleted' \
                                       ELSE d.last_error END, \
                     updated_at = now() \
                FROM due \
               WHERE d.id = due.id AND d.merchant_id = due.merchant_id \
              RETURNING d.id, d.merchant_id, d.event_id, d.endpoint_id, d.status, d.attempts, \
                        d.locked_until \
          ) \
          SELECT c.id, c.merchant_id, c.endpoint_id, c.status, c.attempts, c.locked_until, \
                 e.url, e.secret, ev.id AS event_id, ev.type AS event_type, ev.data AS event_data, \
                 ev.created_at AS event_created_at \
            FROM claimed c \
            JOIN webhook_endpoints e ON e.id = c.endpoint_id AND e.merchant_id = c.merchant_id \
            JOIN events ev ON ev.id = c.event_id AND ev.merchant_id = c.merchant_id",
    params: &[Type::INT8, Type::INT8],
};

/// Records one attempt of a delivery we hold the lease `$3` of: counts it,
/// and makes the delivery `delivered` (`$4`), `failed` (the `$6`th attempt
/// failed) or pending again at now + `$7` ms; in the same statement the
/// attempt itself goes into `webhook_attempts`. A lease that is no longer
/// ours (it ran out and another dispatcher claimed the delivery) matches
/// nothing and records nothing.
pub const RECORD_ATTEMPT: Statement = Statement {
    sql: "WITH updated AS ( \
              UPDATE webhook_deliveries \
                 SET attempts = attempts + 1, \
                     status = CASE WHEN $4 THEN 'delivered' \
                                   WHEN attempts + 1 >= $6 THEN 'failed' \
                                   ELSE 'pending' END, \
                     next_attempt_at = CASE WHEN $4 OR attempts + 1 >= $6 THEN now() \
                                            ELSE now() + $7::bigint * interval '1 millisecond' END, \
                     locked_until = NULL, \
                     last_status_code = $5, \
                     last_error = $8, \
                     updated_at = now() \
               WHERE merchant_id = $1 AND id = $2 AND status IS NOT DISTINCT FROM 'pending' AND locked_until = $3 \
              RETURNING id, merchant_id, attempts, status, next_attempt_at \
          ), attempt AS ( \
              INSERT INTO webhook_attempts (id, merchant_id, delivery_id, attempt, status_code, \
                                            error, duration_ms) \
              SELECT $9, merchant_id, id, attempts, $5, $8, $10 FROM updated \
          ) \
          SELECT attempts, status, next_attempt_at FROM updated",
    params: &[
        Type::UUID,
        Type::UUID,
        Type::TIMESTAMPTZ,
        Type::BOOL,
        Type::INT4,
        Type::INT4,
        Type::INT8,
        Type::TEXT,
        Type::UUID,
        Type::INT4,
    ],
};

/// An event's deliveries, each with its attempts (one row per attempt, or
/// one row without attempt columns for a delivery not yet attempted), in the
/// order they were created. Both joins follow a unique index led by the
/// merchant.
pub const OF_EVENT: Statement = Statement {
    sql: "SELECT d.id AS delivery_id, d.endpoint_id, e.url, d.status, d.attempts, \
                 d.next_attempt_at, d.last_status_code, d.last_error, d.created_at, d.updated_at, \
                 a.attempt, a.status_code, a.error, a.duration_ms, a.created_at AS attempted_at \
            FROM webhook_deliveries d \
            JOIN webhook_endpoints e ON e.merchant_id = d.merchant_id AND e.id = d.endpoint_id \
            LEFT JOIN webhook_attempts a ON a.merchant_id = d.merchant_id AND a.delivery_id = d.id \
           WHERE d.merchant_id = $1 AND d.event_id = $2 \
           ORDER BY d.created_at, d.endpoint_id, a.attempt",
    params: &[Type::UUID, Type::UUID],
};

/// A delivery the dispatcher holds the lease of, with what sending takes.
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    pub id: Uuid,
    pub merchant_id: MerchantId,
    pub endpoint_id: WebhookEndpointId,
    /// Attempts before this one.
    pub attempts: i32,
    /// Our lease, exactly as stored: the record matches it.
    pub lease: DateTime<Utc>,
    pub url: String,
    pub secret: WebhookSecret,
    pub event: Event,
}

/// What one claim took: deliveries to attempt, and how many it gave up
/// because their endpoint was deleted.
#[derive(Debug, Default)]
pub struct Claim {
    pub deliveries: Vec<ClaimedDelivery>,
    pub dropped: usize,
}

impl Claim {
    /// How many due deliveries the claim took: to attempt, or given up.
    pub fn taken(&self) -> usize {
        self.deliveries.len() + self.dropped
    }
}

/// See `CLAIM_DUE`.
pub async fn claim_due(conn: &Conn, lease: Duration, batch: i64) -> Result<Claim, DbError> {
    let rows = conn
        .query(&CLAIM_DUE, &[&super::records::lease_ms(lease), &batch])
        .await?;
    let mut claim = Claim::default();
    for row in &rows {
        let status: &str = column(row, "status")?;
        if status != DeliveryStatus::Pending.as_str() {
            claim.dropped += 1;
            continue;
        }
        let merchant_id = MerchantId::from_uuid(column(row, "merchant_id")?);
        claim.deliveries.push(ClaimedDelivery {
            id: column(row, "id")?,
            merchant_id,
            endpoint_id: WebhookEndpointId::from_uuid(column(row, "endpoint_id")?),
            attempts: column(row, "attempts")?,
            lease: column(row, "locked_until")?,
            url: column(row, "url")?,
            secret: WebhookSecret::from_stored(column(row, "secret")?),
            event: Event {
                id: EventId::from_uuid(column(row, "event_id")?),
                merchant_id,
                event_type: event_type(row, "event_type")?,
                data: column(row, "event_data")?,
                created_at: column(row, "event_created_at")?,
            },
        });
    }
    Ok(claim)
}

/// How one attempt ended.
#[derive(Debug, Clone)]
pub struct AttemptRecord<'a> {
    pub delivered: bool,
    pub status_code: Option<i32>,
    pub error: Option<&'a str>,
    pub duration_ms: i32,
    /// Attempts after which a failing delivery is given up.
    pub max_attempts: i32,
    /// When to try again if it failed and attempts are left.
    pub retry_in: Duration,
}

/// The delivery after a recorded attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub attempts: i32,
    pub status: DeliveryStatus,
    pub next_attempt_at: DateTime<Utc>,
}

/// See `RECORD_ATTEMPT`. `None`: the lease was no longer ours.
pub async fn record_attempt(
    conn: &Conn,
    delivery: &ClaimedDelivery,
    attempt: &AttemptRecord<'_>,
) -> Result<Option<Recorded>, DbError> {
    let row = conn
        .query_opt(
            &RECORD_ATTEMPT,
            &[
                delivery.merchant_id.as_uuid(),
                &delivery.id,
                &delivery.lease,
                &attempt.delivered,
                &attempt.status_code,
                &attempt.max_attempts,
                &super::records::lease_ms(attempt.retry_in),
                &attempt.error,
                &crate::clock::new_v7(),
                &attempt.duration_ms,
            ],
        )
        .await?;
    row.map(|row| {
        Ok(Recorded {
            attempts: column(&row, "attempts")?,
            status: delivery_status(&row, "status")?,
            next_attempt_at: column(&row, "next_attempt_at")?,
        })
    })
    .transpose()
}

/// The deliveries of the merchant's event `event`, each with its attempts.
pub async fn of_event(
    conn: &Conn,
    merchant: MerchantId,
    event: EventId,
) -> Result<Vec<Delivery>, DbError> {
    let rows = conn
        .query(&OF_EVENT, &[merchant.as_uuid(), event.as_uuid()])
        .await?;
    let mut deliveries: Vec<(Uuid, Delivery)> = Vec::new();
    for row in &rows {
        let delivery_id: Uuid = column(row, "delivery_id")?;
        // Rows come grouped by delivery: a new id starts a new delivery.
        if deliveries.last().is_none_or(|(id, _)| *id != delivery_id) {
            deliveries.push((
                delivery_id,
                Delivery {
                    event_id: event,
                    endpoint_id: WebhookEndpointId::from_uuid(column(row, "endpoint_id")?),
                    url: column(row, "url")?,
                    status: delivery_status(row, "status")?,
                    attempts: column(row, "attempts")?,
                    next_attempt_at: column(row, "next_attempt_at")?,
                    last_status_code: column(row, "last_status_code")?,
                    last_error: column(row, "last_error")?,
                    created_at: column(row, "created_at")?,
                    updated_at: column(row, "updated_at")?,
                    attempt_log: Vec::new(),
                },
            ));
        }
        let attempt: Option<i32> = column(row, "attempt")?;
        if let (Some(attempt), Some((_, delivery))) = (attempt, deliveries.last_mut()) {
            delivery.attempt_log.push(DeliveryAttempt {
                attempt,
                status_code: column(row, "status_code")?,
                error: column(row, "error")?,
                duration_ms: column(row, "duration_ms")?,
                created_at: column(row, "attempted_at")?,
            });
        }
    }
    Ok(deliveries
        .into_iter()
        .map(|(_, delivery)| delivery)
        .collect())
}

fn delivery_status(row: &Row, name: &str) -> Result<DeliveryStatus, DbError> {
    let text: &str = column(row, name)?;
    DeliveryStatus::parse(text)
        .ok_or_else(|| DbError::Decode(format!("column {name}: unknown delivery status {text:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliveries_given_up_count_as_taken() {
        let claim = Claim {
            deliveries: Vec::new(),
            dropped: 3,
        };
        assert_eq!(claim.taken(), 3);
        assert_eq!(Claim::default().taken(), 0);
    }
}
