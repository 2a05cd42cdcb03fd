//! Running pgbench: the two script sets of `script` (the service's own SQL
//! and the floor) written to the output folder, checked for doing what they
//! stand for, then run at each scenario's client count as
//! `pgbench -n -M prepared -c C -j 2 -T D`, right after the service, for as
//! long and after as long a warm-up. Throughput and mean latency come from
//! pgbench's summary; percentiles from its per-transaction log (`-l`), one
//! entry per script run, that is per charge or per replay.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, ensure, Context as _, Result};
use tokio_postgres::Client;

use crate::proc::{CpuClock, CpuShare};
use crate::scenario::{Workload, MIX_NEW_PERCENT};
use crate::script::{self, ServiceValues};
use crate::stats::Latencies;
use crate::{say, Plan};

/// pgbench's threads; it uses fewer when there are fewer clients. Two, as
/// the machine has two cores; more would only compete with the backends.
const THREADS: usize = 2;
/// Script runs of each check.
const CHECK_RUNS: i64 = 20;

/// One pair of scripts (a new charge, a replay) and the variables they need.
pub struct ScriptSet {
    /// "own SQL" or "floor", for messages and the report.
    pub label: &'static str,
    new: PathBuf,
    replay: PathBuf,
    /// `-D name=value`, but `run`.
    variables: Vec<(String, String)>,
}

impl ScriptSet {
    fn file_args(&self, workload: Workload) -> Vec<String> {
        let file = |path: &Path, weight: String| {
            vec!["-f".to_owned(), format!("{}{weight}", path.display())]
        };
        match workload {
            Workload::New => file(&self.new, String::new()),
            Workload::Replay => file(&self.replay, String::new()),
            Workload::Mix => {
                let mut args = file(&self.new, format!("@{MIX_NEW_PERCENT}"));
                args.extend(file(&self.replay, format!("@{}", 100 - MIX_NEW_PERCENT)));
                args
            }
        }
    }

    /// `-D` arguments; `run` names the run in the keys of new charges.
    fn variable_args(&self, run: &str) -> Vec<String> {
        let mut args = Vec::new();
        for (name, value) in &self.variables {
            args.push("-D".to_owned());
            args.push(format!("{name}={value}"));
        }
        if !self.variables.is_empty() {
            args.push("-D".to_owned());
            args.push(format!("run={run}"));
        }
        args
    }

    /// The command that runs this set at C clients, for the report.
    fn command_line(&self) -> String {
        let variables: Vec<String> = self
            .variables
            .iter()
            .map(|(name, _)| format!("-D {name}=… "))
            .collect();
        let run = if variables.is_empty() {
            ""
        } else {
            "-D run=… "
        };
        format!(
            "pgbench -n -M prepared -c C -j {THREADS} -T D {}{run}-f {new} \
             (replay: -f {replay}; mix: -f {new}@{MIX_NEW_PERCENT} -f {replay}@{}) BENCH_DATABASE",
            variables.concat(),
            100 - MIX_NEW_PERCENT,
            new = file_name(&self.new),
            replay = file_name(&self.replay),
        )
    }
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// What one measured pgbench run gave (or several rounds of one point,
/// merged).
pub struct PgbenchRun {
    pub tps: f64,
    /// pgbench's mean latency per script run.
    pub mean_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Transactions slower than `stats::SLOW`: a stall of the machine (its
    /// disk, its hypervisor) shows here as it shows in the service's count.
    pub slow: u64,
    /// Share of all cores busy during the run (pgbench itself included).
    pub cpu_busy: f64,
    /// The measured time, and every logged transaction's latency: what
    /// merging needs.
    seconds: f64,
    latencies: Latencies,
}

impl PgbenchRun {
    fn new(tps: f64, mean_ms: f64, cpu_busy: f64, seconds: f64, latencies: Latencies) -> Self {
        Self {
            tps,
            mean_ms,
            p99_ms: latencies.percentile_ms(0.99),
            max_ms: latencies.max_ms(),
            slow: latencies.slow(),
            cpu_busy,
            seconds,
            latencies,
        }
    }

    /// Adds a later round of the same point: throughput over the whole
    /// time, the mean latency weighted by transactions, the percentiles of
    /// all transactions, the CPU weighted by time.
    pub fn merge(&mut self, other: &PgbenchRun) -> Result<()> {
        let seconds = self.seconds + other.seconds;
        let (mine, theirs) = (self.tps * self.seconds, other.tps * other.seconds);
        let mut latencies = self.latencies.clone();
        latencies.merge(&other.latencies)?;
        let weighted = |a: f64, b: f64, wa: f64, wb: f64| {
            if wa + wb > 0.0 {
                (a * wa + b * wb) / (wa + wb)
            } else {
                0.0
            }
        };
        *self = PgbenchRun::new(
            if seconds > 0.0 {
                (mine + theirs) / seconds
            } else {
                0.0
            },
            weighted(self.mean_ms, other.mean_ms, mine, theirs),
            weighted(self.cpu_busy, other.cpu_busy, self.seconds, other.seconds),
            seconds,
            latencies,
        );
        Ok(())
    }
}

pub struct Pgbench {
    url: String,
    pub own_sql: ScriptSet,
    pub floor: ScriptSet,
    /// Where pgbench writes its per-transaction logs.
    log_dir: PathBuf,
}

impl Pgbench {
    /// Writes the four scripts to `out_dir`.
    pub fn write_scripts(
        url: String,
        values: &ServiceValues,
        plan: &Plan,
        out_dir: &Path,
    ) -> Result<Self> {
        let own_sql = ScriptSet {
            label: "own SQL",
            new: out_dir.join("own-sql-new.sql"),
            replay: out_dir.join("own-sql-replay.sql"),
            variables: values.variables(),
        };
        let floor = ScriptSet {
            label: "floor",
            new: out_dir.join("floor-new.sql"),
            replay: out_dir.join("floor-replay.sql"),
            variables: Vec::new(),
        };
        let own_header =
            "-- The service's own SQL: the constants of chargeonce::db it runs per request,\n\
                          -- translated by chargeonce-loadbench (tools/loadbench/src/script.rs).\n";
        let floor_header =
            "-- The floor: the least SQL this design can cost, on its own minimal table\n\
                            -- (tools/loadbench/src/script.rs).\n";
        let files = [
            (&own_sql, &own_sql.new, own_header, script::own_sql_new()?),
            (
                &own_sql,
                &own_sql.replay,
                own_header,
                script::own_sql_replay(plan.pool_size)?,
            ),
            (
                &floor,
                &floor.new,
                floor_header,
                script::FLOOR_NEW.to_owned(),
            ),
            (
                &floor,
                &floor.replay,
                floor_header,
                script::floor_replay(plan.pool_size),
            ),
        ];
        for (set, path, header, body) in files {
            let by_hand: Vec<String> = set
                .variable_args("byhand")
                .iter()
                .map(|arg| shell_quote(arg))
                .collect();
            let text =
                format!(
                "{header}-- Each statement is its own transaction. By hand, on a bench database:\n\
                 --   pgbench -n -M prepared -c 1 -T 5 {}-f {} DATABASE_URL\n{body}",
                by_hand.iter().map(|arg| format!("{arg} ")).collect::<String>(),
                path.display()
            );
            fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
            say(format!("pgbench script: {}", path.display()));
        }
        Ok(Self {
            url,
            own_sql,
            floor,
            log_dir: out_dir.join("pgbench-log"),
        })
    }

    pub fn command_lines(&self) -> Vec<String> {
        vec![self.own_sql.command_line(), self.floor.command_line()]
    }

    async fn pgbench(&self, mut args: Vec<String>) -> Result<String> {
        args.push(self.url.clone());
        let output = tokio::process::Command::new("pgbench")
            .args(["-n", "-M", "prepared"])
            .args(&args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .context("cannot run pgbench (apt-get install postgresql-client)")?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            bail!(
                "pgbench failed ({}): {}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                stdout.trim()
            );
        }
        Ok(stdout)
    }

    /// `set`'s scripts for `workload` at `clients` connections, after a
    /// warm-up as long as the service's (full runs).
    pub async fn run(
        &self,
        set: &ScriptSet,
        workload: Workload,
        clients: usize,
        plan: &Plan,
        service_pid: u32,
    ) -> Result<PgbenchRun> {
        let run = format!("{}-{clients}-{}", workload.name(), plan.round);
        let mut args = vec![
            "-c".to_owned(),
            clients.to_string(),
            "-j".to_owned(),
            THREADS.to_string(),
        ];
        args.extend(set.file_args(workload));
        args.extend(set.variable_args(&run));
        // -T takes whole seconds.
        let seconds = |duration: std::time::Duration| duration.as_secs().max(1).to_string();
        if !plan.quick && !plan.warmup.is_zero() {
            let mut warmup = args.clone();
            warmup.extend(["-T".to_owned(), seconds(plan.warmup)]);
            self.pgbench(warmup).await?;
        }
        args.extend(["-T".to_owned(), seconds(plan.measure)]);
        // One log file per pgbench thread, `<prefix>.<pid>[.<thread>]`.
        let _ = fs::remove_dir_all(&self.log_dir);
        fs::create_dir_all(&self.log_dir)
            .with_context(|| format!("creating {}", self.log_dir.display()))?;
        let prefix = format!("{}-{run}", set.label.replace(' ', "-"));
        args.extend([
            "-l".to_owned(),
            format!("--log-prefix={}", self.log_dir.join(prefix).display()),
        ]);
        let start = CpuClock::read(service_pid)?;
        let stdout = self.pgbench(args).await?;
        let cpu = CpuShare::between(&start, &CpuClock::read(service_pid)?);
        let latencies = logged_latencies(&self.log_dir)?;
        let (tps, mean_ms) = summary(&stdout)?;
        Ok(PgbenchRun::new(
            tps,
            mean_ms,
            cpu.busy,
            // What -T was given.
            plan.measure.as_secs().max(1) as f64,
            latencies,
        ))
    }

    /// Runs each script a few times and checks its effect: a new charge
    /// leaves a charge in the state the service leaves it (with its outbox
    /// event), or a row of the floor's table in its final state; a replay
    /// creates nothing.
    pub async fn check(&self, db: &Client) -> Result<()> {
        let count = |sql: String| async move {
            db.query_one(sql.as_str(), &[])
                .await
                .map(|row| row.get::<_, i64>(0))
                .with_context(|| format!("checking the scripts: {sql}"))
        };
        let run_script = |set: &ScriptSet, workload| {
            let mut args = vec![
                "-c".to_owned(),
                "1".to_owned(),
                "-t".to_owned(),
                CHECK_RUNS.to_string(),
            ];
            args.extend(set.file_args(workload));
            args.extend(set.variable_args("check"));
            self.pgbench(args)
        };

        run_script(&self.own_sql, Workload::New).await?;
        let like_service = count(
            "SELECT count(*) FROM charges c JOIN events e ON e.charge_id = c.id \
              WHERE c.client_idempotency_key LIKE 'pgb-check-%' \
                AND c.status = (SELECT status FROM charges WHERE client_idempotency_key = 'capture-0') \
                AND c.locked_until IS NULL"
                .to_owned(),
        )
        .await?;
        ensure!(
            like_service == CHECK_RUNS,
            "{} made {like_service} charges (with their event) like the service's out of \
             {CHECK_RUNS} runs: it does not do what a new charge does",
            self.own_sql.new.display()
        );
        let charges = "SELECT count(*) FROM charges".to_owned();
        let before = count(charges.clone()).await?;
        run_script(&self.own_sql, Workload::Replay).await?;
        let made = count(charges).await? - before;
        ensure!(
            made == 0,
            "{} created {made} charges: a replay creates none",
            self.own_sql.replay.display()
        );

        let rows = "SELECT count(*) FROM bench_charges WHERE status = 'succeeded'".to_owned();
        let before = count(rows.clone()).await?;
        run_script(&self.floor, Workload::New).await?;
        let made = count(rows).await? - before;
        ensure!(
            made == CHECK_RUNS,
            "{} made {made} final rows in {CHECK_RUNS} runs",
            self.floor.new.display()
        );
        let rows = "SELECT count(*) FROM bench_charges".to_owned();
        let before = count(rows.clone()).await?;
        run_script(&self.floor, Workload::Replay).await?;
        let made = count(rows).await? - before;
        ensure!(
            made == 0,
            "{} created {made} rows: a replay creates none",
            self.floor.replay.display()
        );
        say("pgbench scripts checked: a new charge is made once, a replay makes nothing");
        Ok(())
    }
}

/// TPS and mean latency from pgbench's summary: `tps = 2273.1 (without
/// initial connection time)`, `latency average = 14.0 ms`.
fn summary(stdout: &str) -> Result<(f64, f64)> {
    let number = |prefix: &str| -> Option<f64> {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    match (number("tps = "), number("latency average = ")) {
        (Some(tps), Some(mean_ms)) => Ok((tps, mean_ms)),
        _ => bail!("no TPS or latency in pgbench's output:\n{stdout}"),
    }
}

/// The latencies in pgbench's per-transaction logs in `log_dir`.
fn logged_latencies(log_dir: &Path) -> Result<Latencies> {
    let mut latencies = Latencies::new()?;
    let entries =
        fs::read_dir(log_dir).with_context(|| format!("reading {}", log_dir.display()))?;
    for entry in entries {
        let path = entry.context("reading pgbench's logs")?.path();
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines() {
            let micros = logged_latency_us(line)
                .with_context(|| format!("unexpected line in {}: {line}", path.display()))?;
            latencies.record_us(micros);
        }
    }
    ensure!(
        latencies.count() > 0,
        "pgbench logged no transactions in {}",
        log_dir.display()
    );
    Ok(latencies)
}

/// The latency of a per-transaction log line, `client transaction
/// latency_us script epoch_s epoch_us`.
fn logged_latency_us(line: &str) -> Option<u64> {
    line.split_whitespace().nth(2)?.parse().ok()
}

fn shell_quote(text: &str) -> String {
    if text
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_=./:@".contains(c))
    {
        text.to_owned()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_and_the_log_are_read() {
        let stdout = "number of failed transactions: 0 (0.000%)\n\
                      latency average = 10.030 ms\n\
                      initial connection time = 40.1 ms\n\
                      tps = 3191.2 (without initial connection time)\n";
        assert_eq!(summary(stdout).unwrap(), (3191.2, 10.03));
        assert!(summary("nothing").is_err());
        assert_eq!(
            logged_latency_us("0 199 1834 0 1764550000 123456"),
            Some(1834)
        );
        assert_eq!(logged_latency_us("garbage"), None);
    }

    /// Every thread's log counts, and a stall shows in the maximum and the
    /// count over 100 ms.
    #[test]
    fn the_logs_of_all_threads_are_read_with_their_stalls() {
        let dir = std::env::temp_dir().join(format!("loadbench-logs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("floor-0.1"), "0 0 1000 0 1 1\n1 0 198188 0 1 2\n").unwrap();
        fs::write(
            dir.join("floor-0.1.1"),
            "2 0 2000 0 1 3\n3 0 100000 0 1 4\n",
        )
        .unwrap();
        let latencies = logged_latencies(&dir).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(latencies.count(), 4);
        // 100 ms itself is not over; 198 ms is.
        assert_eq!(latencies.slow(), 1);
        assert!((latencies.max_ms() - 198.188).abs() < 0.2);
    }

    #[test]
    fn commands_name_the_files_and_weights() {
        let set = ScriptSet {
            label: "floor",
            new: PathBuf::from("/x/floor-new.sql"),
            replay: PathBuf::from("/x/floor-replay.sql"),
            variables: Vec::new(),
        };
        assert_eq!(
            set.file_args(Workload::Mix),
            ["-f", "/x/floor-new.sql@90", "-f", "/x/floor-replay.sql@10"]
        );
        assert!(set.variable_args("r").is_empty());
        assert_eq!(
            set.command_line(),
            "pgbench -n -M prepared -c C -j 2 -T D -f floor-new.sql (replay: -f floor-replay.sql; \
             mix: -f floor-new.sql@90 -f floor-replay.sql@10) BENCH_DATABASE"
        );
        assert_eq!(shell_quote("payload={\"a\": 1}"), "'payload={\"a\": 1}'");
    }

    #[test]
    fn rounds_merge_into_one_point() {
        let run = |tps: f64, mean_ms: f64, cpu: f64, micros: &[u64]| {
            let mut latencies = Latencies::new().unwrap();
            for &us in micros {
                latencies.record_us(us);
            }
            PgbenchRun::new(tps, mean_ms, cpu, 2.0, latencies)
        };
        let mut point = run(1_000.0, 1.0, 30.0, &[1_000, 2_000]);
        point
            .merge(&run(3_000.0, 0.2, 50.0, &[500, 150_000]))
            .unwrap();
        // 2,000 and 6,000 transactions in 4 s.
        assert!((point.tps - 2_000.0).abs() < 1e-9);
        // Weighted by transactions: (2,000 × 1.0 + 6,000 × 0.2) / 8,000.
        assert!((point.mean_ms - 0.4).abs() < 1e-9);
        assert!((point.cpu_busy - 40.0).abs() < 1e-9);
        assert_eq!(point.slow, 1);
        assert!((point.max_ms - 150.0).abs() < 0.2);
        assert_eq!(point.seconds, 4.0);
    }
}
