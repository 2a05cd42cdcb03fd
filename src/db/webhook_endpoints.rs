//! Statements on `webhook_endpoints`. An endpoint row is also the
//! idempotency record of its creation, like a charge: the key and the
//! request fingerprint live on it, in the endpoints' own key space per
//! merchant (`webhook_endpoints_merchant_key_unique`). Keys are kept for as
//! long as the row; endpoints are few and never purged.

use tokio_postgres::types::Type;
use tokio_postgres::Row;
use uuid::Uuid;

use super::codec::column;
use super::{Conn, DbError, Statement};
use crate::domain::{
    EventType, Fingerprint, IdempotencyKey, MerchantId, NewWebhookEndpoint, WebhookEndpoint,
    WebhookEndpointId, WebhookSecret,
};

/// The columns a `WebhookEndpoint` is decoded from, by name.
macro_rules! endpoint_columns {
    () => {
        "id, merchant_id, url, event_types, secret, request_fingerprint, created_at, deleted_at"
    };
}

/// Inserts the endpoint unless the merchant already used the key; then
/// returns the endpoint that holds it. One round trip; `created` says which.
/// The unique index decides between concurrent requests with one key: the
/// second waits for the first's commit, then conflicts.
pub const INSERT_OR_FIND: Statement = Statement {
    sql: concat!(
        "WITH inserted AS ( \
             INSERT INTO webhook_endpoints (id, merchant_id, url, event_types, secret, \
                                            client_idempotency_key, request_fingerprint) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (merchant_id, client_idempotency_key) DO NOTHING \
             RETURNING ",
        endpoint_columns!(),
        ") SELECT ",
        endpoint_columns!(),
        ", true AS created FROM inserted \
         UNION ALL \
         SELECT ",
        endpoint_columns!(),
        ", false AS created FROM webhook_endpoints \
          WHERE merchant_id = $2 AND client_idempotency_key = $6 \
            AND NOT EXISTS (SELECT 1 FROM inserted)"
    ),
    params: &[
        Type::UUID,
        Type::UUID,
        Type::TEXT,
        Type::TEXT_ARRAY,
        Type::TEXT,
        Type::TEXT,
        Type::BYTEA,
    ],
};

pub const FIND_BY_KEY: Statement = Statement {
    sql: concat!(
        "SELECT ",
        endpoint_columns!(),
        " FROM webhook_endpoints WHERE merchant_id = $1 AND client_idempotency_key = $2"
    ),
    params: &[Type::UUID, Type::TEXT],
};

/// Live endpoints, newest first, after the cursor `$3`. `deleted_at IS
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

/// Soft delete: the row stays (its deliveries refer to it). The fan-out
/// skips a deleted endpoint from then on, and the dispatcher fails its
/// pending deliveries when they come due instead of sending them. Only a
/// live endpoint matches, so deleting twice finds nothing the second time.
pub const DELETE: Statement = Statement {
    sql: concat!(
        "UPDATE webhook_endpoints SET deleted_at = now() \
          WHERE merchant_id = $1 AND id = $2 AND deleted_at IS NULL \
          RETURNING ",
        endpoint_columns!()
    ),
    params: &[Type::UUID, Type::UUID],
};

/// Inserts the endpoint `id` with `secret` unless the merchant already has
/// an endpoint created with `key`; then returns that one. Returns the
/// endpoint and whether this call created it; `None` only if the holder of
/// the key could not be read (it cannot vanish: keys are never released).
///
/// When the conflicting row was committed after this statement's snapshot
/// began, the statement's own SELECT cannot see it; a second read, with a
/// fresh snapshot, does.
pub async fn insert_or_find(
    conn: &Conn,
    id: WebhookEndpointId,
    merchant: MerchantId,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    request: &NewWebhookEndpoint,
    secret: &WebhookSecret,
) -> Result<Option<(WebhookEndpoint, bool)>, DbError> {
    let event_types: Option<Vec<&str>> = request
        .event_types
        .as_ref()
        .map(|types| types.iter().map(|t| t.as_str()).collect());
    let row = conn
        .query_opt(
            &INSERT_OR_FIND,
            &[
                id.as_uuid(),
                merchant.as_uuid(),
                &request.url.as_str(),
                &event_types,
                &secret.expose_secret(),
                &key.as_str(),
                &fingerprint.as_bytes().as_slice(),
            ],
        )
        .await?;
    if let Some(row) = row {
        return Ok(Some((decode(&row)?, column(&row, "created")?)));
    }
    let row = conn
        .query_opt(&FIND_BY_KEY, &[merchant.as_uuid(), &key.as_str()])
        .await?;
    row.map(|row| Ok((decode(&row)?, false))).transpose()
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
    })
}
