//! Statements on `events`, the outbox: queueing a new event, reading it for
//! the API, fanning it out to webhook deliveries, and deleting what
//! retention lets go. The events themselves are written in the transaction
//! of the state change they record (`records::record_outcomes`,
//! `records::record_unknown`, `webhook_endpoints::disable`), each followed
//! there by [`QUEUE`].
//!
//! The background work looks across merchants only to read (`QUEUED`,
//! `EXPIRED`, `BACKLOG`), once per round and without locking; every change
//! names one merchant and one event, and checks its conditions again under
//! the row lock, so on a database distributed by merchant each runs on one
//! shard. Several events change together as one statement each, sent
//! together in one transaction (`records::per_row`): a statement by one id
//! always probes its key, where one naming many ids by an array could get a
//! plan that reads all of the merchant's rows.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::column;
use super::records::{lease_ms, per_row, uuid_v7_floor};
use super::{Conn, DbError, Statement};
use crate::domain::{Event, EventId, EventType, MerchantId};

/// Queues the merchant `$1`'s event `$2` for the fan-out if this
/// transaction wrote it and a live endpoint of the merchant wants its type:
/// the writers add an event only when its state change happened (a unique
/// index refuses a second one), and this reads the event back instead of
/// being told, so both can be sent together. So an event is in the queue
/// exactly when it committed and has somewhere to go. An event no endpoint
/// wants costs no queue row and no fan-out, so a merchant without endpoints
/// pays for neither (fanning out every event cost it an eighth of its new
/// charges on 2 cores: BENCHMARKS.md, "Decisions the measurements
/// shaped"). An endpoint gets the events that commit once it exists. What
/// "wants" means is [`FAN_OUT`]'s join on `webhook_endpoints`: the two
/// conditions change together.
pub const QUEUE: Statement = Statement {
    sql: "INSERT INTO event_queue (event_id, merchant_id, type) \
          SELECT ev.id, ev.merchant_id, ev.type FROM events ev \
           WHERE ev.merchant_id = $1 AND ev.id = $2 \
             AND EXISTS (SELECT 1 FROM webhook_endpoints e \
                          WHERE e.merchant_id = $1 \
                            AND e.deleted_at IS NULL AND e.disabled_at IS NULL \
                            AND (e.event_types IS NULL OR ev.type = ANY (e.event_types)))",
    params: &[Type::UUID, Type::UUID],
};

/// Runs [`QUEUE`] for the event `id`.
pub async fn queue(conn: &Conn, merchant: MerchantId, id: Uuid) -> Result<(), DbError> {
    conn.execute(&QUEUE, &[merchant.as_uuid(), &id]).await?;
    Ok(())
}

/// Newest first, after the cursor `$3`, of one type if `$4` is not null.
/// The listing index `events_listing (merchant_id, id DESC)` serves both
/// forms; the type is a filter on what it returns.
pub const LIST: Statement = Statement {
    sql: "SELECT id, merchant_id, type, data, created_at FROM events \
           WHERE merchant_id = $1 AND id < $3 AND ($4::text IS NULL OR type = $4) \
           ORDER BY id DESC LIMIT $2",
    params: &[Type::UUID, Type::INT8, Type::UUID, Type::TEXT],
};

pub const FIND: Statement = Statement {
    sql: "SELECT id, merchant_id, type, data, created_at FROM events \
           WHERE merchant_id = $1 AND id = $2",
    params: &[Type::UUID, Type::UUID],
};

/// The fan-out's candidates: up to `$1` queued events that are due (not
/// set aside, or set aside until a time now past), oldest first, across
/// merchants, read without locking anything. Each is then fanned out by
/// `FAN_OUT`, which takes it under its row lock. Event ids are UUIDv7, so
/// the queue's key is its order; an event set aside is skipped by a filter
/// (there are few: only events whose fan-out failed on its own).
pub const QUEUED: Statement = Statement {
    sql: "SELECT merchant_id, event_id, attempts FROM event_queue \
           WHERE next_attempt_at IS NULL OR next_attempt_at <= now() \
           ORDER BY event_id LIMIT $1",
    params: &[Type::INT8],
};

/// Fans out the merchant `$1`'s queued event `$2`, in one statement: takes
/// it off the queue and inserts a pending delivery for each live, enabled
/// endpoint of the merchant that wants its type, at most `$3` (the cap on
/// endpoints per merchant, `webhooks.max_endpoints_per_merchant`, so no
/// statement inserts more rows than that; a merchant over the cap from
/// before it existed gets deliveries for its first `$3` endpoints by slot).
/// A crash leaves all of it or none of it.
///
/// The queue row is taken with `SKIP LOCKED`: an instance fanning the same
/// event out at that moment has it, and this statement, finding nothing,
/// inserts nothing instead of waiting for it. The delete then re-checks that
/// the event is still queued and due under the row lock. The unique
/// (merchant, event, endpoint) makes a second fan-out of an event, should
/// one ever happen, add nothing. The event itself is only read (it must
/// exist: one deleted by hand leaves the queue with no delivery instead of
/// failing on the deliveries' foreign key); an event row is never changed
/// (migration V6).
///
/// Delivery ids are random (`gen_random_uuid`): a delivery is found by its
/// event or by when it is due, never by a range of ids.
pub const FAN_OUT: Statement = Statement {
    sql: "WITH taken AS ( \
              DELETE FROM event_queue \
               WHERE merchant_id = $1 AND event_id = $2 \
                 AND event_id IN ( \
                     SELECT q.event_id FROM event_queue q \
                      WHERE q.merchant_id = $1 AND q.event_id = $2 \
                        AND (q.next_attempt_at IS NULL OR q.next_attempt_at <= now()) \
                        FOR UPDATE SKIP LOCKED) \
              RETURNING type \
          ) \
          INSERT INTO webhook_deliveries (id, merchant_id, event_id, endpoint_id, status) \
          SELECT gen_random_uuid(), $1, $2, e.id, 'pending' \
            FROM taken t \
            JOIN webhook_endpoints e \
                 ON e.merchant_id = $1 AND e.deleted_at IS NULL AND e.disabled_at IS NULL \
                AND (e.event_types IS NULL OR t.type = ANY (e.event_types)) \
           WHERE EXISTS (SELECT 1 FROM events ev WHERE ev.merchant_id = $1 AND ev.id = $2) \
           ORDER BY e.slot LIMIT $3 \
          ON CONFLICT ON CONSTRAINT webhook_deliveries_one_per_endpoint DO NOTHING",
    params: &[Type::UUID, Type::UUID, Type::INT8],
};

/// Sets the merchant `$1`'s queued event `$2` aside after its fan-out
/// failed on its own: counts the failure, keeps its error `$4`, and makes it
/// due again `$3` ms from now. Skips it if it is locked (a fan-out of it
/// still runs, or one that timed out is still being undone): it is then
/// tried again as it is.
pub const SET_ASIDE: Statement = Statement {
    sql: "UPDATE event_queue \
             SET attempts = attempts + 1, \
                 next_attempt_at = now() + $3::bigint * interval '1 millisecond', \
                 last_error = $4 \
           WHERE merchant_id = $1 AND event_id = $2 \
             AND event_id IN (SELECT q.event_id FROM event_queue q \
                               WHERE q.merchant_id = $1 AND q.event_id = $2 \
                                 FOR UPDATE SKIP LOCKED) \
          RETURNING attempts",
    params: &[Type::UUID, Type::UUID, Type::INT8, Type::TEXT],
};

/// Retention's candidates: up to `$2` events older than the id bound `$1`
/// that are done with, i.e. fanned out (no longer queued) and without a
/// delivery still pending, oldest first, across merchants, read without
/// locking. Each is then deleted by `DELETE_EXPIRED`.
///
/// "Pending" is said as "neither delivered nor failed" so that the check
/// can only probe the (merchant, event) unique index per event, never read
/// every pending delivery through `webhook_deliveries_due`, whose predicate
/// only `status = 'pending'` implies (the trick of migration V3).
pub const EXPIRED: Statement = Statement {
    sql: "SELECT merchant_id, id FROM events ev \
           WHERE ev.id < $1 \
             AND NOT EXISTS ( \
                 SELECT 1 FROM event_queue q \
                  WHERE q.event_id = ev.id AND q.merchant_id = ev.merchant_id) \
             AND NOT EXISTS ( \
                 SELECT 1 FROM webhook_deliveries d \
                  WHERE d.merchant_id = ev.merchant_id AND d.event_id = ev.id \
                    AND d.status NOT IN ('delivered', 'failed')) \
           ORDER BY ev.id LIMIT $2",
    params: &[Type::UUID, Type::INT8],
};

/// Deletes the merchant `$1`'s event `$2` if it is still older than the id
/// bound `$3` and done with (as `EXPIRED` says); its deliveries and
/// attempts go with it (ON DELETE CASCADE). Nothing can make such an event
/// pending again: only the fan-out adds deliveries, and only to queued
/// events, and an event enters the queue once, when it is written.
pub const DELETE_EXPIRED: Statement = Statement {
    sql: "DELETE FROM events ev \
           WHERE ev.merchant_id = $1 AND ev.id = $2 AND ev.id < $3 \
             AND NOT EXISTS ( \
                 SELECT 1 FROM event_queue q WHERE q.merchant_id = $1 AND q.event_id = $2) \
             AND NOT EXISTS ( \
                 SELECT 1 FROM webhook_deliveries d \
                  WHERE d.merchant_id = $1 AND d.event_id = $2 \
                    AND d.status NOT IN ('delivered', 'failed'))",
    params: &[Type::UUID, Type::UUID, Type::UUID],
};

/// The outbox backlog, for the metrics (`workers::backlog`): events not yet
/// fanned out (queued) and pending deliveries, each counted up to `$1`, how
/// many of those queued events are set aside, and the age in seconds of the
/// oldest event not yet delivered (the oldest queued event or the oldest
/// event of a pending delivery, whichever is older; 0 when there is none).
///
/// Every read goes through an index and stops at `$1` entries: the queue by
/// its key (ids are UUIDv7, so its first entry is the oldest), the
/// deliveries by `webhook_deliveries_due`, whose first `$1` entries (the
/// ones due first) are the ones looked at for the oldest event; with more
/// pending deliveries than that, the oldest may be missed. The one or two
/// events whose age is taken are found by `events_pkey`. No plan reads a
/// whole table, whatever the statistics say. Every subquery names the
/// columns it reads (a subquery of no columns trips Citus). (`extract('epoch'
/// …)` is written with the field as a literal, which it is to PostgreSQL: so
/// the text matches what pg_stat_statements records, and the benchmark
/// recognises the statement with unnamed statements too.)
pub const BACKLOG: Statement = Statement {
    sql: "WITH queued AS MATERIALIZED ( \
              SELECT event_id, next_attempt_at FROM event_queue \
               ORDER BY event_id LIMIT $1 \
          ), pending AS MATERIALIZED ( \
              SELECT event_id FROM webhook_deliveries \
               WHERE status = 'pending' \
               ORDER BY next_attempt_at LIMIT $1 \
          ) \
          SELECT (SELECT count(*) FROM queued) AS undispatched_events, \
                 (SELECT count(*) FROM queued WHERE next_attempt_at > now()) AS set_aside_events, \
                 (SELECT count(*) FROM pending) AS pending_deliveries, \
                 coalesce(extract('epoch' FROM now() - ( \
                     SELECT min(created_at) FROM events \
                      WHERE id = ANY (ARRAY[ \
                            (SELECT event_id FROM queued ORDER BY event_id LIMIT 1), \
                            (SELECT event_id FROM pending ORDER BY event_id LIMIT 1)]) \
                 )), 0)::float8 AS oldest_age_seconds",
    params: &[Type::INT8],
};

/// Newest first; `starting_after` continues after that event, `of_type`
/// keeps only that type.
pub async fn list(
    conn: &Conn,
    merchant: MerchantId,
    limit: i64,
    starting_after: Option<EventId>,
    of_type: Option<EventType>,
) -> Result<Vec<Event>, DbError> {
    // No cursor: start above every id (the all-ones UUID).
    let cursor = starting_after.map_or(Uuid::max(), |id| *id.as_uuid());
    let of_type = of_type.map(EventType::as_str);
    let rows = conn
        .query(&LIST, &[merchant.as_uuid(), &limit, &cursor, &of_type])
        .await?;
    rows.iter().map(decode).collect()
}

pub async fn find(
    conn: &Conn,
    merchant: MerchantId,
    id: EventId,
) -> Result<Option<Event>, DbError> {
    let row = conn
        .query_opt(&FIND, &[merchant.as_uuid(), id.as_uuid()])
        .await?;
    row.as_ref().map(decode).transpose()
}

/// A queued event, as the fan-out's read found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedEvent {
    pub merchant_id: MerchantId,
    pub event_id: EventId,
    /// Fan-outs of it that failed so far (each set it aside).
    pub attempts: i32,
}

/// See `QUEUED`.
pub async fn queued(conn: &Conn, limit: i64) -> Result<Vec<QueuedEvent>, DbError> {
    let rows = conn.query(&QUEUED, &[&limit]).await?;
    rows.iter()
        .map(|row| {
            Ok(QueuedEvent {
                merchant_id: MerchantId::from_uuid(column(row, "merchant_id")?),
                event_id: EventId::from_uuid(column(row, "event_id")?),
                attempts: column(row, "attempts")?,
            })
        })
        .collect()
}

/// Fans out each of `events` (`FAN_OUT`, one statement each, sent together
/// in one transaction), to at most `max_endpoints` endpoints each; returns
/// how many deliveries were created. Events another instance is fanning
/// out at the same time are skipped.
pub async fn fan_out(
    conn: &Conn,
    events: &[QueuedEvent],
    max_endpoints: i64,
) -> Result<u64, DbError> {
    let created = per_row(conn, events, |event| async move {
        conn.execute(
            &FAN_OUT,
            &[
                event.merchant_id.as_uuid(),
                event.event_id.as_uuid(),
                &max_endpoints,
            ],
        )
        .await
    })
    .await?;
    Ok(created.iter().sum())
}

/// Sets `event` aside for `retry_in` after its fan-out failed with `error`
/// (`SET_ASIDE`); returns its failures so far, or `None` if it was locked
/// and so left as it is.
pub async fn set_aside(
    conn: &Conn,
    event: &QueuedEvent,
    retry_in: Duration,
    error: &str,
) -> Result<Option<i32>, DbError> {
    let row = conn
        .query_opt(
            &SET_ASIDE,
            &[
                event.merchant_id.as_uuid(),
                event.event_id.as_uuid(),
                &lease_ms(retry_in),
                &error,
            ],
        )
        .await?;
    row.map(|row| column(&row, "attempts")).transpose()
}

/// What `BACKLOG` measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub undispatched_events: i64,
    /// Of the undispatched events, those set aside for now.
    pub set_aside_events: i64,
    pub pending_deliveries: i64,
    /// Seconds; 0 when nothing waits.
    pub oldest_age_seconds: f64,
}

/// See `BACKLOG`; counts stop at `limit`.
pub async fn backlog(conn: &Conn, limit: i64) -> Result<Backlog, DbError> {
    let rows = conn.query(&BACKLOG, &[&limit]).await?;
    let row = rows
        .first()
        .ok_or_else(|| DbError::Decode("the backlog query returned no row".into()))?;
    Ok(Backlog {
        undispatched_events: column(row, "undispatched_events")?,
        set_aside_events: column(row, "set_aside_events")?,
        pending_deliveries: column(row, "pending_deliveries")?,
        oldest_age_seconds: column(row, "oldest_age_seconds")?,
    })
}

/// Deletes up to `batch` events created before `cutoff` that are done with;
/// returns how many. Ids are time-ordered, so the cutoff is an id bound and
/// the candidates an index range; each is deleted by a statement of its own
/// that checks it again (`DELETE_EXPIRED`), all in one transaction.
pub async fn delete_expired(
    conn: &Conn,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let cutoff = uuid_v7_floor(cutoff);
    let rows = conn.query(&EXPIRED, &[&cutoff, &batch]).await?;
    let candidates = rows
        .iter()
        .map(|row| {
            Ok((
                column::<Uuid>(row, "merchant_id")?,
                column::<Uuid>(row, "id")?,
            ))
        })
        .collect::<Result<Vec<_>, DbError>>()?;
    let deleted = per_row(conn, &candidates, |(merchant, id)| async move {
        conn.execute(&DELETE_EXPIRED, &[merchant, id, &cutoff])
            .await
    })
    .await?;
    Ok(deleted.iter().sum())
}

/// The stored type, one of those the CHECK allows.
pub(super) fn event_type(row: &Row, name: &str) -> Result<EventType, DbError> {
    let text: &str = column(row, name)?;
    EventType::parse(text)
        .ok_or_else(|| DbError::Decode(format!("column {name}: unknown event type {text:?}")))
}

fn decode(row: &Row) -> Result<Event, DbError> {
    Ok(Event {
        id: EventId::from_uuid(column(row, "id")?),
        merchant_id: MerchantId::from_uuid(column(row, "merchant_id")?),
        event_type: event_type(row, "type")?,
        data: column(row, "data")?,
        created_at: column(row, "created_at")?,
    })
}
