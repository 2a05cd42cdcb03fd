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
//!
//! The claim reads its candidates across merchants without locking (`DUE`)
//! and then claims each by a statement of its own that names its merchant
//! and checks it again under the row lock (`CLAIM`), all sent together in
//! one transaction: so on a database distributed by merchant every change
//! runs on one shard.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::column;
use super::events::event_type;
use super::{Conn, DbError, Decision, Statement};
use crate::domain::{
    Delivery, DeliveryAttempt, DeliveryStatus, Event, EventId, MerchantId, WebhookEndpointId,
    WebhookSecret,
};

/// The claim's candidates: up to `$1` due pending deliveries, the ones due
/// first, across merchants, read without locking anything, leaving out
/// those of the endpoints `$2` and the merchants `$3` (the ones this
/// instance already has as many deliveries in flight for as they may have).
/// Each is then claimed by `CLAIM`, which checks it again under its row
/// lock. The scan follows `webhook_deliveries_due` in order and stops at
/// `$1` rows.
pub const DUE: Statement = Statement {
    sql: "SELECT merchant_id, id, endpoint_id FROM webhook_deliveries \
           WHERE status = 'pending' AND next_attempt_at <= now() \
             AND endpoint_id <> ALL ($2) AND merchant_id <> ALL ($3) \
           ORDER BY next_attempt_at LIMIT $1",
    params: &[Type::INT8, Type::UUID_ARRAY, Type::UUID_ARRAY],
};

/// Claims the merchant `$1`'s delivery `$2` if it is still pending and due,
/// by what its endpoint allows:
/// - a live, enabled endpoint whose circuit breaker lets attempts through:
///   the delivery is leased for `$3` ms (`locked_until`, and
///   `next_attempt_at` moves to the end of the lease, so a dispatcher that
///   dies mid-attempt leaves it to come due again then) and returned with
///   what sending takes: the endpoint's URL and secret, and the event;
/// - an endpoint the breaker holds back (`retry_at` still ahead): the
///   delivery waits until then, which is not an attempt (`held`);
/// - a deleted or disabled endpoint: the delivery is given up (`failed`).
///
/// `state` says which. The CASEs take their times from `clock`, computed
/// outside them: Citus refuses a function that is not immutable (`now()`,
/// and adding an interval to a time) in a CASE of a change. Row locking
/// makes the claim a single winner: a
/// second claimer waits for the first, re-checks `next_attempt_at`, and
/// matches nothing. One row by its key, one endpoint and one event by
/// theirs; `status IS NOT DISTINCT FROM 'pending'` keeps the partial index
/// of due deliveries out of the plan (`super::Statement`).
pub const CLAIM: Statement = Statement {
    sql: "UPDATE webhook_deliveries d \
             SET status = CASE WHEN e.deleted_at IS NULL AND e.disabled_at IS NULL \
                               THEN 'pending' ELSE 'failed' END, \
                 locked_until = CASE WHEN e.deleted_at IS NULL AND e.disabled_at IS NULL \
                                      AND (e.retry_at IS NULL OR e.retry_at <= clock.now) \
                                     THEN clock.lease_ends END, \
                 next_attempt_at = CASE WHEN e.deleted_at IS NOT NULL OR e.disabled_at IS NOT NULL \
                                        THEN d.next_attempt_at \
                                        WHEN e.retry_at > clock.now THEN e.retry_at \
                                        ELSE clock.lease_ends END, \
                 last_error = CASE WHEN e.deleted_at IS NOT NULL THEN 'the endpoint was deleted' \
                                   WHEN e.disabled_at IS NOT NULL THEN 'the endpoint was disabled' \
                                   ELSE d.last_error END, \
                 updated_at = now() \
            FROM webhook_endpoints e, events ev, \
                 (SELECT now() AS now, \
                         now() + $3::bigint * interval '1 millisecond' AS lease_ends) clock \
           WHERE d.merchant_id = $1 AND d.id = $2 \
             AND d.status IS NOT DISTINCT FROM 'pending' AND d.next_attempt_at <= now() \
             AND e.merchant_id = $1 AND e.id = d.endpoint_id \
             AND ev.merchant_id = $1 AND ev.id = d.event_id \
          RETURNING d.id, d.merchant_id, d.endpoint_id, d.attempts, d.locked_until, \
                    CASE WHEN e.deleted_at IS NOT NULL THEN 'deleted' \
                         WHEN e.disabled_at IS NOT NULL THEN 'disabled' \
                         WHEN d.locked_until IS NULL THEN 'held' \
                         ELSE 'claimed' END AS state, \
                    e.url, e.secret, e.consecutive_failures, \
                    ev.id AS event_id, ev.type AS event_type, ev.data AS event_data, \
                    ev.created_at AS event_created_at",
    params: &[Type::UUID, Type::UUID, Type::INT8],
};

/// A statement that settles the merchant `$1`'s deliveries `$2` still
/// pending and due whose endpoint (`e`) meets `$endpoint`: sets `$set` and
/// returns `$state`. The dispatcher settles so the rest of a window's
/// deliveries to endpoints it knows closed, one statement each per merchant
/// and round: a backlog behind a dead endpoint leaves the due deliveries in
/// a few rounds, not one delivery a round (the open breaker's share) with
/// every other merchant's waiting behind it, and on Citus with one round
/// trip, not one per delivery.
///
/// The form keeps the plan a probe of the ids, on an empty table too
/// (where a generic plan is cached and then kept as the table grows):
/// the endpoint is read by subqueries and the ids are matched by `= ANY`,
/// since a join would let the planner start from the merchant's endpoints,
/// or from its range of `webhook_deliveries_one_per_endpoint`, and read
/// all of its deliveries (`settling_probes_the_ids_it_is_given` checks the
/// plan). Rows another transaction holds are skipped (`SKIP LOCKED`): it
/// is claiming them, and a settling that never waits cannot deadlock with
/// a claim, which locks its rows one by one in key order while this may
/// lock them in the table's.
macro_rules! settling {
    (set: $set:literal, endpoint: $endpoint:literal, state: $state:literal) => {
        concat!(
            "WITH free AS MATERIALIZED ( \
                 SELECT q.id FROM webhook_deliveries q \
                  WHERE q.merchant_id = $1 AND q.id = ANY ($2) \
                    FOR UPDATE SKIP LOCKED \
             ) \
             UPDATE webhook_deliveries d SET ",
            $set,
            ", updated_at = now() \
              WHERE d.merchant_id = $1 AND d.id = ANY ($2) AND d.id IN (SELECT id FROM free) \
                AND d.status IS NOT DISTINCT FROM 'pending' AND d.next_attempt_at <= now() \
                AND (SELECT ",
            $endpoint,
            " FROM webhook_endpoints e WHERE e.merchant_id = $1 AND e.id = d.endpoint_id) \
             RETURNING ",
            $state,
            " AS state"
        )
    };
}

/// Holds back those of the merchant `$1`'s deliveries `$2` that are still
/// pending and due and whose endpoint's circuit breaker is open, until the
/// end of its pause, as `CLAIM` would; the others are left as they are.
/// See `settling!`.
pub const HOLD: Statement = Statement {
    sql: settling!(
        set: "next_attempt_at = (SELECT e.retry_at FROM webhook_endpoints e \
                                  WHERE e.merchant_id = $1 AND e.id = d.endpoint_id)",
        endpoint: "e.deleted_at IS NULL AND e.disabled_at IS NULL AND e.retry_at > now()",
        state: "'held'"
    ),
    params: &[Type::UUID, Type::UUID_ARRAY],
};

/// Gives up those of the merchant `$1`'s deliveries `$2` that are still
/// pending and due and whose endpoint was deleted or disabled, as `CLAIM`
/// would; the others are left as they are. See `settling!`.
pub const GIVE_UP: Statement = Statement {
    sql: settling!(
        set: "status = 'failed', \
              last_error = (SELECT CASE WHEN e.deleted_at IS NOT NULL \
                                        THEN 'the endpoint was deleted' \
                                        ELSE 'the endpoint was disabled' END \
                              FROM webhook_endpoints e \
                             WHERE e.merchant_id = $1 AND e.id = d.endpoint_id)",
        endpoint: "e.deleted_at IS NOT NULL OR e.disabled_at IS NOT NULL",
        state: "CASE WHEN d.last_error = 'the endpoint was deleted' THEN 'deleted' \
                     ELSE 'disabled' END"
    ),
    params: &[Type::UUID, Type::UUID_ARRAY],
};

/// Records one attempt of a delivery we hold the lease `$3` of: counts it,
/// and makes the delivery `delivered` (`$4`), `failed` (the `$6`th attempt
/// failed) or pending again at now + `$7` ms. A lease that is no longer
/// ours (it ran out and another dispatcher claimed the delivery) matches
/// nothing and records nothing; `INSERT_ATTEMPT` goes with it in one
/// transaction. (`clock`: see `CLAIM`.)
pub const RECORD_ATTEMPT: Statement = Statement {
    sql: "UPDATE webhook_deliveries \
             SET attempts = attempts + 1, \
                 status = CASE WHEN $4 THEN 'delivered' \
                               WHEN attempts + 1 >= $6 THEN 'failed' \
                               ELSE 'pending' END, \
                 next_attempt_at = CASE WHEN $4 OR attempts + 1 >= $6 THEN clock.now \
                                        ELSE clock.next_try END, \
                 locked_until = NULL, \
                 last_status_code = $5, \
                 last_error = $8, \
                 updated_at = now() \
            FROM (SELECT now() AS now, \
                         now() + $7::bigint * interval '1 millisecond' AS next_try) clock \
           WHERE merchant_id = $1 AND id = $2 AND status IS NOT DISTINCT FROM 'pending' \
             AND locked_until = $3 \
          RETURNING attempts, status, next_attempt_at",
    params: &[
        Type::UUID,
        Type::UUID,
        Type::TIMESTAMPTZ,
        Type::BOOL,
        Type::INT4,
        Type::INT4,
        Type::INT8,
        Type::TEXT,
    ],
};

/// The attempt `$4` (id `$3`) of the merchant `$1`'s delivery `$2`, its
/// status code `$5`, error `$6` and duration `$7` ms, if the delivery has
/// counted `$4` attempts, as this transaction's `RECORD_ATTEMPT` left it:
/// sent together with it. A dispatcher whose lease ran out finds the
/// attempt already recorded by the one that took over (one row per
/// number, `webhook_attempts_one_per_number`), or the count elsewhere.
pub const INSERT_ATTEMPT: Statement = Statement {
    sql: "INSERT INTO webhook_attempts (id, merchant_id, delivery_id, attempt, status_code, \
                                        error, duration_ms) \
          SELECT $3, merchant_id, id, $4, $5, $6, $7 FROM webhook_deliveries \
           WHERE merchant_id = $1 AND id = $2 AND attempts = $4 \
          ON CONFLICT (merchant_id, delivery_id, attempt) DO NOTHING",
    params: &[
        Type::UUID,
        Type::UUID,
        Type::UUID,
        Type::INT4,
        Type::INT4,
        Type::TEXT,
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

/// A due delivery, as the claim's read found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueDelivery {
    pub merchant_id: MerchantId,
    pub id: Uuid,
    pub endpoint_id: WebhookEndpointId,
}

/// See `DUE`: up to `limit` due deliveries, none of `busy_endpoints` nor
/// of `busy_merchants`.
pub async fn due(
    conn: &Conn,
    limit: i64,
    busy_endpoints: &[Uuid],
    busy_merchants: &[Uuid],
) -> Result<Vec<DueDelivery>, DbError> {
    let rows = conn
        .query(&DUE, &[&limit, &busy_endpoints, &busy_merchants])
        .await?;
    rows.iter()
        .map(|row| {
            Ok(DueDelivery {
                merchant_id: MerchantId::from_uuid(column(row, "merchant_id")?),
                id: column(row, "id")?,
                endpoint_id: WebhookEndpointId::from_uuid(column(row, "endpoint_id")?),
            })
        })
        .collect()
}

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
    /// The endpoint's failed attempts in a row when this was claimed.
    pub endpoint_failures: i32,
    pub event: Event,
}

/// What one claim (or settling) did with the deliveries it was given:
/// those to attempt, and how many it held back for their endpoint's
/// circuit breaker or gave up because their endpoint was deleted or
/// disabled, and those endpoints. Deliveries another dispatcher claimed
/// first are in none of these.
#[derive(Debug, Default)]
pub struct Claim {
    pub deliveries: Vec<ClaimedDelivery>,
    pub held: usize,
    pub endpoint_deleted: usize,
    pub endpoint_disabled: usize,
    /// The endpoints of the deliveries held back or given up: closed to
    /// attempts for now.
    pub closed: HashSet<WebhookEndpointId>,
}

impl Claim {
    /// How many due deliveries the claim changed: claimed, held or given up.
    pub fn taken(&self) -> usize {
        self.deliveries.len() + self.held + self.endpoint_deleted + self.endpoint_disabled
    }

    /// Counts a delivery held back or given up, by the row's `state`.
    fn count(&mut self, row: &Row) -> Result<(), DbError> {
        match column::<&str>(row, "state")? {
            "held" => self.held += 1,
            "deleted" => self.endpoint_deleted += 1,
            "disabled" => self.endpoint_disabled += 1,
            other => {
                return Err(DbError::Decode(format!(
                    "column state: unknown claim state {other:?}"
                )))
            }
        }
        Ok(())
    }
}

/// Claims each of `deliveries` (`CLAIM`, one statement each, sent together
/// in one transaction), leasing those to attempt for `lease`. They are
/// claimed in key order, so two instances claiming some of the same
/// deliveries lock them in the same order and never deadlock.
pub async fn claim(
    conn: &Conn,
    lease: Duration,
    deliveries: &[DueDelivery],
) -> Result<Claim, DbError> {
    let lease = super::records::lease_ms(lease);
    let mut deliveries = deliveries.to_vec();
    deliveries.sort_unstable_by_key(|d| (d.merchant_id, d.id));
    deliveries.dedup();
    let rows = super::records::per_row(conn, &deliveries, |delivery| async move {
        conn.query_opt(
            &CLAIM,
            &[delivery.merchant_id.as_uuid(), &delivery.id, &lease],
        )
        .await
    })
    .await?;
    let mut claim = Claim::default();
    for row in rows.iter().flatten() {
        if column::<&str>(row, "state")? == "claimed" {
            claim.deliveries.push(claimed(row)?);
        } else {
            claim.count(row)?;
            let endpoint = column(row, "endpoint_id")?;
            claim.closed.insert(WebhookEndpointId::from_uuid(endpoint));
        }
    }
    Ok(claim)
}

/// Settles each of `deliveries` whose endpoint takes no attempt now: held
/// back (`HOLD`) or given up (`GIVE_UP`), one statement each per merchant,
/// all sent together in one transaction. The others are left as they are.
pub async fn settle(conn: &Conn, deliveries: &[DueDelivery]) -> Result<Claim, DbError> {
    let mut by_merchant: BTreeMap<MerchantId, Vec<Uuid>> = BTreeMap::new();
    for delivery in deliveries {
        let ids = by_merchant.entry(delivery.merchant_id).or_default();
        ids.push(delivery.id);
    }
    let merchants: Vec<(MerchantId, Vec<Uuid>)> = by_merchant.into_iter().collect();
    let settled = super::records::per_row(conn, &merchants, |(merchant, ids)| async move {
        let params: [&(dyn ToSql + Sync); 2] = [merchant.as_uuid(), ids];
        let mut rows = conn.query(&HOLD, &params).await?;
        rows.extend(conn.query(&GIVE_UP, &params).await?);
        Ok(rows)
    })
    .await?;
    let mut claim = Claim::default();
    for row in settled.iter().flatten() {
        claim.count(row)?;
    }
    Ok(claim)
}

/// A delivery `CLAIM` leased, from its row.
fn claimed(row: &Row) -> Result<ClaimedDelivery, DbError> {
    let merchant_id = MerchantId::from_uuid(column(row, "merchant_id")?);
    Ok(ClaimedDelivery {
        id: column(row, "id")?,
        merchant_id,
        endpoint_id: WebhookEndpointId::from_uuid(column(row, "endpoint_id")?),
        attempts: column(row, "attempts")?,
        lease: column(row, "locked_until")?,
        url: column(row, "url")?,
        secret: WebhookSecret::from_stored(column(row, "secret")?),
        endpoint_failures: column(row, "consecutive_failures")?,
        event: Event {
            id: EventId::from_uuid(column(row, "event_id")?),
            merchant_id,
            event_type: event_type(row, "event_type")?,
            data: column(row, "event_data")?,
            created_at: column(row, "event_created_at")?,
        },
    })
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
    let merchant = delivery.merchant_id.as_uuid();
    let number = delivery.attempts + 1;
    let retry_in = super::records::lease_ms(attempt.retry_in);
    let id = crate::clock::new_v7();
    let record: [&(dyn ToSql + Sync); 8] = [
        merchant,
        &delivery.id,
        &delivery.lease,
        &attempt.delivered,
        &attempt.status_code,
        &attempt.max_attempts,
        &retry_in,
        &attempt.error,
    ];
    let insert: [&(dyn ToSql + Sync); 7] = [
        merchant,
        &delivery.id,
        &id,
        &number,
        &attempt.status_code,
        &attempt.error,
        &attempt.duration_ms,
    ];
    // The insert reads what the update counted (`Conn::prepare` says why
    // this comes first).
    conn.prepare(&[&RECORD_ATTEMPT, &INSERT_ATTEMPT]).await?;
    let row = conn
        .transaction(async {
            let (row, _) = futures_util::try_join!(
                conn.query_opt(&RECORD_ATTEMPT, &record),
                conn.execute(&INSERT_ATTEMPT, &insert),
            )?;
            Ok(Decision::Commit(row))
        })
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
    fn deliveries_held_or_given_up_count_as_taken() {
        let claim = Claim {
            deliveries: Vec::new(),
            held: 2,
            endpoint_deleted: 3,
            endpoint_disabled: 1,
            closed: HashSet::new(),
        };
        assert_eq!(claim.taken(), 6);
        assert_eq!(Claim::default().taken(), 0);
    }
}
