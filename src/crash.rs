//! Crash points for tests. With the `crash-points` feature, a process started
//! with `CHARGEONCE_CRASH_AT=<point>` aborts when it reaches that point, as an
//! OOM kill or a power cut would stop it. Without the feature (every normal
//! and release build) `point` is an empty function and the names are unused.
//!
//! The points, in the order a charge passes them:
//! - `after_pending_commit`: the pending row is committed (or a lease was
//!   taken over), the processor not yet called;
//! - `after_processor_reply`: the processor answered, the outcome is not
//!   committed;
//! - `after_outcome_commit`: the outcome is committed, no answer written.

#[cfg(feature = "crash-points")]
pub fn point(name: &str) {
    if std::env::var("CHARGEONCE_CRASH_AT").is_ok_and(|at| at == name) {
        eprintln!("chargeonce: crash point {name} reached; aborting");
        std::process::abort();
    }
}

#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn point(_name: &str) {}
