//! Statements on `charges` that are a charge's own: the insert under its
//! key, one request at a time or in batches (`db::batch`). What charges
//! share with refunds (finding, listing, leases, outcomes, recovery, key
//! release) is [`STATEMENTS`], run by `super::records`.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::types::{Json, Type};
use uuid::Uuid;

use super::codec::Columns;
use super::records::{self, first_by_key, lease_ms, RecordStatements, Stored};
use super::{Conn, DbError, Statement};
use crate::domain::lifecycle::Lease;
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

/// The statements a charge shares with a refund (`super::records`).
pub const STATEMENTS: RecordStatements = crate::record_statements! {
    table: "charges",
    object: "charge",
    columns: [charge_columns!()],
    processor_id: "processor_payment_id",
    outcome_also: "",
    forget_also: "SELECT 1 FROM gone",
};

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

/// Inserts many pending charges of one merchant (`$2`) at once
/// (`db::batch`), skipping each whose key is taken; returns the inserted
/// rows, each with its key, in no particular order. The keys arrive sorted
/// and distinct (see `insert_or_find_many`): every batch takes the unique
/// index's entries in one order, so two batches can never wait for each
/// other in a cycle. The holders of taken keys are read by the caller
/// (`INSERT_OR_FIND`, one per key): an INSERT alone, not inside a CTE with
/// that read, so that on Citus the merchant's worker alone carries it out.
///
/// Planned once per connection. `LIMIT cardinality($1)` takes nothing
/// away (the arrays are as long as each other); it tells the plan made
/// without the parameters that a batch is a row or two rather than
/// `unnest`'s guess of ten. Without it, that plan looked dearer than the
/// ones made for batches of a few rows, so PostgreSQL kept planning the
/// statement at every execution while batches stayed small (planning was
/// 0.35 ms of a 0.85 ms statement for a batch of six). With it, the plan
/// made once is used after PostgreSQL's five trial plans.
pub const INSERT_MANY: Statement = Statement {
    sql: concat!(
        "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                              amount, currency, customer, description, metadata, status, \
                              locked_until) \
         SELECT new_id, $2, new_key, new_fingerprint, new_amount, new_currency, new_customer, \
                new_description, new_metadata, 'pending', \
                now() + $10::bigint * interval '1 millisecond' \
           FROM (SELECT * FROM unnest($1::uuid[], $3::text[], $4::bytea[], $5::int8[], \
                                      $6::text[], $7::text[], $8::text[], $9::jsonb[]) \
                     WITH ORDINALITY AS input (new_id, new_key, new_fingerprint, new_amount, \
                                               new_currency, new_customer, new_description, \
                                               new_metadata, position) \
                  LIMIT cardinality($1::uuid[])) AS input \
          ORDER BY position \
         ON CONFLICT (merchant_id, client_idempotency_key) DO NOTHING \
         RETURNING ",
        charge_columns!(),
        ", client_idempotency_key"
    ),
    params: &[
        Type::UUID_ARRAY,
        Type::UUID,
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
    item: &PendingCharge,
    lease: Duration,
) -> Result<Option<(Charge, bool)>, DbError> {
    let request = &item.request;
    let metadata = Json(&request.metadata);
    for _ in 0..3 {
        let row = conn
            .query_opt(
                &INSERT_OR_FIND,
                &[
                    item.id.as_uuid(),
                    item.merchant.as_uuid(),
                    &item.key.as_str(),
                    &item.fingerprint.as_bytes().as_slice(),
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
            let charge = Charge::decode_from(&mut columns)?;
            return Ok(Some((charge, columns.next("created")?)));
        }
        if let Some(charge) = records::find_by_key(conn, item.merchant, &item.key).await? {
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

/// `insert_or_find` for many charges, an answer per item in order: one
/// statement (`INSERT_MANY`) per merchant among them (the batcher gives it
/// one). Items with the same merchant and key go to the database once: the
/// first is inserted (or finds the existing charge), the others get the
/// same charge as not created, as a concurrent duplicate would. An item
/// whose key was taken, and a merchant's only item, goes through
/// `insert_or_find`, all of them together (pipelined).
pub async fn insert_or_find_many(
    conn: &Conn,
    items: &[PendingCharge],
    lease: Duration,
) -> Result<Vec<Option<(Charge, bool)>>, DbError> {
    // Distinct keys, sorted: the order every batch takes the index in.
    let first_of_key = first_by_key(items, |item| (item.merchant, item.key.as_str()));
    let mut found: BTreeMap<(MerchantId, String), Option<(Charge, bool)>> = BTreeMap::new();
    for (merchant, indexes) in by_merchant(&first_of_key) {
        // A lone charge goes through `insert_or_find` below: one statement
        // whether its key is new or taken.
        if indexes.len() == 1 {
            continue;
        }
        let sent: Vec<&PendingCharge> = indexes.iter().map(|&index| &items[index]).collect();
        let ids: Vec<&Uuid> = sent.iter().map(|item| item.id.as_uuid()).collect();
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
                &INSERT_MANY,
                &[
                    &ids,
                    merchant.as_uuid(),
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
        for row in &rows {
            let mut columns = Columns::new(row);
            let charge = Charge::decode_from(&mut columns)?;
            let key: String = columns.next("client_idempotency_key")?;
            found.insert((merchant, key), Some((charge, true)));
        }
    }
    // The lone items and the keys that were taken, each inserted or read on
    // its own.
    let taken: Vec<&PendingCharge> = first_of_key
        .values()
        .map(|&index| &items[index])
        .filter(|item| !found.contains_key(&(item.merchant, item.key.as_str().to_owned())))
        .collect();
    let holders = futures_util::future::try_join_all(
        taken.iter().map(|item| insert_or_find(conn, item, lease)),
    )
    .await?;
    for (item, holder) in taken.iter().zip(holders) {
        found.insert((item.merchant, item.key.as_str().to_owned()), holder);
    }
    Ok(items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let first = first_of_key[&(item.merchant, item.key.as_str())];
            let answer = &found[&(item.merchant, item.key.as_str().to_owned())];
            // A later item with the same key is its duplicate: not created.
            answer
                .clone()
                .map(|(charge, created)| (charge, created && first == index))
        })
        .collect())
}

/// The indexes of `first_of_key` (by merchant, then key) grouped by
/// merchant, each group in key order.
fn by_merchant<K>(
    first_of_key: &BTreeMap<(MerchantId, K), usize>,
) -> Vec<(MerchantId, Vec<usize>)> {
    let mut groups: Vec<(MerchantId, Vec<usize>)> = Vec::new();
    for (&(merchant, _), &index) in first_of_key {
        match groups.last_mut() {
            Some((last, indexes)) if *last == merchant => indexes.push(index),
            _ => groups.push((merchant, vec![index])),
        }
    }
    groups
}

impl Stored for Charge {
    const STATEMENTS: &'static RecordStatements = &STATEMENTS;

    /// Every column decodes exactly (see `codec`) or the whole row is an
    /// error.
    fn decode_from(columns: &mut Columns<'_>) -> Result<Self, DbError> {
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
            lease: Lease {
                locked_until: columns.next("locked_until")?,
                processor_attempts: columns.next("processor_attempts")?,
            },
            refunds_reserved: columns.next("refunds_reserved")?,
            amount_refunded: columns.next("amount_refunded")?,
            processor_payment_id: columns.next("processor_payment_id")?,
            created_at: columns.next("created_at")?,
        })
    }

    fn with_outcome(&self, outcome: &Outcome) -> Self {
        Charge::with_outcome(self, outcome)
    }

    fn into_event(self) -> Self {
        self.into_created()
    }
}
