//! The load benchmark of chargeonce, run by `scripts/bench` (method and
//! results: BENCHMARKS.md): the release binary beside pgbench running **its
//! own SQL** and **the floor**. Every spawned process is killed and the bench
//! database dropped on every way out; the exit status says whether it could
//! measure, not whether a target was met.

mod bench;
mod capture;
mod database;
mod http;
mod pgbench;
mod report;
mod scenario;
mod script;
mod stats;
mod sustain;

use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Parser;

use crate::bench::ServiceBinary;
use crate::database::BenchDatabase;
use crate::sustain::Offer;

/// Measures chargeonce against pgbench running its own SQL and a fixed
/// floor. Normally run through scripts/bench, which provides PostgreSQL.
#[derive(Parser)]
#[command(name = "chargeonce-loadbench")]
struct Args {
    /// Any database of the PostgreSQL server to measure on (it must preload
    /// pg_stat_statements); the benchmark makes and drops its own there.
    #[arg(long, env = "BENCH_DATABASE_URL")]
    admin_url: String,

    /// A smoke run (1 s per point, clients 1 and 32): proves the benchmark
    /// works; its numbers mean little.
    #[arg(long)]
    quick: bool,

    /// Instead: the mix's maximum throughput, then `--load-percent` of it
    /// for this many seconds, memory sampled each second; the floor likewise.
    #[arg(long, value_name = "SECONDS", conflicts_with = "quick")]
    sustain: Option<u64>,

    /// The share of the maximum throughput a sustained run offers.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u32).range(1..=100))]
    load_percent: u32,

    /// Instead of `--load-percent`: offer this many requests a second (to
    /// compare two builds at the same load); the floor gets the same share
    /// of its own maximum as this is of the service's.
    #[arg(long, value_name = "REQUESTS_PER_SECOND", requires = "sustain",
          conflicts_with = "load_percent", value_parser = positive_rate)]
    rate: Option<f64>,

    /// Full runs, each on a fresh database; with several, report.md starts
    /// with each target judged over all (report-K.md keeps run K's).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50), conflicts_with = "sustain")]
    runs: u32,

    /// The binary to measure [default: `chargeonce` beside this program].
    #[arg(long)]
    service: Option<PathBuf>,

    /// Where the report, scripts and logs go [default: target/bench].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Clone)]
pub struct Plan {
    pub quick: bool,
    pub connections: &'static [usize],
    pub warmup: Duration,
    pub measure: Duration,
    /// Charges made beforehand for replays; the floor's table has as many.
    pub pool_size: usize,
    pub rounds: usize,
    /// This round, in the keys: no round re-sends another's.
    pub round: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        // Sides take turns in rounds: this machine's speed swings within
        // minutes (the floor's new charges/s: 6,049, then 4,013).
        let (connections, warmup, measure, pool_size, rounds): (&[usize], _, _, _, _) = match quick
        {
            true => (&[1, 32], Duration::from_millis(300), Duration::from_secs(1), 2_000, 1),
            false => (&[1, 32, 64], Duration::from_secs(2), Duration::from_secs(10), 20_000, 5),
        };
        Self { quick, connections, warmup, measure, pool_size, rounds, round: 0 }
    }

    /// Round `round`: its share of the measured time, warm-up only first.
    fn for_round(&self, round: usize) -> Plan {
        let rounds = u32::try_from(self.rounds.max(1)).unwrap_or(u32::MAX);
        let warmup = if round == 0 { self.warmup } else { Duration::ZERO };
        Plan { warmup, measure: self.measure / rounds, round, ..self.clone() }
    }
}

/// A rate to offer: a finite number of requests a second above zero.
fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!("not a positive number of requests a second: {text}")),
    }
}

pub fn say(message: impl Display) {
    eprintln!("loadbench: {message}");
}

fn main() -> ExitCode {
    let args = Args::parse();
    // One thread: the load generator takes at most one core.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
    let outcome =
        runtime.context("a tokio runtime").and_then(|runtime| runtime.block_on(run(args)));
    match outcome {
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
    let binary = ServiceBinary::find(args.service, &output_dir(args.out)?)?;
    let out = |name: &str| binary.out_dir.join(name);
    let runs = if args.sustain.is_some() { 1 } else { args.runs };
    let (mut each, mut targets) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        if runs > 1 {
            say(format!("run {run} of {runs}"));
        }
        // Processes live in the future: killed with it (Ctrl-C), before the
        // database is dropped.
        let database = BenchDatabase::create(&args.admin_url).await?;
        let measured = async {
            let Some(seconds) = args.sustain else {
                let report = bench::measure(&plan, &binary, &database).await?;
                return Ok((report.markdown(&plan), Some(report.targets())));
            };
            let offer = args.rate.map_or(Offer::Percent(args.load_percent), Offer::Rate);
            let shape = (Duration::from_secs(seconds), offer);
            let run = bench::sustain(&plan, &binary, &database, shape).await?;
            let command = format!("scripts/bench --sustain {seconds} {}", offer.option());
            Ok((run.markdown(&command), None))
        };
        let outcome = tokio::select! {
            outcome = measured => outcome,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        database.close();
        let (markdown, run_targets) = outcome?;
        if runs > 1 {
            write(&out(&format!("report-{run}.md")), &markdown)?;
        }
        each.push(markdown);
        targets.extend(run_targets);
    }
    let mut markdown = if runs > 1 { report::over_runs(&targets) + "\n" } else { String::new() };
    markdown.push_str(&each.join("\n"));
    let written = if args.sustain.is_some() { "sustain.md" } else { "report.md" };
    write(&out(written), &markdown)?;
    println!("{markdown}");
    let took = started.elapsed().as_secs_f64();
    say(format!("done in {took:.0} s; {written} written to {}", binary.out_dir.display()));
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// The output folder, emptied of the previous run's service log.
fn output_dir(chosen: Option<PathBuf>) -> Result<PathBuf> {
    let dir = match chosen {
        Some(dir) => dir,
        // This program is target/<profile>/chargeonce-loadbench.
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .context("this program is not inside a cargo target folder; pass --out")?
            .join("bench"),
    };
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = fs::remove_file(dir.join("service.log"));
    Ok(dir)
}
