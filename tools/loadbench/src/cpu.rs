//! Where the machine's CPU time went while a run was measured, from Linux's
//! /proc: all cores, the service, this load generator. Shares are of all
//! cores' time (100 % is every core busy); what is neither the service's
//! nor ours ("rest") is PostgreSQL, pgbench, the kernel and anything else.

use std::fs;
use std::time::Instant;

use anyhow::{Context as _, Result};

use crate::stats::weighted_mean;

/// CPU time so far in clock ticks: the machine's busy and total, the
/// service's and this program's.
pub struct CpuClock {
    busy: u64,
    total: u64,
    service: u64,
    generator: u64,
}

impl CpuClock {
    pub fn read(service_pid: u32) -> Result<Self> {
        let stat = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        // cpu user nice system idle iowait irq softirq steal (guest is in user)
        let line = stat.lines().next().and_then(|l| l.strip_prefix("cpu "));
        let ticks: Vec<u64> = (line.context("no cpu line in /proc/stat")?.split_whitespace())
            .take(8)
            .map(|n| n.parse().context("parsing /proc/stat"))
            .collect::<Result<_>>()?;
        let total: u64 = ticks.iter().sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        Ok(Self {
            busy: total.saturating_sub(idle),
            total,
            service: process_ticks(&service_pid.to_string())?,
            generator: process_ticks("self")?,
        })
    }
}

/// utime + stime of a process: the 14th and 15th fields of its stat line,
/// counted after the command name's last `)` (a name may hold spaces).
fn process_ticks(pid: &str) -> Result<u64> {
    let stat =
        fs::read_to_string(format!("/proc/{pid}/stat")).context("reading a process's stat")?;
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let field = |index: usize| fields.get(index).and_then(|f| f.parse::<u64>().ok());
    field(11).zip(field(12)).map(|(user, system)| user + system).context("no utime in a stat line")
}

/// Shares of all cores' time over an interval, in percent.
#[derive(Clone, Copy, Debug)]
pub struct CpuShare {
    pub busy: f64,
    pub service: f64,
    pub generator: f64,
}

impl CpuShare {
    pub fn between(start: &CpuClock, end: &CpuClock) -> Self {
        let total = end.total.saturating_sub(start.total).max(1) as f64;
        let share = |from: u64, to: u64| 100.0 * to.saturating_sub(from) as f64 / total;
        Self {
            busy: share(start.busy, end.busy),
            service: share(start.service, end.service),
            generator: share(start.generator, end.generator),
        }
    }

    /// The mean of `shares`, each weighted by its interval's length.
    pub fn weighted(shares: &[(CpuShare, f64)]) -> Self {
        let mean = |field: fn(&CpuShare) -> f64| {
            weighted_mean(&shares.iter().map(|(s, weight)| (field(s), *weight)).collect::<Vec<_>>())
        };
        Self {
            busy: mean(|s| s.busy),
            service: mean(|s| s.service),
            generator: mean(|s| s.generator),
        }
    }

    /// PostgreSQL, the kernel and anything else.
    pub fn rest(&self) -> f64 {
        (self.busy - self.service - self.generator).max(0.0)
    }
}

/// The CPU shares between two instants (waits for both).
pub async fn cpu_between(from: Instant, until: Instant, service_pid: u32) -> Result<CpuShare> {
    tokio::time::sleep_until(from.into()).await;
    let start = CpuClock::read(service_pid)?;
    tokio::time::sleep_until(until.into()).await;
    Ok(CpuShare::between(&start, &CpuClock::read(service_pid)?))
}

/// The CPU's model name, e.g. "Intel(R) Xeon(R) Processor".
pub fn cpu_model() -> String {
    let info = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info.lines().find_map(|line| line.strip_prefix("model name"));
    model
        .and_then(|rest| rest.split_once(':'))
        .map_or("unknown CPU".to_owned(), |(_, m)| m.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_measured_from_after_its_name() {
        let clock = CpuClock::read(std::process::id()).unwrap();
        assert!(clock.total >= clock.busy);
        assert!(process_ticks("self").is_ok());
    }
}
