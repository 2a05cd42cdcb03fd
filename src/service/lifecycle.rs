//! The life of a charge or a refund after its row exists: both are created
//! exactly once per idempotency key and finished through the processor in
//! the same way, so the one engine here runs both (`Kind` says which).
//!
//! 1. The row is inserted as `pending` with a lease and committed, before any
//!    side effect (by the kind's own `create`: a charge's insert, a refund's
//!    reservation on its charge).
//! 2. The processor is called with the row's stable downstream key, holding
//!    no database connection.
//! 3. The outcome and its outbox event are recorded in one statement
//!    (shared with the outcomes of concurrent requests, see `db::batch`).
//!
//! A request that finds a pending row whose lease ran out (its owner died or
//! got no answer) takes the lease over and repeats step 2 with the same
//! downstream key; the processor answers as it did the first time.
//!
//! What a client is told never claims less than happened:
//! - 503 (`ServiceError::Unavailable`) only before the processor was called.
//!   If the insert of step 1 may have committed although its answer was
//!   lost, a background task deletes the row again once the database
//!   answers, as long as nobody has worked on it (`forget_unconfirmed`).
//! - After the processor answered, the outcome is recorded (a final one, or
//!   an unknown one with the next recovery time, which ends our lease),
//!   retrying while the database is away, until our lease has surely run
//!   out by the database's clock too; then the answer is 202 with the row
//!   still pending, and whoever comes next takes it over at once.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rand::Rng;
use tokio::time::Instant;
use uuid::Uuid;

use crate::backoff::{self, Backoff, RECORD_RETRY};
use crate::config::{IdempotencySettings, RecoverySettings};
use crate::crash;
use crate::db::batch::{self, BatchStatement, Batcher};
use crate::db::records::{self, Stored};
use crate::db::{Conn, Database, DbError};
use crate::domain::lifecycle::Record;
use chrono::{DateTime, Utc};

use crate::domain::{IdempotencyKey, MerchantId, Outcome, Status};
use crate::metrics;
use crate::processor::{PaymentProcessor, ProcessorReply};
use crate::telemetry::{self, error_chain};
use tracing::Instrument;

use super::replay_cache::{Cached, ReplayCache};
use super::ServiceError;

/// What a client is told to wait before retrying a key that is in flight.
/// Requests normally finish in milliseconds, so a second is a fair hint even
/// though the lease itself may run longer.
pub const IN_USE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Pauses between two looks at a row in flight elsewhere: a request that
/// finishes within a few milliseconds is seen at once, a slow one costs a
/// look every 20 ms.
const IN_FLIGHT_POLLS: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));

/// Added to a lease as this process measures it before it counts as run out
/// by the database's clock too: `now()` there and the monotonic clock here
/// may drift apart a little while a lease lasts (NTP slews the wall clock by
/// up to 0.05 %, 15 ms in a 30 s lease).
const LEASE_CLOCK_MARGIN: Duration = Duration::from_millis(50);

/// What differs between the kinds of record: the processor call, and how
/// many outcomes one transaction may record. Everything else the engine
/// runs for any kind through `db::records`.
#[async_trait]
pub trait Kind: Send + Sync + 'static {
    type Record: Stored;
    /// For log lines and metrics: "charge", "refund".
    const NAME: &'static str;
    /// For metrics: the name of the batched outcome recording.
    const RECORD_OUTCOMES: &'static str;
    /// The most outcomes one transaction may record (`database.batch_rows`
    /// bounds it further); 1 records each alone.
    const OUTCOMES_PER_TRANSACTION: usize;

    async fn call_processor(
        &self,
        processor: &dyn PaymentProcessor,
        record: &Self::Record,
    ) -> ProcessorReply;
}

/// A record to answer with. `replayed` is true when the key already existed,
/// so the answer belongs to an earlier request.
#[derive(Debug)]
pub struct Reply<R> {
    pub record: R,
    pub replayed: bool,
    /// `Record::created_json`, when it is rendered already (the replay
    /// cache holds it); else whoever answers renders the record.
    pub json: Option<Arc<str>>,
}

/// A pending record whose lease we hold, and by when the lease has surely
/// run out by the database's clock too.
pub struct Leased<R> {
    pub record: R,
    pub over_by: Instant,
}

impl<R> Leased<R> {
    /// A lease of `lease` taken by a statement that has just answered: the
    /// database set `locked_until` from its `now()` before it answered, so
    /// counting from after the answer (plus a margin for clocks) never ends
    /// sooner than the row's lease. A request that gives up recording when
    /// this has passed leaves a row that the next retry takes over at once.
    fn taken_just_now(record: R, lease: Duration) -> Self {
        Self {
            record,
            over_by: Instant::now() + lease + LEASE_CLOCK_MARGIN,
        }
    }
}

/// The engine for one kind: the database (an HTTP worker's own pool), the
/// processor, the lease and retry rules. Cheap to clone.
pub struct Lifecycle<K: Kind> {
    pub(super) db: Database,
    kind: Arc<K>,
    processor: Arc<dyn PaymentProcessor>,
    /// How long a request owns a pending row before others may take over.
    pub(super) lease: Duration,
    /// How long a request waits for a concurrent one with the same key to
    /// finish before answering 409.
    in_flight_wait: Duration,
    /// How long after its first use a key replays (`retention_hours`).
    window: Duration,
    /// The recovery worker's pace after unknown outcomes.
    retry_base: Duration,
    retry_cap: Duration,
    /// Final answers by key, shared by all clones.
    replays: ReplayCache<K::Record>,
    /// Outcomes to record, batched per pool (`db::batch`).
    outcomes: Batcher<RecordOutcomes<K>>,
}

/// The outcome statement of a kind, for the batcher.
struct RecordOutcomes<K: Kind>(std::marker::PhantomData<K>);

#[async_trait]
impl<K: Kind> BatchStatement for RecordOutcomes<K> {
    type Item = (K::Record, Outcome);
    type Output = Option<K::Record>;

    fn name(&self) -> &'static str {
        K::RECORD_OUTCOMES
    }

    fn merchant(&self, (record, _): &Self::Item) -> MerchantId {
        record.merchant()
    }

    async fn run(&self, conn: &Conn, items: &[Self::Item]) -> Result<Vec<Self::Output>, DbError> {
        records::record_outcomes(conn, items).await
    }
}

fn outcome_batcher<K: Kind>(db: &Database) -> Batcher<RecordOutcomes<K>> {
    let rows = db.batch_rows().min(K::OUTCOMES_PER_TRANSACTION);
    Batcher::with_limits(
        db.clone(),
        RecordOutcomes(std::marker::PhantomData),
        rows,
        batch::slots(db),
    )
}

impl<K: Kind> Clone for Lifecycle<K> {
    fn clone(&self) -> Self {
        Self {
            db: self.db.clone(),
            kind: self.kind.clone(),
            processor: self.processor.clone(),
            lease: self.lease,
            in_flight_wait: self.in_flight_wait,
            window: self.window,
            retry_base: self.retry_base,
            retry_cap: self.retry_cap,
            replays: self.replays.clone(),
            outcomes: self.outcomes.clone(),
        }
    }
}

impl<K: Kind> Lifecycle<K> {
    pub fn new(
        kind: K,
        db: Database,
        processor: Arc<dyn PaymentProcessor>,
        idempotency: &IdempotencySettings,
        recovery: &RecoverySettings,
    ) -> Self {
        let kind = Arc::new(kind);
        Self {
            outcomes: outcome_batcher(&db),
            db,
            kind,
            processor,
            lease: idempotency.lease,
            in_flight_wait: idempotency.in_flight_wait,
            window: idempotency.retention(),
            retry_base: recovery.interval,
            retry_cap: recovery.max_backoff,
            replays: ReplayCache::new(idempotency.replay_cache_bytes, idempotency.retention()),
        }
    }

    /// The same engine on another pool (each HTTP worker thread has its own):
    /// its statements and its outcome batches both move.
    pub fn with_database(&self, db: Database) -> Self {
        let mut moved = self.clone();
        moved.outcomes = outcome_batcher(&db);
        moved.db = db;
        moved
    }

    pub fn kind(&self) -> &K {
        &self.kind
    }

    pub async fn find(&self, merchant: MerchantId, id: Uuid) -> Result<K::Record, ServiceError> {
        let conn = self.db.conn().await?;
        records::find(&conn, merchant, id)
            .await?
            .ok_or(ServiceError::NotFound)
    }

    /// When the replay window of the key that created `record` ends: its
    /// id's time (the database's, `crate::clock`) and `retention_hours`.
    pub fn window_end(&self, record: &K::Record) -> DateTime<Utc> {
        record.id_time() + chrono::Duration::from_std(self.window).unwrap_or(chrono::Duration::MAX)
    }

    /// Refuses to go on with an existing record whose key's replay window
    /// has ended (422 `idempotency_key_expired`): neither processed nor
    /// replayed, whatever was sent. The key stays held until the sweeper
    /// releases it (`idempotency.expired_key_hold_days`).
    pub fn refuse_if_expired(&self, record: &K::Record) -> Result<(), ServiceError> {
        let window_ended = self.window_end(record);
        if window_ended > crate::clock::now() {
            return Ok(());
        }
        outcome::<K>("expired");
        Err(ServiceError::KeyExpired {
            object: record.public_id(),
            window_ended,
        })
    }

    /// The error for a key reused with another request, counted with the
    /// fields that differ (`None`: they cannot be told).
    pub fn reused(&self, differing_fields: Option<Vec<String>>) -> ServiceError {
        outcome::<K>("reused_mismatch");
        metrics::mismatched_fields(K::NAME, differing_fields.as_deref().unwrap_or_default());
        ServiceError::KeyReused { differing_fields }
    }

    /// The record `key` created, as it is now; `None` if the key names
    /// nothing (never used, or released). Reads one row, by the unique key:
    /// no lease, no processor call.
    pub async fn find_by_key(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
    ) -> Result<Option<K::Record>, ServiceError> {
        let conn = self.db.conn().await?;
        let found: Option<K::Record> = records::find_by_key(&conn, merchant, key).await?;
        metrics::key_lookup(K::NAME, found.is_some());
        Ok(found)
    }

    /// The final record `key` led to, if it is in the replay cache. The
    /// caller still compares the request with it, as with a row.
    pub fn cached(&self, merchant: MerchantId, key: &IdempotencyKey) -> Option<Cached<K::Record>> {
        let found = self.replays.get(merchant, key);
        metrics::replay_cache(K::NAME, if found.is_some() { "hit" } else { "miss" });
        found
    }

    /// Answers with a cached record (see `cached`).
    pub fn replay(&self, cached: Cached<K::Record>) -> Reply<K::Record> {
        telemetry::record("id", &cached.record.public_id());
        outcome::<K>("replayed");
        Reply {
            record: cached.record,
            replayed: true,
            json: Some(cached.json),
        }
    }

    /// Keeps a reply for later replays if it is final, and gives it the
    /// JSON kept, so its own answer is rendered only once.
    pub fn remember(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
        reply: &mut Reply<K::Record>,
    ) {
        reply.json = self.replays.remember(merchant, key, &reply.record);
    }

    /// Goes on from a row the key led to: ours and new (process it), final
    /// (replay it) or pending (resume it). `None`: the row vanished while we
    /// looked (its insert was undone); the caller starts over.
    ///
    /// Call it as soon as the statement that found or inserted the row has
    /// answered: a new row's lease is counted from here.
    pub async fn continue_with(
        &self,
        record: K::Record,
        created: bool,
    ) -> Result<Option<Reply<K::Record>>, ServiceError> {
        telemetry::record("id", &record.public_id());
        if created {
            outcome::<K>("created");
            let leased = Leased::taken_just_now(record, self.lease);
            return self.process(leased, false).await.map(Some);
        }
        if record.status() != Status::Pending {
            outcome::<K>("replayed");
            return Ok(Some(Reply {
                record,
                replayed: true,
                json: None,
            }));
        }
        self.resume(record).await
    }

    /// A pending row found by a retry or a concurrent duplicate. If its lease
    /// ran out, take it over and finish it. If it is in flight elsewhere,
    /// wait up to `in_flight_wait` for that request to finish and answer
    /// with its result; only then give up with 409.
    async fn resume(&self, record: K::Record) -> Result<Option<Reply<K::Record>>, ServiceError> {
        let deadline = Instant::now() + self.in_flight_wait;
        let mut pauses = IN_FLIGHT_POLLS.pauses();
        let mut waited = false;
        loop {
            let found = {
                let conn = self.db.conn().await?;
                records::take_over_or_read(&conn, record.merchant(), record.uuid(), self.lease)
                    .await?
            };
            let Some((current, taken)) = found else {
                return Ok(None);
            };
            if taken {
                outcome::<K>("taken_over");
                metrics::lease_takeover(K::NAME);
                let leased = Leased::taken_just_now(current, self.lease);
                return self.process(leased, true).await.map(Some);
            }
            if current.status() != Status::Pending {
                outcome::<K>(if waited {
                    "in_flight_waited"
                } else {
                    "replayed"
                });
                return Ok(Some(Reply {
                    record: current,
                    replayed: true,
                    json: None,
                }));
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                outcome::<K>("in_use");
                return Err(ServiceError::KeyInUse {
                    retry_after: IN_USE_RETRY_AFTER,
                });
            }
            waited = true;
            tokio::time::sleep(pauses.next_pause().min(remaining)).await;
        }
    }

    /// Steps 2 and 3 for a row whose lease we hold. Runs as its own task so
    /// a client that hangs up mid-request cannot cancel it between the
    /// processor's answer and the outcome's commit.
    async fn process(
        &self,
        leased: Leased<K::Record>,
        replayed: bool,
    ) -> Result<Reply<K::Record>, ServiceError> {
        let this = self.clone();
        // The task logs in the request's span, though it may outlive it.
        let task = tokio::spawn(
            async move {
                let record = this.call_processor_and_record(leased).await?;
                Ok(Reply {
                    record,
                    replayed,
                    json: None,
                })
            }
            .instrument(tracing::Span::current()),
        );
        task.await.map_err(ServiceError::TaskFailed)?
    }

    /// Undoes, in the background, an insert whose commit was not confirmed,
    /// so the 503 its request gets stays true: the row goes unless someone
    /// has started to work on it.
    ///
    /// The insert may still be on its way (held in a stalled network, it
    /// executes when the partition heals), so not finding the row proves
    /// nothing: the task keeps looking for twice the lease. A row that lands
    /// within that window is deleted long before its own lease lets the
    /// recovery worker claim it. One that lands later still (a partition of
    /// more than two leases with this insert in flight) is finished by the
    /// worker like any abandoned one; the README says so.
    pub fn forget_unconfirmed(&self, merchant: MerchantId, uuid: Uuid, id: String) {
        let this = self.clone();
        let until = Instant::now() + self.lease * 2;
        tokio::spawn(async move {
            let mut pauses = RECORD_RETRY.pauses();
            while Instant::now() < until {
                let forgotten = async {
                    let conn = this.db.conn().await?;
                    records::forget_unconfirmed::<K::Record>(&conn, merchant, uuid).await
                }
                .await;
                match forgotten {
                    Ok(true) => {
                        tracing::warn!(kind = K::NAME, %id, "undid an insert whose commit was unconfirmed");
                        return;
                    }
                    Ok(false) => {}
                    Err(error) => {
                        tracing::debug!(kind = K::NAME, %id, error = %error_chain(&error), "cannot undo an unconfirmed insert yet");
                    }
                }
                tokio::time::sleep(pauses.next_pause()).await;
            }
        });
    }

    /// Finishes abandoned rows (pending, lease run out, backoff passed)
    /// through the same path a request takes; returns how many it claimed.
    /// Used by the recovery worker.
    pub async fn recover_abandoned(&self, batch: i64) -> Result<usize, ServiceError> {
        let claimed = {
            let conn = self.db.conn().await?;
            records::claim_abandoned::<K::Record>(&conn, self.lease, batch).await?
        };
        let count = claimed.len();
        metrics::recovery_claims(K::NAME, count);
        let results = futures_util::future::join_all(claimed.into_iter().map(|record| {
            let span = tracing::info_span!("recover", kind = K::NAME, id = %record.public_id());
            self.call_processor_and_record(Leased::taken_just_now(record, self.lease))
                .instrument(span)
        }))
        .await;
        for result in results {
            match result {
                Ok(record) if record.status() == Status::Pending => {
                    tracing::info!(kind = K::NAME, id = %record.public_id(), attempts = record.lease().processor_attempts, "still pending after recovery attempt")
                }
                Ok(record) => {
                    tracing::info!(kind = K::NAME, id = %record.public_id(), status = record.status().as_str(), "recovered")
                }
                Err(error) => {
                    tracing::warn!(kind = K::NAME, error = %error_chain(&error), "recovery attempt failed")
                }
            }
        }
        Ok(count)
    }

    /// Steps 2 and 3, for a row whose lease the caller holds.
    async fn call_processor_and_record(
        &self,
        leased: Leased<K::Record>,
    ) -> Result<K::Record, ServiceError> {
        crash::point("after_pending_commit");
        let record = &leased.record;
        let asked = Instant::now();
        let reply = self
            .kind
            .call_processor(self.processor.as_ref(), record)
            .instrument(tracing::info_span!("processor", operation = K::NAME))
            .await;
        metrics::processor_call(K::NAME, classify(&reply), asked.elapsed());
        crash::point("after_processor_reply");
        match reply {
            ProcessorReply::Final(outcome) => self.record_final(&leased, &outcome).await,
            ProcessorReply::Unknown { reason, attention } => {
                let id = record.public_id();
                if attention {
                    tracing::error!(kind = K::NAME, %id, %reason, "processor outcome unknown and needs attention; stays pending");
                } else {
                    tracing::warn!(kind = K::NAME, %id, %reason, "processor outcome unknown; stays pending");
                }
                let retry_in = retry_delay(
                    record.lease().processor_attempts,
                    Backoff::new(self.retry_base, self.retry_cap),
                    rand::thread_rng().gen(),
                );
                // Recording it ends our lease, so a retry need not wait
                // for the lease to run out: worth trying while it lasts.
                let recorded = self
                    .record_within_lease(&leased, "an unknown outcome", move || async move {
                        let conn = self.db.conn().await?;
                        records::record_unknown(&conn, record, retry_in).await
                    })
                    .await;
                match recorded {
                    Ok(Some(Some(recorded))) => Ok(recorded),
                    // The lease was no longer ours: someone took it over.
                    Ok(Some(None)) => Ok(leased.record),
                    Ok(None) => {
                        tracing::warn!(kind = K::NAME, %id, "cannot record an unknown outcome within the lease; it has run out, so the next retry or the worker goes on at once");
                        Ok(leased.record)
                    }
                    Err(error) => {
                        tracing::warn!(kind = K::NAME, %id, error = %error_chain(&error), "cannot record an unknown outcome; the lease will run out");
                        Ok(leased.record)
                    }
                }
            }
        }
    }

    /// The outcome is known and must not be lost: keep trying to record it
    /// while the lease lasts. Never calls the processor again for it.
    async fn record_final(
        &self,
        leased: &Leased<K::Record>,
        outcome: &Outcome,
    ) -> Result<K::Record, ServiceError> {
        let record = &leased.record;
        let recorded = self
            .record_within_lease(leased, "the processor's answer", move || async move {
                match self.outcomes.run((record.clone(), outcome.clone())).await? {
                    Some(recorded) => Ok(Some(recorded)),
                    // Someone else recorded it first (the processor gave them
                    // the same answer) or took the lease over: show the row
                    // as it is now.
                    None => {
                        let conn = self.db.conn().await?;
                        records::find(&conn, record.merchant(), record.uuid()).await
                    }
                }
            })
            .await?;
        match recorded {
            Some(recorded) => {
                crash::point("after_outcome_commit");
                recorded.ok_or(ServiceError::NotFound)
            }
            None => {
                tracing::error!(kind = K::NAME, id = %record.public_id(), "processor answered but the outcome could not be recorded within the lease; answering pending");
                Ok(leased.record.clone())
            }
        }
    }

    /// Runs `record`, a statement that records what the processor said and
    /// so ends our lease, retrying while the database is away, until it
    /// gets through or the lease has surely run out (`Ok(None)`). Only then
    /// may the request answer 202: a retry that follows finds the lease
    /// over and takes it at once, never 409. Errors other than the
    /// database being away end it at once.
    async fn record_within_lease<T, F, Fut>(
        &self,
        leased: &Leased<K::Record>,
        what: &str,
        record: F,
    ) -> Result<Option<T>, DbError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, DbError>>,
    {
        let mut pauses = RECORD_RETRY.pauses();
        loop {
            match record().await {
                Ok(recorded) => return Ok(Some(recorded)),
                Err(error) if error.is_transient() => {
                    let id = leased.record.public_id();
                    tracing::warn!(kind = K::NAME, %id, error = %error_chain(&error), "cannot record {what} yet");
                    let remaining = leased.over_by.saturating_duration_since(Instant::now());
                    if remaining.is_zero() {
                        return Ok(None);
                    }
                    tokio::time::sleep(pauses.next_pause().min(remaining)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Counts what a key led to, and notes it on the request's span.
fn outcome<K: Kind>(outcome: &'static str) {
    telemetry::record("idempotency", &outcome);
    metrics::idempotency(K::NAME, outcome);
}

/// A processor answer as a metric label.
fn classify(reply: &ProcessorReply) -> &'static str {
    match reply {
        ProcessorReply::Final(Outcome::Succeeded { .. }) => "succeeded",
        ProcessorReply::Final(Outcome::Declined { code, .. })
            if code == crate::processor::PROCESSOR_REJECTED =>
        {
            "rejected"
        }
        ProcessorReply::Final(Outcome::Declined { .. }) => "declined",
        ProcessorReply::Unknown {
            attention: true, ..
        } => "attention",
        ProcessorReply::Unknown { .. } => "unknown",
    }
}

/// How long the recovery worker waits after the `attempts + 1`-th call
/// without a final answer: the pace's pause after that many failures, then
/// a random share of it between a half and all (`jitter` in 0..1), so rows
/// that failed together do not come back together.
pub fn retry_delay(attempts: i32, pace: Backoff, jitter: f64) -> Duration {
    let failures = u32::try_from(attempts.saturating_add(1)).unwrap_or(0);
    backoff::equal_jitter(pace.after(failures), jitter)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;
    use crate::config::Settings;
    use crate::processor::simulated::SimulatedProcessor;
    use crate::service::charges::ChargeKind;

    #[tokio::test]
    async fn with_database_moves_its_statements_and_its_outcome_batches_to_the_new_pool() {
        let settings = Settings::load_from(Path::new("/nonexistent-config-dir"), &HashMap::new())
            .expect("the embedded defaults load");
        // Building a pool connects to nothing; the sizes tell them apart.
        let pool = |size| Database::new(&settings.database, size).expect("a pool");
        let flow = Lifecycle::new(
            ChargeKind,
            pool(3),
            Arc::new(SimulatedProcessor::new(Duration::ZERO)),
            &settings.idempotency,
            &settings.recovery,
        );
        let moved = flow.with_database(pool(5));
        let size = |db: &Database| db.pool().status().max_size;
        assert_eq!(size(&moved.db), 5);
        assert_eq!(size(moved.outcomes.database()), 5);
        assert_eq!(
            size(flow.outcomes.database()),
            3,
            "the original keeps its pool"
        );
        assert_eq!(moved.lease, flow.lease);
        assert_eq!(moved.in_flight_wait, flow.in_flight_wait);
    }

    #[test]
    fn the_retry_delay_doubles_up_to_the_cap_with_jitter() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_millis(1000);
        let pace = Backoff::new(base, cap);
        let delays: Vec<_> = (0..6).map(|n| retry_delay(n, pace, 1.0)).collect();
        assert_eq!(
            delays,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        assert_eq!(retry_delay(2, pace, 0.0), Duration::from_millis(200));
        assert_eq!(retry_delay(2, pace, 0.5), Duration::from_millis(300));
        assert_eq!(retry_delay(1000, pace, 1.0), cap);
        assert_eq!(retry_delay(-3, pace, 1.0), base);
    }
}
