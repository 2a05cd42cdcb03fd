//! Which due deliveries an instance attempts next, so that no merchant can
//! slow down another's: each endpoint gets at most
//! `webhooks.max_in_flight_per_endpoint` of the instance's delivery slots
//! (one while its circuit breaker is open: a single probe at a time) and
//! each merchant at most half of them, and the free slots go merchant by
//! merchant in turn rather than to whoever's deliveries came due first.
//! Pure bookkeeping: the counts of what is in flight, and the choice. And
//! the same for the database work of finished attempts (`RecordTurns`):
//! each merchant gets at most all but one of the records' connections.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

use crate::db::webhook_deliveries::DueDelivery;
use crate::domain::{MerchantId, WebhookEndpointId};

/// The most deliveries in flight per endpoint and per merchant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    pub per_endpoint: usize,
    pub per_merchant: usize,
}

/// What one instance has in flight, by endpoint and by merchant. Cheap to
/// clone; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<Counts>>);

#[derive(Debug, Default)]
struct Counts {
    endpoints: HashMap<WebhookEndpointId, usize>,
    merchants: HashMap<MerchantId, usize>,
    /// Endpoints whose circuit breaker is open, as this instance last
    /// learned: one delivery at a time.
    tripped: HashSet<WebhookEndpointId>,
}

impl Counts {
    fn share(&self, id: WebhookEndpointId, shares: Shares) -> usize {
        if self.tripped.contains(&id) {
            1
        } else {
            shares.per_endpoint
        }
    }

    fn endpoint(&self, id: WebhookEndpointId) -> usize {
        self.endpoints.get(&id).copied().unwrap_or(0)
    }

    fn merchant(&self, id: MerchantId) -> usize {
        self.merchants.get(&id).copied().unwrap_or(0)
    }
}

impl InFlight {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The endpoints and merchants that have their full share in flight:
    /// the claim's read leaves their deliveries out.
    pub fn full(&self, shares: Shares) -> (Vec<Uuid>, Vec<Uuid>) {
        let counts = self.counts();
        let endpoints = counts
            .endpoints
            .iter()
            .filter(|(&id, &n)| n >= counts.share(id, shares))
            .map(|(id, _)| *id.as_uuid())
            .collect();
        let merchants = counts
            .merchants
            .iter()
            .filter(|(_, &n)| n >= shares.per_merchant)
            .map(|(id, _)| *id.as_uuid())
            .collect();
        (endpoints, merchants)
    }

    /// Chooses up to `free` of `due` (in the order they came due):
    /// merchant by merchant in turn, each merchant's next due delivery whose
    /// endpoint has room, as long as the merchant has room, counting what is
    /// in flight already. The merchants take turns in the order of their
    /// first due delivery.
    pub fn choose(&self, due: &[DueDelivery], free: usize, shares: Shares) -> Vec<DueDelivery> {
        let counts = self.counts();
        let mut endpoints: HashMap<WebhookEndpointId, usize> = HashMap::new();
        let mut merchants: Vec<(MerchantId, usize, VecDeque<DueDelivery>)> = Vec::new();
        for delivery in due {
            match merchants
                .iter_mut()
                .find(|(m, _, _)| *m == delivery.merchant_id)
            {
                Some((_, _, queue)) => queue.push_back(*delivery),
                None => merchants.push((
                    delivery.merchant_id,
                    counts.merchant(delivery.merchant_id),
                    VecDeque::from([*delivery]),
                )),
            }
        }
        let mut chosen = Vec::new();
        while chosen.len() < free && !merchants.is_empty() {
            merchants.retain_mut(|(_, taken, queue)| {
                if chosen.len() >= free || *taken >= shares.per_merchant {
                    return chosen.len() >= free && *taken < shares.per_merchant;
                }
                while let Some(delivery) = queue.pop_front() {
                    let endpoint = endpoints
                        .entry(delivery.endpoint_id)
                        .or_insert_with(|| counts.endpoint(delivery.endpoint_id));
                    if *endpoint < counts.share(delivery.endpoint_id, shares) {
                        *endpoint += 1;
                        *taken += 1;
                        chosen.push(delivery);
                        break;
                    }
                }
                !queue.is_empty()
            });
        }
        chosen
    }

    /// The rest of `due`, past `chosen`, whose endpoint this instance knows
    /// closed (its breaker open, or deleted or disabled): they are settled
    /// together (held back or given up), so a backlog behind such an
    /// endpoint leaves the window in one round and does not hide the other
    /// merchants' deliveries behind it.
    pub fn to_settle(&self, due: &[DueDelivery], chosen: &[DueDelivery]) -> Vec<DueDelivery> {
        let counts = self.counts();
        let chosen: HashSet<Uuid> = chosen.iter().map(|delivery| delivery.id).collect();
        due.iter()
            .filter(|d| counts.tripped.contains(&d.endpoint_id) && !chosen.contains(&d.id))
            .copied()
            .collect()
    }

    /// Records whether `endpoint`'s circuit breaker is open.
    pub fn set_tripped(&self, endpoint: WebhookEndpointId, tripped: bool) {
        let mut counts = self.counts();
        if tripped {
            counts.tripped.insert(endpoint);
        } else {
            counts.tripped.remove(&endpoint);
        }
    }

    /// Counts `delivery` in flight until the guard is dropped.
    pub fn start(&self, endpoint: WebhookEndpointId, merchant: MerchantId) -> Started {
        let mut counts = self.counts();
        *counts.endpoints.entry(endpoint).or_insert(0) += 1;
        *counts.merchants.entry(merchant).or_insert(0) += 1;
        Started {
            in_flight: self.clone(),
            endpoint,
            merchant,
        }
    }
}

/// One delivery in flight; dropping it ends it.
#[derive(Debug)]
pub struct Started {
    in_flight: InFlight,
    endpoint: WebhookEndpointId,
    merchant: MerchantId,
}

impl Drop for Started {
    fn drop(&mut self) {
        let mut counts = self.in_flight.counts();
        fn end<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: K) {
            if let Some(n) = map.get_mut(&key) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&key);
                }
            }
        }
        end(&mut counts.endpoints, self.endpoint);
        end(&mut counts.merchants, self.merchant);
    }
}

/// Turns at the connections that record finished attempts, per merchant:
/// at most `per_merchant` of one merchant's attempts are recorded at once.
/// A merchant whose records are slow (its endpoint's row locked, its
/// attempts all ending together) then leaves the rest of the connections
/// to the others; their attempts, recorded at once, free their endpoints'
/// shares. Cheap to clone; clones share the turns.
#[derive(Debug, Clone)]
pub struct RecordTurns {
    per_merchant: usize,
    merchants: Arc<Mutex<HashMap<MerchantId, Arc<Semaphore>>>>,
}

impl RecordTurns {
    pub fn new(per_merchant: usize) -> Self {
        Self {
            per_merchant: per_merchant.max(1),
            merchants: Arc::default(),
        }
    }

    fn merchants(&self) -> std::sync::MutexGuard<'_, HashMap<MerchantId, Arc<Semaphore>>> {
        self.merchants
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a turn of `merchant`'s; it lasts until the guard is dropped.
    pub async fn take(&self, merchant: MerchantId) -> Turn {
        let turns = self
            .merchants()
            .entry(merchant)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_merchant)))
            .clone();
        // Never closed.
        let permit = turns.acquire_owned().await.ok();
        Turn {
            permit,
            merchant,
            turns: self.clone(),
        }
    }
}

/// One merchant's turn at recording; dropping it ends it, and the last one
/// out forgets the merchant.
#[derive(Debug)]
pub struct Turn {
    permit: Option<OwnedSemaphorePermit>,
    merchant: MerchantId,
    turns: RecordTurns,
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut merchants = self.turns.merchants();
        // Clones are made under this lock: only the map's is left when no
        // turn of the merchant is held or awaited.
        if merchants
            .get(&self.merchant)
            .is_some_and(|turns| Arc::strong_count(turns) == 1)
        {
            merchants.remove(&self.merchant);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn merchant(n: u128) -> MerchantId {
        MerchantId::from_uuid(Uuid::from_u128(n))
    }

    fn endpoint(n: u128) -> WebhookEndpointId {
        WebhookEndpointId::from_uuid(Uuid::from_u128(1000 + n))
    }

    /// `count` due deliveries of the merchant `m`'s endpoint `e`.
    fn due(m: u128, e: u128, count: usize) -> Vec<DueDelivery> {
        (0..count)
            .map(|_| DueDelivery {
                merchant_id: merchant(m),
                id: Uuid::new_v4(),
                endpoint_id: endpoint(e),
            })
            .collect()
    }

    const SHARES: Shares = Shares {
        per_endpoint: 4,
        per_merchant: 50,
    };

    fn merchants_of(chosen: &[DueDelivery]) -> Vec<u128> {
        chosen
            .iter()
            .map(|d| d.merchant_id.as_uuid().as_u128())
            .collect()
    }

    #[test]
    fn merchants_take_turns_whoever_came_due_first() {
        // B's 30 deliveries (to 10 endpoints) came due before A's 2 and C's 1.
        let mut queue: Vec<DueDelivery> = (0..10).flat_map(|e| due(2, e, 3)).collect();
        queue.extend(due(1, 100, 2));
        queue.extend(due(3, 200, 1));
        let chosen = InFlight::default().choose(&queue, 5, SHARES);
        assert_eq!(merchants_of(&chosen), [2, 1, 3, 2, 1]);
    }

    #[test]
    fn an_endpoint_gets_at_most_its_share_counting_what_is_in_flight() {
        let in_flight = InFlight::default();
        let held: Vec<Started> = (0..3)
            .map(|_| in_flight.start(endpoint(1), merchant(1)))
            .collect();
        let mut queue = due(1, 1, 10);
        queue.extend(due(1, 2, 10));
        let chosen = in_flight.choose(&queue, 100, SHARES);
        let to = |e| {
            chosen
                .iter()
                .filter(|d| d.endpoint_id == endpoint(e))
                .count()
        };
        assert_eq!((to(1), to(2)), (1, 4));
        let (full_endpoints, full_merchants) = in_flight.full(SHARES);
        assert!(full_endpoints.is_empty() && full_merchants.is_empty());
        drop(held);
        assert!(in_flight.counts().endpoints.is_empty());
        assert!(in_flight.counts().merchants.is_empty());
    }

    #[test]
    fn a_merchant_gets_at_most_its_share_and_the_others_the_rest() {
        let shares = Shares {
            per_endpoint: 4,
            per_merchant: 6,
        };
        let mut queue: Vec<DueDelivery> = (0..16).flat_map(|e| due(2, e, 4)).collect();
        queue.extend(due(1, 100, 2));
        let chosen = InFlight::default().choose(&queue, 10, shares);
        let of = |m| merchants_of(&chosen).iter().filter(|&&x| x == m).count();
        assert_eq!((of(2), of(1)), (6, 2));

        let in_flight = InFlight::default();
        let started: Vec<Started> = chosen
            .iter()
            .map(|d| in_flight.start(d.endpoint_id, d.merchant_id))
            .collect();
        let (_, full_merchants) = in_flight.full(shares);
        assert_eq!(full_merchants, [*merchant(2).as_uuid()]);
        assert_eq!(in_flight.choose(&due(2, 20, 3), 10, shares), []);
        drop(started);
        assert_eq!(in_flight.choose(&due(2, 20, 3), 10, shares).len(), 3);
    }

    #[test]
    fn an_endpoint_whose_breaker_is_open_gets_one_delivery_at_a_time() {
        let in_flight = InFlight::default();
        in_flight.set_tripped(endpoint(1), true);
        let mut queue = due(1, 1, 10);
        queue.extend(due(1, 2, 10));
        let chosen = in_flight.choose(&queue, 100, SHARES);
        let to = |e| {
            chosen
                .iter()
                .filter(|d| d.endpoint_id == endpoint(e))
                .count()
        };
        assert_eq!((to(1), to(2)), (1, 4));
        let started = in_flight.start(endpoint(1), merchant(1));
        assert_eq!(in_flight.full(SHARES).0, [*endpoint(1).as_uuid()]);
        drop(started);
        in_flight.set_tripped(endpoint(1), false);
        assert_eq!(in_flight.choose(&due(1, 1, 10), 100, SHARES).len(), 4);
    }

    #[test]
    fn the_rest_of_a_closed_endpoints_window_is_settled() {
        let in_flight = InFlight::default();
        in_flight.set_tripped(endpoint(1), true);
        let mut queue = due(1, 1, 10);
        queue.extend(due(1, 2, 10));
        let chosen = in_flight.choose(&queue, 100, SHARES);
        let settle = in_flight.to_settle(&queue, &chosen);
        // The probe is chosen; its 9 others are settled, endpoint 2's left.
        assert_eq!(settle.len(), 9);
        assert!(settle.iter().all(|d| d.endpoint_id == endpoint(1)));
        assert!(settle.iter().all(|d| !chosen.contains(d)));
        in_flight.set_tripped(endpoint(1), false);
        assert_eq!(in_flight.to_settle(&queue, &chosen), []);
    }

    #[test]
    fn nothing_is_chosen_without_free_slots_or_candidates() {
        let in_flight = InFlight::default();
        assert_eq!(in_flight.choose(&due(1, 1, 3), 0, SHARES), []);
        assert_eq!(in_flight.choose(&[], 10, SHARES), []);
        assert_eq!(in_flight.choose(&due(1, 1, 3), 2, SHARES).len(), 2);
    }

    /// One merchant waits for its own turns at recording, never for
    /// another's, and a merchant with no turn held or awaited is forgotten.
    #[tokio::test]
    async fn a_merchant_waits_only_for_its_own_turns_at_recording() {
        let turns = RecordTurns::new(2);
        let first = turns.take(merchant(1)).await;
        let second = turns.take(merchant(1)).await;
        let third = turns.take(merchant(1));
        tokio::pin!(third);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(20), &mut third).await;
        assert!(waited.is_err(), "a third turn of one merchant at once");
        let other = turns.take(merchant(2)).await;
        drop(first);
        let third = third.await;
        drop((second, third, other));
        assert!(turns.merchants().is_empty());
    }
}
