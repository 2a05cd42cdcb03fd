//! The load benchmark of chargeonce. Run it with `scripts/bench [--quick]`,
//! which provides a PostgreSQL with pg_stat_statements, builds the release
//! service and then runs `cargo run --release -p chargeonce-loadbench --
//! --admin-url URL [--quick]`. BENCHMARKS.md explains the method and keeps
//! the results.
//!
//! The job: measure the release `chargeonce` binary, running as a separate
//! process against a fresh database, and compare it on the same machine in
//! the same run with two pgbench yardsticks at the same client counts:
//!
//! - **its own SQL**: the statements the service prepares (the constants of
//!   `chargeonce::db`), with the same kind of values. Service ÷ own SQL is
//!   the cost of our layer (HTTP, JSON, the pool, the scheduling).
//! - **the floor**: the least SQL this design can cost, on a minimal table
//!   of its own. Service ÷ floor also counts what our SQL itself costs,
//!   which a ratio against our own SQL cannot show.
//!
//! Invariants:
//! - The service runs exactly the statements the scripts run: the
//!   statements it executes per request are read back from
//!   pg_stat_statements and must be the constants the scripts use, and every
//!   statement it executes at all must be a known constant; anything else
//!   stops the run with the statement's text rather than compare wrongly.
//! - Every spawned process (the service, pgbench) is killed and the bench
//!   database dropped on every path out: success, error, panic or Ctrl-C.
//! - The exit status says whether the benchmark could measure, not whether
//!   a target was met: it is a measurement, not a test.
//!
//! Modules, by job: `service` (the binary under test), `http` (the load
//! client), `scenario` (what the clients send), `stats` (latencies and
//! statuses), `proc` (CPU and memory from /proc), `database` (the bench
//! database), `capture` (pg_stat_statements), `script` (pgbench scripts),
//! `pgbench` (running it), `report` (the Markdown report and the targets),
//! `runs` (each target judged over several runs, `--runs N`), `sustain`
//! (the sustained run: a steady share of the maximum for minutes, memory
//! sampled each second).

mod capture;
mod database;
mod http;
mod pgbench;
mod proc;
mod report;
mod runs;
mod scenario;
mod script;
mod service;
mod stats;
mod sustain;

use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use clap::Parser;

use crate::capture::Capture;
use crate::database::{BenchDatabase, Checkpointer};
use crate::http::Api;
use crate::pgbench::{Pgbench, PgbenchRun};
use crate::report::{Report, Row};
use crate::scenario::Workload;
use crate::service::ServiceBinary;
use crate::stats::Sample;

/// Measures chargeonce against pgbench running its own SQL and a fixed
/// floor. Normally run through scripts/bench, which also provides the
/// PostgreSQL server and builds the service.
#[derive(Parser)]
#[command(name = "chargeonce-loadbench")]
struct Args {
    /// Any database of the PostgreSQL server to measure on; it must preload
    /// pg_stat_statements. The benchmark creates its own database there and
    /// drops it at the end.
    #[arg(long, env = "BENCH_DATABASE_URL")]
    admin_url: String,

    /// A smoke run (1 s per point, clients 1 and 32): proves the benchmark
    /// works; its numbers mean little.
    #[arg(long)]
    quick: bool,

    /// Instead of the benchmark: measure the mix's maximum throughput, then
    /// hold `--load-percent` of it for this many seconds, sampling the
    /// service's memory each second (sustain.md, sustain.csv).
    #[arg(long, value_name = "SECONDS", conflicts_with = "quick")]
    sustain: Option<u64>,

    /// The share of the maximum throughput a sustained run offers.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=100))]
    load_percent: u32,

    /// Full runs to make one after the other, each on a fresh database. With
    /// more than one, report.md starts with each target judged over all runs
    /// (the mean and its 95 % confidence interval) and each run's report
    /// follows; report-K.md keeps run K's alone.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50), conflicts_with = "sustain")]
    runs: u32,

    /// The release `chargeonce` binary to measure [default: `chargeonce`
    /// next to this program, i.e. target/release/chargeonce].
    #[arg(long)]
    service: Option<PathBuf>,

    /// Where the report, the pgbench scripts and logs and the service's log
    /// go [default: target/bench].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// How long and how wide each step runs.
#[derive(Clone)]
pub struct Plan {
    pub quick: bool,
    pub connections: &'static [usize],
    pub warmup: Duration,
    pub measure: Duration,
    /// Charges created beforehand whose keys replays re-send; the floor's
    /// lookup table has as many rows.
    pub pool_size: usize,
    /// How many interleaved rounds each point is measured in (`ROUNDS` in
    /// a full run, one in a quick run).
    pub rounds: usize,
    /// Which of a point's interleaved rounds this is:
    /// part of the keys and pgbench's run names, so that a later round
    /// never re-sends an earlier round's "new" keys.
    pub round: usize,
}

/// Rounds each point of a full run is measured in: the service, its own
/// SQL and the floor take turns, each `measure / ROUNDS` at a time. This
/// machine's throughput swings within minutes (the floor made 6,049 and
/// 4,013 new charges/s at 32 clients ten minutes apart), and at one client
/// where the scheduler puts the two threads moves a run by ±12 %
/// (BENCHMARKS.md, round 12); taking turns gives every side the machine's
/// good and bad seconds alike.
const ROUNDS: usize = 5;

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                quick,
                connections: &[1, 32],
                warmup: Duration::from_millis(300),
                measure: Duration::from_secs(1),
                pool_size: 2_000,
                rounds: 1,
                round: 0,
            }
        } else {
            Self {
                quick,
                connections: &[1, 32, 64],
                warmup: Duration::from_secs(2),
                measure: Duration::from_secs(10),
                pool_size: 20_000,
                rounds: ROUNDS,
                round: 0,
            }
        }
    }

    /// The plan of round `round` of `self.rounds`: an equal share of the
    /// measured time, and the warm-up only before the first round.
    fn for_round(&self, round: usize) -> Plan {
        let rounds = u32::try_from(self.rounds.max(1)).unwrap_or(u32::MAX);
        Plan {
            warmup: if round == 0 {
                self.warmup
            } else {
                Duration::ZERO
            },
            measure: self.measure / rounds,
            round,
            ..self.clone()
        }
    }
}

/// Sequential requests whose statements are counted, per flow.
const CAPTURE_REQUESTS: usize = 500;
/// Connections that create the charges replays are drawn from.
const POOL_FILL_CONNECTIONS: usize = 32;

pub fn say(message: impl Display) {
    eprintln!("loadbench: {message}");
}

fn main() -> ExitCode {
    let args = Args::parse();
    // One thread: the load generator takes at most one of the machine's
    // cores and leaves the rest to the service and PostgreSQL.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            say(format!("FAILED: cannot build a tokio runtime: {error}"));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            say(format!("FAILED: {error:#}"));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let plan = Plan::new(args.quick);
    let out_dir = output_dir(args.out)?;
    let binary = ServiceBinary::find(args.service, &out_dir)?;

    if let Some(seconds) = args.sustain {
        let database = BenchDatabase::create(&args.admin_url).await?;
        let length = Duration::from_secs(seconds);
        let outcome = tokio::select! {
            outcome = sustain(&plan, &binary, &database, &out_dir, length, args.load_percent) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        database.close();
        let command = format!(
            "scripts/bench --sustain {seconds} --load-percent {}",
            args.load_percent
        );
        let markdown = outcome?.write(&out_dir, &command)?;
        println!("{markdown}");
        say(format!(
            "done in {:.0} s; sustain.md and sustain.csv written to {}",
            started.elapsed().as_secs_f64(),
            out_dir.display()
        ));
        return Ok(());
    }

    let runs = usize::try_from(args.runs).unwrap_or(1);
    // Each run's report, written when it ends (it says when), and its
    // targets.
    let mut each = Vec::with_capacity(runs);
    let mut targets = Vec::with_capacity(runs);
    for run in 1..=runs {
        if runs > 1 {
            say(format!("run {run} of {runs}"));
        }
        // Each run on a fresh database.
        let database = BenchDatabase::create(&args.admin_url).await?;
        // The service and pgbench live inside `measure`: they are killed
        // when that future ends or is dropped (Ctrl-C), before the database
        // goes.
        let outcome = tokio::select! {
            outcome = measure(&plan, &binary, &database, &out_dir) => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        database.close();
        let report = outcome?;
        let markdown = report.markdown(&plan);
        if runs > 1 {
            write(&out_dir.join(format!("report-{run}.md")), &markdown)?;
        }
        each.push(markdown);
        targets.push(report.targets());
    }

    let mut markdown = String::new();
    if runs > 1 {
        markdown.push_str(&runs::markdown(&runs::judge(&targets), runs));
        markdown.push('\n');
    }
    markdown.push_str(&each.join("\n"));
    let report_path = out_dir.join("report.md");
    write(&report_path, &markdown)?;
    println!("{markdown}");
    say(format!(
        "done in {:.0} s; report written to {}",
        started.elapsed().as_secs_f64(),
        report_path.display()
    ));
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The bench database migrated, with its merchant; the merchant's API key.
async fn migrate_and_create_merchant(
    binary: &ServiceBinary,
    database: &BenchDatabase,
    out_dir: &Path,
) -> Result<String> {
    say("migrating and creating the merchant");
    binary.cli(&database.url, &["migrate"]).await?;
    let api_key = binary
        .cli(&database.url, &["merchant", "create", "Bench"])
        .await?;
    if api_key.is_empty() {
        bail!("`chargeonce merchant create` printed no API key");
    }
    Ok(api_key)
}

/// Creates the charges replays re-send, then gathers statistics, as
/// autovacuum does within a minute on a table in use. Without them, a
/// generic plan cached while the table was new may look a replay's key up
/// through the merchant's listing index (reading every charge of the
/// merchant) until the first autoanalyze, for the service and for pgbench
/// alike; ANALYZE drops those cached plans.
async fn fill_replay_pool(
    plan: &Plan,
    api: &Api,
    database: &BenchDatabase,
    binary: &ServiceBinary,
    service: &mut chargeonce_testkit::Spawned,
    out_dir: &Path,
) -> Result<()> {
    say(format!(
        "creating {} charges for the replays",
        plan.pool_size
    ));
    send_replay_pool(
        plan,
        api,
        binary,
        service,
        out_dir,
        "creating the charges for the replays",
    )
    .await?;
    database
        .client
        .batch_execute("ANALYZE")
        .await
        .context("ANALYZE after creating the replay pool")
}

/// Sends one request for every key of the replay pool: the first time it
/// creates the charges, later ones replay them. `doing` names the step in
/// an error.
async fn send_replay_pool(
    plan: &Plan,
    api: &Api,
    binary: &ServiceBinary,
    service: &mut chargeonce_testkit::Spawned,
    out_dir: &Path,
    doing: &str,
) -> Result<()> {
    let pool_keys: Vec<String> = (0..plan.pool_size).map(scenario::pool_key).collect();
    let sent = scenario::send_all(api, POOL_FILL_CONNECTIONS, &pool_keys).await;
    or_explain(sent, binary, service, out_dir)
        .await?
        .require_success(doing)
}

/// The sustained run, between creating the database and dropping it.
async fn sustain(
    plan: &Plan,
    binary: &ServiceBinary,
    database: &BenchDatabase,
    out_dir: &Path,
    length: Duration,
    percent: u32,
) -> Result<sustain::Sustained> {
    let api_key = migrate_and_create_merchant(binary, database, out_dir).await?;
    let mut service = binary.start(&database.url).await;
    let api = Api::new(service.port, &api_key)?;
    fill_replay_pool(plan, &api, database, binary, &mut service, out_dir).await?;
    let run = sustain::run(&api, plan, service.pid(), length, percent).await;
    or_explain(run, binary, &mut service, out_dir).await
}

/// The output folder, emptied of the previous run's service log.
fn output_dir(chosen: Option<PathBuf>) -> Result<PathBuf> {
    let dir = match chosen {
        Some(dir) => dir,
        // This program is target/<profile>/chargeonce-loadbench.
        None => std::env::current_exe()
            .context("finding this program's path")?
            .parent()
            .and_then(Path::parent)
            .context("this program is not inside a cargo target folder; pass --out")?
            .join("bench"),
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = fs::remove_file(dir.join("service.log"));
    Ok(dir)
}

/// Everything between creating the database and dropping it.
async fn measure(
    plan: &Plan,
    binary: &ServiceBinary,
    database: &BenchDatabase,
    out_dir: &Path,
) -> Result<Report> {
    let machine = database.machine().await?;

    let api_key = migrate_and_create_merchant(binary, database, out_dir).await?;

    // Start-to-ready, before anything else loads the machine.
    let ready = binary.start_to_ready(&database.url).await;

    // What the service asks PostgreSQL per request: the same keys twice,
    // first as new charges, then as replays. Each must be exactly what the
    // scripts run.
    let keys: Vec<String> = (0..CAPTURE_REQUESTS)
        .map(|i| format!("capture-{i}"))
        .collect();
    let capture = Capture {
        new: capture::capture(binary, database, &api_key, &keys, out_dir).await?,
        replay: capture::capture(binary, database, &api_key, &keys, out_dir).await?,
    };
    capture
        .new
        .write(&out_dir.join("captured-new.txt"), "new charges")?;
    capture
        .replay
        .write(&out_dir.join("captured-replay.txt"), "replays")?;
    capture
        .new
        .require_same_as(script::NEW_CHARGE_STATEMENTS, "new charge")?;
    capture
        .replay
        .require_same_as(script::REPLAY_STATEMENTS, "replay")?;
    for (flow, captured) in [("new charge", &capture.new), ("replay", &capture.replay)] {
        say(format!(
            "round trips per {flow}: {:.2}",
            captured.round_trips()
        ));
    }

    // The instance under load, from here to the end.
    let mut service = binary.start(&database.url).await;
    let api = Api::new(service.port, &api_key)?;

    // The floor's table first: the ANALYZE after the pool covers it too.
    database.create_floor(plan.pool_size).await?;
    fill_replay_pool(plan, &api, database, binary, &mut service, out_dir).await?;

    let values = script::ServiceValues::read(&database.client).await?;
    let pgbench = Pgbench::write_scripts(database.url.clone(), &values, plan, out_dir)?;
    pgbench.check(&database.client).await?;

    let mut rows = Vec::new();
    let checkpoint = Checkpointer::new(database);
    for workload in [Workload::New, Workload::Replay, Workload::Mix] {
        if workload == Workload::Replay {
            // The new-charge scenarios create far more charges (about
            // 145,000 in a full run) than the default replay cache holds
            // (`idempotency.replay_cache_bytes`, 32 MiB: about 30,000), so
            // the pool's answers are out of it by now and the first replay
            // point would measure the database path (a cache miss,
            // `charges::INSERT_OR_FIND_MANY`, which the own-SQL column
            // measures). Replaying the pool once puts them back: the replay
            // scenarios measure replays the cache can answer (BENCHMARKS.md).
            send_replay_pool(
                plan,
                &api,
                binary,
                &mut service,
                out_dir,
                "replaying the pool's keys before the replay scenarios",
            )
            .await?;
        }
        for &connections in plan.connections {
            let mut point: Option<(Sample, PgbenchRun, PgbenchRun)> = None;
            let mut floor_ratio_by_round = Vec::with_capacity(plan.rounds);
            for round in 0..plan.rounds {
                let plan = &plan.for_round(round);
                checkpoint.run().await?;
                let sample =
                    scenario::closed_loop(&api, workload, connections, plan, service.pid()).await;
                let sample = or_explain(sample, binary, &mut service, out_dir).await?;
                checkpoint.run().await?;
                let own = pgbench
                    .run(&pgbench.own_sql, workload, connections, plan, service.pid())
                    .await?;
                checkpoint.run().await?;
                let floor = pgbench
                    .run(&pgbench.floor, workload, connections, plan, service.pid())
                    .await?;
                floor_ratio_by_round.extend(report::ratio(&sample, &floor));
                point = Some(match point {
                    None => (sample, own, floor),
                    Some((mut all, mut all_own, mut all_floor)) => {
                        all.merge(&sample)?;
                        all_own.merge(&own)?;
                        all_floor.merge(&floor)?;
                        (all, all_own, all_floor)
                    }
                });
            }
            let Some((sample, own, floor)) = point else {
                bail!("no round measured at {connections} clients");
            };
            say(format!(
                "{} x {connections}: {:.0} req/s, p99 {:.2} ms, over 100 ms {}, non-2xx {}; \
                 own SQL {:.0} TPS, floor {:.0} TPS (over 100 ms {})",
                workload.name(),
                sample.rps(),
                sample.tally.percentile_ms(0.99),
                sample.tally.slow(),
                sample.tally.non_2xx_text(),
                own.tps,
                floor.tps,
                floor.slow,
            ));
            rows.push(Row {
                scenario: workload.name().to_owned(),
                connections,
                sample,
                own: Some(own),
                floor: Some(floor),
                floor_ratio_by_round,
            });
        }
    }
    checkpoint.run().await?;
    let bursts = scenario::bursts(&api, plan, service.pid()).await;
    let (sample, bursts) = or_explain(bursts, binary, &mut service, out_dir).await?;
    say(format!(
        "burst: {} rounds, {:.0} req/s, p99 {:.2} ms, non-2xx {}, rounds not created exactly once {}",
        bursts.rounds,
        sample.rps(),
        sample.tally.percentile_ms(0.99),
        sample.tally.non_2xx_text(),
        bursts.not_created_once
    ));
    rows.push(Row {
        scenario: format!("burst ({} same-key requests per round)", scenario::BURST),
        connections: scenario::BURST,
        sample,
        own: None,
        floor: None,
        floor_ratio_by_round: Vec::new(),
    });

    // Peak memory, after everything.
    let peak_rss = proc::peak_rss_bytes(service.pid())?;
    drop(service);

    Ok(Report {
        machine,
        rows,
        bursts,
        peak_rss,
        capture,
        ready,
        longest_settle: checkpoint.longest_settle.get(),
        commands: pgbench.command_lines(),
    })
}

/// The result of a run against `service`, its error explained if the
/// service stopped.
async fn or_explain<T>(
    result: Result<T>,
    binary: &ServiceBinary,
    service: &mut chargeonce_testkit::Spawned,
    out_dir: &Path,
) -> Result<T> {
    match result {
        Ok(value) => Ok(value),
        Err(error) => Err(binary.explain(service, error).await),
    }
}
