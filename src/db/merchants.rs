//! Merchants and their API keys.

use deadpool_postgres::GenericClient;
use tokio_postgres::Error;

use crate::domain::{ApiKey, MerchantId};

/// Creates a merchant with one fresh API key, in one transaction. The secret
/// is returned to be shown once; only its digest is stored.
pub async fn create(
    client: &mut deadpool_postgres::Client,
    name: &str,
) -> Result<(MerchantId, ApiKey), Error> {
    let id = MerchantId::new();
    let key = ApiKey::generate();
    let transaction = client.transaction().await?;
    transaction
        .execute(
            "INSERT INTO merchants (id, name) VALUES ($1, $2)",
            &[id.as_uuid(), &name],
        )
        .await?;
    transaction
        .execute(
            "INSERT INTO api_keys (key_hash, merchant_id) VALUES ($1, $2)",
            &[&key.digest().as_slice(), id.as_uuid()],
        )
        .await?;
    transaction.commit().await?;
    Ok((id, key))
}

/// The merchant whose unrevoked API key has this digest.
pub async fn find_by_digest(
    client: &impl GenericClient,
    digest: &[u8; 32],
) -> Result<Option<MerchantId>, Error> {
    let statement = client
        .prepare_cached(
            "SELECT merchant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
        )
        .await?;
    let row = client.query_opt(&statement, &[&digest.as_slice()]).await?;
    row.map(|row| row.try_get(0).map(MerchantId::from_uuid))
        .transpose()
}
