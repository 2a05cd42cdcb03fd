//! Statements on `charges` (and the outbox rows written with them). Each
//! function runs one statement, prepared once per connection; the SQL is a
//! constant, built once.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::types::{Json, Type};
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::Columns;
use super::{Conn, DbError, Statement};
use crate::domain::{
    Charge, ChargeId, Fingerprint, IdempotencyKey, MerchantId, NewCharge, Outcome,
};

/// The columns a `Charge` is decoded from, by name.
macro_rules! charge_columns {
    () => {
        "id, merchant_id, request_fingerprint, amount, currency, customer, description, \
         metadata, status, failure_code, failure_message, locked_until, processor_attempts, \
         refunds_reserved, amount_refunded, processor_payment_id, created_at"
    };
}

/// Inserts a pending charge with a lease, or (no row inserted: the key is
/// taken) reads the charge that holds the key, in one round trip. `created`
/// says which.
pub const INSERT_OR_FIND: Statement = Statement {
    sql: concat!(
        "WITH inserted AS ( \
             INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, customer, description, metadata, status, \
                                  locked_until) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', \
                     now() + $10::bigint * interval '1 millisecond') \
             ON CONFLICT (merchant_id, client_idempotency_key) DO NOTHING \
             RETURNING ",
        charge_columns!(),
        ") SELECT ",
        charge_columns!(),
        ", true AS created FROM inserted \
         UNION ALL \
         SELECT ",
        charge_columns!(),
        ", false AS created FROM charges \
          WHERE merchant_id = $2 AND client_idempotency_key = $3 \
            AND NOT EXISTS (SELECT 1 FROM inserted)"
    ),
    params: &[
        Type::UUID,
        Type::UUID,
        Type::TEXT,
        Type::BYTEA,
        Type::INT8,
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::JSONB,
        Type::INT8,
    ],
};

/// `INSERT_OR_FIND` for many charges at once (`db::batch`): the pending
/// charges are inserted in one statement, and for each key that was taken
/// the charge that holds it is read in the same one. Rows come back in no
/// particular order, each with its key, so the caller matches them to its
/// items. The keys arrive sorted and distinct (see `insert_or_find_many`):
/// every batch takes the unique index's entries in one order, so two
/// batches can never wait for each other in a cycle. The taken keys are
/// read one probe per item (`LATERAL … OFFSET 0` keeps the planner from
/// turning the probes into a join it might run as a scan): the unique
/// index is the only plan, with or without table statistics.
///
/// Planned once per connection. `LIMIT cardinality($1)` takes nothing
/// away (the arrays are as long as each other); it tells the plan made
/// without the parameters that a batch is a row or two rather than
/// `unnest`'s guess of ten. Without it, that plan looked dearer than the
/// ones made for batches of a few rows, so PostgreSQL kept planning the
/// statement at every execution while batches stayed small (0.35 ms of a
/// 0.85 ms statement for a batch of six; BENCHMARKS.md, round 10). With
/// it, the plan made once is used after PostgreSQL's five trial plans.
pub const INSERT_OR_FIND_MANY: Statement = Statement {
    sql: concat!(
        "WITH input AS ( \
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::bytea[], $5::int8[], \
                                  $6::text[], $7::text[], $8::text[], $9::jsonb[]) \
                 WITH ORDINALITY AS input (new_id, new_merchant_id, new_key, new_fingerprint, \
                                           new_amount, new_currency, new_customer, \
                                           new_description, new_metadata, position) \
              LIMIT cardinality($1::uuid[]) \
         ), inserted AS ( \
             INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, customer, description, metadata, status, \
                                  locked_until) \
             SELECT new_id, new_merchant_id, new_key, new_fingerprint, new_amount, new_currency, \
                    new_customer, new_description, new_metadata, 'pending', \
                    now() + $10::bigint * interval '1 millisecond' \
               FROM input ORDER BY position \
             ON CONFLICT (merchant_id, client_idempotency_key) DO NOTHING \
             RETURNING ",
        charge_columns!(),
        ", client_idempotency_key) SELECT ",
        charge_columns!(),
        ", client_idempotency_key, true AS created FROM inserted \
         UNION ALL \
         SELECT ",
        charge_columns!(),
        ", client_idempotency_key, false AS created \
           FROM input, LATERAL (SELECT * FROM charges \
                                 WHERE merchant_id = new_merchant_id \
                                   AND client_idempotency_key = new_key \
                                OFFSET 0) AS existing"
    ),
    params: &[
        Type::UUID_ARRAY,
        Type::UUID_ARRAY,
        Type::TEXT_ARRAY,
        Type::BYTEA_ARRAY,
        Type::INT8_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::JSONB_ARRAY,
        Type::INT8,
    ],
};

pub const FIND_BY_KEY: Statement = Statement {
    sql: concat!(
        "SELECT ",
        charge_columns!(),
        " FROM charges WHERE merchant_id = $1 AND client_idempotency_key = $2"
    ),
    params: &[Type::UUID, Type::TEXT],
};

pub const FIND: Statement = Statement {
    sql: concat!(
        "SELECT ",
        charge_columns!(),
        " FROM charges WHERE merchant_id = $1 AND id = $2"
    ),
    params: &[Type::UUID, Type::UUID],
};

/// Newest first, after the cursor `$3`. `status IS NOT NULL` is always true:
/// it is the predicate of the partial index `charges_listing`, stated so that
/// this statement, and no other, can use that index (migration V3).
pub const LIST: Statement = Statement {
    sql: concat!(
        "SELECT ",
        charge_columns!(),
        " FROM charges WHERE merchant_id = $1 AND id < $3 AND status IS NOT NULL \
          ORDER BY id DESC LIMIT $2"
    ),
    params: &[Type::UUID, Type::INT8, Type::UUID],
};

pub const TAKE_OVER_OR_READ: Statement = Statement {
    sql: concat!(
        "WITH taken AS ( \
             UPDATE charges SET locked_until = now() + $2::bigint * interval '1 millisecond', \
                                updated_at = now() \
              WHERE id = $1 AND merchant_id = $3 \
                AND status IS NOT DISTINCT FROM 'pending' AND locked_until <= now() \
              RETURNING ",
        charge_columns!(),
        ") SELECT ",
        charge_columns!(),
        ", true AS taken FROM taken \
         UNION ALL \
         SELECT ",
        charge_columns!(),
        ", false AS taken FROM charges \
          WHERE id = $1 AND merchant_id = $3 AND NOT EXISTS (SELECT 1 FROM taken)"
    ),
    params: &[Type::UUID, Type::INT8, Type::UUID],
};

/// Pending charges whose lease ran out and whose backoff has passed.
pub const CLAIM_ABANDONED: Statement = Statement {
    sql: concat!(
        "UPDATE charges SET locked_until = now() + $1::bigint * interval '1 millisecond', \
                            updated_at = now() \
          WHERE id IN (SELECT id FROM charges \
                        WHERE status = 'pending' AND locked_until <= now() \
                          AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
                        ORDER BY locked_until LIMIT $2 FOR UPDATE SKIP LOCKED) \
            AND status = 'pending' AND locked_until <= now() \
            AND (next_attempt_at IS NULL OR next_attempt_at <= now()) \
          RETURNING ",
        charge_columns!()
    ),
    params: &[Type::INT8, Type::INT8],
};

/// After an unknown outcome: count the attempt, end our lease (matched by
/// its exact expiry) and tell the recovery worker when to try again. The
/// first unknown outcome of a charge is a state change too: the outbox gets
/// one `charge.pending` event.
pub const RECORD_UNKNOWN: Statement = Statement {
    sql: concat!(
        "WITH updated AS ( \
             UPDATE charges SET locked_until = now(), \
                                processor_attempts = processor_attempts + 1, \
                                next_attempt_at = now() + $3::bigint * interval '1 millisecond', \
                                updated_at = now() \
              WHERE id = $1 AND merchant_id = $6 \
                AND status IS NOT DISTINCT FROM 'pending' AND locked_until = $2 \
              RETURNING ",
        charge_columns!(),
        "), event AS ( \
             INSERT INTO events (id, merchant_id, charge_id, type, data) \
             SELECT $4, merchant_id, id, 'charge.pending', $5 FROM updated \
              WHERE processor_attempts = 1 \
             ON CONFLICT (merchant_id, charge_id, type) WHERE charge_id IS NOT NULL DO NOTHING) \
         SELECT ",
        charge_columns!(),
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

/// Deletes a pending charge nobody has worked on since it was inserted (no
/// takeover, no claim, no processor call): the undo of an insert whose
/// commit was never confirmed to its request.
pub const FORGET_UNCONFIRMED: Statement = Statement {
    sql: "DELETE FROM charges \
           WHERE merchant_id = $1 AND id = $2 AND status IS NOT DISTINCT FROM 'pending' \
             AND processor_attempts = 0 AND updated_at = created_at",
    params: &[Type::UUID, Type::UUID],
};

/// Records a final outcome and its outbox event in one statement. Only a
/// pending charge changes: one whose outcome another request recorded first
/// (the processor gave it the same answer) returns no row. "Pending" is
/// spelled `IS NOT DISTINCT FROM` (the same, as the column is NOT NULL) so
/// that no partial index on the status can serve the statement: without
/// statistics the planner rates a whole read of the listing index or of the
/// pending leases as good as the primary key, and a generic plan cached
/// while the table is small is kept as it grows (`tests/api/plans.rs`).
pub const RECORD_OUTCOME: Statement = Statement {
    sql: concat!(
        "WITH updated AS ( \
             UPDATE charges SET status = $2, failure_code = $3, failure_message = $4, \
                                processor_payment_id = $5, locked_until = NULL, \
                                updated_at = now() \
              WHERE id = $1 AND merchant_id = $8 AND status IS NOT DISTINCT FROM 'pending' \
              RETURNING ",
        charge_columns!(),
        "), event AS ( \
             INSERT INTO events (id, merchant_id, charge_id, type, data) \
             SELECT $6, merchant_id, id, 'charge.' || status, $7 FROM updated) \
         SELECT ",
        charge_columns!(),
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

/// `RECORD_OUTCOME` for many charges in one statement (`db::batch`): the
/// pending ones among them take their outcomes and their events in one
/// round trip and one commit. Rows come back in no particular order; the
/// caller matches them by id.
///
/// Planned once per connection, so its plan must not depend on the
/// table's size (`tests/api/plans.rs`). An `UPDATE … FROM` the input
/// joined by id has no such plan: made while the table was small, it read
/// the table whole, and kept doing so on every batch as the table grew.
/// So the rows are found one probe per item, as `INSERT_OR_FIND_MANY`
/// finds taken keys (`LATERAL … OFFSET 0` on the primary key), and locked
/// there, in the items' order (by id: two batches that share charges lock
/// them in one order). The update then takes each locked row by its
/// physical address (`ctid`), which nobody else can change while the lock
/// is held: a TID scan, one row per item. `LIMIT cardinality($1)` takes
/// nothing away; it tells the plan made without parameters that a batch
/// is a row or two, for which these probes are the cheapest plan even on
/// a new, empty table. Before, the statement was parsed and planned for
/// every batch (0.5 ms of a 1.6 ms statement for a batch of six;
/// BENCHMARKS.md, round 10).
pub const RECORD_OUTCOMES: Statement = Statement {
    sql: concat!(
        "WITH input AS ( \
             SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], \
                                  $6::text[], $7::uuid[], $8::jsonb[]) \
                 AS input (charge_id, charge_merchant_id, new_status, new_failure_code, \
                           new_failure_message, new_payment_id, event_id, event_data) \
              LIMIT cardinality($1::uuid[]) \
         ), pending AS MATERIALIZED ( \
             SELECT input.*, locked.row_address \
               FROM input, LATERAL (SELECT ctid AS row_address FROM charges \
                                     WHERE id = charge_id AND merchant_id = charge_merchant_id \
                                       AND status IS NOT DISTINCT FROM 'pending' \
                                    OFFSET 0 FOR UPDATE) AS locked \
         ), updated AS ( \
             UPDATE charges SET status = new_status, failure_code = new_failure_code, \
                                failure_message = new_failure_message, \
                                processor_payment_id = new_payment_id, locked_until = NULL, \
                                updated_at = now() \
               FROM pending \
              WHERE charges.ctid = pending.row_address \
                AND charges.merchant_id = pending.charge_merchant_id \
              RETURNING ",
        charge_columns!(),
        ", event_id, event_data), event AS ( \
             INSERT INTO events (id, merchant_id, charge_id, type, data) \
             SELECT event_id, merchant_id, id, 'charge.' || status, event_data FROM updated) \
         SELECT ",
        charge_columns!(),
        " FROM updated"
    ),
    params: &[
        Type::UUID_ARRAY,
        Type::UUID_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::UUID_ARRAY,
        Type::JSONB_ARRAY,
    ],
};

pub const RELEASE_EXPIRED_KEYS: Statement = Statement {
    sql: "UPDATE charges SET client_idempotency_key = NULL \
           WHERE id IN (SELECT id FROM charges \
                         WHERE client_idempotency_key IS NOT NULL AND id < $1 \
                           AND status <> 'pending' \
                         ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)",
    params: &[Type::UUID, Type::INT8],
};

pub(super) fn lease_ms(lease: Duration) -> i64 {
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
    conn: &Conn,
    id: ChargeId,
    merchant: MerchantId,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    request: &NewCharge,
    lease: Duration,
) -> Result<Option<(Charge, bool)>, DbError> {
    let metadata = Json(&request.metadata);
    for _ in 0..3 {
        let row = conn
            .query_opt(
                &INSERT_OR_FIND,
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
            let mut columns = Columns::new(&row);
            let charge = decode_from(&mut columns)?;
            return Ok(Some((charge, columns.next("created")?)));
        }
        if let Some(charge) = find_by_key(conn, merchant, key).await? {
            return Ok(Some((charge, false)));
        }
    }
    Ok(None)
}

/// A charge to insert as pending, for `insert_or_find_many`.
#[derive(Debug, Clone)]
pub struct PendingCharge {
    pub id: ChargeId,
    pub merchant: MerchantId,
    pub key: IdempotencyKey,
    pub fingerprint: Fingerprint,
    pub request: NewCharge,
}

/// `insert_or_find` for many charges in one statement (`INSERT_OR_FIND_MANY`),
/// an answer per item in order. Items with the same merchant and key go to
/// the database once: the first is inserted (or finds the existing charge),
/// the others get the same charge as not created, as a concurrent duplicate
/// would. An item whose key was taken by a charge committed after the
/// statement began (so the statement cannot see it) goes on alone, through
/// `insert_or_find`, which reads again.
pub async fn insert_or_find_many(
    conn: &Conn,
    items: &[PendingCharge],
    lease: Duration,
) -> Result<Vec<Option<(Charge, bool)>>, DbError> {
    // Distinct keys, sorted: the order every batch takes the index in.
    let first_of_key = first_by_key(items, |item| (item.merchant, item.key.as_str()));
    let sent: Vec<&PendingCharge> = first_of_key.values().map(|&index| &items[index]).collect();
    let ids: Vec<&Uuid> = sent.iter().map(|item| item.id.as_uuid()).collect();
    let merchants: Vec<&Uuid> = sent.iter().map(|item| item.merchant.as_uuid()).collect();
    let keys: Vec<&str> = sent.iter().map(|item| item.key.as_str()).collect();
    let fingerprints: Vec<&[u8]> = sent
        .iter()
        .map(|item| item.fingerprint.as_bytes().as_slice())
        .collect();
    let amounts: Vec<i64> = sent
        .iter()
        .map(|item| item.request.amount.minor_units())
        .collect();
    let currencies: Vec<&str> = sent
        .iter()
        .map(|item| item.request.currency.as_str())
        .collect();
    let customers: Vec<Option<&str>> = sent
        .iter()
        .map(|item| item.request.customer.as_deref())
        .collect();
    let descriptions: Vec<Option<&str>> = sent
        .iter()
        .map(|item| item.request.description.as_deref())
        .collect();
    let metadata: Vec<Json<&BTreeMap<String, String>>> = sent
        .iter()
        .map(|item| Json(&item.request.metadata))
        .collect();
    let rows = conn
        .query(
            &INSERT_OR_FIND_MANY,
            &[
                &ids,
                &merchants,
                &keys,
                &fingerprints,
                &amounts,
                &currencies,
                &customers,
                &descriptions,
                &metadata,
                &lease_ms(lease),
            ],
        )
        .await?;
    let mut found: BTreeMap<(MerchantId, String), (Charge, bool)> = BTreeMap::new();
    for row in &rows {
        let mut columns = Columns::new(row);
        let charge = decode_from(&mut columns)?;
        let key: String = columns.next("client_idempotency_key")?;
        found.insert(
            (charge.merchant_id, key),
            (charge, columns.next("created")?),
        );
    }
    let mut answers: Vec<Option<(Charge, bool)>> = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let first = first_of_key[&(item.merchant, item.key.as_str())];
        let answer = match found.get(&(item.merchant, item.key.as_str().to_owned())) {
            Some((charge, created)) => Some((charge.clone(), *created && first == index)),
            None if first == index => {
                insert_or_find(
                    conn,
                    item.id,
                    item.merchant,
                    &item.key,
                    &item.fingerprint,
                    &item.request,
                    lease,
                )
                .await?
            }
            // The first of this key went alone (above, earlier in order);
            // this one is its duplicate.
            None => answers[first].clone().map(|(charge, _)| (charge, false)),
        };
        answers.push(answer);
    }
    Ok(answers)
}

pub async fn find_by_key(
    conn: &Conn,
    merchant: MerchantId,
    key: &IdempotencyKey,
) -> Result<Option<Charge>, DbError> {
    let row = conn
        .query_opt(&FIND_BY_KEY, &[merchant.as_uuid(), &key.as_str()])
        .await?;
    row.as_ref().map(decode).transpose()
}

pub async fn find(
    conn: &Conn,
    merchant: MerchantId,
    id: ChargeId,
) -> Result<Option<Charge>, DbError> {
    let row = conn
        .query_opt(&FIND, &[merchant.as_uuid(), id.as_uuid()])
        .await?;
    row.as_ref().map(decode).transpose()
}

/// Newest first; `starting_after` continues after that charge.
pub async fn list(
    conn: &Conn,
    merchant: MerchantId,
    limit: i64,
    starting_after: Option<ChargeId>,
) -> Result<Vec<Charge>, DbError> {
    // No cursor: start above every id (the all-ones UUID).
    let cursor = starting_after.map_or(Uuid::max(), |id| *id.as_uuid());
    let rows = conn
        .query(&LIST, &[merchant.as_uuid(), &limit, &cursor])
        .await?;
    rows.iter().map(decode).collect()
}

/// Takes over the lease of a pending charge whose lease has run out (its
/// owner died or got no answer), or else reads the charge as it is. Row
/// locking makes the takeover a single winner: a second taker waits for the
/// first, re-checks `locked_until`, and matches nothing. Returns the charge and
/// whether the lease is now ours.
pub async fn take_over_or_read(
    conn: &Conn,
    merchant: MerchantId,
    id: ChargeId,
    lease: Duration,
) -> Result<Option<(Charge, bool)>, DbError> {
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

/// Claims up to `batch` pending charges whose lease ran out, taking a fresh
/// lease on each, for the recovery worker. SKIP LOCKED lets several instances
/// claim at once without waiting on, or claiming, each other's rows; the
/// outer condition repeats the test so a row finished meanwhile is skipped.
pub async fn claim_abandoned(
    conn: &Conn,
    lease: Duration,
    batch: i64,
) -> Result<Vec<Charge>, DbError> {
    let rows = conn
        .query(&CLAIM_ABANDONED, &[&lease_ms(lease), &batch])
        .await?;
    rows.iter().map(decode).collect()
}

/// Records an unknown processor outcome: ends our lease early, so the
/// client's next retry can ask the processor again at once, and sets when
/// the recovery worker may try (`retry_in` from now). Only our own lease
/// (matched by its exact expiry) is touched, never one another request took
/// over since.
pub async fn record_unknown(
    conn: &Conn,
    charge: &Charge,
    our_lease: DateTime<Utc>,
    retry_in: Duration,
) -> Result<Option<Charge>, DbError> {
    let row = conn
        .query_opt(
            &RECORD_UNKNOWN,
            &[
                charge.id.as_uuid(),
                &our_lease,
                &lease_ms(retry_in),
                &Uuid::now_v7(),
                &Json(charge),
                charge.merchant_id.as_uuid(),
            ],
        )
        .await?;
    row.as_ref().map(decode).transpose()
}

/// Deletes the charge `id` if it is still exactly as its insert left it;
/// returns whether it did. See `FORGET_UNCONFIRMED`.
pub async fn forget_unconfirmed(
    conn: &Conn,
    merchant: MerchantId,
    id: ChargeId,
) -> Result<bool, DbError> {
    let deleted = conn
        .execute(&FORGET_UNCONFIRMED, &[merchant.as_uuid(), id.as_uuid()])
        .await?;
    Ok(deleted > 0)
}

/// Records outcomes and their events: one alone with `RECORD_OUTCOME`,
/// several with `RECORD_OUTCOMES`, one statement either way (so one round
/// trip and one commit). For each item, the charge as recorded, or `None`
/// if it was not pending any more (an item whose charge appears earlier in
/// `items` too finds it recorded by that one).
///
/// A charge that another transaction changed and committed while the
/// statement waited for its lock (a takeover once the lease ran out) is a
/// version the statement cannot see, so it cannot update it. Such an item,
/// like any the statement did not record, goes on alone, through
/// `RECORD_OUTCOME`, which sees the charge as it is now.
pub async fn record_outcomes(
    conn: &Conn,
    items: &[(Charge, Outcome)],
) -> Result<Vec<Option<Charge>>, DbError> {
    if let [(charge, outcome)] = items {
        return Ok(vec![record_outcome(conn, charge, outcome).await?]);
    }
    // Each charge once, with its first outcome, in id order as every
    // batch: two batches that share charges lock them in one order.
    let sent: Vec<&(Charge, Outcome)> = first_by_key(items, |(charge, _)| charge.id)
        .into_values()
        .map(|index| &items[index])
        .collect();
    let mut ids = Vec::with_capacity(sent.len());
    let mut merchants = Vec::with_capacity(sent.len());
    let mut statuses = Vec::with_capacity(sent.len());
    let mut codes = Vec::with_capacity(sent.len());
    let mut messages = Vec::with_capacity(sent.len());
    let mut payment_ids = Vec::with_capacity(sent.len());
    let mut event_ids = Vec::with_capacity(sent.len());
    let mut events = Vec::with_capacity(sent.len());
    for (charge, outcome) in &sent {
        let (payment_id, code, message) = outcome.columns();
        ids.push(*charge.id.as_uuid());
        merchants.push(*charge.merchant_id.as_uuid());
        statuses.push(outcome.status().as_str());
        codes.push(code);
        messages.push(message);
        payment_ids.push(payment_id);
        event_ids.push(Uuid::now_v7());
        events.push(Json(charge.with_outcome(outcome).into_created()));
    }
    let rows = conn
        .query(
            &RECORD_OUTCOMES,
            &[
                &ids,
                &merchants,
                &statuses,
                &codes,
                &messages,
                &payment_ids,
                &event_ids,
                &events,
            ],
        )
        .await?;
    let mut recorded: BTreeMap<ChargeId, Charge> = BTreeMap::new();
    for row in &rows {
        let charge = decode(row)?;
        recorded.insert(charge.id, charge);
    }
    for (charge, outcome) in sent {
        if !recorded.contains_key(&charge.id) {
            if let Some(alone) = record_outcome(conn, charge, outcome).await? {
                recorded.insert(alone.id, alone);
            }
        }
    }
    // `remove`: a charge named twice was recorded once, for the first.
    Ok(items
        .iter()
        .map(|(charge, _)| recorded.remove(&charge.id))
        .collect())
}

/// The index of each key's first item, by key: a batch's distinct keys in
/// the order every batch locks them in.
fn first_by_key<'a, T, K: Ord>(items: &'a [T], key: impl Fn(&'a T) -> K) -> BTreeMap<K, usize> {
    let mut first = BTreeMap::new();
    for (index, item) in items.iter().enumerate() {
        first.entry(key(item)).or_insert(index);
    }
    first
}

async fn record_outcome(
    conn: &Conn,
    charge: &Charge,
    outcome: &Outcome,
) -> Result<Option<Charge>, DbError> {
    let (payment_id, code, message) = outcome.columns();
    let row = conn
        .query_opt(
            &RECORD_OUTCOME,
            &[
                charge.id.as_uuid(),
                &outcome.status().as_str(),
                &code,
                &message,
                &payment_id,
                &Uuid::now_v7(),
                &Json(charge.with_outcome(outcome).into_created()),
                charge.merchant_id.as_uuid(),
            ],
        )
        .await?;
    row.as_ref().map(decode).transpose()
}

/// Releases the idempotency keys of final charges created before `cutoff`,
/// at most `batch` of them; returns how many. The charges stay. Pending
/// charges keep their key until they are final. Ids are time-ordered, so the
/// cutoff is an id bound and the scan is an index range.
pub async fn release_expired_keys(
    conn: &Conn,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, DbError> {
    conn.execute(&RELEASE_EXPIRED_KEYS, &[&uuid_v7_floor(cutoff), &batch])
        .await
}

/// The smallest UUIDv7 of the millisecond `at`: every id created before that
/// millisecond sorts below it.
pub(super) fn uuid_v7_floor(at: DateTime<Utc>) -> Uuid {
    let millis = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

/// A charge from a row of `charge_columns!()`, each column checked by its
/// name. Every column decodes exactly (see `codec`) or the whole row is an
/// error.
fn decode(row: &Row) -> Result<Charge, DbError> {
    decode_from(&mut Columns::new(row))
}

/// A charge from `charge_columns!()`, read in that order; the columns a
/// statement selects after them can be read from `columns` next.
fn decode_from(columns: &mut Columns<'_>) -> Result<Charge, DbError> {
    let id = ChargeId::from_uuid(columns.next("id")?);
    let merchant_id = MerchantId::from_uuid(columns.next("merchant_id")?);
    let fingerprint = columns.next("request_fingerprint")?;
    let amount = columns.next("amount")?;
    let currency = columns.next("currency")?;
    let customer = columns.next("customer")?;
    let description = columns.next("description")?;
    let Json(metadata): Json<BTreeMap<String, String>> = columns.next("metadata")?;
    Ok(Charge {
        id,
        merchant_id,
        fingerprint,
        amount,
        currency,
        customer,
        description,
        metadata,
        status: columns.next("status")?,
        failure_code: columns.next("failure_code")?,
        failure_message: columns.next("failure_message")?,
        locked_until: columns.next("locked_until")?,
        processor_attempts: columns.next("processor_attempts")?,
        refunds_reserved: columns.next("refunds_reserved")?,
        amount_refunded: columns.next("amount_refunded")?,
        processor_payment_id: columns.next("processor_payment_id")?,
        created_at: columns.next("created_at")?,
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
