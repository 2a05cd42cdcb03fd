//! The dispatcher: the outbox delivered to the merchants' webhook endpoints,
//! at least once, without any merchant slowing down another's. Run by
//! `workers::dispatcher` in every instance; the instances share the work
//! through the database alone.
//!
//! 1. **Fan-out** (`db::events::QUEUED`, then `FAN_OUT` per event): due
//!    queued events become one pending delivery per live endpoint that
//!    wants their type, each event atomically and by a statement inserting
//!    at most `webhooks.max_endpoints_per_merchant` rows. A batch of events
//!    goes in one transaction; one that fails (or times out) is tried again
//!    in halves, and an event that fails on its own is set aside
//!    (`SET_ASIDE`: counted, logged with its id, tried again after a
//!    backoff), so the events behind it go on.
//! 2. **Claim** (`db::webhook_deliveries::DUE`, then `CLAIM` per delivery):
//!    due deliveries, chosen fairly (`fair`): merchant by merchant in turn,
//!    no endpoint with more than `webhooks.max_in_flight_per_endpoint` in
//!    flight on this instance, no merchant with more than half of its
//!    slots. A full window of candidates whose merchants cannot take the
//!    free slots is read past (`choose_due`), so one merchant's backlog
//!    never hides another's deliveries behind it. Each is leased for
//!    `webhooks.timeout_ms` + 5 s, held back while its endpoint's circuit
//!    breaker says so, or given up if its endpoint was deleted or disabled.
//!    No other instance claims a leased delivery, so a delivery is never
//!    being sent twice at the same time. The rest of the candidates to
//!    endpoints known closed are then settled together (`HOLD`,
//!    `GIVE_UP`), so a merchant's backlog behind a dead endpoint leaves the
//!    due deliveries in a few rounds rather than one a round.
//! 3. **Attempt** (`webhooks::Sender`), holding no database connection and
//!    no transaction: the receiver's time is never the database's.
//! 4. **Record** (`db::webhook_deliveries::RECORD_ATTEMPT`, one statement):
//!    the attempt, and the delivery's new state (delivered on 2xx; else
//!    pending again after a backoff with full jitter, or failed after
//!    `webhooks.max_attempts`), matched by our exact lease. Then the
//!    endpoint's circuit breaker (`db::webhook_endpoints::FAILED`,
//!    `RECOVERED`, `DISABLE`): after `webhooks.trip_after_failures` failures
//!    in a row its deliveries wait for a growing pause, after which one
//!    delivery at a time probes it (per instance), and after
//!    `webhooks.disable_after_ms` of failing it is disabled, with a
//!    `webhook_endpoint.disabled` event for its merchant. A merchant's
//!    records take at most all but one of the records' connections at once
//!    (`fair::RecordTurns`): one whose records are slow (its endpoint's row
//!    locked) leaves a connection to the others, whose attempts would
//!    otherwise keep their endpoints' shares while they wait.
//!
//! If the process dies between 3 and 4, the delivery comes due again when
//! its lease runs out and is sent again, with the same `webhook-id`:
//! receivers deduplicate by it. That duplicate is the price of at-least-once;
//! nothing is ever lost, since an event leaves the outbox only by retention,
//! and retention takes only events with no pending delivery.
//!
//! Nothing here touches `charges`: the dispatcher has its own pools (whose
//! statements the server cancels before the client would give up on them,
//! `database_settings`), and the fan-out's row locks are on the event queue
//! only. The rounds (steps 1 and 2) have a connection of their own, apart
//! from the records of step 4: deliveries started together end together
//! (a merchant's hanging receivers all reach `webhooks.timeout_ms` in the
//! same moment), and the burst of records and breaker updates that follows
//! must not hold up the next round, which starts every other merchant's
//! events. Sharing one pool, 50 timed-out deliveries of one merchant held
//! another's next events 0.4 s on an idle Citus cluster and 1.3 s under
//! CI's load (`tests/api/webhooks/isolation.rs` has each of these cases).

mod fair;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

use crate::backoff::{equal_jitter, full_jitter, Backoff, RECORD_RETRY};
use crate::config::{DatabaseSettings, WebhookSettings};
use crate::db::events::QueuedEvent;
use crate::db::webhook_deliveries::{AttemptRecord, Claim, ClaimedDelivery, DueDelivery};
use crate::db::{self, Database, DbError};
use crate::domain::DeliveryStatus;
use crate::metrics;
use crate::telemetry::error_chain;
use crate::webhooks::{AttemptOutcome, Sender};

use self::fair::{InFlight, RecordTurns, Shares};
use super::ServiceError;

/// What one round did, and whether there is probably more to do at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Round {
    /// Queued events the fan-out looked at.
    pub events_dispatched: i64,
    pub deliveries_created: u64,
    pub deliveries_started: usize,
    /// A full batch was fanned out, or a full window of due deliveries was
    /// read and some were taken: go again without waiting.
    pub busy: bool,
}

/// The fan-out and the delivery of webhooks. Cheap to clone.
#[derive(Clone)]
pub struct Dispatcher {
    /// The rounds' pool: fan-out and claim, one statement at a time.
    rounds: Database,
    /// The attempts' pool: their records and the circuit breakers, each
    /// merchant's at most all but one of its connections at once.
    records: Database,
    record_turns: RecordTurns,
    sender: Sender,
    settings: WebhookSettings,
    /// One permit per delivery being attempted, `webhooks.batch_size` in
    /// all: a slow receiver holds its own permit, not a whole batch.
    permits: Arc<Semaphore>,
    /// The deliveries in flight by endpoint and merchant, for their shares.
    in_flight: InFlight,
}

impl Dispatcher {
    /// `rounds` and `records` should be pools of their own, so deliveries
    /// never wait for the request handlers' connections, nor they for ours,
    /// and a burst of records never delays a round; the rounds hold one
    /// connection at a time.
    pub fn new(
        rounds: Database,
        records: Database,
        sender: Sender,
        settings: WebhookSettings,
    ) -> Self {
        let connections = records.pool().status().max_size;
        Self {
            rounds,
            record_turns: RecordTurns::new(connections.saturating_sub(1)),
            records,
            sender,
            permits: Arc::new(Semaphore::new(slots(&settings))),
            settings,
            in_flight: InFlight::default(),
        }
    }

    /// One round: fan out a batch of new events, then start attempts for as
    /// many due deliveries as there are free permits and fair shares. The
    /// attempts run on in the background; `drain` waits for them.
    pub async fn round(&self) -> Result<Round, ServiceError> {
        let (events, deliveries_created) = self.fan_out().await?;
        let free = self.permits.available_permits();
        let (started, claim_busy) = if free == 0 {
            (0, false)
        } else {
            self.start_due(free).await?
        };
        Ok(Round {
            events_dispatched: events as i64,
            deliveries_created,
            deliveries_started: started,
            busy: events as i64 >= self.settings.batch_size || claim_busy,
        })
    }

    /// Fans out up to a batch of due queued events; returns how many were
    /// looked at and how many deliveries were created. A failed batch is
    /// split in halves and each tried again; an event that fails alone is
    /// set aside. A database out of reach ends the round instead, as do
    /// more failures than one or two bad events explain.
    async fn fan_out(&self) -> Result<(usize, u64), ServiceError> {
        let queued = {
            let conn = self.rounds.conn().await?;
            db::events::queued(&conn, self.settings.batch_size).await?
        };
        let max_endpoints = i64::from(self.settings.max_endpoints_per_merchant);
        let mut created = 0;
        let mut failures_left = failure_budget(queued.len());
        // Last in, first out: the halves go in the queue's order.
        let mut work: Vec<&[QueuedEvent]> = vec![&queued];
        while let Some(batch) = work.pop() {
            if batch.is_empty() {
                continue;
            }
            let fanned = async {
                let conn = self.rounds.conn().await?;
                db::events::fan_out(&conn, batch, max_endpoints).await
            }
            .await;
            let error = match fanned {
                Ok(deliveries) => {
                    created += deliveries;
                    continue;
                }
                Err(error) if database_away(&error) || failures_left == 0 => {
                    return Err(error.into())
                }
                Err(error) => error,
            };
            failures_left -= 1;
            match batch {
                [event] => self.set_aside(event, &error).await?,
                _ => {
                    tracing::debug!(events = batch.len(), error = %error_chain(&error), "a fan-out batch failed; trying it in halves");
                    let (first, second) = batch.split_at(batch.len() / 2);
                    work.push(second);
                    work.push(first);
                }
            }
        }
        Ok((queued.len(), created))
    }

    /// Sets `event` aside after its fan-out failed on its own with `error`.
    async fn set_aside(&self, event: &QueuedEvent, error: &DbError) -> Result<(), ServiceError> {
        let failures = u32::try_from(event.attempts).unwrap_or(0) + 1;
        let retry_in = equal_jitter(
            Backoff::new(self.settings.backoff_base, self.settings.max_backoff).after(failures),
            rand::random(),
        );
        let reason = error_chain(error);
        let conn = self.rounds.conn().await?;
        let set = db::events::set_aside(&conn, event, retry_in, &reason).await?;
        // Locked: a fan-out of it (or one being undone) still holds it; it
        // is tried again as it is.
        if let Some(failures) = set {
            metrics::webhook_events_set_aside(1);
            tracing::warn!(
                event = %event.event_id, merchant = %event.merchant_id, failures,
                retry_in_ms = retry_in.as_millis() as u64, error = %reason,
                "an event's fan-out failed on its own; set aside, the events behind it go on"
            );
        }
        Ok(())
    }

    /// Claims up to `free` due deliveries, chosen fairly, and starts an
    /// attempt of each; returns how many it started, and whether it read a
    /// full window and took something (then more may be ready at once).
    async fn start_due(&self, free: usize) -> Result<(usize, bool), ServiceError> {
        let lease = self.settings.lease();
        // Our clock's view of the lease ends no later than the database's.
        let lease_ends = Instant::now() + lease;
        let (full_window, claim, settled) = {
            let conn = self.rounds.conn().await?;
            let (due, chosen, full_window) = self.choose_due(&conn, free).await?;
            let claim = db::webhook_deliveries::claim(&conn, lease, &chosen).await?;
            // Closed, whichever instance found it so: no attempt goes there
            // now, one delivery a round is checked (a probe, when the
            // breaker's pause ends), and the rest of its window is settled.
            // A deleted or disabled endpoint stays in the set for good (an
            // id each; only a delivered attempt takes one out).
            for endpoint in &claim.closed {
                self.in_flight.set_tripped(*endpoint, true);
            }
            let rest = self.in_flight.to_settle(&due, &chosen);
            let settled = if rest.is_empty() {
                Claim::default()
            } else {
                db::webhook_deliveries::settle(&conn, &rest).await?
            };
            (full_window, claim, settled)
        };
        self.report(&claim);
        self.report(&settled);
        let taken = claim.taken() + settled.taken();
        let mut started = 0;
        for delivery in claim.deliveries {
            // Only this task takes permits, and it chose no more than were
            // free: this cannot fail. If it ever did, the delivery's lease
            // runs out and it comes due again.
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                tracing::error!("no free delivery permit for a claimed delivery");
                continue;
            };
            // What the claim saw of the endpoint's breaker, which another
            // instance may have opened.
            if delivery.endpoint_failures >= self.settings.trip_after_failures {
                self.in_flight.set_tripped(delivery.endpoint_id, true);
            }
            let in_flight = self
                .in_flight
                .start(delivery.endpoint_id, delivery.merchant_id);
            let this = self.clone();
            tokio::spawn(async move {
                this.attempt(&delivery, lease_ends).await;
                drop(in_flight);
                drop(permit);
            });
            started += 1;
        }
        Ok((started, taken > 0 && full_window))
    }

    /// Reads due deliveries (`DUE`) and chooses up to `free` of them fairly;
    /// returns what it read, what it chose, and whether the last read
    /// filled its window. A full window may hide other merchants' due
    /// deliveries behind its own: when its merchants could not take all the
    /// free slots, it reads on past them (at most `DUE_READS` times a
    /// round). Without that, a merchant with a backlog whose deliveries end
    /// quickly, below its share whenever a round reads, filled every window
    /// with its backlog. Once the rounds stopped waiting for the records
    /// (their own connection, `RecordTurns`), that was every round on
    /// Citus, where a round takes longer than such a delivery: another
    /// merchant's events waited 50 s behind a backlog of 10,000. (Before,
    /// rounds slowed by B's records read B at its share often enough:
    /// 0.5 s.)
    async fn choose_due(
        &self,
        conn: &db::Conn,
        free: usize,
    ) -> Result<(Vec<DueDelivery>, Vec<DueDelivery>, bool), DbError> {
        let shares = self.shares();
        let (full_endpoints, mut passed) = self.in_flight.full(shares);
        let (mut due, mut chosen) = (Vec::new(), Vec::new());
        for _ in 0..DUE_READS {
            // Read more than there are slots: some candidates belong to
            // endpoints or merchants that reach their share on the way.
            let left = free - chosen.len();
            let window = i64::try_from(left.saturating_mul(2)).unwrap_or(i64::MAX);
            let read = db::webhook_deliveries::due(conn, window, &full_endpoints, &passed).await?;
            // Its merchants are not in `passed`, nor in an earlier read:
            // their counts are not changed by what was chosen before.
            chosen.extend(self.in_flight.choose(&read, left, shares));
            let full_window = read.len() as i64 >= window;
            passed.extend(read.iter().map(|delivery| *delivery.merchant_id.as_uuid()));
            passed.sort_unstable();
            passed.dedup();
            due.extend(read);
            if !full_window || chosen.len() >= free {
                return Ok((due, chosen, full_window));
            }
        }
        Ok((due, chosen, true))
    }

    fn shares(&self) -> Shares {
        Shares {
            per_endpoint: self.settings.max_in_flight_per_endpoint,
            per_merchant: self.settings.max_in_flight_per_merchant(),
        }
    }

    /// Counts and logs the deliveries a claim held back or gave up.
    fn report(&self, claim: &Claim) {
        if claim.held > 0 {
            metrics::webhook_deliveries_held(claim.held);
            tracing::debug!(
                deliveries = claim.held,
                "held back deliveries to endpoints whose circuit breaker is open"
            );
        }
        for (reason, given_up) in [
            ("endpoint_deleted", claim.endpoint_deleted),
            ("endpoint_disabled", claim.endpoint_disabled),
        ] {
            if given_up > 0 {
                metrics::webhook_deliveries_failed(reason, given_up);
                tracing::info!(
                    deliveries = given_up,
                    reason,
                    "gave up deliveries to deleted or disabled webhook endpoints"
                );
            }
        }
    }

    /// Sends one delivery, records the attempt, and tells the endpoint's
    /// circuit breaker.
    async fn attempt(&self, delivery: &ClaimedDelivery, lease_ends: Instant) {
        let outcome = self
            .sender
            .send(&delivery.url, &delivery.secret, &delivery.event)
            .await;
        metrics::webhook_attempt(outcome.kind.as_str(), outcome.duration);
        let _turn = self.record_turns.take(delivery.merchant_id).await;
        self.record(delivery, &outcome, lease_ends).await;
        self.breaker(delivery, &outcome).await;
    }

    /// Records the attempt, trying again while the database is away and
    /// the lease lasts.
    async fn record(
        &self,
        delivery: &ClaimedDelivery,
        outcome: &AttemptOutcome,
        lease_ends: Instant,
    ) {
        let number = delivery.attempts + 1;
        let record = AttemptRecord {
            delivered: outcome.delivered(),
            status_code: outcome.status_code.map(i32::from),
            error: outcome.error.as_deref(),
            duration_ms: i32::try_from(outcome.duration.as_millis()).unwrap_or(i32::MAX),
            max_attempts: i32::try_from(self.settings.max_attempts).unwrap_or(i32::MAX),
            retry_in: backoff(
                number,
                self.settings.backoff_base,
                self.settings.max_backoff,
                rand::random(),
            ),
        };
        let event = delivery.event.id.to_string();
        let endpoint = delivery.endpoint_id.to_string();
        // The attempt is over; what is left is telling the database. While
        // it is away, keep trying as long as the lease lasts: after that,
        // another instance may be sending this delivery again, and our
        // record would no longer match its lease anyway.
        let mut pauses = RECORD_RETRY.pauses();
        let mut pause = pauses.next_pause();
        loop {
            let recorded = async {
                let conn = self.records.conn().await?;
                db::webhook_deliveries::record_attempt(&conn, delivery, &record).await
            }
            .await;
            match recorded {
                Ok(Some(recorded)) => {
                    match recorded.status {
                        DeliveryStatus::Delivered => {
                            tracing::debug!(%event, %endpoint, attempt = number, "webhook delivered")
                        }
                        DeliveryStatus::Pending => tracing::info!(
                            %event, %endpoint, attempt = number,
                            status = ?outcome.status_code, error = outcome.error.as_deref().unwrap_or(""),
                            next_attempt_at = %recorded.next_attempt_at,
                            "webhook attempt failed; will retry"
                        ),
                        DeliveryStatus::Failed => {
                            metrics::webhook_deliveries_failed("max_attempts", 1);
                            tracing::warn!(
                                %event, %endpoint, attempts = recorded.attempts,
                                status = ?outcome.status_code, error = outcome.error.as_deref().unwrap_or(""),
                                "webhook delivery failed for good (webhooks.max_attempts)"
                            )
                        }
                    }
                    return;
                }
                Ok(None) => {
                    tracing::warn!(%event, %endpoint, attempt = number, "webhook attempt not recorded: its lease had run out");
                    return;
                }
                Err(error) if error.is_transient() && Instant::now() + pause < lease_ends => {
                    tracing::debug!(%event, %endpoint, error = %error_chain(&error), "cannot record a webhook attempt yet; retrying");
                    tokio::time::sleep(pause).await;
                    pause = pauses.next_pause();
                }
                Err(error) => {
                    tracing::warn!(%event, %endpoint, error = %error_chain(&error), "cannot record a webhook attempt; the delivery comes due again when its lease runs out");
                    return;
                }
            }
        }
    }

    /// The endpoint's circuit breaker after an attempt: a delivered one ends
    /// its run of failures; a failed one adds to it, trips the breaker from
    /// `trip_after_failures` on (its deliveries then wait for a pause that
    /// grows like a delivery's backoff) and disables the endpoint once it
    /// has failed for `disable_after`. One try: a failure to say so is
    /// logged, and the next attempt's outcome says it again.
    async fn breaker(&self, delivery: &ClaimedDelivery, outcome: &AttemptOutcome) {
        let endpoint = delivery.endpoint_id;
        let merchant = delivery.merchant_id;
        let told = async {
            let conn = self.records.conn().await?;
            if outcome.delivered() {
                self.in_flight.set_tripped(endpoint, false);
                // Only an endpoint that was failing has a run to end.
                if delivery.endpoint_failures > 0
                    && db::webhook_endpoints::recovered(&conn, merchant, endpoint).await?
                {
                    tracing::info!(%endpoint, %merchant, "webhook endpoint delivers again; circuit breaker closed");
                }
                return Ok(());
            }
            let trip_after = self.settings.trip_after_failures;
            // The run as the claim saw it, plus this failure; concurrent
            // attempts may have added to it, which only makes the pause
            // shorter than it could be.
            let failures = delivery.endpoint_failures.saturating_add(1);
            let pause = breaker_pause(
                failures,
                trip_after,
                self.settings.backoff_base,
                self.settings.max_backoff,
                rand::random(),
            );
            let disable_after = self.settings.disable_after;
            let Some(failing) = db::webhook_endpoints::failed(
                &conn,
                merchant,
                endpoint,
                trip_after,
                pause,
                disable_after,
            )
            .await?
            else {
                return Ok(());
            };
            if failing.failures >= trip_after {
                self.in_flight.set_tripped(endpoint, true);
            }
            if failing.failures == trip_after {
                metrics::webhook_endpoints_tripped(1);
                tracing::warn!(
                    %endpoint, %merchant, failures = failing.failures,
                    pause_ms = pause.as_millis() as u64,
                    "webhook endpoint keeps failing; circuit breaker open, its attempts are spaced out"
                );
            }
            if failing.failing_too_long
                && db::webhook_endpoints::disable(&conn, &failing.endpoint, disable_after).await?
            {
                metrics::webhook_endpoints_disabled(1);
                tracing::warn!(
                    %endpoint, %merchant, failures = failing.failures,
                    "webhook endpoint disabled: it kept failing for webhooks.disable_after_ms"
                );
            }
            Ok::<(), DbError>(())
        }
        .await;
        if let Err(error) = told {
            tracing::warn!(%endpoint, error = %error_chain(&error), "cannot update a webhook endpoint's circuit breaker");
        }
    }

    /// Waits until no attempt is in flight (on shutdown), at most one lease.
    pub async fn drain(&self) {
        let all = u32::try_from(slots(&self.settings)).unwrap_or(1);
        let _ = tokio::time::timeout(self.settings.lease(), self.permits.acquire_many(all)).await;
    }
}

/// The most `DUE` reads of one round: a full window whose merchants could
/// not take the free slots is read past, up to this many times.
const DUE_READS: usize = 4;

/// Deliveries one instance attempts at once: `webhooks.batch_size`.
fn slots(settings: &WebhookSettings) -> usize {
    usize::try_from(settings.batch_size).unwrap_or(1).max(1)
}

/// How many failed batches one fan-out round may take: enough to split a
/// batch of `events` down to a bad event twice over (two bad events in it),
/// then the round ends and the next one goes on where it stopped.
fn failure_budget(events: usize) -> usize {
    let halvings = usize::BITS - events.saturating_sub(1).leading_zeros();
    2 * (halvings as usize + 1)
}

/// The dispatcher's database settings: the service's, with PostgreSQL's
/// `statement_timeout` at most three quarters of `query_timeout_ms`. So a
/// statement that runs too long is cancelled by the server itself, which
/// answers with an error and rolls its transaction back at once, releasing
/// its row locks, before the client's deadline would give up on the
/// connection and leave the statement running (its locks held) until the
/// server notices. A fan-out batch that is too slow thus fails cleanly and
/// can be retried in halves at once. With `statement_timeout_ms = 0` (left
/// to the server, behind PgBouncer) it stays the server's.
pub fn database_settings(settings: &DatabaseSettings) -> DatabaseSettings {
    let mut settings = settings.clone();
    if !settings.statement_timeout.is_zero() {
        let bound = settings
            .query_timeout
            .mul_f64(0.75)
            .max(Duration::from_millis(1));
        settings.statement_timeout = settings.statement_timeout.min(bound);
    }
    settings
}

/// Whether `error` says the database is out of reach (or refuses writes, or
/// did not answer within the client's deadline, which the server's own
/// statement timeout is shorter than: see `database_settings`), rather than
/// that this batch failed: then trying again in smaller parts cannot help,
/// and no event should be set aside for it.
fn database_away(error: &DbError) -> bool {
    match error {
        DbError::Connect(_) | DbError::Pool(_) | DbError::BatchLost | DbError::Timeout(_) => true,
        DbError::Query(error) => error.code().is_none_or(|code| {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::READ_ONLY_SQL_TRANSACTION,
                    SqlState::TOO_MANY_CONNECTIONS,
                ]
                .contains(code)
        }),
        _ => false,
    }
}

/// How long to wait after failed attempt number `attempt` (1-based): a
/// random share (`jitter` in 0..1) of `base · 2^(attempt-1)`, at most
/// `cap` ("full jitter"), so deliveries that failed together, e.g. while a
/// receiver was down, do not all come back at the same moment.
pub fn backoff(attempt: i32, base: Duration, cap: Duration, jitter: f64) -> Duration {
    let failures = u32::try_from(attempt).unwrap_or(0);
    full_jitter(Backoff::new(base, cap).after(failures), jitter)
}

/// How long an endpoint's deliveries wait after its `failures`th failure
/// in a row, once the breaker trips at `trip_after`: `base` at the trip,
/// doubling with each failure after it up to `cap`, with equal jitter (at
/// least half of it: a pause is what spaces the attempts out).
pub fn breaker_pause(
    failures: i32,
    trip_after: i32,
    base: Duration,
    cap: Duration,
    jitter: f64,
) -> Duration {
    let past_trip = u32::try_from(failures.saturating_sub(trip_after)).unwrap_or(0);
    equal_jitter(
        Backoff::new(base, cap).after(past_trip.saturating_add(1)),
        jitter,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_the_cap_with_full_jitter() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_millis(1000);
        let ceilings: Vec<_> = (1..=6).map(|n| backoff(n, base, cap, 1.0)).collect();
        assert_eq!(
            ceilings,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        assert_eq!(backoff(3, base, cap, 0.0), Duration::ZERO);
        assert_eq!(backoff(3, base, cap, 0.25), Duration::from_millis(100));
        assert_eq!(backoff(10_000, base, cap, 1.0), cap);
        assert_eq!(backoff(-1, base, cap, 1.0), base);
    }

    #[test]
    fn the_breaker_pause_starts_at_the_base_when_it_trips_and_grows() {
        let base = Duration::from_millis(100);
        let cap = Duration::from_millis(1000);
        let pauses: Vec<_> = (5..=10)
            .map(|n| breaker_pause(n, 5, base, cap, 1.0))
            .collect();
        assert_eq!(
            pauses,
            [100, 200, 400, 800, 1000, 1000].map(Duration::from_millis)
        );
        // Never less than half, however the jitter falls; before the trip
        // (not applied then) it is the base's.
        assert_eq!(
            breaker_pause(7, 5, base, cap, 0.0),
            Duration::from_millis(200)
        );
        assert_eq!(breaker_pause(1, 5, base, cap, 1.0), base);
    }

    #[test]
    fn a_fan_out_round_may_split_down_to_two_bad_events() {
        assert_eq!(failure_budget(0), 2);
        assert_eq!(failure_budget(1), 2);
        assert_eq!(failure_budget(2), 4);
        // 100 events: 7 halvings down to one event.
        assert_eq!(failure_budget(100), 16);
        assert_eq!(failure_budget(128), 16);
        assert_eq!(failure_budget(129), 18);
    }

    #[test]
    fn only_a_database_out_of_reach_ends_a_fan_out_round_at_once() {
        assert!(database_away(&DbError::Pool(
            deadpool_postgres::PoolError::Closed
        )));
        assert!(database_away(&DbError::BatchLost));
        assert!(database_away(&DbError::Timeout(Duration::from_secs(3))));
        assert!(!database_away(&DbError::Decode("x".into())));
    }

    #[test]
    fn the_server_cancels_a_dispatcher_statement_before_the_client_gives_up() {
        let mut settings = crate::config::Settings::load_from(
            std::path::Path::new("/nonexistent"),
            &std::collections::HashMap::new(),
        )
        .expect("defaults")
        .database;
        settings.query_timeout = Duration::from_millis(3000);
        settings.statement_timeout = Duration::from_millis(5000);
        assert_eq!(
            database_settings(&settings).statement_timeout,
            Duration::from_millis(2250)
        );
        settings.statement_timeout = Duration::from_millis(1000);
        assert_eq!(
            database_settings(&settings).statement_timeout,
            Duration::from_millis(1000)
        );
        settings.statement_timeout = Duration::ZERO;
        assert_eq!(
            database_settings(&settings).statement_timeout,
            Duration::ZERO
        );
    }
}
