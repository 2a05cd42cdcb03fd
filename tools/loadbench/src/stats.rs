//! What a measured run gave: every answer's latency in an HDR histogram
//! (3 significant digits: a percentile is exact to 0.1 %), every status,
//! and an exact count of answers slower than [`SLOW`]. Clients record into
//! tallies of their own, merged at the end, so recording never waits.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use hdrhistogram::Histogram;

use crate::http::Answer;
use crate::proc::CpuShare;

/// A request slower than this is counted on its own: one of the targets is
/// that none is.
pub const SLOW: Duration = Duration::from_millis(100);
/// The largest latency the histograms hold; a slower one is recorded as
/// this (and counted as slow).
const MAX_LATENCY_US: u64 = 60_000_000;

/// Latencies in microseconds.
#[derive(Clone)]
pub struct Latencies {
    histogram: Histogram<u64>,
    slow: u64,
}

impl Latencies {
    pub fn new() -> Result<Self> {
        Ok(Self {
            histogram: Histogram::new_with_max(MAX_LATENCY_US, 3)
                .context("creating a latency histogram")?,
            slow: 0,
        })
    }

    pub fn record(&mut self, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.record_us(micros);
    }

    pub fn record_us(&mut self, micros: u64) {
        self.histogram.saturating_record(micros);
        if u128::from(micros) > SLOW.as_micros() {
            self.slow += 1;
        }
    }

    pub fn merge(&mut self, other: &Latencies) -> Result<()> {
        self.histogram
            .add(&other.histogram)
            .context("merging latency histograms")?;
        self.slow += other.slow;
        Ok(())
    }

    pub fn count(&self) -> u64 {
        self.histogram.len()
    }

    /// The latency below which `quantile` of the answers fall, in ms; NaN
    /// when nothing was recorded.
    pub fn percentile_ms(&self, quantile: f64) -> f64 {
        if self.histogram.is_empty() {
            return f64::NAN;
        }
        self.histogram.value_at_quantile(quantile) as f64 / 1000.0
    }

    pub fn max_ms(&self) -> f64 {
        if self.histogram.is_empty() {
            return f64::NAN;
        }
        self.histogram.max() as f64 / 1000.0
    }

    /// Answers slower than [`SLOW`].
    pub fn slow(&self) -> u64 {
        self.slow
    }
}

/// Every latency and every status of a run.
pub struct Tally {
    pub latencies: Latencies,
    statuses: BTreeMap<u16, u64>,
}

impl Tally {
    pub fn new() -> Result<Self> {
        Ok(Self {
            latencies: Latencies::new()?,
            statuses: BTreeMap::new(),
        })
    }

    pub fn record(&mut self, answer: &Answer) {
        self.latencies.record(answer.latency);
        *self.statuses.entry(answer.status).or_default() += 1;
    }

    pub fn merge(&mut self, other: &Tally) -> Result<()> {
        self.latencies.merge(&other.latencies)?;
        for (status, count) in &other.statuses {
            *self.statuses.entry(*status).or_default() += count;
        }
        Ok(())
    }

    pub fn percentile_ms(&self, quantile: f64) -> f64 {
        self.latencies.percentile_ms(quantile)
    }

    pub fn slow(&self) -> u64 {
        self.latencies.slow()
    }

    fn failures(&self) -> impl Iterator<Item = (&u16, &u64)> {
        self.statuses
            .iter()
            .filter(|(status, _)| !(200..300).contains(*status))
    }

    pub fn non_2xx(&self) -> u64 {
        self.failures().map(|(_, count)| count).sum()
    }

    /// "0", or e.g. "3 (409: 2, 503: 1)".
    pub fn non_2xx_text(&self) -> String {
        let failures: Vec<String> = self
            .failures()
            .map(|(status, count)| format!("{status}: {count}"))
            .collect();
        if failures.is_empty() {
            "0".to_owned()
        } else {
            format!("{} ({})", self.non_2xx(), failures.join(", "))
        }
    }

    pub fn require_success(&self, what: &str) -> Result<()> {
        if self.non_2xx() > 0 {
            bail!("{what}: unexpected answers {}", self.non_2xx_text());
        }
        Ok(())
    }
}

/// A measured run: its tally over `seconds`, and where the machine's CPU
/// went meanwhile.
pub struct Sample {
    pub tally: Tally,
    pub seconds: f64,
    pub cpu: Option<CpuShare>,
}

impl Sample {
    pub fn rps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tally.latencies.count() as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Adds a later round of the same point: its answers, its time, and
    /// the CPU shares weighted by time.
    pub fn merge(&mut self, other: &Sample) -> Result<()> {
        self.tally.merge(&other.tally)?;
        self.cpu = match (self.cpu, other.cpu) {
            (Some(mine), Some(theirs)) => Some(CpuShare::weighted(&[
                (mine, self.seconds),
                (theirs, other.seconds),
            ])),
            (mine, theirs) => mine.or(theirs),
        };
        self.seconds += other.seconds;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_exact_to_three_digits_and_slow_answers_are_counted() {
        let mut latencies = Latencies::new().unwrap();
        for micros in 1..=1000 {
            latencies.record_us(micros * 100); // 0.1 ms … 100 ms
        }
        latencies.record(Duration::from_millis(250));
        assert_eq!(latencies.count(), 1001);
        // The 501st of 1001 answers: 50.1 ms, to 0.1 %.
        assert!((latencies.percentile_ms(0.5) - 50.1).abs() <= 0.05);
        assert!((latencies.max_ms() - 250.0).abs() < 0.25);
        // 100 ms itself is not over the limit; 250 ms is.
        assert_eq!(latencies.slow(), 1);
    }

    #[test]
    fn merged_tallies_add_up() {
        let mut first = Latencies::new().unwrap();
        let mut second = Latencies::new().unwrap();
        first.record_us(1_000);
        second.record_us(200_000);
        first.merge(&second).unwrap();
        assert_eq!(first.count(), 2);
        assert_eq!(first.slow(), 1);
        assert!(Latencies::new().unwrap().percentile_ms(0.99).is_nan());
    }

    #[test]
    fn samples_of_rounds_add_their_answers_and_time() {
        let sample = |micros: u64, answers: u64, seconds: f64, busy: f64| {
            let mut tally = Tally::new().unwrap();
            for _ in 0..answers {
                tally.latencies.record_us(micros);
            }
            let cpu = CpuShare {
                busy,
                service: busy / 2.0,
                generator: 1.0,
            };
            Sample {
                tally,
                seconds,
                cpu: Some(cpu),
            }
        };
        let mut point = sample(100, 3_000, 1.0, 30.0);
        point.merge(&sample(200, 1_000, 3.0, 50.0)).unwrap();
        assert_eq!(point.tally.latencies.count(), 4_000);
        assert!((point.rps() - 1_000.0).abs() < 1e-9);
        let cpu = point.cpu.unwrap();
        assert!((cpu.busy - 45.0).abs() < 1e-9);
        assert!((cpu.service - 22.5).abs() < 1e-9);
        assert!((cpu.generator - 1.0).abs() < 1e-9);
    }
}
