//! The Markdown report and its targets, PASS or MISS, set against service ÷
//! floor (÷ own SQL improves when our SQL gets slower); with `--runs N`,
//! judged over the runs (BENCHMARKS.md, "Judging a target over runs").

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, Result};
use statrs::distribution::{ContinuousCDF, StudentsT};
use statrs::statistics::Statistics;

use crate::capture::Capture;
use crate::database::Wal;
use crate::pgbench::PgbenchRun;
use crate::scenario::BurstCounts;
use crate::stats::{Sample, SLOW};
use crate::Plan;

pub struct Row {
    pub scenario: String,
    pub connections: usize,
    pub sample: Sample,
    pub own: Option<PgbenchRun>,
    pub floor: Option<PgbenchRun>,
    /// Service ÷ floor in each round: how far it swings on this machine.
    pub floor_ratio_by_round: Vec<f64>,
}

pub type Round = (Sample, PgbenchRun, PgbenchRun);

pub fn ratio(sample: &Sample, yardstick: Option<&PgbenchRun>) -> Option<f64> {
    yardstick.filter(|run| run.tps > 0.0).map(|run| sample.rps() / run.tps)
}

pub fn lowest_and_highest(values: &[f64]) -> Option<(f64, f64)> {
    let (&first, rest) = values.split_first()?;
    Some(rest.iter().fold((first, first), |(low, high), &v| (low.min(v), high.max(v))))
}

impl Row {
    pub fn alone(scenario: String, connections: usize, sample: Sample) -> Self {
        let floor_ratio_by_round = Vec::new();
        Row { scenario, connections, sample, own: None, floor: None, floor_ratio_by_round }
    }

    /// Each round: the service, own SQL, the floor.
    pub fn from_rounds(scenario: String, connections: usize, rounds: Vec<Round>) -> Result<Self> {
        let floor_ratio_by_round =
            rounds.iter().filter_map(|(s, _, f)| ratio(s, Some(f))).collect();
        let mut rounds = rounds.into_iter();
        let (mut sample, mut own, mut floor) = rounds.next().context("no round measured")?;
        for (later, later_own, later_floor) in rounds {
            sample.merge(&later)?;
            own.merge(&later_own)?;
            floor.merge(&later_floor)?;
        }
        let (own, floor) = (Some(own), Some(floor));
        Ok(Row { own, floor, floor_ratio_by_round, ..Row::alone(scenario, connections, sample) })
    }

    /// `0.97 (rounds 0.88–1.10)`: over all rounds, then the lowest and highest.
    fn floor_ratio_text(&self) -> String {
        let spread = lowest_and_highest(&self.floor_ratio_by_round);
        match (ratio(&self.sample, self.floor.as_ref()), spread) {
            (Some(r), Some((low, high))) if self.floor_ratio_by_round.len() > 1 => {
                format!("{r:.2} (rounds {low:.2}–{high:.2})")
            }
            (r, _) => number(r, 2),
        }
    }
}

pub struct Report {
    pub machine: String,
    pub rows: Vec<Row>,
    pub bursts: BurstCounts,
    pub peak_rss: u64,
    pub capture: Capture,
    pub ready: Vec<Duration>,
}

/// A target, whether it was met (None: not measured), and its number and
/// bound if it has them.
pub struct Target {
    pub name: String,
    pub measured: String,
    pub met: Option<bool>,
    pub number: Option<(f64, Bound)>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

impl Bound {
    pub fn keeps(self, value: f64) -> bool {
        match self {
            Bound::AtLeast(least) => value >= least,
            Bound::AtMost(most) => value <= most,
        }
    }
}

impl Target {
    fn on_number(name: String, measured: String, value: Option<f64>, bound: Bound) -> Self {
        let met = value.map(|value| bound.keeps(value));
        Target { name, measured, met, number: value.map(|value| (value, bound)) }
    }
}

const TARGET_CONNECTIONS: usize = 32;
const NEW_MIN_OF_FLOOR: f64 = 0.8;
const REPLAY_MIN_OF_FLOOR: f64 = 1.0;
const P99_NEW_MAX_MS: f64 = 15.0;
const PEAK_RSS_MAX_MB: f64 = 64.0;
const WAL_NEW_MAX_OF_FLOOR: f64 = 1.5;

fn number(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.decimals$}"))
}

/// The service's per-request amount (`of` its `Wal`) over the floor's.
fn per_floor(row: &Row, of: fn(&Wal) -> Option<f64>) -> Option<f64> {
    let floor = row.floor.as_ref().and_then(|run| of(&run.wal));
    of(&row.sample.wal).zip(floor.filter(|f| *f > 0.0)).map(|(s, f)| s / f)
}

fn wal_ratio(row: &Row) -> Option<f64> {
    per_floor(row, Wal::per_request)
}

impl Report {
    fn row(&self, scenario: &str, connections: usize) -> Option<&Row> {
        self.rows.iter().find(|row| row.scenario == scenario && row.connections == connections)
    }

    pub fn targets(&self) -> Vec<Target> {
        let (at, not_measured) = (TARGET_CONNECTIONS, || "not measured".to_owned());
        let mut targets = Vec::new();
        for (scenario, connections, min) in [
            ("new", 32, NEW_MIN_OF_FLOOR),
            ("new", 64, NEW_MIN_OF_FLOOR),
            ("replay", 1, REPLAY_MIN_OF_FLOOR),
            ("replay", 32, REPLAY_MIN_OF_FLOOR),
            ("replay", 64, REPLAY_MIN_OF_FLOOR),
        ] {
            let row = self.row(scenario, connections);
            let ratio = row.and_then(|row| ratio(&row.sample, row.floor.as_ref()));
            let measured = row.filter(|_| ratio.is_some()).map(Row::floor_ratio_text);
            let name = format!("{scenario} ≥ {min:.1} × floor at {connections}");
            let measured = measured.unwrap_or_else(not_measured);
            targets.push(Target::on_number(name, measured, ratio, Bound::AtLeast(min)));
        }

        let (new_32, max) = (self.row("new", at), WAL_NEW_MAX_OF_FLOOR);
        let (wal, name) =
            (new_32.and_then(wal_ratio), format!("WAL per new charge ≤ {max:.1} × floor at {at}"));
        targets.push(Target::on_number(name, number(wal, 2), wal, Bound::AtMost(max)));

        // The floor's p99: what this machine can do at all.
        let p99 = new_32.map(|row| row.sample.tally.percentile_ms(0.99));
        let floor_p99 = new_32.and_then(|row| row.floor.as_ref()).map(PgbenchRun::p99_ms);
        let measured = p99.map_or_else(not_measured, |p| match floor_p99 {
            Some(floor) => format!("{p:.2} ms (floor: {floor:.2} ms)"),
            None => format!("{p:.2} ms"),
        });
        let name = format!("p99 of new at {at} ≤ {P99_NEW_MAX_MS:.0} ms");
        targets.push(Target::on_number(name, measured, p99, Bound::AtMost(P99_NEW_MAX_MS)));

        // The floor's count tells a stall of the machine from one of ours.
        let at_32 = || self.rows.iter().filter(|r| r.connections == at && r.floor.is_some());
        let slow: Vec<String> = (at_32())
            .filter_map(|row| Some((row, row.floor.as_ref()?.latencies.slow)))
            .map(|(row, floor)| {
                format!("{} {} (floor: {floor})", row.scenario, row.sample.tally.slow)
            })
            .collect();
        let name = format!("no request over {} ms in any scenario at {at}", SLOW.as_millis());
        let met = (!slow.is_empty()).then(|| at_32().all(|row| row.sample.tally.slow == 0));
        let measured = if slow.is_empty() { not_measured() } else { slow.join(", ") };
        targets.push(Target { name, measured, met, number: None });

        let failures: u64 = self.rows.iter().map(|row| row.sample.tally.non_2xx()).sum();
        let (name, measured) = ("zero non-2xx answers".to_owned(), failures.to_string());
        targets.push(Target { name, measured, met: Some(failures == 0), number: None });
        let (rss, name) = (mb(self.peak_rss), format!("peak RSS ≤ {PEAK_RSS_MAX_MB:.0} MB"));
        let bound = Bound::AtMost(PEAK_RSS_MAX_MB);
        targets.push(Target::on_number(name, format!("{rss:.1} MB"), Some(rss), bound));
        targets
    }

    pub fn markdown(&self, plan: &Plan) -> String {
        let mut md = String::new();
        let when = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC");
        let mode = match plan.quick {
            true => "quick run (smoke test: numbers are indicative only)",
            false => "full run",
        };
        let rounds = match plan.rounds {
            1 => String::new(),
            rounds => format!(
                " The three take turns in {rounds} rounds of {:.0} s each (the warm-ups before \
                 the first), and each side's rounds are added up: the machine's speed swings \
                 within minutes, and taking turns gives each side the good and the bad seconds \
                 alike. In brackets after service ÷ floor: its lowest and highest round, how far \
                 one round can fall from the whole.",
                plan.measure.as_secs_f64() / rounds as f64
            ),
        };
        let _ = writeln!(
            md,
            "## chargeonce load benchmark: {mode}, {when}\n\n\
             Machine: {}. Service: release build, \
             default configuration, simulated processor with 0 ms latency. Load generator: \
             one thread, one keep-alive HTTP/1.1 connection per client. Each point: \
             {:.1} s warm-up, then {:.0} s measured; then pgbench (`-n -M prepared -c C -j 2`, \
             the scripts beside this report) with the service's own SQL, then with the floor, likewise, at the same client count.{rounds}\n",
            self.machine,
            plan.warmup.as_secs_f64(),
            plan.measure.as_secs_f64(),
        );
        self.tables(&mut md);
        md.push_str("\nTargets:\n\n| target | measured | result |\n|---|---|---|\n");
        for target in self.targets() {
            let result = target.met.map_or("—", |met| if met { "PASS" } else { "MISS" });
            let _ = writeln!(md, "| {} | {} | {result} |", target.name, target.measured);
        }
        md
    }

    fn tables(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "| scenario | connections | requests/s | p50 ms | p99 ms | p99.9 ms | max ms \
             | over {} ms | non-2xx | own SQL TPS | floor TPS | floor p99 ms | service ÷ own SQL \
             | service ÷ floor |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
            SLOW.as_millis()
        );
        for row in &self.rows {
            let (tally, own, floor) = (&row.sample.tally, row.own.as_ref(), row.floor.as_ref());
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.connections,
                row.sample.rps(),
                tally.percentile_ms(0.50),
                tally.percentile_ms(0.99),
                tally.percentile_ms(0.999),
                tally.max_ms(),
                tally.slow,
                tally.non_2xx_text(),
                number(own.map(|run| run.tps), 0),
                number(floor.map(|run| run.tps), 0),
                number(floor.map(PgbenchRun::p99_ms), 2),
                number(ratio(&row.sample, own), 2),
                row.floor_ratio_text(),
            );
        }

        md.push_str(
            "\nWAL per request or script run, warm-ups and the fan-out of events included, \
             each side from a CHECKPOINT (BENCHMARKS.md); FPI: full-page images' share:\n\n\
             | scenario | connections | service bytes | service FPI % | own SQL bytes \
             | floor bytes | floor FPI % | service ÷ floor |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for row in self.rows.iter().filter(|row| row.floor.is_some()) {
            let wal = |wal: Option<&Wal>| wal.and_then(Wal::per_request);
            let (own, floor) = (row.own.as_ref(), row.floor.as_ref());
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.connections,
                number(wal(Some(&row.sample.wal)), 0),
                number(row.sample.wal.fpi_share().map(|s| 100.0 * s), 0),
                number(wal(own.map(|run| &run.wal)), 0),
                number(wal(floor.map(|run| &run.wal)), 0),
                number(floor.and_then(|run| run.wal.fpi_share()).map(|s| 100.0 * s), 0),
                number(wal_ratio(row), 2),
            );
        }

        md.push_str(
            "\nThe machine's CPU time per request or script run (every process, µs), over the \
             same spans as the WAL: what a request costs where batches are small (1 \
             connection) and where they fill (32, 64):\n\n\
             | scenario | connections | service | own SQL | floor | service ÷ floor |\n\
             |---|---:|---:|---:|---:|---:|\n",
        );
        for row in self.rows.iter().filter(|row| row.floor.is_some()) {
            let cpu = |wal: Option<&Wal>| wal.and_then(Wal::busy_us_per_request);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.connections,
                number(cpu(Some(&row.sample.wal)), 0),
                number(cpu(row.own.as_ref().map(|run| &run.wal)), 0),
                number(cpu(row.floor.as_ref().map(|run| &run.wal)), 0),
                number(per_floor(row, Wal::busy_us_per_request), 2),
            );
        }

        let _ = writeln!(
            md,
            "\nBurst: {} measured rounds; rounds in which not exactly one request created the \
             charge: {}.\n\n| measure | value |\n|---|---|\n\
             | peak RSS of the service (VmHWM, after all scenarios) | {:.1} MB |",
            self.bursts.rounds,
            self.bursts.not_created_once,
            mb(self.peak_rss)
        );
        for (flow, captured) in
            [("new charge", &self.capture.new), ("replay", &self.capture.replay)]
        {
            let (requests, trips) = (captured.requests, captured.round_trips());
            let _ = writeln!(
                md,
                "| round trips per {flow} ({requests} sequential requests) | {trips:.2} |"
            );
        }
        let ms = |d: Option<&Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        let _ = writeln!(
            md,
            "| start-to-ready ({} starts, spawn to GET /readyz 200) | median {:.0} ms, max {:.0} ms |",
            self.ready.len(),
            ms(self.ready.get(self.ready.len() / 2)),
            ms(self.ready.iter().max()),
        );

        md.push_str(
            "\nStatements per request (pg_stat_statements), by the constant of chargeonce::db \
             they are:\n\n| flow | calls | per request | statement |\n|---|---:|---:|---|\n",
        );
        for (flow, captured) in [("new", &self.capture.new), ("replay", &self.capture.replay)] {
            for seen in &captured.statements {
                let constant = seen.constant.unwrap_or("unknown");
                let per_request = captured.per_request(seen);
                let _ = writeln!(md, "| {flow} | {} | {per_request:.3} | {constant} |", seen.calls);
            }
        }
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// (mean, low, high) of the 95 % confidence interval; None for one value.
pub fn interval(values: &[f64]) -> Option<(f64, f64, f64)> {
    let count = values.len() as f64;
    let (mean, variance) = (values.mean(), values.variance());
    let t = StudentsT::new(0.0, 1.0, count - 1.0).ok()?.inverse_cdf(0.975);
    let half = t * (variance / count).sqrt();
    (values.len() >= 2).then_some((mean, mean - half, mean + half))
}

/// The targets over the runs, each run's in `Report::targets` order.
pub fn over_runs(runs: &[Vec<Target>]) -> String {
    let mut md = format!(
        "## The targets over {} runs\n\n\
         A target on a number is MET when the 95 % confidence interval of its mean over \
         the runs keeps the bound, MISSED when the interval breaks it, UNDECIDED when it \
         straddles it. A target that something never happens is MET only if every run \
         met it. Each run's report follows.\n\n\
         | target | runs met | mean (95 % interval) | lowest–highest run | over the runs |\n\
         |---|---|---|---|---|\n",
        runs.len()
    );
    for (index, target) in runs.first().into_iter().flatten().enumerate() {
        let of_runs: Vec<&Target> = runs.iter().filter_map(|run| run.get(index)).collect();
        let results: Vec<bool> = of_runs.iter().filter_map(|t| t.met).collect();
        let met = results.iter().filter(|&&met| met).count();
        let numbers: Vec<f64> = of_runs.iter().filter_map(|t| t.number.map(|n| n.0)).collect();
        let bound = of_runs.iter().find_map(|t| t.number.map(|n| n.1));
        let mean = interval(&numbers);
        let verdict = match (bound, mean) {
            _ if results.is_empty() => "not measured",
            (Some(bound), Some((_, low, high))) => match (bound.keeps(low), bound.keeps(high)) {
                (true, true) => "MET",
                (false, false) => "MISSED",
                _ => "UNDECIDED",
            },
            _ if met == results.len() => "MET",
            _ => "MISSED",
        };
        let mean = mean.map_or("—".to_owned(), |(m, l, h)| format!("{m:.2} ({l:.2}–{h:.2})"));
        let range = lowest_and_highest(&numbers)
            .map_or("—".to_owned(), |(l, h)| format!("{l:.2}–{h:.2}"));
        let name = &target.name;
        let _ =
            writeln!(md, "| {name} | {met} of {} | {mean} | {range} | {verdict} |", results.len());
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Tally;

    #[test]
    fn the_spread_is_the_lowest_and_the_highest_round_when_there_are_several() {
        assert_eq!(lowest_and_highest(&[1.04, 0.88, 1.10, 0.97]), Some((0.88, 1.10)));
        assert_eq!(lowest_and_highest(&[]), None);
        let row = |ratios: &[f64]| {
            let sample = Sample { tally: Tally::new().unwrap(), seconds: 0.0, wal: Wal::default() };
            Row { floor_ratio_by_round: ratios.to_vec(), ..Row::alone("replay".into(), 1, sample) }
        };
        // No floor run: no ratio, whatever the rounds.
        assert_eq!(row(&[0.9, 1.0]).floor_ratio_text(), "—");
    }

    fn target(value: f64, bound: Bound) -> Target {
        let met = Some(bound.keeps(value));
        Target { name: "t".to_owned(), measured: String::new(), met, number: Some((value, bound)) }
    }

    fn verdict(values: &[f64], bound: Bound) -> String {
        let runs: Vec<Vec<Target>> = values.iter().map(|&v| vec![target(v, bound)]).collect();
        let md = over_runs(&runs);
        md.lines().last().unwrap().rsplit('|').nth(1).unwrap().trim().to_owned()
    }

    #[test]
    fn the_interval_is_students_t_around_the_mean() {
        // Mean 1.0, sample standard deviation 0.1, three values: the half
        // width is t(0.975, 2) = 4.303 × 0.1 / √3.
        let (mean, low, high) = interval(&[0.9, 1.0, 1.1]).unwrap();
        let half = 4.303 * 0.1 / 3f64.sqrt();
        assert!((mean - 1.0).abs() < 1e-12);
        assert!((low - (1.0 - half)).abs() < 1e-4 && (high - (1.0 + half)).abs() < 1e-4);
        assert_eq!(interval(&[1.0]), None);
    }

    #[test]
    fn a_number_is_met_only_when_its_whole_interval_keeps_the_bound() {
        let at_least = Bound::AtLeast(1.0);
        assert_eq!(verdict(&[1.13, 1.11, 1.08], at_least), "MET");
        assert_eq!(verdict(&[1.13, 0.97, 1.06, 0.94], at_least), "UNDECIDED");
        assert_eq!(verdict(&[0.90, 0.92, 0.91], at_least), "MISSED");
        assert_eq!(verdict(&[8.0, 20.0, 12.0], Bound::AtMost(15.0)), "UNDECIDED");
        assert_eq!(verdict(&[8.0, 9.0, 10.0], Bound::AtMost(15.0)), "MET");
        let line = over_runs(&[vec![target(1.14, at_least)], vec![target(1.08, at_least)]]);
        assert!(line.contains("| t | 2 of 2 | 1.11 ("), "{line}");
    }

    #[test]
    fn a_never_target_is_met_only_if_every_run_met_it() {
        let never =
            |met| vec![Target { name: "n".into(), measured: String::new(), met, number: None }];
        let md = over_runs(&[never(Some(true)), never(Some(false)), never(Some(true))]);
        assert!(md.ends_with("| n | 2 of 3 | — | — | MISSED |\n"), "{md}");
        assert!(over_runs(&[never(Some(true)), never(Some(true))]).ends_with("| MET |\n"));
        assert!(over_runs(&[never(None)]).ends_with("| 0 of 0 | — | — | not measured |\n"));
    }
}
