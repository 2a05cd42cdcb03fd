//! What Linux's /proc says about the run: where the machine's CPU time went
//! while a run was measured (all cores, the service, this load generator),
//! the service's peak resident memory, and the CPU's model for the report.
//!
//! CPU shares are of all cores' time: 100 % is every core busy. What is not
//! the service's or ours ("rest") is PostgreSQL, pgbench, the kernel's work
//! for all of them, and anything else on the machine.

use std::fs;
use std::time::Instant;

use anyhow::{Context as _, Result};

/// CPU time so far, in the kernel's clock ticks: the whole machine's (busy
/// and in total), the service's and this load generator's.
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
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("cpu "))
            .context("no cpu line in /proc/stat")?
            .split_whitespace()
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

/// utime + stime of a process, all its threads.
fn process_ticks(pid: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    stat_ticks(&stat).with_context(|| format!("no utime and stime in {path}"))
}

/// utime + stime from a /proc/<pid>/stat line. The command name (2nd field)
/// may hold spaces and parentheses, so fields are counted after its last
/// `)`: there state is the 3rd field of the line, utime the 14th, stime the
/// 15th.
fn stat_ticks(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |index: usize| fields.get(index)?.parse::<u64>().ok();
    Some(field(11)? + field(12)?)
}

/// Shares of all cores' time over an interval, in percent.
#[derive(Clone, Copy)]
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
        let total: f64 = shares.iter().map(|(_, weight)| weight).sum();
        let mean = |field: fn(&CpuShare) -> f64| {
            if total > 0.0 {
                shares
                    .iter()
                    .map(|(s, weight)| field(s) * weight)
                    .sum::<f64>()
                    / total
            } else {
                0.0
            }
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

/// VmHWM: the most resident memory the process has had, in bytes.
pub fn peak_rss_bytes(pid: u32) -> Result<u64> {
    status_bytes(pid, "VmHWM:")
}

/// VmRSS: the process's resident memory now, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    status_bytes(pid, "VmRSS:")
}

fn status_bytes(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    kib_field_bytes(&status, field).with_context(|| format!("no {field} in {path}"))
}

/// `VmHWM:    13108 kB` → bytes, for `field` "VmHWM:".
fn kib_field_bytes(status: &str, field: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The CPU's model name, e.g. "Intel(R) Xeon(R) Processor".
pub fn cpu_model() -> String {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("model name"))
                .and_then(|rest| rest.split_once(':'))
                .map(|(_, model)| model.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_read_after_the_command_name() {
        let line = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    170 30 0 0 20 0 3 0 12345 1000000 2000 18446744073709551615";
        assert_eq!(stat_ticks(line), Some(200));
        assert_eq!(stat_ticks("4242 (short"), None);
    }

    #[test]
    fn peak_rss_comes_from_vm_hwm_and_current_rss_from_vm_rss() {
        let status =
            "Name:\tchargeonce\nVmPeak:\t  500000 kB\nVmHWM:\t   13108 kB\nVmRSS:\t 9000 kB\n";
        assert_eq!(kib_field_bytes(status, "VmHWM:"), Some(13108 * 1024));
        assert_eq!(kib_field_bytes(status, "VmRSS:"), Some(9000 * 1024));
        assert_eq!(kib_field_bytes("Name:\tx\n", "VmHWM:"), None);
    }

    #[test]
    fn this_process_can_be_measured() {
        assert!(peak_rss_bytes(std::process::id()).unwrap() > 0);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
        let clock = CpuClock::read(std::process::id()).unwrap();
        assert!(clock.total >= clock.busy);
    }
}
