//! API key → merchant, with a small in-process cache so a request does not
//! cost a query to authenticate. Only successful lookups are cached, for
//! `auth.cache_ttl_ms`: a revoked key stops working within that time. A key
//! the database has never accepted is always asked about.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use crate::db::{self, Database};
use crate::domain::{ApiKey, MerchantId};

use super::ServiceError;

/// Most keys kept; past it, expired entries go, and if that is not enough the
/// cache starts over. Merchants are few; this only bounds memory.
const CAPACITY: usize = 10_000;

pub struct ApiKeyCache {
    ttl: Duration,
    entries: RwLock<HashMap<[u8; 32], (MerchantId, Instant)>>,
}

impl ApiKeyCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: RwLock::new(HashMap::new()),
        }
    }

    /// The merchant that owns `key`, or `None` for an unknown or revoked key.
    pub async fn authenticate(
        &self,
        db: &Database,
        key: &ApiKey,
    ) -> Result<Option<MerchantId>, ServiceError> {
        let digest = key.digest();
        if let Some(merchant) = self.get(&digest) {
            return Ok(Some(merchant));
        }
        let conn = db.conn().await?;
        let merchant = db::merchants::find_by_digest(&conn, &digest).await?;
        if let Some(merchant) = merchant {
            self.insert(digest, merchant);
        }
        Ok(merchant)
    }

    fn get(&self, digest: &[u8; 32]) -> Option<MerchantId> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries
            .get(digest)
            .filter(|(_, stored)| stored.elapsed() < self.ttl)
            .map(|(merchant, _)| *merchant)
    }

    fn insert(&self, digest: [u8; 32], merchant: MerchantId) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= CAPACITY {
            entries.retain(|_, (_, stored)| stored.elapsed() < self.ttl);
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert(digest, (merchant, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_after_the_ttl() {
        let cache = ApiKeyCache::new(Duration::from_millis(30));
        let merchant = MerchantId::new();
        cache.insert([1; 32], merchant);
        assert_eq!(cache.get(&[1; 32]), Some(merchant));
        assert_eq!(cache.get(&[2; 32]), None);
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(cache.get(&[1; 32]), None);
    }

    #[test]
    fn a_zero_ttl_disables_the_cache() {
        let cache = ApiKeyCache::new(Duration::ZERO);
        cache.insert([1; 32], MerchantId::new());
        assert_eq!(cache.get(&[1; 32]), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let cache = ApiKeyCache::new(Duration::from_secs(60));
        for i in 0..=CAPACITY as u32 {
            let mut digest = [0; 32];
            digest[..4].copy_from_slice(&i.to_be_bytes());
            cache.insert(digest, MerchantId::new());
        }
        assert!(cache.entries.read().map(|e| e.len()).unwrap_or(0) <= CAPACITY);
    }
}
