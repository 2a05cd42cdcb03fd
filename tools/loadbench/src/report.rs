//! The Markdown report (printed and written to `report.md`) and the
//! targets, each with PASS or MISS. A missed target is a result, not a
//! failure: the benchmark's exit status does not depend on it.
//!
//! The two ratios: **service ÷ own SQL** is the cost of our layer over the
//! SQL the service runs; **service ÷ floor** also includes what that SQL
//! costs over the least this design can cost, and is the one the targets
//! use, because a ratio against our own SQL improves when the SQL gets
//! slower.

use std::fmt::Write as _;
use std::time::Duration;

use crate::capture::Capture;
use crate::database::Machine;
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
    /// Service ÷ floor in each interleaved round, in order: how far the
    /// ratio swings from one round to the next on this machine.
    pub floor_ratio_by_round: Vec<f64>,
}

/// The service's throughput over a pgbench run's, if the run made any.
pub fn ratio(sample: &Sample, yardstick: &PgbenchRun) -> Option<f64> {
    (yardstick.tps > 0.0).then(|| sample.rps() / yardstick.tps)
}

impl Row {
    fn ratio(&self, yardstick: Option<&PgbenchRun>) -> Option<f64> {
        yardstick.and_then(|run| ratio(&self.sample, run))
    }

    pub fn ratio_own(&self) -> Option<f64> {
        self.ratio(self.own.as_ref())
    }

    pub fn ratio_floor(&self) -> Option<f64> {
        self.ratio(self.floor.as_ref())
    }

    /// The lowest and the highest service ÷ floor of the point's rounds,
    /// when it had more than one.
    pub fn floor_ratio_spread(&self) -> Option<(f64, f64)> {
        let rounds = &self.floor_ratio_by_round;
        lowest_and_highest(rounds).filter(|_| rounds.len() > 1)
    }

    /// Service ÷ floor, and the spread of its rounds if there were several.
    fn floor_ratio_text(&self) -> String {
        ratio_with_spread(self.ratio_floor(), self.floor_ratio_spread())
    }
}

/// The lowest and the highest of `values`; None if there are none.
pub fn lowest_and_highest(values: &[f64]) -> Option<(f64, f64)> {
    let (&first, rest) = values.split_first()?;
    Some(rest.iter().fold((first, first), |(low, high), &value| {
        (low.min(value), high.max(value))
    }))
}

/// `0.97 (rounds 0.88–1.10)`: a ratio over all rounds, then its lowest and
/// highest round; a ratio alone when there was one round.
fn ratio_with_spread(ratio: Option<f64>, spread: Option<(f64, f64)>) -> String {
    match (ratio, spread) {
        (Some(ratio), Some((low, high))) => format!("{ratio:.2} (rounds {low:.2}–{high:.2})"),
        (ratio, _) => number(ratio, 2),
    }
}

pub struct Report {
    pub machine: Machine,
    pub rows: Vec<Row>,
    pub bursts: BurstCounts,
    pub peak_rss: u64,
    pub capture: Capture,
    pub ready: Vec<Duration>,
    /// The longest wait, before a run, for the service's webhook dispatcher
    /// to fan out what the previous runs left (`database::Checkpointer`).
    pub longest_settle: Duration,
    /// The pgbench commands, own SQL then floor.
    pub commands: Vec<String>,
}

/// One target and whether it was met (None: not measured in this run).
pub struct Target {
    pub name: String,
    pub measured: String,
    pub met: Option<bool>,
    /// For a target on a number (a ratio, a p99, megabytes): the number and
    /// its bound, which `runs` averages over several runs. None for a target
    /// that something never happens, and when not measured.
    pub number: Option<Bounded>,
}

/// A measured number and the bound a target sets it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounded {
    pub value: f64,
    pub bound: Bound,
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
    /// A target on a number: met if the number keeps the bound.
    fn on_number(name: String, measured: String, value: Option<f64>, bound: Bound) -> Self {
        Target {
            name,
            measured,
            met: value.map(|value| bound.keeps(value)),
            number: value.map(|value| Bounded { value, bound }),
        }
    }
}

/// Clients at which latency targets apply.
const TARGET_CONNECTIONS: usize = 32;
const NEW_MIN_OF_FLOOR: f64 = 0.8;
const REPLAY_MIN_OF_FLOOR: f64 = 1.0;
const P99_NEW_MAX_MS: f64 = 15.0;
const PEAK_RSS_MAX_MB: f64 = 64.0;

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn number(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "—".to_owned(), |v| format!("{v:.decimals$}"))
}

impl Report {
    fn row(&self, scenario: &str, connections: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|row| row.scenario == scenario && row.connections == connections)
    }

    pub fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        let mut floor_target = |scenario: &str, connections: usize, min: f64| {
            let row = self.row(scenario, connections);
            let ratio = row.and_then(Row::ratio_floor);
            let measured = match (row, ratio) {
                (Some(row), Some(_)) => row.floor_ratio_text(),
                _ => "not measured".to_owned(),
            };
            targets.push(Target::on_number(
                format!("{scenario} ≥ {min:.1} × floor at {connections}"),
                measured,
                ratio,
                Bound::AtLeast(min),
            ));
        };
        floor_target("new", 32, NEW_MIN_OF_FLOOR);
        floor_target("new", 64, NEW_MIN_OF_FLOOR);
        for connections in [1, 32, 64] {
            floor_target("replay", connections, REPLAY_MIN_OF_FLOOR);
        }

        let new_32 = self.row("new", TARGET_CONNECTIONS);
        let p99 = new_32.map(|row| row.sample.tally.percentile_ms(0.99));
        // The floor's own p99 at the same count says what this machine can
        // do at all.
        let floor_p99 = new_32
            .and_then(|row| row.floor.as_ref())
            .map_or(String::new(), |run| {
                format!(" (floor: {:.2} ms)", run.p99_ms)
            });
        targets.push(Target::on_number(
            format!("p99 of new at {TARGET_CONNECTIONS} ≤ {P99_NEW_MAX_MS:.0} ms"),
            p99.map_or("not measured".to_owned(), |p| {
                format!("{p:.2} ms{floor_p99}")
            }),
            p99,
            Bound::AtMost(P99_NEW_MAX_MS),
        ));

        let at_32: Vec<&Row> = self
            .rows
            .iter()
            .filter(|row| row.connections == TARGET_CONNECTIONS)
            .collect();
        // The floor's own count at the same scenario tells a stall of the
        // machine (every client of the floor waits too) from one of ours.
        let slow: Vec<String> = at_32
            .iter()
            .map(|row| {
                let floor = row
                    .floor
                    .as_ref()
                    .map_or(String::new(), |run| format!(" (floor: {})", run.slow));
                format!("{} {}{floor}", row.scenario, row.sample.tally.slow())
            })
            .collect();
        targets.push(Target {
            name: format!(
                "no request over {} ms in any scenario at {TARGET_CONNECTIONS}",
                SLOW.as_millis()
            ),
            measured: if slow.is_empty() {
                "not measured".to_owned()
            } else {
                slow.join(", ")
            },
            met: (!at_32.is_empty()).then(|| at_32.iter().all(|row| row.sample.tally.slow() == 0)),
            number: None,
        });

        let failures: u64 = self.rows.iter().map(|row| row.sample.tally.non_2xx()).sum();
        targets.push(Target {
            name: "zero non-2xx answers".to_owned(),
            measured: failures.to_string(),
            met: Some(failures == 0),
            number: None,
        });
        let rss = mb(self.peak_rss);
        targets.push(Target::on_number(
            format!("peak RSS ≤ {PEAK_RSS_MAX_MB:.0} MB"),
            format!("{rss:.1} MB"),
            Some(rss),
            Bound::AtMost(PEAK_RSS_MAX_MB),
        ));
        targets
    }

    pub fn markdown(&self, plan: &Plan) -> String {
        let mut md = String::new();
        let when = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC");
        let mode = if plan.quick {
            "quick run (smoke test: numbers are indicative only)"
        } else {
            "full run"
        };
        let _ = writeln!(md, "## chargeonce load benchmark: {mode}, {when}\n");
        let m = &self.machine;
        let _ = writeln!(
            md,
            "Machine: {} cores (nproc), {}; PostgreSQL {} ({}). Service: release build, \
             default configuration, simulated processor with 0 ms latency. Load generator: \
             one thread, one keep-alive HTTP/1.1 connection per client. Each point: \
             {:.1} s warm-up, then {:.0} s measured; then pgbench with the service's own SQL, \
             then pgbench with the floor, likewise, at the same client count.{}\n",
            m.cores,
            m.cpu,
            m.postgres,
            m.settings,
            plan.warmup.as_secs_f64(),
            plan.measure.as_secs_f64(),
            match plan.rounds {
                1 => String::new(),
                rounds => format!(
                    " The three take turns in {rounds} rounds of {:.0} s each (the warm-ups \
                     before the first), and each side's rounds are added up: the machine's \
                     speed swings within minutes, and taking turns gives each side the good and \
                     the bad seconds alike. In brackets after service ÷ floor: its lowest and \
                     highest round, how far one round can fall from the whole.",
                    plan.measure.as_secs_f64() / rounds as f64
                ),
            }
        );

        self.main_table(&mut md);
        self.pgbench_table(&mut md);
        self.cpu_table(&mut md);
        let _ = writeln!(
            md,
            "\nBurst: {} measured rounds; rounds in which not exactly one request created the \
             charge: {}.\n",
            self.bursts.rounds, self.bursts.not_created_once
        );
        self.measures_table(&mut md);
        self.statements_table(&mut md);
        md.push_str("\npgbench:\n\n");
        for command in &self.commands {
            let _ = writeln!(md, "- `{command}`");
        }

        md.push_str("\nTargets:\n\n| target | measured | result |\n|---|---|---|\n");
        for target in self.targets() {
            let result = match target.met {
                Some(true) => "PASS",
                Some(false) => "MISS",
                None => "—",
            };
            let _ = writeln!(md, "| {} | {} | {result} |", target.name, target.measured);
        }
        md
    }

    fn main_table(&self, md: &mut String) {
        let _ = writeln!(
            md,
            "| scenario | connections | requests/s | p50 ms | p99 ms | p99.9 ms | max ms \
             | over {} ms | non-2xx | own SQL TPS | floor TPS | service ÷ own SQL \
             | service ÷ floor |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
            SLOW.as_millis()
        );
        for row in &self.rows {
            let tally = &row.sample.tally;
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.connections,
                row.sample.rps(),
                tally.percentile_ms(0.50),
                tally.percentile_ms(0.99),
                tally.percentile_ms(0.999),
                tally.latencies.max_ms(),
                tally.slow(),
                tally.non_2xx_text(),
                number(row.own.as_ref().map(|run| run.tps), 0),
                number(row.floor.as_ref().map(|run| run.tps), 0),
                number(row.ratio_own(), 2),
                row.floor_ratio_text(),
            );
        }
    }

    fn pgbench_table(&self, md: &mut String) {
        md.push_str(
            "\npgbench latencies per script run (a charge or a replay), from its summary \
             (mean) and its per-transaction log (the rest). The floor's slowest \
             transactions show the machine's own stalls:\n\n\
             | scenario | connections | own SQL mean ms | own SQL p99 ms | floor mean ms \
             | floor p99 ms | floor max ms | floor over 100 ms |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for row in self.rows.iter().filter(|row| row.own.is_some()) {
            let own = row.own.as_ref();
            let floor = row.floor.as_ref();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.connections,
                number(own.map(|run| run.mean_ms), 2),
                number(own.map(|run| run.p99_ms), 2),
                number(floor.map(|run| run.mean_ms), 2),
                number(floor.map(|run| run.p99_ms), 2),
                number(floor.map(|run| run.max_ms), 2),
                floor.map_or("—".to_owned(), |run| run.slow.to_string()),
            );
        }
    }

    fn cpu_table(&self, md: &mut String) {
        md.push_str(
            "\nWhere the CPU went, in % of all cores' time during the measured seconds \
             (from /proc; \"rest\" is PostgreSQL, the kernel and anything else):\n\n\
             | scenario | connections | service run: busy | service | load generator \
             | rest | own SQL run: busy | floor run: busy |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for row in &self.rows {
            let Some(cpu) = row.sample.cpu else { continue };
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} |",
                row.scenario,
                row.connections,
                cpu.busy,
                cpu.service,
                cpu.generator,
                cpu.rest(),
                number(row.own.as_ref().map(|run| run.cpu_busy), 0),
                number(row.floor.as_ref().map(|run| run.cpu_busy), 0),
            );
        }
    }

    fn measures_table(&self, md: &mut String) {
        md.push_str("| measure | value |\n|---|---|\n");
        let _ = writeln!(
            md,
            "| peak RSS of the service (VmHWM, after all scenarios) | {:.1} MB |",
            mb(self.peak_rss)
        );
        for (flow, captured) in [
            ("new charge", &self.capture.new),
            ("replay", &self.capture.replay),
        ] {
            let _ = writeln!(
                md,
                "| round trips per {flow} ({} sequential requests) | {:.2} |",
                captured.requests,
                captured.round_trips()
            );
        }
        let median = self
            .ready
            .get(self.ready.len() / 2)
            .copied()
            .unwrap_or_default();
        let slowest = self.ready.iter().max().copied().unwrap_or_default();
        let _ = writeln!(
            md,
            "| start-to-ready ({} starts, spawn to GET /readyz 200) | median {:.0} ms, max {:.0} ms |",
            self.ready.len(),
            ms(median),
            ms(slowest)
        );
        let _ = writeln!(
            md,
            "| longest wait before a run for the webhook dispatcher to fan out the events of the runs before | {:.1} s |",
            self.longest_settle.as_secs_f64()
        );
    }

    fn statements_table(&self, md: &mut String) {
        md.push_str(
            "\nStatements per request (pg_stat_statements), by the constant of chargeonce::db \
             they are:\n\n| flow | calls | per request | statement |\n|---|---:|---:|---|\n",
        );
        for (flow, captured) in [("new", &self.capture.new), ("replay", &self.capture.replay)] {
            for seen in &captured.statements {
                let _ = writeln!(
                    md,
                    "| {flow} | {} | {:.3} | {} |",
                    seen.calls,
                    captured.per_request(seen),
                    seen.constant.unwrap_or("unknown"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row_of_rounds(ratios: &[f64]) -> Row {
        Row {
            scenario: "replay".to_owned(),
            connections: 1,
            sample: Sample {
                tally: crate::stats::Tally::new().unwrap(),
                seconds: 0.0,
                cpu: None,
            },
            own: None,
            floor: None,
            floor_ratio_by_round: ratios.to_vec(),
        }
    }

    #[test]
    fn the_spread_is_the_lowest_and_the_highest_round() {
        let row = row_of_rounds(&[1.04, 0.88, 1.10, 0.97]);
        assert_eq!(row.floor_ratio_spread(), Some((0.88, 1.10)));
        assert_eq!(
            ratio_with_spread(Some(0.9749), row.floor_ratio_spread()),
            "0.97 (rounds 0.88–1.10)"
        );
    }

    #[test]
    fn one_round_has_no_spread() {
        for ratios in [&[][..], &[0.95][..]] {
            let row = row_of_rounds(ratios);
            assert_eq!(row.floor_ratio_spread(), None);
            assert_eq!(
                ratio_with_spread(Some(0.95), row.floor_ratio_spread()),
                "0.95"
            );
        }
        assert_eq!(ratio_with_spread(None, Some((0.9, 1.0))), "—");
    }
}
