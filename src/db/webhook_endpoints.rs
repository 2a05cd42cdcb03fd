//! Statements on `webhook_endpoints`. An endpoint row is also the
//! idempotency record of its creation, like a charge: the key and the
//! request fingerprint live on it, in the endpoints' own key space per
//! merchant (`webhook_endpoints_merchant_key_unique`). Keys are kept for as
//! long as the row; endpoints are few and never purged.
//!
//! A merchant has at most `webhooks.max_endpoints_per_merchant` live
//! endpoints: each live one holds a slot, and a unique index on the slots
//! (migration V9) refuses a second endpoint in one. The circuit
//! breaker's state is kept on the endpoint too (`FAILED`, `RECOVERED`,
//! `DISABLE`), changed by one statement per attempt outcome.

use std::time::Duration;

use tokio_postgres::types::{Json, ToSql, Type};
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::column;
use super::records::lease_ms;
use super::{Conn, DbError, Statement};
use crate::domain::{
    EventType, Fingerprint, IdempotencyKey, MerchantId, NewWebhookEndpoint, WebhookEndpoint,
    WebhookEndpointId, WebhookSecret,
};

/// The columns a `WebhookEndpoint` is decoded from, by name.
macro_rules! endpoint_columns {
    () => {
        "id, merchant_id, url, event_types, secret, request_fingerprint, created_at, deleted_at, \
         disabled_at"
    };
}

/// Inserts the endpoint, in a free slot among `1..=$8` chosen at random,
/// unless the merchant already used the key. No row: the key is taken
/// (`FIND_BY_KEY` reads its holder), or no slot was free (the merchant is at
/// its cap), or another creation took the chosen slot at the same moment
/// (see `insert_or_find`). An INSERT alone, not inside a CTE with the read
/// of the key's holder, so that on Citus the merchant's worker alone carries
/// it out.
///
/// The unique indexes decide between concurrent requests: with one key, the
/// second waits for the first's commit, then conflicts; with one slot
/// (`webhook_endpoints_one_per_slot`), likewise. `ON CONFLICT DO NOTHING`
/// names no index so that it covers both. A random free slot makes
/// concurrent creations of one merchant rarely pick the same one.
pub const INSERT: Statement = Statement {
    sql: concat!(
        "INSERT INTO webhook_endpoints (id, merchant_id, url, event_types, secret, \
                                        client_idempotency_key, request_fingerprint, slot) \
         SELECT $1, $2, $3, $4, $5, $6, $7, s FROM generate_series(1, $8::int) s \
          WHERE NOT EXISTS (SELECT 1 FROM webhook_endpoints w \
                             WHERE w.merchant_id = $2 AND w.slot = s) \
          ORDER BY random() LIMIT 1 \
         ON CONFLICT DO NOTHING \
         RETURNING ",
        endpoint_columns!()
    ),
    params: &[
        Type::UUID,
        Type::UUID,
        Type::TEXT,
        Type::TEXT_ARRAY,
        Type::TEXT,
        Type::TEXT,
        Type::BYTEA,
        Type::INT4,
    ],
};

/// How many of the merchant `$1`'s slots `1..=$2` live endpoints hold.
pub const SLOTS_TAKEN: Statement = Statement {
    sql: "SELECT count(*) AS taken FROM webhook_endpoints \
           WHERE merchant_id = $1 AND slot <= $2",
    params: &[Type::UUID, Type::INT4],
};

pub const FIND_BY_KEY: Statement = Statement {
    sql: concat!(
        "SELECT ",
        endpoint_columns!(),
        " FROM webhook_endpoints WHERE merchant_id = $1 AND client_idempotency_key = $2"
    ),
    params: &[Type::UUID, Type::TEXT],
};

/// Live endpoints (disabled ones included), newest first, after the cursor
/// `$3`. `deleted_at IS
/// NULL` is the predicate of the partial index `webhook_endpoints_of_merchant`.
pub const LIST: Statement = Statement {
    sql: concat!(
        "SELECT ",
        endpoint_columns!(),
        " FROM webhook_endpoints \
          WHERE merchant_id = $1 AND deleted_at IS NULL AND id < $3 \
          ORDER BY id DESC LIMIT $2"
    ),
    params: &[Type::UUID, Type::INT8, Type::UUID],
};

/// Soft delete: the row stays (its deliveries refer to it) and gives up its
/// slot, which is free for a new endpoint from then on. The
/// fan-out skips a deleted endpoint from then on, and the dispatcher fails
/// its pending deliveries when they come due instead of sending them. Only
/// a live endpoint matches, so deleting twice finds nothing the second
/// time.
pub const DELETE: Statement = Statement {
    sql: concat!(
        "UPDATE webhook_endpoints SET deleted_at = now(), slot = NULL \
          WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL \
          RETURNING ",
        endpoint_columns!()
    ),
    params: &[Type::UUID, Type::UUID],
};

/// The circuit breaker, after a failed attempt at the merchant `$1`'s
/// endpoint `$2`: one more failure in a row, failing since the first of
/// them, and from the `$3`th on no delivery to it is attempted for `$4` ms
/// (`retry_at`; the claim holds its deliveries back until then). Returns
/// the endpoint, its failures in a row, and whether it has been failing
/// for `$5` ms or longer (then `DISABLE` follows). Only a live, enabled
/// endpoint counts. (The CASE, the `coalesce` and RETURNING take their
/// times from `clock`: Citus refuses a function that is not immutable in
/// them.)
pub const FAILED: Statement = Statement {
    sql: concat!(
        "UPDATE webhook_endpoints \
            SET consecutive_failures = consecutive_failures + 1, \
                failing_since = coalesce(failing_since, clock.now), \
                retry_at = CASE WHEN consecutive_failures + 1 >= $3 \
                                THEN clock.pause_ends ELSE retry_at END \
           FROM (SELECT now() AS now, \
                        now() + $4::bigint * interval '1 millisecond' AS pause_ends, \
                        now() - $5::bigint * interval '1 millisecond' AS too_long_since) clock \
          WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL AND disabled_at IS NULL \
          RETURNING ",
        endpoint_columns!(),
        ", consecutive_failures, \
         failing_since <= clock.too_long_since AS failing_too_long"
    ),
    params: &[Type::UUID, Type::UUID, Type::INT4, Type::INT8, Type::INT8],
};

/// The circuit breaker, after a delivered attempt at the merchant `$1`'s
/// endpoint `$2`: its run of failures is over. Writes only an endpoint that
/// had one.
pub const RECOVERED: Statement = Statement {
    sql: "UPDATE webhook_endpoints \
             SET consecutive_failures = 0, failing_since = NULL, retry_at = NULL \
           WHERE merchant_id = $1 AND id = $2 AND consecutive_failures > 0",
    params: &[Type::UUID, Type::UUID],
};

/// Disables the merchant `$1`'s endpoint `$2` if it is live and has been
/// failing for `$3` ms. No delivery goes to a disabled endpoint; its
/// pending ones are given up when they come due.
pub const DISABLE: Statement = Statement {
    sql: "UPDATE webhook_endpoints SET disabled_at = now(), retry_at = NULL \
           WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL \
             AND disabled_at IS NULL \
             AND failing_since <= now() - $3::bigint * interval '1 millisecond' \
          RETURNING id",
    params: &[Type::UUID, Type::UUID, Type::INT8],
};

/// The `webhook_endpoint.disabled` event (`$3`, data `$4`) of the merchant
/// `$1`'s endpoint `$2` if it is disabled, as this transaction left it: at
/// most one such event per endpoint (`events_one_per_endpoint_change`).
pub const DISABLED_EVENT: Statement = Statement {
    sql: "INSERT INTO events (id, merchant_id, webhook_endpoint_id, type, data) \
          SELECT $3, merchant_id, id, 'webhook_endpoint.disabled', $4 FROM webhook_endpoints \
           WHERE merchant_id = $1 AND id = $2 AND disabled_at IS NOT NULL \
          ON CONFLICT (merchant_id, webhook_endpoint_id, type) \
             WHERE webhook_endpoint_id IS NOT NULL DO NOTHING",
    params: &[Type::UUID, Type::UUID, Type::UUID, Type::JSONB],
};

/// What a creation found.
#[derive(Debug)]
pub enum Inserted {
    /// This call created the endpoint.
    Created(WebhookEndpoint),
    /// An earlier request with the key created this one.
    Found(WebhookEndpoint),
    /// The merchant's live endpoints hold every slot: nothing was created.
    Full,
}

/// How often a creation tries again after another creation of the same
/// merchant took the slot it chose; then it gives up (`None`).
const SLOT_TRIES: usize = 8;

/// Inserts the endpoint `id` with `secret` in a free slot of the merchant's
/// `max_endpoints`, unless the merchant already has an endpoint created with
/// `key`. `None` only if every try lost its slot to another creation, or
/// the holder of the key could not be read (it cannot vanish: keys are
/// never released).
///
/// When the insert adds nothing, the key's holder is read; when there is
/// none, the merchant is either at its cap or lost a race for a slot:
/// counting the taken slots tells.
#[allow(clippy::too_many_arguments)]
pub async fn insert_or_find(
    conn: &Conn,
    id: WebhookEndpointId,
    merchant: MerchantId,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    request: &NewWebhookEndpoint,
    secret: &WebhookSecret,
    max_endpoints: i32,
) -> Result<Option<Inserted>, DbError> {
    let event_types: Option<Vec<&str>> = request
        .event_types
        .as_ref()
        .map(|types| types.iter().map(|t| t.as_str()).collect());
    for _ in 0..SLOT_TRIES {
        let row = conn
            .query_opt(
                &INSERT,
                &[
                    id.as_uuid(),
                    merchant.as_uuid(),
                    &request.url.as_str(),
                    &event_types,
                    &secret.expose_secret(),
                    &key.as_str(),
                    &fingerprint.as_bytes().as_slice(),
                    &max_endpoints,
                ],
            )
            .await?;
        if let Some(row) = row {
            return Ok(Some(Inserted::Created(decode(&row)?)));
        }
        let row = conn
            .query_opt(&FIND_BY_KEY, &[merchant.as_uuid(), &key.as_str()])
            .await?;
        if let Some(row) = row {
            return Ok(Some(Inserted::Found(decode(&row)?)));
        }
        let taken = conn
            .query_opt(&SLOTS_TAKEN, &[merchant.as_uuid(), &max_endpoints])
            .await?
            .map(|row| column::<i64>(&row, "taken"))
            .transpose()?
            .unwrap_or(0);
        if taken >= i64::from(max_endpoints) {
            return Ok(Some(Inserted::Full));
        }
    }
    Ok(None)
}

/// Live endpoints, newest first; `starting_after` continues after that one.
pub async fn list(
    conn: &Conn,
    merchant: MerchantId,
    limit: i64,
    starting_after: Option<WebhookEndpointId>,
) -> Result<Vec<WebhookEndpoint>, DbError> {
    let cursor = starting_after.map_or(Uuid::max(), |id| *id.as_uuid());
    let rows = conn
        .query(&LIST, &[merchant.as_uuid(), &limit, &cursor])
        .await?;
    rows.iter().map(decode).collect()
}

/// Deletes a live endpoint; `None` if the merchant has no live endpoint
/// `id`.
pub async fn delete(
    conn: &Conn,
    merchant: MerchantId,
    id: WebhookEndpointId,
) -> Result<Option<WebhookEndpoint>, DbError> {
    let row = conn
        .query_opt(&DELETE, &[merchant.as_uuid(), id.as_uuid()])
        .await?;
    row.as_ref().map(decode).transpose()
}

/// Where an endpoint's circuit breaker stands after a failed attempt.
#[derive(Debug)]
pub struct Failing {
    pub endpoint: WebhookEndpoint,
    /// Failed attempts in a row, this one included.
    pub failures: i32,
    /// It has been failing for `disable_after` or longer.
    pub failing_too_long: bool,
}

/// Counts a failed attempt of the merchant's endpoint (`FAILED`): from
/// `trip_after` failures in a row on, no delivery to it is attempted for
/// `pause`. `None` if the endpoint is deleted or disabled already.
pub async fn failed(
    conn: &Conn,
    merchant: MerchantId,
    id: WebhookEndpointId,
    trip_after: i32,
    pause: Duration,
    disable_after: Duration,
) -> Result<Option<Failing>, DbError> {
    let row = conn
        .query_opt(
            &FAILED,
            &[
                merchant.as_uuid(),
                id.as_uuid(),
                &trip_after,
                &lease_ms(pause),
                &lease_ms(disable_after),
            ],
        )
        .await?;
    row.map(|row| {
        Ok(Failing {
            endpoint: decode(&row)?,
            failures: column(&row, "consecutive_failures")?,
            failing_too_long: column(&row, "failing_too_long")?,
        })
    })
    .transpose()
}

/// Ends the endpoint's run of failures after an attempt succeeded
/// (`RECOVERED`); returns whether there was one.
pub async fn recovered(
    conn: &Conn,
    merchant: MerchantId,
    id: WebhookEndpointId,
) -> Result<bool, DbError> {
    Ok(conn
        .execute(&RECOVERED, &[merchant.as_uuid(), id.as_uuid()])
        .await?
        > 0)
}

/// Disables `endpoint` if it is still live and has been failing for
/// `disable_after` (`DISABLE`), with its `webhook_endpoint.disabled` event;
/// returns whether this call disabled it.
pub async fn disable(
    conn: &Conn,
    endpoint: &WebhookEndpoint,
    disable_after: Duration,
) -> Result<bool, DbError> {
    let disabled = WebhookEndpoint {
        disabled_at: Some(crate::clock::now()),
        ..endpoint.clone()
    };
    let data = Json(chargeonce_api::WebhookEndpoint::from(&disabled));
    let merchant = endpoint.merchant_id;
    let id = endpoint.id.as_uuid();
    let event = crate::clock::new_v7();
    let disable_after = lease_ms(disable_after);
    // The event reads the row the update changed, and the queue row the
    // event (`Conn::prepare` says why this comes first).
    conn.prepare(&[&DISABLE, &DISABLED_EVENT, &super::events::QUEUE])
        .await?;
    let row = conn
        .transaction(async {
            let disable: [&(dyn ToSql + Sync); 3] = [merchant.as_uuid(), id, &disable_after];
            let add_event: [&(dyn ToSql + Sync); 4] = [merchant.as_uuid(), id, &event, &data];
            let (row, _, ()) = futures_util::try_join!(
                conn.query_opt(&DISABLE, &disable),
                conn.execute(&DISABLED_EVENT, &add_event),
                super::events::queue(conn, merchant, event),
            )?;
            Ok(super::Decision::Commit(row))
        })
        .await?;
    Ok(row.is_some())
}

/// An endpoint from a row of `endpoint_columns!()`, read by name.
fn decode(row: &Row) -> Result<WebhookEndpoint, DbError> {
    let names: Option<Vec<&str>> = column(row, "event_types")?;
    let event_types = names
        .map(|names| {
            names
                .into_iter()
                .map(|name| {
                    EventType::parse(name).ok_or_else(|| {
                        DbError::Decode(format!("column event_types: unknown type {name:?}"))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    Ok(WebhookEndpoint {
        id: WebhookEndpointId::from_uuid(column(row, "id")?),
        merchant_id: MerchantId::from_uuid(column(row, "merchant_id")?),
        url: column(row, "url")?,
        event_types,
        secret: WebhookSecret::from_stored(column(row, "secret")?),
        fingerprint: column(row, "request_fingerprint")?,
        created_at: column(row, "created_at")?,
        deleted_at: column(row, "deleted_at")?,
        disabled_at: column(row, "disabled_at")?,
    })
}
