//! The sustained run (`--sustain SECONDS`, RELIABILITY.md): the mix's
//! maximum, then a share of it (or a fixed rate) open-loop (a latency from
//! the scheduled time); then the floor's at the same share of its own
//! maximum through pgbench `--rate`.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use chargeonce_testkit::memory_bytes;
use futures_util::future::join_all;
use statrs::statistics::Statistics;

use crate::database::{BenchDatabase, Wal};
use crate::http::{Api, Http};
use crate::pgbench::Pgbench;
use crate::scenario::{closed_loop, Keys, Workload};
use crate::stats::Tally;
use crate::{say, Plan};

/// Enough that the offered rate holds while a few answers are slow.
pub const CONNECTIONS: usize = 64;
const MAX_CONNECTIONS: usize = 32;

/// What the service is offered: a share of its measured maximum, or a fixed
/// rate (to compare two builds at the same load, whatever their maxima).
#[derive(Clone, Copy, Debug)]
pub enum Offer {
    Percent(u32),
    Rate(f64),
}

impl Offer {
    /// The requests a second to offer, and the share of `max_rps` that is.
    fn of(self, max_rps: f64) -> (f64, f64) {
        match self {
            Offer::Percent(percent) => {
                let percent = f64::from(percent);
                (max_rps * percent / 100.0, percent)
            }
            Offer::Rate(rate) => (rate, 100.0 * rate / max_rps),
        }
    }

    /// The option of `scripts/bench` that asks for it, for the report.
    pub fn option(self) -> String {
        match self {
            Offer::Percent(percent) => format!("--load-percent {percent}"),
            Offer::Rate(rate) => format!("--rate {rate}"),
        }
    }
}

/// One second: 2xx, other statuses, no answer, the service's VmRSS, the
/// slowest answer that ended in it and what the machine's CPUs did in it.
#[derive(Clone, Default)]
pub struct Second {
    pub ok: u64,
    pub non_2xx: u64,
    pub failed: u64,
    pub rss: Option<u64>,
    pub slowest_us: u64,
    pub cpu: Option<CpuShares>,
}

/// Shares of the machine's CPU time in one second, in %: busy (user,
/// system, interrupts), waiting for I/O, taken by the hypervisor (steal).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CpuShares {
    pub busy: f64,
    pub iowait: f64,
    pub steal: f64,
}

/// The `cpu` line of /proc/stat: jiffies per state since boot.
#[derive(Clone, Copy)]
pub struct CpuTimes([u64; 8]);

/// Jiffies a second in /proc/stat (Linux's USER_HZ, 100 on every
/// architecture it runs on).
const JIFFIES_PER_SECOND: f64 = 100.0;

impl CpuTimes {
    pub fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        Self::parse(stat.lines().next()?)
    }

    /// `cpu  user nice system idle iowait irq softirq steal ...`
    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.strip_prefix("cpu ")?.split_whitespace();
        let mut times = [0; 8];
        for time in &mut times {
            *time = fields.next()?.parse().ok()?;
        }
        Some(Self(times))
    }

    /// Reads the times now: them, and the shares since `earlier`.
    fn read_since(earlier: Option<Self>) -> (Option<Self>, Option<CpuShares>) {
        let now = Self::read();
        let shares = now.zip(earlier).and_then(|(now, then)| now.shares_since(&then));
        (now, shares)
    }

    /// Jiffies busy since `earlier`: user, nice, system, irq, softirq.
    fn busy_since(&self, earlier: &Self) -> u64 {
        let busy = |t: &Self| t.0[0] + t.0[1] + t.0[2] + t.0[5] + t.0[6];
        busy(self).saturating_sub(busy(earlier))
    }

    /// Seconds the machine's CPUs were busy since `earlier`, all CPUs added
    /// up.
    pub fn busy_seconds_since(&self, earlier: &Self) -> f64 {
        self.busy_since(earlier) as f64 / JIFFIES_PER_SECOND
    }

    fn shares_since(&self, earlier: &Self) -> Option<CpuShares> {
        let delta: Vec<f64> =
            (0..8).map(|i| self.0[i].saturating_sub(earlier.0[i]) as f64).collect();
        let total: f64 = delta.iter().sum();
        let share = |jiffies: f64| 100.0 * jiffies / total;
        (total > 0.0).then(|| CpuShares {
            busy: share(self.busy_since(earlier) as f64),
            iowait: share(delta[4]),
            steal: share(delta[7]),
        })
    }
}

/// Whether a checkpoint is running, from successive readings of
/// `BenchDatabase::checkpoint_progress`: one began for each rise of the
/// started count, one ended for each new end time. Both tables of a
/// sustained run say how many of each minute's seconds had one, to tell
/// whether a slow minute came with a checkpoint.
struct CheckpointWatch {
    started: i64,
    ended: i64,
    last_end: i64,
}

impl CheckpointWatch {
    fn new((started, last_end): (i64, i64)) -> Self {
        Self { started, ended: 0, last_end }
    }

    /// True while more checkpoints have begun than ended since the first
    /// reading (the end of one already running then is not counted).
    fn running(&mut self, (started, last_end): (i64, i64)) -> bool {
        let begun = started - self.started;
        if last_end != self.last_end {
            self.last_end = last_end;
            self.ended = (self.ended + 1).min(begun);
        }
        begun > self.ended
    }
}

/// Each second of a run from `start`: whether a checkpoint was running at
/// its end, `None` where the server did not say.
async fn watch_checkpoints(db: &BenchDatabase, start: Instant, length: usize) -> Vec<Option<bool>> {
    let mut tick = tokio::time::interval_at(start.into(), Duration::from_secs(1));
    tick.tick().await;
    let mut watch = db.checkpoint_progress().await.map(CheckpointWatch::new);
    let mut seconds = Vec::with_capacity(length);
    for _ in 0..length {
        tick.tick().await;
        let now = db.checkpoint_progress().await;
        seconds.push(watch.as_mut().zip(now).map(|(watch, now)| watch.running(now)));
    }
    seconds
}

/// How many seconds of minute `minute` had a checkpoint running, or "—".
fn checkpoint_seconds(running: &[Option<bool>], minute: usize) -> String {
    let known = running.iter().skip(minute * 60).take(60).flatten();
    let (seconds, in_one) =
        known.fold((0, 0), |(n, r), &running| (n + 1, r + usize::from(running)));
    match seconds {
        0 => "—".to_owned(),
        _ => in_one.to_string(),
    }
}

impl Second {
    fn answers(&self) -> u64 {
        self.ok + self.non_2xx + self.failed
    }
}

pub struct Sustained {
    pub max_rps: f64,
    /// The share of `max_rps` offered; the floor got as much of its own.
    pub percent: f64,
    pub target_rps: f64,
    pub seconds: Vec<Second>,
    pub minutes: Vec<Tally>,
    pub wal: Wal,
    /// Checkpoints PostgreSQL started during the service's run.
    pub checkpoints: Option<i64>,
    /// Each second: a checkpoint running at its end (`watch_checkpoints`).
    pub in_checkpoint: Vec<Option<bool>>,
    /// Wall-clock time of the run's first second, to match a slow second
    /// with the database's log.
    pub started: chrono::DateTime<chrono::Utc>,
    pub floor: Floor,
}

/// The floor's open-loop run beside the service's.
pub struct Floor {
    pub max_tps: f64,
    pub rate: f64,
    pub minutes: Vec<Tally>,
    /// What the machine's CPUs did over the whole run.
    pub cpu: Option<CpuShares>,
    /// Each second: a checkpoint running at its end (`watch_checkpoints`).
    pub in_checkpoint: Vec<Option<bool>>,
}

pub async fn run(
    (api, db, pgbench): (&Api, &BenchDatabase, &Pgbench),
    plan: &Plan,
    pid: u32,
    length: Duration,
    offer: Offer,
) -> Result<Sustained> {
    say(format!("measuring the maximum throughput of the mix at {MAX_CONNECTIONS} connections"));
    let max = closed_loop(api, Workload::Mix, MAX_CONNECTIONS, plan).await?;
    max.tally.require_success("the maximum-throughput measurement")?;
    let max_rps = max.rps();
    let (target_rps, percent) = offer.of(max_rps);
    say(format!(
        "maximum {max_rps:.0} req/s; holding {target_rps:.0} req/s ({percent:.0} %) for {} s \
         with {CONNECTIONS} connections",
        length.as_secs()
    ));

    let total_seconds = usize::try_from(length.as_secs()).context("run length")?;
    let seconds = RefCell::new(vec![Second::default(); total_seconds]);
    let minutes = (0..total_seconds.div_ceil(60)).map(|_| Tally::new());
    let minutes = RefCell::new(minutes.collect::<Result<Vec<_>>>()?);
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + length;
    let interval = Duration::from_secs_f64(CONNECTIONS as f64 / target_rps);
    // `answered`: Some(success), or None for no answer.
    let record = |scheduled: Instant, finished: Instant, answered: Option<bool>| {
        let index = finished.saturating_duration_since(start).as_secs() as usize;
        if let Some(second) = seconds.borrow_mut().get_mut(index) {
            match answered {
                Some(true) => second.ok += 1,
                Some(false) => second.non_2xx += 1,
                None => second.failed += 1,
            }
        }
        let latency_us = finished.saturating_duration_since(scheduled).as_micros() as u64;
        if let Some(second) = seconds.borrow_mut().get_mut(index) {
            second.slowest_us = second.slowest_us.max(latency_us);
        }
        if let Some(minute) = minutes.borrow_mut().get_mut(index / 60) {
            minute.record_us(latency_us);
        }
    };

    let clients = (0..CONNECTIONS).map(|client| {
        let record = &record;
        async move {
            let mut keys = Keys::new(Workload::Mix, CONNECTIONS, client, plan);
            let mut http = Http::connect(api.addr).await?;
            let mut scheduled = start + interval.mul_f64(client as f64 / CONNECTIONS as f64);
            while scheduled < end {
                tokio::time::sleep_until(scheduled.into()).await;
                match http.send(&api.charge(&keys.next_key())?).await {
                    Ok(answer) => record(scheduled, answer.finished, Some(answer.is_success())),
                    Err(_) => {
                        record(scheduled, Instant::now(), None);
                        // A new connection; if that fails, the run ends.
                        http = Http::connect(api.addr).await?;
                    }
                }
                scheduled += interval;
            }
            anyhow::Ok(())
        }
    });
    let sampler = async {
        let mut tick = tokio::time::interval_at(start.into(), Duration::from_secs(1));
        tick.tick().await;
        let mut cpu = CpuTimes::read();
        for index in 0..total_seconds {
            tick.tick().await;
            let rss = memory_bytes(&pid.to_string(), "VmRSS:").context("the service's VmRSS")?;
            let shares;
            (cpu, shares) = CpuTimes::read_since(cpu);
            let mut seconds = seconds.borrow_mut();
            seconds[index].rss = Some(rss);
            seconds[index].cpu = shares;
            if (index + 1) % 60 == 0 {
                say(format!("{:>4} s: RSS {:.1} MB", index + 1, mb(rss)));
            }
        }
        anyhow::Ok(())
    };
    // From a checkpoint, as in the benchmark.
    let _ = db.admin.batch_execute("CHECKPOINT").await;
    let mark = db.wal_mark().await?;
    let checkpoints_before = db.checkpoints().await;
    let started = chrono::Utc::now() + chrono::Duration::milliseconds(100);
    let watched = watch_checkpoints(db, start, total_seconds);
    let (results, sampled, in_checkpoint) = tokio::join!(join_all(clients), sampler, watched);
    sampled?;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let (seconds, minutes) = (seconds.into_inner(), minutes.into_inner());
    let wal = db.wal_since(&mark, seconds.iter().map(Second::answers).sum()).await?;
    let checkpoints =
        db.checkpoints().await.zip(checkpoints_before).map(|(after, before)| after - before);
    let (set, mix) = (&pgbench.floor, Workload::Mix);
    let floor_max = pgbench.run(set, mix, MAX_CONNECTIONS, plan).await?.tps;
    let rate = floor_max * percent / 100.0;
    say(format!("floor: maximum {floor_max:.0} TPS; offering {rate:.0}/s open-loop"));
    let _ = db.admin.batch_execute("CHECKPOINT").await;
    let (before, floor_start) = (CpuTimes::read(), Instant::now());
    let (floor_minutes, floor_in_checkpoint) = tokio::join!(
        pgbench.open_loop(set, mix, (CONNECTIONS, rate), length),
        watch_checkpoints(db, floor_start, total_seconds)
    );
    let (_, cpu) = CpuTimes::read_since(before);
    let floor = Floor {
        max_tps: floor_max,
        rate,
        minutes: floor_minutes?,
        cpu,
        in_checkpoint: floor_in_checkpoint,
    };
    Ok(Sustained {
        max_rps,
        percent,
        target_rps,
        seconds,
        minutes,
        wal,
        checkpoints,
        in_checkpoint,
        started,
        floor,
    })
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// Least-squares slope; 0 without a spread.
fn slope(points: &[(f64, f64)]) -> f64 {
    let (xs, ys): (Vec<f64>, Vec<f64>) = points.iter().copied().unzip();
    let slope = xs.iter().covariance(ys.iter()) / xs.iter().variance();
    Some(slope).filter(|slope| slope.is_finite()).unwrap_or(0.0)
}

/// p50, p99, p99.9 and maximum in ms, "—" without a minute.
fn quantiles(minute: Option<&Tally>) -> [String; 4] {
    let ms = |value: Option<f64>| value.map_or("—".to_owned(), |v| format!("{v:.2}"));
    let [p50, p99, p999] = [0.5, 0.99, 0.999].map(|q| ms(minute.map(|m| m.percentile_ms(q))));
    [p50, p99, p999, ms(minute.map(Tally::max_ms))]
}

/// The CPUs' busy and stolen shares over `seconds`, in %, "—" where none
/// was read. A minute's share shows whether the cost of a request drifted
/// (the offered rate is the same every minute) or the hypervisor took the
/// time.
fn mean_cpu(seconds: &[Second]) -> (String, String) {
    let read: Vec<CpuShares> = seconds.iter().filter_map(|s| s.cpu).collect();
    let mean = |share: fn(&CpuShares) -> f64| match read.len() {
        0 => "—".to_owned(),
        n => format!("{:.0}", read.iter().map(share).sum::<f64>() / n as f64),
    };
    (mean(|cpu| cpu.busy), mean(|cpu| cpu.steal))
}

/// How many of the slowest seconds the report lists.
const SLOWEST_SECONDS: usize = 5;

impl Sustained {
    /// Where a slow minute came from: the checkpoints of the run, the
    /// machine's CPU over it, and its slowest seconds by wall-clock time
    /// (to match with PostgreSQL's log), each with what the CPUs did then.
    fn slowest_seconds(&self) -> String {
        let checkpoints = self.checkpoints.map_or("not known".to_owned(), |n| n.to_string());
        let (mean_busy, _) = mean_cpu(&self.seconds);
        let mut text = format!(
            "- PostgreSQL checkpoints started during the run: {checkpoints}. The machine's CPUs \
             (service, PostgreSQL, this load generator) were {mean_busy} % busy on average.\n\
             - Slowest seconds (the slowest answer that ended in each):"
        );
        let mut slowest: Vec<(usize, &Second)> = self.seconds.iter().enumerate().collect();
        slowest.sort_by_key(|(_, second)| std::cmp::Reverse(second.slowest_us));
        for (index, second) in slowest.into_iter().take(SLOWEST_SECONDS) {
            let at = self.started + chrono::Duration::seconds(index as i64);
            let cpu = second.cpu.map_or(String::new(), |cpu| {
                format!(
                    "; CPUs {:.0} % busy, {:.0} % waiting for I/O, {:.0} % stolen",
                    cpu.busy, cpu.iowait, cpu.steal
                )
            });
            let checkpoint = match self.in_checkpoint.get(index).copied().flatten() {
                Some(true) => "; a checkpoint running",
                Some(false) => "; no checkpoint running",
                None => "",
            };
            let _ = write!(
                text,
                "\n  - {} UTC (second {}): {:.1} ms{cpu}{checkpoint}",
                at.format("%H:%M:%S"),
                index + 1,
                second.slowest_us as f64 / 1e3,
            );
        }
        text.push('\n');
        text
    }

    pub fn markdown(&self, command: &str) -> String {
        let (max_rps, length, target_rps) = (self.max_rps, self.seconds.len(), self.target_rps);
        let mut text = format!(
            "# Sustained load\n\nCommand: `{command}`\n\n\
             Mix workload (as in the benchmark). Maximum measured first: {max_rps:.0} req/s \
             (closed loop, {MAX_CONNECTIONS} connections). Offered for {length} s: \
             {target_rps:.0} req/s ({:.0} % of it), open loop over {CONNECTIONS} connections; \
             latency from each request's scheduled time.\n\n\
             | minute | answers/s | not 2xx | no answer | p50 ms | p99 ms | p99.9 ms | max ms \
             | RSS min MB | RSS max MB | CPUs busy % | stolen % |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.percent
        );
        let rss_mb = |seconds: &[Second]| {
            let rss = || seconds.iter().filter_map(|s| s.rss);
            let in_mb = |bytes: Option<u64>| bytes.map_or(f64::NAN, mb);
            (in_mb(rss().min()), in_mb(rss().max()))
        };
        for (minute, latencies) in self.minutes.iter().enumerate() {
            let seconds = &self.seconds[minute * 60..((minute + 1) * 60).min(length)];
            let sum = |field: fn(&Second) -> u64| seconds.iter().map(field).sum::<u64>();
            let (low, high) = rss_mb(seconds);
            let quantiles = quantiles(Some(latencies)).join(" | ");
            let (busy, stolen) = mean_cpu(seconds);
            let _ = writeln!(
                text,
                "| {} | {:.0} | {} | {} | {quantiles} | {low:.1} | {high:.1} | {busy} | {stolen} |",
                minute + 1,
                sum(Second::answers) as f64 / seconds.len().max(1) as f64,
                sum(|s| s.non_2xx),
                sum(|s| s.failed),
            );
        }
        let total: u64 = self.seconds.iter().map(Second::answers).sum();
        let bad: u64 = self.seconds.iter().map(|s| s.non_2xx + s.failed).sum();
        let achieved = total as f64 / length.max(1) as f64;
        // Memory after the first minute (caches fill, pools open): a slope.
        let settled: Vec<(f64, f64)> = (self.seconds.iter().enumerate().skip(60))
            .filter_map(|(second, s)| Some((second as f64 / 60.0, mb(s.rss?))))
            .collect();
        let peak =
            |from: usize, to: usize| rss_mb(&self.seconds[from.min(length)..to.min(length)]).1;
        let second_minute = match length >= 120 {
            true => format!("peak {:.1} MB in minute 2, ", peak(60, 120)),
            false => String::new(),
        };
        let _ = write!(
            text,
            "\n- Throughput: {achieved:.0} answers/s on average, {:.1} % of the offered rate.\n\
             - Errors: {bad} of {total} requests not 2xx or unanswered ({:.4} %).\n\
             - Resident memory: {second_minute}{:.1} MB in the last minute, {:.1} MB over the \
             run; slope after the first minute {:+.3} MB per minute.\n\
             - WAL: {:.0} bytes per request ({:.0} MB a minute).\n",
            100.0 * achieved / target_rps,
            100.0 * bad as f64 / total.max(1) as f64,
            peak(length.saturating_sub(60), length),
            peak(0, length),
            slope(&settled),
            self.wal.per_request().unwrap_or(f64::NAN),
            self.wal.bytes / 1e6 / (length.max(1) as f64 / 60.0),
        );
        text += &self.slowest_seconds();
        let Floor { max_tps: floor_max, rate, minutes: floor, cpu, in_checkpoint } = &self.floor;
        let cpu = cpu.map_or(String::new(), |cpu| {
            format!(" The machine's CPUs were {:.0} % busy on average over it.", cpu.busy)
        });
        let _ = write!(
            text,
            "\nBeside the floor: its mix at {:.0} % of its own maximum ({floor_max:.0} TPS, closed \
             loop, {MAX_CONNECTIONS} clients), {rate:.0}/s offered by pgbench `--rate` over \
             {CONNECTIONS} clients for as long; each latency from its scheduled start (pgbench's \
             latency plus its schedule lag).{cpu} \"checkpoint s\": the minute's seconds with a \
             PostgreSQL checkpoint running.\n\n\
             | minute | service p50 ms | p99 | p99.9 | max | checkpoint s \
             | floor p50 ms | p99 | p99.9 | max | checkpoint s |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
            self.percent
        );
        for minute in 0..self.minutes.len().max(floor.len()) {
            let service = quantiles(self.minutes.get(minute)).join(" | ");
            let in_service = checkpoint_seconds(&self.in_checkpoint, minute);
            let floor = quantiles(floor.get(minute)).join(" | ");
            let in_floor = checkpoint_seconds(in_checkpoint, minute);
            let _ = writeln!(
                text,
                "| {} | {service} | {in_service} | {floor} | {in_floor} |",
                minute + 1
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offer_is_a_rate_and_its_share_of_the_maximum() {
        assert_eq!(Offer::Percent(80).of(5_000.0), (4_000.0, 80.0));
        assert_eq!(Offer::Rate(2_500.0).of(5_000.0), (2_500.0, 50.0));
        // More than the maximum is offered as asked, the share said as it is.
        assert_eq!(Offer::Rate(6_000.0).of(5_000.0), (6_000.0, 120.0));
        assert_eq!(Offer::Percent(80).option(), "--load-percent 80");
        assert_eq!(Offer::Rate(2_800.0).option(), "--rate 2800");
    }

    #[test]
    fn the_report_counts_every_second_flags_errors_and_fits_the_memory() {
        let line: Vec<(f64, f64)> = (0..10).map(|x| (x as f64, 3.0 * x as f64 + 1.0)).collect();
        assert!((slope(&line) - 3.0).abs() < 1e-9);
        assert_eq!(slope(&[(1.0, 2.0)]), 0.0);
        let second = |ok, non_2xx, rss| Second {
            ok,
            non_2xx,
            rss: Some(rss),
            slowest_us: 2_000,
            ..Second::default()
        };
        let mut seconds: Vec<Second> = (0..120).map(|_| second(100, 0, 40_000_000)).collect();
        seconds[90] = second(98, 2, 41_000_000);
        seconds[30].slowest_us = 640_000;
        seconds[30].cpu = Some(CpuShares { busy: 97.0, iowait: 2.0, steal: 1.0 });
        // A checkpoint in seconds 20 to 39 of the first minute; none read in the second.
        let in_checkpoint = (0..60).map(|second| Some((20..40).contains(&second))).collect();
        let mut minute = Tally::new().unwrap();
        minute.record_us(1_000);
        let mut minute_of_floor = Tally::new().unwrap();
        minute_of_floor.record_us(3_000);
        let minutes = vec![minute.clone(), minute];
        let wal = Wal { bytes: 48e6, requests: 12_000, ..Wal::default() };
        let cpu = Some(CpuShares { busy: 88.0, iowait: 0.0, steal: 0.0 });
        let floor = Floor {
            max_tps: 200.0,
            rate: 160.0,
            minutes: vec![minute_of_floor],
            cpu,
            in_checkpoint: (0..60).map(|second| Some(second < 12)).collect(),
        };
        let run = Sustained {
            max_rps: 125.0,
            percent: 80.0,
            target_rps: 100.0,
            seconds,
            minutes,
            wal,
            checkpoints: Some(1),
            in_checkpoint,
            started: "2026-12-06T01:00:00Z".parse().unwrap(),
            floor,
        };
        let report = run.markdown("scripts/bench --sustain 120");
        assert!(report.contains("| 2 | 100 | 2 | 0 |"), "{report}");
        // Minute 1 had one second read (97 % busy, 1 % stolen), minute 2 none.
        assert!(report.contains("| 40.0 | 40.0 | 97 | 1 |\n| 2 |"), "{report}");
        assert!(report.contains("| 40.0 | 41.0 | — | — |\n\n"), "{report}");
        assert!(report.contains("2 of 12000 requests"), "{report}");
        assert!(report.contains("100.0 % of the offered rate"), "{report}");
        assert!(report.contains("41.0 MB in minute 2"), "{report}");
        assert!(report.contains("4000 bytes per request (24 MB a minute)"), "{report}");
        let first = "| 1 | 1.00 | 1.00 | 1.00 | 1.00 | 20 | 3.00 | 3.00 | 3.00 | 3.00 | 12 |";
        assert!(report.contains(first), "{report}");
        let second = "| 2 | 1.00 | 1.00 | 1.00 | 1.00 | — | — | — | — | — | — |";
        assert!(report.contains(second), "{report}");
        assert!(report.contains("checkpoints started during the run: 1."), "{report}");
        // The mean of the seconds read, not of every second.
        assert!(report.contains("load generator) were 97 % busy on average."), "{report}");
        assert!(report.contains("lag). The machine's CPUs were 88 % busy on average"), "{report}");
        let slowest = "  - 01:00:30 UTC (second 31): 640.0 ms; CPUs 97 % busy, 2 % waiting for \
                       I/O, 1 % stolen; a checkpoint running\n  - ";
        assert!(report.contains(slowest), "{report}");
        assert_eq!(report.matches(" UTC (second ").count(), SLOWEST_SECONDS, "{report}");
    }

    #[test]
    fn a_checkpoint_runs_from_the_rise_of_the_started_count_to_a_new_end_time() {
        let mut watch = CheckpointWatch::new((5, 1_000));
        assert!(!watch.running((5, 1_000)));
        assert!(watch.running((6, 1_000)), "one began");
        assert!(watch.running((6, 1_000)));
        assert!(!watch.running((6, 1_300)), "it ended");
        // One that begins and ends between two readings was never seen running.
        assert!(!watch.running((7, 1_301)));
        assert!(watch.running((8, 1_301)));

        // The end of one running before the first reading ends nothing later.
        let mut watch = CheckpointWatch::new((5, 1_000));
        assert!(!watch.running((5, 1_100)));
        assert!(watch.running((6, 1_100)), "a later one is seen");
    }

    #[test]
    fn cpu_shares_come_from_two_readings_of_proc_stat() {
        let earlier = CpuTimes::parse("cpu  100 0 50 800 10 0 0 0 0 0").unwrap();
        let later = CpuTimes::parse("cpu  150 0 60 820 15 0 5 10 0 0").unwrap();
        let shares = later.shares_since(&earlier).unwrap();
        assert_eq!(shares, CpuShares { busy: 65.0, iowait: 5.0, steal: 10.0 });
        assert!(later.shares_since(&later).is_none(), "no time passed");
        assert_eq!(later.busy_seconds_since(&earlier), 0.65, "50 user, 10 system, 5 softirq");
        assert!(CpuTimes::parse("cpu0 1 2 3").is_none());
        assert!(CpuTimes::read().is_some(), "this machine has /proc/stat");
    }
}
