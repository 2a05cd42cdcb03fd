//! Statements on `events`, the outbox: reading it for the API, fanning it
//! out to webhook deliveries, and deleting what retention lets go. The
//! events themselves are written with the state change they record
//! (`charges::RECORD_OUTCOME`, `charges::RECORD_UNKNOWN`, and refunds'
//! statements), never here.

use chrono::{DateTime, Utc};
use tokio_postgres::types::Type;
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::column;
use super::records::uuid_v7_floor;
use super::{Conn, DbError, Statement};
use crate::domain::{Event, EventId, EventType, MerchantId};

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

/// Fan-out, in one statement and so in one transaction: takes up to `$1`
/// events off the queue (oldest first; `SKIP LOCKED`, so instances running
/// this at once take disjoint sets and never wait on each other) and
/// inserts a pending delivery for every live endpoint of the event's
/// merchant that wants its type. A crash leaves either all of it or none of
/// it. The unique (merchant, event, endpoint) makes a second fan-out of an
/// event, should one ever happen, add nothing. The event itself is only
/// read, and only where an endpoint wants it: an event row is never
/// changed (migration V6). A queued event that no longer exists (deleted
/// by hand) leaves the queue with no delivery instead of failing every
/// fan-out on the deliveries' foreign key.
///
/// Delivery ids are random (`gen_random_uuid`): a delivery is found by its
/// event or by when it is due, never by a range of ids.
///
/// Plans must not depend on statistics (see migration V3): the queued
/// events are deleted by `event_id = ANY (…)` on the queue's key, and an
/// event is looked for by its key, never by a join the planner might hash
/// over a whole table. Event ids are UUIDs, unique on their own; the
/// merchant is part of the key for distribution only (V4).
pub const FAN_OUT: Statement = Statement {
    sql: "WITH claimed AS MATERIALIZED ( \
              DELETE FROM event_queue \
               WHERE event_id = ANY (ARRAY( \
                     SELECT event_id FROM event_queue \
                      ORDER BY event_id LIMIT $1 \
                      FOR UPDATE SKIP LOCKED)) \
              RETURNING event_id, merchant_id, type \
          ), fanned AS ( \
              INSERT INTO webhook_deliveries (id, merchant_id, event_id, endpoint_id, status) \
              SELECT gen_random_uuid(), c.merchant_id, c.event_id, e.id, 'pending' \
                FROM claimed c \
                JOIN webhook_endpoints e ON e.merchant_id = c.merchant_id \
               WHERE e.deleted_at IS NULL \
                 AND (e.event_types IS NULL OR c.type = ANY (e.event_types)) \
                 AND EXISTS (SELECT 1 FROM events ev \
                              WHERE ev.id = c.event_id AND ev.merchant_id = c.merchant_id) \
              ON CONFLICT ON CONSTRAINT webhook_deliveries_one_per_endpoint DO NOTHING \
              RETURNING 1 \
          ) \
          SELECT (SELECT count(*) FROM claimed) AS events, \
                 (SELECT count(*) FROM fanned) AS deliveries",
    params: &[Type::INT8],
};

/// Retention: deletes up to `$2` events older than the id bound `$1` that
/// are done with, i.e. fanned out (no longer queued) and without a delivery
/// still pending; their deliveries and attempts go with them (ON DELETE
/// CASCADE). Nothing can make such an event pending again: only the fan-out
/// adds deliveries, and only to queued events, which this never picks (an
/// event enters the queue once, when it is written).
///
/// "Pending" is said as "neither delivered nor failed" so that the check
/// can only probe the (merchant, event) unique index per event, never read
/// every pending delivery through `webhook_deliveries_due`, whose predicate
/// only `status = 'pending'` implies (the trick of migration V3).
pub const DELETE_EXPIRED: Statement = Statement {
    sql: "DELETE FROM events \
           WHERE id = ANY (ARRAY( \
                 SELECT id FROM events ev \
                  WHERE ev.id < $1 \
                    AND NOT EXISTS ( \
                        SELECT 1 FROM event_queue q \
                         WHERE q.event_id = ev.id AND q.merchant_id = ev.merchant_id) \
                    AND NOT EXISTS ( \
                        SELECT 1 FROM webhook_deliveries d \
                         WHERE d.merchant_id = ev.merchant_id AND d.event_id = ev.id \
                           AND d.status NOT IN ('delivered', 'failed')) \
                  ORDER BY ev.id LIMIT $2 \
                  FOR UPDATE SKIP LOCKED))",
    params: &[Type::UUID, Type::INT8],
};

/// The outbox backlog, for the metrics (`workers::backlog`): events not yet
/// fanned out (queued) and pending deliveries, each counted up to `$1`, and
/// the age in seconds of the oldest event not yet delivered (the oldest
/// queued event or the oldest event of a pending delivery, whichever is
/// older; 0 when there is none).
///
/// Every read goes through an index and stops at `$1` entries: the queue by
/// its key (ids are UUIDv7, so its first entry is the oldest), the
/// deliveries by `webhook_deliveries_due`, whose first `$1`
/// entries (the ones due first) are the ones looked at for the oldest event;
/// with more pending deliveries than that, the oldest may be missed. The
/// one or two events whose age is taken are found by `events_pkey`. No plan
/// reads a whole table, whatever the statistics say. (`extract('epoch' …)`
/// is written with the field as a literal, which it is to PostgreSQL: so
/// the text matches what pg_stat_statements records, and the benchmark
/// recognises the statement with unnamed statements too.)
pub const BACKLOG: Statement = Statement {
    sql: "WITH pending AS MATERIALIZED ( \
              SELECT event_id FROM webhook_deliveries \
               WHERE status = 'pending' \
               ORDER BY next_attempt_at LIMIT $1 \
          ) \
          SELECT (SELECT count(*) FROM ( \
                      SELECT FROM event_queue ORDER BY event_id LIMIT $1) q) \
                     AS undispatched_events, \
                 (SELECT count(*) FROM pending) AS pending_deliveries, \
                 coalesce(extract('epoch' FROM now() - ( \
                     SELECT min(created_at) FROM events \
                      WHERE id = ANY (ARRAY[ \
                            (SELECT event_id FROM event_queue ORDER BY event_id LIMIT 1), \
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

/// What one fan-out did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FannedOut {
    /// Events taken off the queue.
    pub events: i64,
    /// Deliveries created for them.
    pub deliveries: i64,
}

/// See `FAN_OUT`.
pub async fn fan_out(conn: &Conn, batch: i64) -> Result<FannedOut, DbError> {
    let rows = conn.query(&FAN_OUT, &[&batch]).await?;
    let row = rows
        .first()
        .ok_or_else(|| DbError::Decode("the fan-out returned no row".into()))?;
    Ok(FannedOut {
        events: column(row, "events")?,
        deliveries: column(row, "deliveries")?,
    })
}

/// What `BACKLOG` measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backlog {
    pub undispatched_events: i64,
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
        pending_deliveries: column(row, "pending_deliveries")?,
        oldest_age_seconds: column(row, "oldest_age_seconds")?,
    })
}

/// Deletes up to `batch` delivered events created before `cutoff`; returns
/// how many. Ids are time-ordered, so the cutoff is an id bound and the scan
/// an index range.
pub async fn delete_expired(
    conn: &Conn,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    conn.execute(&DELETE_EXPIRED, &[&uuid_v7_floor(cutoff), &batch])
        .await
}

/// The stored type, exactly one of the six (the CHECK says so).
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
