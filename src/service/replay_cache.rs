//! Final answers kept in memory, so a replay needs no database round trip.
//!
//! Why this is safe: a charge or refund that reached a final status never
//! changes what its creation answers (`Charge::into_created`: later refunds
//! do not show in a replay), and its key replays it until its replay window
//! (`idempotency.retention_hours`) ends; after that the key answers 422
//! expired, and later the sweeper releases it. So an entry keyed by
//! (merchant, key) can answer any later request with that key, on any
//! instance, until shortly before the window ends:
//!
//! - only final records go in; a pending one is never cached (its answer
//!   is still to come);
//! - the entry holds the record's fingerprint, so a different request with
//!   the same key still gets 422 (the caller compares, as with a row);
//! - an entry expires `RELEASE_MARGIN` before the key's window ends by the
//!   database's clock (`crate::clock`), so a key used after its window
//!   always reaches the database, which answers it expired (or, once
//!   released, as a new request). The margin covers what is left of clock
//!   skew; the sweeper's interval only ever makes a release later;
//! - the cache is bounded by an estimate of its entries' bytes
//!   (`idempotency.replay_cache_bytes`; 0 turns it off), least recently
//!   used out first.
//!
//! What it cannot see: rows deleted or keys released behind the service's
//! back (a test suite truncating tables between tests). Such setups turn the
//! cache off; the README says so.

use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::policy::EvictionPolicy;
use moka::sync::Cache;
use moka::Expiry;

use crate::domain::lifecycle::Record;
use crate::domain::{IdempotencyKey, MerchantId, Status};

/// How long before its key's replay window ends an entry goes.
pub const RELEASE_MARGIN: Duration = Duration::from_secs(300);

/// What every entry costs besides its record's own heap data: the key's
/// fixed part, the `Arc`, moka's bookkeeping and the allocator's rounding.
/// Calibrated with `scripts/bench`: a full run that filled a 32 MiB cache
/// (about 60,000 charges at the earlier estimate of 160 bytes) peaked at
/// 87 MB RSS against 21 MB without the cache, about 1,100 bytes per charge
/// in all; this overhead brings the weight to that (BENCHMARKS.md). The
/// rendered JSON, kept since, is weighed by its length on top: about 330
/// bytes more per charge, so 32 MiB now hold about 25,000 charges. The
/// weight errs high: measured by hand, a full 32 MiB cache held about
/// 26 MB (about 1,035 bytes per charge against a weight of about 1,310).
const ENTRY_OVERHEAD: usize = 700;

type Key = (MerchantId, String);

struct Entry<R> {
    record: R,
    /// `Record::created_json`, rendered once.
    json: Arc<str>,
    expires: Instant,
}

/// A final record from the cache, and its public JSON as its creation
/// answers it.
pub struct Cached<R> {
    pub record: R,
    pub json: Arc<str>,
}

/// Expires each entry at its own time.
struct AtReleaseTime;

impl<R> Expiry<Key, Arc<Entry<R>>> for AtReleaseTime {
    fn expire_after_create(
        &self,
        _key: &Key,
        entry: &Arc<Entry<R>>,
        now: Instant,
    ) -> Option<Duration> {
        Some(entry.expires.saturating_duration_since(now))
    }
}

/// Final records by (merchant, idempotency key). Cheap to clone; clones
/// share the entries.
#[derive(Clone)]
pub struct ReplayCache<R: Record> {
    entries: Option<Cache<Key, Arc<Entry<R>>>>,
    retention: Duration,
}

impl<R: Record> ReplayCache<R> {
    /// A cache of about `max_bytes` (none if 0) for keys kept `retention`.
    pub fn new(max_bytes: u64, retention: Duration) -> Self {
        let entries = (max_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(max_bytes)
                // Retries follow their first request closely: keep the
                // newest answers (moka's default, TinyLFU, may refuse them).
                .eviction_policy(EvictionPolicy::lru())
                .weigher(|key: &Key, entry: &Arc<Entry<R>>| {
                    let bytes = ENTRY_OVERHEAD
                        + std::mem::size_of::<R>()
                        + key.1.len()
                        + entry.record.heap_bytes()
                        + entry.json.len();
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .expire_after(AtReleaseTime)
                .build()
        });
        Self { entries, retention }
    }

    /// The final record a key led to, if this process has seen it.
    pub fn get(&self, merchant: MerchantId, key: &IdempotencyKey) -> Option<Cached<R>> {
        let entries = self.entries.as_ref()?;
        let entry = entries.get(&(merchant, key.as_str().to_owned()))?;
        // Expiry is also enforced on read, but only to moka's tick; be exact.
        (Instant::now() < entry.expires).then(|| Cached {
            record: entry.record.clone(),
            json: entry.json.clone(),
        })
    }

    /// Remembers a key's record if it is final and its key not about to be
    /// released; returns the JSON it keeps for it (`Record::created_json`).
    pub fn remember(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
        record: &R,
    ) -> Option<Arc<str>> {
        let entries = self.entries.as_ref()?;
        if record.status() == Status::Pending {
            return None;
        }
        let lifetime = self.lifetime_left(record)?;
        // Cannot fail for these plain structs; if it did, the record is
        // simply not kept and its replays read the database.
        let json: Arc<str> = record.created_json().ok()?.into();
        let entry = Entry {
            record: record.clone(),
            json: json.clone(),
            expires: Instant::now() + lifetime,
        };
        entries.insert((merchant, key.as_str().to_owned()), Arc::new(entry));
        Some(json)
    }

    /// Time until `RELEASE_MARGIN` before the key's window ends; `None` if
    /// that has passed. The window is counted from the earlier of the row's
    /// creation time and its id's (the service counts from the id).
    fn lifetime_left(&self, record: &R) -> Option<Duration> {
        let created = record.created_at().min(record.id_time());
        let expires = created + self.retention.checked_sub(RELEASE_MARGIN)?;
        (expires - crate::clock::now()).to_std().ok()
    }

    /// Entries held now (after pending maintenance), for tests and metrics.
    pub fn entries(&self) -> u64 {
        self.entries.as_ref().map_or(0, |entries| {
            entries.run_pending_tasks();
            entries.entry_count()
        })
    }

    /// The estimated bytes held now.
    pub fn weighted_bytes(&self) -> u64 {
        self.entries.as_ref().map_or(0, |entries| {
            entries.run_pending_tasks();
            entries.weighted_size()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{DateTime, Utc};
    use serde_json::json;

    use super::*;
    use crate::domain::{Charge, ChargeId, Fingerprint, Refund, RefundId};

    const DAY: Duration = Duration::from_secs(86_400);

    fn charge(status: Status, created: DateTime<Utc>) -> Charge {
        Charge {
            id: ChargeId::new(),
            merchant_id: MerchantId::from_uuid(uuid::Uuid::nil()),
            fingerprint: Fingerprint::of(&json!({"amount": 1})),
            amount: 1,
            currency: "EUR".to_owned(),
            customer: Some("cus_1".to_owned()),
            description: None,
            metadata: BTreeMap::new(),
            status,
            failure_code: None,
            failure_message: None,
            lease: Default::default(),
            refunds_reserved: 0,
            amount_refunded: 0,
            processor_payment_id: None,
            created_at: created,
        }
    }

    fn refund(status: Status) -> Refund {
        Refund {
            id: RefundId::new(),
            merchant_id: MerchantId::from_uuid(uuid::Uuid::nil()),
            charge_id: ChargeId::new(),
            fingerprint: Fingerprint::of(&json!({"amount": 1})),
            amount: 1,
            currency: "EUR".to_owned(),
            reason: None,
            metadata: BTreeMap::new(),
            status,
            failure_code: None,
            failure_message: None,
            lease: Default::default(),
            processor_payment_id: "pay_1".to_owned(),
            created_at: Utc::now(),
        }
    }

    fn key(text: &str) -> IdempotencyKey {
        IdempotencyKey::parse(text).expect("key")
    }

    #[test]
    fn final_records_are_kept_and_pending_ones_never() {
        let cache = ReplayCache::new(1 << 20, DAY);
        let merchant = MerchantId::from_uuid(uuid::Uuid::nil());
        let paid = charge(Status::Succeeded, Utc::now());
        cache.remember(merchant, &key("paid"), &paid);
        cache.remember(
            merchant,
            &key("pending"),
            &charge(Status::Pending, Utc::now()),
        );
        let kept = cache.get(merchant, &key("paid")).expect("kept");
        assert_eq!(kept.record.id, paid.id);
        assert_eq!(*kept.json, paid.created_json().expect("renders"));
        assert!(cache.get(merchant, &key("pending")).is_none());
        let other = MerchantId::from_uuid(uuid::Uuid::from_u128(1));
        assert!(
            cache.get(other, &key("paid")).is_none(),
            "keys are per merchant"
        );
    }

    #[test]
    fn an_entry_goes_before_its_key_is_released() {
        let cache = ReplayCache::new(1 << 20, DAY);
        let merchant = MerchantId::from_uuid(uuid::Uuid::nil());
        // Created so long ago that its key is released within the margin.
        let nearly = Utc::now() - (DAY - RELEASE_MARGIN + Duration::from_secs(1));
        cache.remember(merchant, &key("old"), &charge(Status::Succeeded, nearly));
        assert!(cache.get(merchant, &key("old")).is_none());
        // The id's time counts too: the sweeper goes by it.
        let mut backdated = charge(Status::Succeeded, Utc::now());
        backdated.id = ChargeId::from_uuid(uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            u64::try_from(nearly.timestamp()).unwrap(),
            0,
        )));
        cache.remember(merchant, &key("old-id"), &backdated);
        assert!(cache.get(merchant, &key("old-id")).is_none());
        // A retention shorter than the margin keeps nothing.
        let short = ReplayCache::new(1 << 20, RELEASE_MARGIN);
        short.remember(merchant, &key("k"), &charge(Status::Succeeded, Utc::now()));
        assert!(short.get(merchant, &key("k")).is_none());
    }

    /// An entry past its time is not only refused by `get` but gone: its
    /// memory is given back without waiting for the size bound.
    #[test]
    fn an_expired_entry_leaves_the_cache() {
        let merchant = MerchantId::from_uuid(uuid::Uuid::nil());
        // A retention one second longer than the margin: a fresh record
        // has about a second left.
        let cache = ReplayCache::new(1 << 20, RELEASE_MARGIN + Duration::from_secs(1));
        cache.remember(merchant, &key("k"), &charge(Status::Succeeded, Utc::now()));
        assert_eq!(cache.entries(), 1);
        std::thread::sleep(Duration::from_millis(1500));
        assert!(cache.get(merchant, &key("k")).is_none());
        assert_eq!(cache.entries(), 0);
    }

    #[test]
    fn the_cache_stays_within_its_bytes_and_can_be_off() {
        let merchant = MerchantId::from_uuid(uuid::Uuid::nil());
        let bound = 64 * 1024;
        let cache = ReplayCache::new(bound, DAY);
        for n in 0..10_000 {
            let charge = charge(Status::Succeeded, Utc::now());
            cache.remember(merchant, &key(&format!("key-{n}")), &charge);
        }
        // Full: within its bound, and not far below it.
        assert!(
            (bound / 2..=bound).contains(&cache.weighted_bytes()),
            "{}",
            cache.weighted_bytes()
        );
        // About 1.3 KB each (the record, its JSON, the overhead).
        assert!(cache.entries() > 40, "{} entries", cache.entries());

        // A record's own heap data counts: ten kilobytes of description
        // each, and the same bytes hold a handful.
        let big = ReplayCache::new(bound, DAY);
        for n in 0..100 {
            let mut charge = charge(Status::Succeeded, Utc::now());
            charge.description = Some("d".repeat(10_000));
            big.remember(merchant, &key(&format!("big-{n}")), &charge);
        }
        assert!(
            (1..=6).contains(&big.entries()),
            "{} entries",
            big.entries()
        );

        // A refund's too (its metadata).
        let big_refunds = ReplayCache::new(bound, DAY);
        for n in 0..100 {
            let mut refund = refund(Status::Succeeded);
            refund
                .metadata
                .insert("note".to_owned(), "d".repeat(10_000));
            big_refunds.remember(merchant, &key(&format!("big-{n}")), &refund);
        }
        assert!(
            (1..=6).contains(&big_refunds.entries()),
            "{} entries",
            big_refunds.entries()
        );

        let off = ReplayCache::new(0, DAY);
        off.remember(merchant, &key("k"), &charge(Status::Succeeded, Utc::now()));
        assert!(off.get(merchant, &key("k")).is_none());
        assert_eq!(off.entries(), 0);
    }

    /// A retry comes soon after its first request, so when the cache is
    /// full the newest answers must be the ones kept: least recently used
    /// out first. (moka's default policy, TinyLFU, may refuse a new entry
    /// that is not used more often than the one it would push out, so in a
    /// full cache fresh answers, each stored once, were often not kept and
    /// their retries went to the database.)
    #[test]
    fn a_full_cache_keeps_the_newest_answers() {
        let merchant = MerchantId::from_uuid(uuid::Uuid::nil());
        let cache = ReplayCache::new(64 * 1024, DAY);
        let remember = |name: &str| {
            cache.remember(merchant, &key(name), &charge(Status::Succeeded, Utc::now()));
        };
        let older = 2_000;
        for n in 0..older {
            remember(&format!("old-{n}"));
        }
        // Each old key replayed once more, as a busy cache sees them.
        for n in 0..older {
            let _ = cache.get(merchant, &key(&format!("old-{n}")));
        }
        let newest = 20;
        for n in 0..newest {
            remember(&format!("new-{n}"));
        }
        // Counting runs moka's pending maintenance, evictions included.
        cache.entries();
        let kept = (0..newest)
            .filter(|n| cache.get(merchant, &key(&format!("new-{n}"))).is_some())
            .count();
        assert_eq!(kept, newest, "of the {newest} newest answers");
    }
}
