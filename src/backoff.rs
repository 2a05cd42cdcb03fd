//! The one backoff: a pause that doubles from a first one up to a cap,
//! built with backon, the crate the Rust client retries with too. The
//! processor client retries through backon itself (`Backoff::builder`);
//! the loops that poll or wait for the database take their pauses from
//! `Backoff::pauses`; a pace stored on a row (a webhook delivery's or a
//! pending charge's next try) is `Backoff::after` its failures, with the
//! jitter its use needs on top (`full_jitter`, `equal_jitter`).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Pauses between tries to reach the database while holding something it
/// must record (an outcome, a webhook attempt): at once at first, then
/// thinning out to one try a second.
pub const RECORD_RETRY: Backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));

/// Pauses that start at `first` and double up to `cap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    cap: Duration,
}

impl Backoff {
    /// A cap below `first` counts as `first`.
    pub const fn new(first: Duration, cap: Duration) -> Self {
        let cap = if cap.as_nanos() < first.as_nanos() {
            first
        } else {
            cap
        };
        Self { first, cap }
    }

    /// backon's builder for these pauses, with no limit on their number
    /// (`with_max_times` sets one).
    pub fn builder(self) -> ExponentialBuilder {
        ExponentialBuilder::default()
            .with_min_delay(self.first)
            .with_max_delay(self.cap)
            .with_factor(2.0)
            .without_max_times()
    }

    /// The pauses, one per try, without end.
    pub fn pauses(self) -> Pauses {
        Pauses {
            steps: self.builder().build(),
            cap: self.cap,
        }
    }

    /// The pause after `failures` failures in a row: `first` after the
    /// first one (and for 0), twice that after the second, and so on up to
    /// the cap.
    pub fn after(self, failures: u32) -> Duration {
        // After 64 doublings any cap is reached, whatever the first pause.
        let nth = failures.clamp(1, 64) - 1;
        self.pauses().nth(nth as usize).unwrap_or(self.cap)
    }
}

/// The pauses of a `Backoff`, in order. Never ends.
pub struct Pauses {
    steps: <ExponentialBuilder as BackoffBuilder>::Backoff,
    cap: Duration,
}

impl Pauses {
    pub fn next_pause(&mut self) -> Duration {
        self.steps.next().map_or(self.cap, whole_microseconds)
    }
}

impl Iterator for Pauses {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_pause())
    }
}

/// backon doubles in `f32` seconds, which leaves a few nanoseconds of
/// error (200 ms comes out as 200.000003 ms); rounded off, the pauses are
/// the round numbers their settings say.
fn whole_microseconds(pause: Duration) -> Duration {
    let micros = pause.as_nanos().saturating_add(500) / 1000;
    Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX))
}

/// A random share of `pause`, from none to all of it ("full jitter"; `unit`
/// is uniform in 0..1): tries that failed together, e.g. while a webhook
/// receiver was down, do not all come back at the same moment.
pub fn full_jitter(pause: Duration, unit: f64) -> Duration {
    pause.mul_f64(unit.clamp(0.0, 1.0))
}

/// A random share of `pause` from half to all of it ("equal jitter"):
/// spread like `full_jitter`, but never much sooner than the pause says.
pub fn equal_jitter(pause: Duration, unit: f64) -> Duration {
    pause.mul_f64(0.5 + unit.clamp(0.0, 1.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(values: &[u64]) -> Vec<Duration> {
        values.iter().copied().map(Duration::from_millis).collect()
    }

    #[test]
    fn pauses_double_up_to_the_cap_and_go_on() {
        let polls = Backoff::new(Duration::from_millis(1), Duration::from_millis(20));
        let pauses: Vec<_> = polls.pauses().take(8).collect();
        assert_eq!(pauses, millis(&[1, 2, 4, 8, 16, 20, 20, 20]));
        let record: Vec<_> = RECORD_RETRY.pauses().take(8).collect();
        assert_eq!(record, millis(&[50, 100, 200, 400, 800, 1000, 1000, 1000]));
        let processor = Backoff::new(Duration::from_millis(100), Duration::from_millis(3200));
        let pauses: Vec<_> = processor.pauses().take(8).collect();
        assert_eq!(
            pauses,
            millis(&[100, 200, 400, 800, 1600, 3200, 3200, 3200])
        );
    }

    #[test]
    fn the_pause_after_n_failures_is_the_nth() {
        let base = Duration::from_millis(100);
        let backoff = Backoff::new(base, Duration::from_millis(1000));
        let afters: Vec<_> = (1..=6).map(|n| backoff.after(n)).collect();
        assert_eq!(afters, millis(&[100, 200, 400, 800, 1000, 1000]));
        assert_eq!(backoff.after(0), base);
        assert_eq!(backoff.after(u32::MAX), Duration::from_millis(1000));
        let hours = Backoff::new(Duration::from_secs(60), Duration::from_secs(6 * 3600));
        assert_eq!(hours.after(8), Duration::from_secs(60 * 128));
        assert_eq!(hours.after(9), Duration::from_secs(60 * 256));
        assert_eq!(hours.after(10), Duration::from_secs(6 * 3600));
    }

    #[test]
    fn a_cap_below_the_first_pause_is_the_first_pause() {
        let backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        let pauses: Vec<_> = backoff.pauses().take(3).collect();
        assert_eq!(pauses, [Duration::from_secs(2); 3]);
    }

    #[test]
    fn jitter_stays_within_its_share_of_the_pause() {
        let pause = Duration::from_millis(800);
        assert_eq!(full_jitter(pause, 0.0), Duration::ZERO);
        assert_eq!(full_jitter(pause, 0.25), Duration::from_millis(200));
        assert_eq!(full_jitter(pause, 7.0), pause);
        assert_eq!(equal_jitter(pause, 0.0), Duration::from_millis(400));
        assert_eq!(equal_jitter(pause, 0.5), Duration::from_millis(600));
        assert_eq!(equal_jitter(pause, 1.0), pause);
        for _ in 0..1000 {
            let unit: f64 = rand::random();
            assert!(full_jitter(pause, unit) <= pause);
            assert!(equal_jitter(pause, unit) >= pause / 2);
            assert!(equal_jitter(pause, unit) <= pause);
        }
    }
}
