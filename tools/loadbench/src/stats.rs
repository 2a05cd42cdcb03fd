//! Latencies (HDR histogram, 3 digits), a count over [`SLOW`], statuses; a
//! tally per client, merged at the end, so recording never waits.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use hdrhistogram::Histogram;

use crate::database::Wal;
use crate::http::Answer;

/// A target: no request slower.
pub const SLOW: Duration = Duration::from_millis(100);

/// Latencies in µs up to a minute (slower count as that), and statuses.
#[derive(Clone)]
pub struct Tally {
    histogram: Histogram<u64>,
    pub slow: u64,
    statuses: BTreeMap<u16, u64>,
}

impl Tally {
    pub fn new() -> Result<Self> {
        let histogram = Histogram::new_with_max(60_000_000, 3).context("a latency histogram")?;
        Ok(Self { histogram, slow: 0, statuses: BTreeMap::new() })
    }

    pub fn record_us(&mut self, micros: u64) {
        self.histogram.saturating_record(micros);
        self.slow += u64::from(u128::from(micros) > SLOW.as_micros());
    }

    pub fn record(&mut self, answer: &Answer) {
        self.record_us(u64::try_from(answer.latency.as_micros()).unwrap_or(u64::MAX));
        *self.statuses.entry(answer.status).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Tally) -> Result<()> {
        self.histogram.add(&other.histogram).context("merging latencies")?;
        self.slow += other.slow;
        for (status, count) in &other.statuses {
            *self.statuses.entry(*status).or_default() += count;
        }
        Ok(())
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// In ms; NaN when nothing was recorded.
    pub fn percentile_ms(&self, quantile: f64) -> f64 {
        self.ms(self.histogram.value_at_quantile(quantile))
    }

    pub fn max_ms(&self) -> f64 {
        self.ms(self.histogram.max())
    }

    fn ms(&self, micros: u64) -> f64 {
        Some(micros as f64 / 1000.0).filter(|_| !self.histogram.is_empty()).unwrap_or(f64::NAN)
    }

    fn failures(&self) -> impl Iterator<Item = (&u16, &u64)> {
        self.statuses.iter().filter(|(status, _)| !(200..300).contains(*status))
    }

    pub fn non_2xx(&self) -> u64 {
        self.failures().map(|(_, count)| count).sum()
    }

    /// "0", or e.g. "3 (409: 2, 503: 1)".
    pub fn non_2xx_text(&self) -> String {
        let failures: Vec<String> =
            self.failures().map(|(status, count)| format!("{status}: {count}")).collect();
        match failures.is_empty() {
            true => "0".to_owned(),
            false => format!("{} ({})", self.non_2xx(), failures.join(", ")),
        }
    }

    pub fn require_success(&self, what: &str) -> Result<()> {
        ensure!(self.non_2xx() == 0, "{what}: unexpected answers {}", self.non_2xx_text());
        Ok(())
    }
}

/// A tally over `seconds`, and the WAL (`wal.requests`: warm-up included).
pub struct Sample {
    pub tally: Tally,
    pub seconds: f64,
    pub wal: Wal,
}

impl Sample {
    pub fn rps(&self) -> f64 {
        match self.seconds > 0.0 {
            true => self.tally.count() as f64 / self.seconds,
            false => 0.0,
        }
    }

    /// Adds a later round of the same point.
    pub fn merge(&mut self, other: &Sample) -> Result<()> {
        self.tally.merge(&other.tally)?;
        self.seconds += other.seconds;
        self.wal.add(&other.wal);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_exact_to_three_digits_and_slow_answers_are_counted() {
        let mut latencies = Tally::new().unwrap();
        for micros in 1..=1000 {
            latencies.record_us(micros * 100); // 0.1 ms … 100 ms
        }
        let mut slower = Tally::new().unwrap();
        slower.record_us(250_000);
        latencies.merge(&slower).unwrap();
        assert_eq!(latencies.count(), 1001);
        // The 501st of 1001 answers: 50.1 ms, to 0.1 %.
        assert!((latencies.percentile_ms(0.5) - 50.1).abs() <= 0.05);
        assert!((latencies.max_ms() - 250.0).abs() < 0.25);
        // 100 ms itself is not over the limit; 250 ms is.
        assert_eq!(latencies.slow, 1);
        assert!(Tally::new().unwrap().percentile_ms(0.99).is_nan());
    }

    #[test]
    fn samples_of_rounds_add_their_answers_time_wal_and_cpu() {
        let sample = |answers: u64, seconds: f64, fpi: f64| {
            let mut tally = Tally::new().unwrap();
            (0..answers).for_each(|_| tally.record_us(100));
            let busy_seconds = Some(0.5);
            let wal =
                Wal { bytes: 1e6, fpi: Some((fpi, 1e6)), requests: answers + 100, busy_seconds };
            Sample { tally, seconds, wal }
        };
        let mut point = sample(3_000, 1.0, 1e5);
        point.merge(&sample(1_000, 3.0, 3e5)).unwrap();
        assert!((point.rps() - 1_000.0).abs() < 1e-9);
        assert_eq!(point.wal.requests, 4_200);
        assert!((point.wal.per_request().unwrap() - 2e6 / 4_200.0).abs() < 1e-9);
        assert!((point.wal.fpi_share().unwrap() - 0.2).abs() < 1e-12);
        // 1 s of busy CPU over 4,200 requests.
        assert!((point.wal.busy_us_per_request().unwrap() - 1e6 / 4_200.0).abs() < 1e-9);
        assert_eq!(Wal::default().per_request(), None);
        assert_eq!(Wal::default().busy_us_per_request(), None);
    }
}
