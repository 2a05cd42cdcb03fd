//! The statements charges and refunds share: both are records with an
//! idempotency key, a fingerprint, a processing lease and an outcome, and
//! go through one lifecycle (`service::lifecycle`). Each table states them
//! once through [`record_statements!`], from its name, its columns and what
//! its outcome changes besides itself; the functions here run them for any
//! [`Stored`] record. A table keeps only what is its own (a charge's batched
//! insert and outcomes, a refund's reservation on its charge).
//!
//! Every statement names one merchant (`merchant_id = $1`), so on a
//! database distributed by merchant each runs on one shard. The two that
//! look across merchants (`abandoned`, `expired_keys`) only read; the
//! changes they lead to are made row by row (`claim`, `release_key`), each
//! re-checking its conditions under the row lock.
//!
//! Where several rows change at once, each is named by a statement of its
//! own, the statements sent together (pipelined) in one transaction: a
//! statement that finds many rows by id cannot keep a plan that probes each
//! one (a plan made while the table is small, without statistics, reads all
//! of the merchant's rows, as `id = ANY (…)` does), while a statement by
//! one id always probes the primary key. Joining the ids as an array does
//! not help either: for `UPDATE … FROM (SELECT * FROM unnest($2) LIMIT
//! cardinality($2))` on an empty, never-analysed table both sides look like
//! one row, and PostgreSQL 15 reads all of the merchant's rows and filters
//! them by the ids (through `charges_merchant_key_unique` for the update,
//! the listing indexes for the event's and the queue's joins), although
//! such a statement per batch cost a fifth less CPU a row than the
//! pipelined ones on a large table.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::{Json, ToSql};
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::{column, Columns};
use super::{Conn, DbError, Decision, Statement};
use crate::domain::lifecycle::Record;
use crate::domain::{IdempotencyKey, MerchantId, Outcome};

/// The statements of one record table; see [`record_statements!`] for their
/// parameters.
#[derive(Debug, Clone, Copy)]
pub struct RecordStatements {
    pub find: Statement,
    pub find_by_key: Statement,
    pub list: Statement,
    pub take_over_or_read: Statement,
    pub abandoned: Statement,
    pub claim: Statement,
    pub record_unknown: Statement,
    pub record_outcome: Statement,
    pub record_event: Statement,
    pub forget_unconfirmed: Statement,
    pub expired_keys: Statement,
    pub release_key: Statement,
}

/// A record type stored in a table with [`RecordStatements`]. Its
/// `Serialize` form is the public JSON, which its events carry.
pub trait Stored: Record + serde::Serialize + std::fmt::Debug {
    const STATEMENTS: &'static RecordStatements;

    /// The record from its table's columns, read in the order its
    /// statements select them; the columns after them can be read from
    /// `columns` next.
    fn decode_from(columns: &mut Columns<'_>) -> Result<Self, DbError>;

    /// The record as it will be once `outcome` is recorded: the event's
    /// data.
    fn with_outcome(&self, outcome: &Outcome) -> Self;

    /// The record as an event about it shows it (a charge before any
    /// refund, as its creation answered).
    fn into_event(self) -> Self;

    /// A statement (merchant, id) that locks the other rows this record's
    /// outcome or forgetting changes too, run first in their transactions;
    /// `None` if they change no other row. A transaction that changes both
    /// must take their locks in the order the record's creation takes them
    /// (`db::refunds` says why).
    const LOCK_FIRST: Option<&'static Statement> = None;
}

/// Writes the shared statements of a record table:
///
/// - `table`: its name; `object`: what its events are about (`charge`
///   writes `charge.*` events referring to it by `charge_id`);
/// - `columns`: the columns its records are decoded from;
/// - `processor_id`: the column for the processor's id of the outcome;
/// - `outcome_also`: CTEs (each starting with a comma) that the outcome
///   statement runs too, reading the changed row from `updated`;
/// - `forget_also`: the statement that follows the deletion of an
///   unconfirmed row, reading it from `gone`; it returns a row if one was
///   deleted.
///
/// Parameters, every statement starting with the merchant:
/// - `find` (merchant, id); `find_by_key` (merchant, key);
///   `list` (merchant, limit, cursor): newest first, ids below the cursor;
/// - `take_over_or_read` (merchant, id, lease ms): the row and `taken`;
/// - `abandoned` (limit): `merchant_id, id` of pending rows whose lease and
///   backoff have run out, across merchants, read only;
///   `claim` (merchant, id, lease ms): a fresh lease on it if it still
///   qualifies;
/// - `record_unknown` (merchant, id, our lease, retry ms);
///   `record_outcome` (merchant, id, status, failure code, failure
///   message, processor id); `record_event` (merchant, id, event id, event
///   data, status, least processor attempts): each changes or adds one
///   row, so that on Citus each is carried out by the merchant's worker
///   alone (an INSERT inside a CTE is not: its result goes to every
///   worker);
/// - `forget_unconfirmed` (merchant, id);
/// - `expired_keys` (cutoff id, limit): `merchant_id, id` of final rows
///   still holding a key and older than the cutoff, read only;
///   `release_key` (merchant, id, cutoff id).
///
/// A statement that names its row by id says "pending" as
/// `status IS NOT DISTINCT FROM 'pending'`, which implies no partial
/// index's predicate (`super::Statement` says why).
#[macro_export]
macro_rules! record_statements {
    (
        table: $table:literal,
        object: $object:literal,
        columns: [$($columns:tt)*],
        processor_id: $processor_id:literal,
        outcome_also: $outcome_also:literal,
        forget_also: $forget_also:literal $(,)?
    ) => {{
        use tokio_postgres::types::Type;
        $crate::db::records::RecordStatements {
            find: $crate::db::Statement {
                sql: concat!("SELECT ", $($columns)*, " FROM ", $table,
                             " WHERE merchant_id = $1 AND id = $2"),
                params: &[Type::UUID, Type::UUID],
            },
            find_by_key: $crate::db::Statement {
                sql: concat!("SELECT ", $($columns)*, " FROM ", $table,
                             " WHERE merchant_id = $1 AND client_idempotency_key = $2"),
                params: &[Type::UUID, Type::TEXT],
            },
            // `status IS NOT NULL` is always true: it is the predicate of the
            // partial listing index, stated so that this statement, and no
            // other, can use that index (migration V3).
            list: $crate::db::Statement {
                sql: concat!("SELECT ", $($columns)*, " FROM ", $table,
                             " WHERE merchant_id = $1 AND id < $3 AND status IS NOT NULL \
                               ORDER BY id DESC LIMIT $2"),
                params: &[Type::UUID, Type::INT8, Type::UUID],
            },
            // Row locking makes the takeover a single winner: a second taker
            // waits for the first, re-checks `locked_until`, and matches
            // nothing, then reads the row as the first left it.
            take_over_or_read: $crate::db::Statement {
                sql: concat!(
                    "WITH taken AS ( \
                         UPDATE ", $table, " SET locked_until = now() + $3::bigint * interval '1 millisecond', \
                                           updated_at = now() \
                          WHERE merchant_id = $1 AND id = $2 \
                            AND status IS NOT DISTINCT FROM 'pending' AND locked_until <= now() \
                          RETURNING ", $($columns)*, ") \
                     SELECT ", $($columns)*, ", true AS taken FROM taken \
                     UNION ALL \
                     SELECT ", $($columns)*, ", false AS taken FROM ", $table,
                    " WHERE merchant_id = $1 AND id = $2 AND NOT EXISTS (SELECT 1 FROM taken)"),
                params: &[Type::UUID, Type::UUID, Type::INT8],
            },
            abandoned: $crate::db::Statement {
                sql: concat!(
                    "SELECT merchant_id, id FROM ", $table,
                    " WHERE status = 'pending' AND locked_until <= now() \
                        AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
                      ORDER BY locked_until LIMIT $1"),
                params: &[Type::INT8],
            },
            claim: $crate::db::Statement {
                sql: concat!(
                    "UPDATE ", $table, " SET locked_until = now() + $3::bigint * interval '1 millisecond', \
                                      updated_at = now() \
                      WHERE merchant_id = $1 AND id = $2 \
                        AND status IS NOT DISTINCT FROM 'pending' AND locked_until <= now() \
                        AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
                      RETURNING ", $($columns)*),
                params: &[Type::UUID, Type::UUID, Type::INT8],
            },
            // Only our own lease (matched by its exact expiry) is ended.
            record_unknown: $crate::db::Statement {
                sql: concat!(
                    "UPDATE ", $table, " SET locked_until = now(), \
                                      processor_attempts = processor_attempts + 1, \
                                      next_attempt_at = now() + $4::bigint * interval '1 millisecond', \
                                      updated_at = now() \
                      WHERE merchant_id = $1 AND id = $2 \
                        AND status IS NOT DISTINCT FROM 'pending' AND locked_until = $3 \
                      RETURNING ", $($columns)*),
                params: &[Type::UUID, Type::UUID, Type::TIMESTAMPTZ, Type::INT8],
            },
            // Only a pending row changes: one whose outcome another request
            // recorded first (the processor gave it the same answer) returns
            // no row.
            record_outcome: $crate::db::Statement {
                sql: concat!(
                    "WITH updated AS ( \
                         UPDATE ", $table, " SET status = $3, failure_code = $4, \
                                           failure_message = $5, ", $processor_id, " = $6, \
                                           locked_until = NULL, updated_at = now() \
                          WHERE merchant_id = $1 AND id = $2 \
                            AND status IS NOT DISTINCT FROM 'pending' \
                          RETURNING ", $($columns)*, ")", $outcome_also,
                    " SELECT ", $($columns)*, " FROM updated"),
                params: &[Type::UUID, Type::UUID, Type::TEXT, Type::TEXT, Type::TEXT, Type::TEXT],
            },
            // The event of the state the row is in, if it is `$5` with at
            // least `$6` processor attempts: `<object>.<status>`, at most one
            // per row and type (the events' unique index), so a request that
            // lost the race to record the same state adds nothing. It reads
            // the row as this transaction's own change left it.
            record_event: $crate::db::Statement {
                sql: concat!(
                    "INSERT INTO events (id, merchant_id, ", $object, "_id, type, data) \
                     SELECT $3, merchant_id, id, '", $object, ".' || status, $4 FROM ", $table,
                    " WHERE merchant_id = $1 AND id = $2 AND status = $5 \
                        AND processor_attempts >= $6 \
                     ON CONFLICT (merchant_id, ", $object, "_id, type) \
                        WHERE ", $object, "_id IS NOT NULL DO NOTHING"),
                params: &[Type::UUID, Type::UUID, Type::UUID, Type::JSONB, Type::TEXT,
                          Type::INT4],
            },
            // The undo of an insert whose commit was never confirmed to its
            // request: only while nobody has worked on the row (no takeover,
            // no claim, no processor call).
            forget_unconfirmed: $crate::db::Statement {
                sql: concat!(
                    "WITH gone AS ( \
                         DELETE FROM ", $table,
                    "     WHERE merchant_id = $1 AND id = $2 \
                            AND status IS NOT DISTINCT FROM 'pending' \
                            AND processor_attempts = 0 AND updated_at = created_at \
                         RETURNING *) ", $forget_also),
                params: &[Type::UUID, Type::UUID],
            },
            expired_keys: $crate::db::Statement {
                sql: concat!(
                    "SELECT merchant_id, id FROM ", $table,
                    " WHERE client_idempotency_key IS NOT NULL AND id < $1 \
                        AND status <> 'pending' \
                      ORDER BY id LIMIT $2"),
                params: &[Type::UUID, Type::INT8],
            },
            release_key: $crate::db::Statement {
                sql: concat!(
                    "UPDATE ", $table, " SET client_idempotency_key = NULL \
                      WHERE merchant_id = $1 AND id = $2 AND id < $3 \
                        AND client_idempotency_key IS NOT NULL \
                        AND status IS DISTINCT FROM 'pending'"),
                params: &[Type::UUID, Type::UUID, Type::UUID],
            },
        }
    }};
}

pub(super) fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

pub async fn find<R: Stored>(
    conn: &Conn,
    merchant: MerchantId,
    id: Uuid,
) -> Result<Option<R>, DbError> {
    let row = conn
        .query_opt(&R::STATEMENTS.find, &[merchant.as_uuid(), &id])
        .await?;
    row.as_ref().map(decode).transpose()
}

pub async fn find_by_key<R: Stored>(
    conn: &Conn,
    merchant: MerchantId,
    key: &IdempotencyKey,
) -> Result<Option<R>, DbError> {
    let row = conn
        .query_opt(
            &R::STATEMENTS.find_by_key,
            &[merchant.as_uuid(), &key.as_str()],
        )
        .await?;
    row.as_ref().map(decode).transpose()
}

/// Newest first; `starting_after` continues after that record.
pub async fn list<R: Stored>(
    conn: &Conn,
    merchant: MerchantId,
    limit: i64,
    starting_after: Option<Uuid>,
) -> Result<Vec<R>, DbError> {
    let rows = conn
        .query(
            &R::STATEMENTS.list,
            &[merchant.as_uuid(), &limit, &cursor(starting_after)],
        )
        .await?;
    rows.iter().map(decode).collect()
}

/// The cursor of a listing: below every id when none is given (the
/// all-ones UUID).
pub(super) fn cursor(starting_after: Option<Uuid>) -> Uuid {
    starting_after.unwrap_or(Uuid::max())
}

/// Takes over the lease of a pending record whose lease has run out (its
/// owner died or got no answer), or else reads the record as it is: the
/// record, and whether the lease is now ours.
pub async fn take_over_or_read<R: Stored>(
    conn: &Conn,
    merchant: MerchantId,
    id: Uuid,
    lease: Duration,
) -> Result<Option<(R, bool)>, DbError> {
    let row = conn
        .query_opt(
            &R::STATEMENTS.take_over_or_read,
            &[merchant.as_uuid(), &id, &lease_ms(lease)],
        )
        .await?;
    row.map(|row| {
        let mut columns = Columns::new(&row);
        Ok((R::decode_from(&mut columns)?, columns.next("taken")?))
    })
    .transpose()
}

/// Claims up to `batch` pending records whose lease ran out and whose
/// backoff has passed, taking a fresh lease on each, for the recovery
/// worker. The candidates are read across merchants without locking; each
/// is then claimed by a statement that re-checks it under the row lock, so
/// instances claiming at once never both get a record: the second waits
/// for the first's lease and then finds it taken.
pub async fn claim_abandoned<R: Stored>(
    conn: &Conn,
    lease: Duration,
    batch: i64,
) -> Result<Vec<R>, DbError> {
    let candidates = conn.query(&R::STATEMENTS.abandoned, &[&batch]).await?;
    let candidates = merchants_and_ids(&candidates)?;
    let lease = lease_ms(lease);
    let claimed = per_row(conn, &candidates, |(merchant, id)| async move {
        conn.query_opt(&R::STATEMENTS.claim, &[merchant, id, &lease])
            .await
    })
    .await?;
    claimed.iter().flatten().map(decode).collect()
}

/// Records an unknown processor outcome: ends our lease early (so the
/// client's next retry asks the processor again at once), counts the
/// attempt and sets when the recovery worker may try (`retry_in` from now);
/// the first unknown outcome is a state change too, with one `.pending`
/// event. `None` if the lease is no longer ours.
pub async fn record_unknown<R: Stored>(
    conn: &Conn,
    record: &R,
    retry_in: Duration,
) -> Result<Option<R>, DbError> {
    let Some(our_lease) = record.lease().locked_until else {
        return Ok(None);
    };
    let merchant = record.merchant();
    let id = record.uuid();
    let event = crate::clock::new_v7();
    conn.prepare(&[
        &R::STATEMENTS.record_unknown,
        &R::STATEMENTS.record_event,
        &super::events::QUEUE,
    ])
    .await?;
    let retry_in = lease_ms(retry_in);
    conn.transaction(async {
        let params: [&(dyn ToSql + Sync); 4] = [merchant.as_uuid(), &id, &our_lease, &retry_in];
        let (row, (), ()) = futures_util::try_join!(
            conn.query_opt(&R::STATEMENTS.record_unknown, &params),
            add_event::<R>(
                conn,
                record,
                event,
                "pending",
                1,
                record.clone().into_event()
            ),
            super::events::queue(conn, merchant, event),
        )?;
        Ok(Decision::Commit(row.as_ref().map(decode).transpose()?))
    })
    .await
}

/// Records many outcomes (`db::batch`) in one transaction, so one commit:
/// for each record once, in id order, its update, its event and the event's
/// queue row, all sent together (pipelined). For each item, the record as
/// recorded, or `None` if it was no longer pending (an item whose record
/// appears earlier in `items` too finds it recorded by that one). Two
/// batches that share records lock them in the same order.
pub async fn record_outcomes<R: Stored>(
    conn: &Conn,
    items: &[(R, Outcome)],
) -> Result<Vec<Option<R>>, DbError> {
    let first_of_record = first_by_key(items, |(record, _)| (record.merchant(), record.uuid()));
    let sent: Vec<&(R, Outcome)> = first_of_record
        .values()
        .map(|&index| &items[index])
        .collect();
    // The update comes after the lock, the event reads the row the update
    // changed, and the queue row the event (`Conn::prepare` says why this
    // comes first).
    let mut statements = vec![
        &R::STATEMENTS.record_outcome,
        &R::STATEMENTS.record_event,
        &super::events::QUEUE,
    ];
    statements.extend(R::LOCK_FIRST);
    conn.prepare(&statements).await?;
    let recorded = conn
        .transaction(async {
            let each = sent.iter().map(|(record, outcome)| async move {
                let (processor_id, code, message) = outcome.columns();
                let merchant = record.merchant();
                let id = record.uuid();
                let status = outcome.status().as_str();
                let event = crate::clock::new_v7();
                let data = record.with_outcome(outcome).into_event();
                let params: [&(dyn ToSql + Sync); 6] = [
                    merchant.as_uuid(),
                    &id,
                    &status,
                    &code,
                    &message,
                    &processor_id,
                ];
                let ((), row, (), ()) = futures_util::try_join!(
                    lock_first::<R>(conn, merchant, id),
                    conn.query_opt(&R::STATEMENTS.record_outcome, &params),
                    add_event::<R>(conn, record, event, status, 0, data),
                    super::events::queue(conn, merchant, event),
                )?;
                row.as_ref().map(decode::<R>).transpose()
            });
            Ok(Decision::Commit(
                futures_util::future::try_join_all(each).await?,
            ))
        })
        .await?;
    let mut by_id: BTreeMap<Uuid, R> = recorded
        .into_iter()
        .flatten()
        .map(|record| (record.uuid(), record))
        .collect();
    // `remove`: a record named twice was recorded once, for the first.
    Ok(items
        .iter()
        .map(|(record, _)| by_id.remove(&record.uuid()))
        .collect())
}

/// Adds the event `<object>.<status>` (`event`, with `data`) of `record` if
/// the row is in `status` with at least `attempts` processor attempts, as
/// this transaction left it (`record_event`).
async fn add_event<R: Stored>(
    conn: &Conn,
    record: &R,
    event: Uuid,
    status: &str,
    attempts: i32,
    data: R,
) -> Result<(), DbError> {
    conn.execute(
        &R::STATEMENTS.record_event,
        &[
            record.merchant().as_uuid(),
            &record.uuid(),
            &event,
            &Json(data),
            &status,
            &attempts,
        ],
    )
    .await?;
    Ok(())
}

/// Runs the record's [`Stored::LOCK_FIRST`], if it has one.
async fn lock_first<R: Stored>(conn: &Conn, merchant: MerchantId, id: Uuid) -> Result<(), DbError> {
    if let Some(lock) = R::LOCK_FIRST {
        conn.execute(lock, &[merchant.as_uuid(), &id]).await?;
    }
    Ok(())
}

/// Deletes the record `id` if it is still exactly as its insert left it;
/// returns whether it did.
pub async fn forget_unconfirmed<R: Stored>(
    conn: &Conn,
    merchant: MerchantId,
    id: Uuid,
) -> Result<bool, DbError> {
    let params: [&(dyn ToSql + Sync); 2] = [merchant.as_uuid(), &id];
    let changed = match R::LOCK_FIRST {
        None => {
            conn.query(&R::STATEMENTS.forget_unconfirmed, &params)
                .await?
        }
        Some(lock) => {
            conn.prepare(&[lock, &R::STATEMENTS.forget_unconfirmed])
                .await?;
            conn.transaction(async {
                let (_, changed) = futures_util::try_join!(
                    conn.execute(lock, &params),
                    conn.query(&R::STATEMENTS.forget_unconfirmed, &params),
                )?;
                Ok(Decision::Commit(changed))
            })
            .await?
        }
    };
    Ok(!changed.is_empty())
}

/// Releases the idempotency keys of final records created before `cutoff`,
/// at most `batch` of them; returns how many. The records stay; pending
/// ones keep their key until they are final. Ids are time-ordered, so the
/// cutoff is an id bound and the candidates an index range.
pub async fn release_expired_keys<R: Stored>(
    conn: &Conn,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    let cutoff = uuid_v7_floor(cutoff);
    let candidates = conn
        .query(&R::STATEMENTS.expired_keys, &[&cutoff, &batch])
        .await?;
    let candidates = merchants_and_ids(&candidates)?;
    let released = per_row(conn, &candidates, |(merchant, id)| async move {
        conn.execute(&R::STATEMENTS.release_key, &[merchant, id, &cutoff])
            .await
    })
    .await?;
    Ok(released.iter().sum())
}

/// Runs `statement` for every item in one transaction (so one commit), the
/// statements sent together (pipelined) rather than one round trip each;
/// their answers in the items' order.
pub(super) async fn per_row<'a, T, O, F, Fut>(
    conn: &Conn,
    items: &'a [T],
    statement: F,
) -> Result<Vec<O>, DbError>
where
    F: Fn(&'a T) -> Fut,
    Fut: std::future::Future<Output = Result<O, DbError>>,
{
    match items {
        [] => Ok(Vec::new()),
        [item] => Ok(vec![statement(item).await?]),
        _ => {
            conn.transaction(async {
                let answers =
                    futures_util::future::try_join_all(items.iter().map(&statement)).await?;
                Ok(Decision::Commit(answers))
            })
            .await
        }
    }
}

/// The `merchant_id, id` of each row.
fn merchants_and_ids(rows: &[Row]) -> Result<Vec<(Uuid, Uuid)>, DbError> {
    rows.iter()
        .map(|row| Ok((column(row, "merchant_id")?, column(row, "id")?)))
        .collect()
}

/// The smallest UUIDv7 of the millisecond `at`: every id created before that
/// millisecond sorts below it.
pub(super) fn uuid_v7_floor(at: DateTime<Utc>) -> Uuid {
    let millis = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

/// The index of each key's first item, by key: a batch's distinct keys in
/// the order every batch locks them in.
pub(super) fn first_by_key<'a, T, K: Ord>(
    items: &'a [T],
    key: impl Fn(&'a T) -> K,
) -> BTreeMap<K, usize> {
    let mut first = BTreeMap::new();
    for (index, item) in items.iter().enumerate() {
        first.entry(key(item)).or_insert(index);
    }
    first
}

pub(super) fn decode<R: Stored>(row: &Row) -> Result<R, DbError> {
    R::decode_from(&mut Columns::new(row))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ChargeId;

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
