//! API key → merchant, with in-process caches so a request does not cost a
//! query to authenticate:
//!
//! - known keys for `auth.cache_ttl_ms`: a revoked key stops working within
//!   that time;
//! - unknown keys for `auth.unknown_key_ttl_ms` (short): a flood of requests
//!   with one bogus key costs one query per that time, not one per request.
//!
//! Both are bounded (moka: concurrent, evicts by recency and frequency, no
//! global lock), so no amount of distinct keys grows memory without bound.

use std::time::Duration;

use moka::sync::Cache;

use crate::config::AuthSettings;
use crate::db::{self, Database};
use crate::domain::{ApiKey, MerchantId};
use crate::metrics;

use super::ServiceError;

/// Most known keys kept. Merchants are few; this only bounds memory.
const KNOWN_CAPACITY: u64 = 10_000;
/// Most unknown keys kept: 32-byte digests, about 5 MB at most.
const UNKNOWN_CAPACITY: u64 = 100_000;

pub struct ApiKeyCache {
    known: Option<Cache<[u8; 32], MerchantId>>,
    unknown: Option<Cache<[u8; 32], ()>>,
}

/// A cache of at most `capacity` entries that live `ttl`; none for a zero
/// `ttl` (caching off).
fn cache<V: Clone + Send + Sync + 'static>(
    capacity: u64,
    ttl: Duration,
) -> Option<Cache<[u8; 32], V>> {
    (!ttl.is_zero()).then(|| {
        Cache::builder()
            .max_capacity(capacity)
            .time_to_live(ttl)
            .build()
    })
}

impl ApiKeyCache {
    pub fn new(settings: &AuthSettings) -> Self {
        Self {
            known: cache(KNOWN_CAPACITY, settings.cache_ttl),
            unknown: cache(UNKNOWN_CAPACITY, settings.unknown_key_ttl),
        }
    }

    /// The merchant that owns `key`, or `None` for an unknown or revoked key.
    pub async fn authenticate(
        &self,
        db: &Database,
        key: &ApiKey,
    ) -> Result<Option<MerchantId>, ServiceError> {
        let digest = key.digest();
        if let Some(merchant) = self.known.as_ref().and_then(|c| c.get(&digest)) {
            metrics::api_key_cache("hit");
            return Ok(Some(merchant));
        }
        if self
            .unknown
            .as_ref()
            .is_some_and(|c| c.contains_key(&digest))
        {
            metrics::api_key_cache("negative_hit");
            return Ok(None);
        }
        metrics::api_key_cache("miss");
        let conn = db.conn().await?;
        let merchant = db::merchants::find_by_digest(&conn, &digest).await?;
        match merchant {
            Some(merchant) => {
                if let Some(known) = &self.known {
                    known.insert(digest, merchant);
                }
            }
            None => {
                if let Some(unknown) = &self.unknown {
                    unknown.insert(digest, ());
                }
            }
        }
        Ok(merchant)
    }
}
