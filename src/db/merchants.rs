//! Merchants and their API keys.

use tokio_postgres::types::Type;

use super::codec::column;
use super::{Conn, DbError, Statement};
use crate::domain::{ApiKey, MerchantId};

/// The merchant and its first key in one statement, hence one transaction.
pub const CREATE: Statement = Statement {
    sql: "WITH merchant AS (INSERT INTO merchants (id, name) VALUES ($1, $2) RETURNING id) \
          INSERT INTO api_keys (key_hash, merchant_id) SELECT $3, id FROM merchant",
    params: &[Type::UUID, Type::TEXT, Type::BYTEA],
};

/// A merchant with a fixed id unless it exists (the demo's, on every start
/// with `demo.enabled`). It gets no API key: nobody can call the API as it.
pub const ENSURE: Statement = Statement {
    sql: "INSERT INTO merchants (id, name) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
    params: &[Type::UUID, Type::TEXT],
};

pub const FIND_BY_DIGEST: Statement = Statement {
    sql: "SELECT merchant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
    params: &[Type::BYTEA],
};

/// Creates a merchant with one fresh API key. The secret is returned to be
/// shown once; only its digest is stored.
pub async fn create(conn: &Conn, name: &str) -> Result<(MerchantId, ApiKey), DbError> {
    let id = MerchantId::new();
    let key = ApiKey::generate();
    conn.execute(&CREATE, &[id.as_uuid(), &name, &key.digest().as_slice()])
        .await?;
    Ok((id, key))
}

/// Creates the merchant `id` unless it exists; safe to repeat, also from
/// several instances at once.
pub async fn ensure(conn: &Conn, id: MerchantId, name: &str) -> Result<(), DbError> {
    conn.execute(&ENSURE, &[id.as_uuid(), &name]).await?;
    Ok(())
}

/// The merchant whose unrevoked API key has this digest.
pub async fn find_by_digest(conn: &Conn, digest: &[u8; 32]) -> Result<Option<MerchantId>, DbError> {
    let row = conn
        .query_opt(&FIND_BY_DIGEST, &[&digest.as_slice()])
        .await?;
    row.map(|row| column(&row, "merchant_id").map(MerchantId::from_uuid))
        .transpose()
}
