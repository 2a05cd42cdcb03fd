//! The database's clock, as this process knows it. Every time rule of the
//! service is a rule on PostgreSQL's `now()`: leases, backoffs and the
//! sweepers' cutoffs are computed there. What the process itself stamps
//! with a time (the UUIDv7 ids, whose time the replay window and the
//! retention of keys and events count from; the replay cache's expiry; a
//! webhook's timestamp) uses this clock: the process's wall clock corrected
//! by its offset from the database's, measured at start and every
//! [`MEASURE_EVERY`] (`workers::clock`).
//!
//! So an instance whose clock runs days ahead or behind still makes ids of
//! the right time: its keys are neither released early nor kept late, and
//! a retry within the window replays wherever it lands.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::{ContextV7, Timestamp, Uuid};

/// How often the offset is measured again.
pub const MEASURE_EVERY: Duration = Duration::from_secs(30);

/// An offset beyond this is logged as an error: the machine's clock needs
/// fixing (the service goes on, on the database's time).
pub const OFFSET_WARNING: Duration = Duration::from_secs(60);

/// The database's clock minus this process's, in microseconds.
static OFFSET_MICROS: AtomicI64 = AtomicI64::new(0);

/// Orders the ids made within one millisecond (a counter in the random
/// bits), as `Uuid::now_v7` does.
static CONTEXT: Mutex<Option<ContextV7>> = Mutex::new(None);

/// The time now by the database's clock.
pub fn now() -> DateTime<Utc> {
    Utc::now() + chrono::Duration::microseconds(OFFSET_MICROS.load(Ordering::Relaxed))
}

/// A new UUIDv7 whose time is `now()`.
pub fn new_v7() -> Uuid {
    v7_at(now())
}

/// A new UUIDv7 of the time `at`; ids made in a row sort in the order they
/// were made.
fn v7_at(at: DateTime<Utc>) -> Uuid {
    let seconds = u64::try_from(at.timestamp()).unwrap_or(0);
    let mut context = CONTEXT.lock().unwrap_or_else(PoisonError::into_inner);
    let context = context.get_or_insert_with(ContextV7::new);
    Uuid::new_v7(Timestamp::from_unix(
        &*context,
        seconds,
        at.timestamp_subsec_nanos(),
    ))
}

/// The database's clock minus this process's.
pub fn offset() -> chrono::Duration {
    chrono::Duration::microseconds(OFFSET_MICROS.load(Ordering::Relaxed))
}

/// Takes the offset from a reading of the database's clock, `database`,
/// made between the local times `asked` and `answered`; returns it.
pub fn set_from(
    database: DateTime<Utc>,
    asked: DateTime<Utc>,
    answered: DateTime<Utc>,
) -> chrono::Duration {
    let offset = offset_of(database, asked, answered);
    OFFSET_MICROS.store(offset.num_microseconds().unwrap_or(0), Ordering::Relaxed);
    offset
}

/// The database read its clock about half way between `asked` and
/// `answered`.
fn offset_of(
    database: DateTime<Utc>,
    asked: DateTime<Utc>,
    answered: DateTime<Utc>,
) -> chrono::Duration {
    database - (asked + (answered - asked) / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_is_counted_from_half_way_through_the_round_trip() {
        let local = Utc::now();
        let ahead = chrono::Duration::days(32);
        // The database answered 32 days ahead, 10 ms into a 20 ms round trip.
        let measured = offset_of(
            local + ahead + chrono::Duration::milliseconds(10),
            local,
            local + chrono::Duration::milliseconds(20),
        );
        assert_eq!(measured, ahead);
        let behind = offset_of(local - chrono::Duration::days(1), local, local);
        assert_eq!(behind, -chrono::Duration::days(1));
    }

    #[test]
    fn ids_carry_the_time_they_are_made_for_in_order() {
        let ahead = Utc::now() + chrono::Duration::days(32);
        let id = v7_at(ahead);
        let (seconds, _) = id.get_timestamp().expect("a v7 id").to_unix();
        assert_eq!(i64::try_from(seconds).expect("seconds"), ahead.timestamp());
        let ids: Vec<Uuid> = (0..1000).map(|_| v7_at(ahead)).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]));
    }
}
