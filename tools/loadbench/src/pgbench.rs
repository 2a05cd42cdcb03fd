//! pgbench: the scripts of `script` written, checked and run as long as the
//! service was; throughput from its summary, latencies from its `-l` log.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, ensure, Context as _, Result};
use tokio_postgres::Client;

use crate::database::Wal;
use crate::scenario::{Workload, MIX_NEW_PERCENT};
use crate::script;
use crate::stats::Tally;
use crate::{say, Plan};

/// pgbench's threads: this machine's cores.
const THREADS: usize = 2;
const CHECK_RUNS: i64 = 20;

/// A new-charge and a replay script and their `-D` variables but `run`.
pub struct ScriptSet {
    pub label: &'static str,
    new: PathBuf,
    replay: PathBuf,
    variables: Vec<(&'static str, String)>,
}

impl ScriptSet {
    fn args(&self, workload: Workload, run: &str) -> Vec<String> {
        let file =
            |path: &Path, weight: &str| ["-f".to_owned(), format!("{}{weight}", path.display())];
        let files = match workload {
            Workload::New => file(&self.new, "").to_vec(),
            Workload::Replay => file(&self.replay, "").to_vec(),
            Workload::Mix => [
                file(&self.new, &format!("@{MIX_NEW_PERCENT}")),
                file(&self.replay, &format!("@{}", 100 - MIX_NEW_PERCENT)),
            ]
            .concat(),
        };
        let run = ("run", run.to_owned());
        let variables = self.variables.iter().chain((!self.variables.is_empty()).then_some(&run));
        let variables =
            variables.flat_map(|(name, value)| ["-D".to_owned(), format!("{name}={value}")]);
        files.into_iter().chain(variables).collect()
    }
}

/// A measured run, or a point's rounds added up; `wal.requests` counts every
/// script run, warm-up included.
pub struct PgbenchRun {
    pub tps: f64,
    pub latencies: Tally,
    pub wal: Wal,
    seconds: f64,
}

impl PgbenchRun {
    pub fn p99_ms(&self) -> f64 {
        self.latencies.percentile_ms(0.99)
    }

    pub fn merge(&mut self, other: &PgbenchRun) -> Result<()> {
        let transactions = self.tps * self.seconds + other.tps * other.seconds;
        self.seconds += other.seconds;
        self.tps = transactions / self.seconds;
        self.latencies.merge(&other.latencies)?;
        self.wal.add(&other.wal);
        Ok(())
    }
}

pub struct Pgbench {
    url: String,
    pub own_sql: ScriptSet,
    pub floor: ScriptSet,
    log_dir: PathBuf,
}

impl Pgbench {
    pub fn write_scripts(
        url: String,
        variables: Vec<(&'static str, String)>,
        plan: &Plan,
        out_dir: &Path,
    ) -> Result<Self> {
        let set = |label, name: &str, variables| ScriptSet {
            label,
            new: out_dir.join(format!("{name}-new.sql")),
            replay: out_dir.join(format!("{name}-replay.sql")),
            variables,
        };
        let (own_sql, floor) =
            (set("own SQL", "own-sql", variables), set("floor", "floor", Vec::new()));
        for (path, body) in [
            (&own_sql.new, script::own_sql_new()?),
            (&own_sql.replay, script::own_sql_replay(plan.pool_size)?),
            (&floor.new, script::FLOOR_NEW.to_owned()),
            (&floor.replay, script::floor_replay(plan.pool_size)),
        ] {
            let text = format!(
                "-- Written by chargeonce-loadbench (tools/loadbench/src/script.rs), which runs it \
                 with pgbench -M prepared\n-- and -D for its variables; each statement is its \
                 own transaction.\n{body}"
            );
            fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        say(format!("pgbench scripts in {}", out_dir.display()));
        Ok(Self { url, own_sql, floor, log_dir: out_dir.join("pgbench-log") })
    }

    async fn pgbench(&self, args: &[String]) -> Result<String> {
        let mut command = tokio::process::Command::new("pgbench");
        command.args(["-n", "-M", "prepared"]).args(args).arg(&self.url).kill_on_drop(true);
        let output = command.output().await;
        let output = output.context("cannot run pgbench (apt-get install postgresql-client)")?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let (status, stderr) = (output.status, String::from_utf8_lossy(&output.stderr));
        let (err, out) = (stderr.trim(), stdout.trim());
        ensure!(status.success(), "pgbench failed ({status}): {err}\n{out}");
        Ok(stdout)
    }

    pub async fn run(
        &self,
        set: &ScriptSet,
        workload: Workload,
        clients: usize,
        plan: &Plan,
    ) -> Result<PgbenchRun> {
        let run = format!("{}-{clients}-{}", workload.name(), plan.round);
        let mut args = set.args(workload, &run);
        args.extend([format!("-c{clients}"), format!("-j{THREADS}")]);
        // -T takes whole seconds.
        let seconds = |duration: Duration| format!("-T{}", duration.as_secs().max(1));
        let mut wal = Wal::default();
        if !plan.quick && !plan.warmup.is_zero() {
            let warmup = [&args[..], &[seconds(plan.warmup)]].concat();
            wal.requests = summary(&self.pgbench(&warmup).await?)?.1;
        }
        args.push(seconds(plan.measure));
        args.extend(self.log_args(set, &run)?);
        let (tps, transactions) = summary(&self.pgbench(&args).await?)?;
        wal.requests += transactions;
        let latencies = logged_latencies(&self.log_dir, None)?.remove(0);
        Ok(PgbenchRun { tps, latencies, wal, seconds: plan.measure.as_secs().max(1) as f64 })
    }

    /// `workload` offered open-loop at `rate`/s; latencies per minute, from
    /// the scheduled start.
    pub async fn open_loop(
        &self,
        set: &ScriptSet,
        workload: Workload,
        (clients, rate): (usize, f64),
        length: Duration,
    ) -> Result<Vec<Tally>> {
        let (seconds, rate) = (length.as_secs().max(1), format!("--rate={rate:.0}"));
        let mut args = set.args(workload, "sustain");
        args.extend([format!("-c{clients}"), format!("-j{THREADS}"), rate, format!("-T{seconds}")]);
        args.extend(self.log_args(set, "sustain")?);
        let start = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH)?;
        self.pgbench(&args).await?;
        logged_latencies(&self.log_dir, Some((start.as_secs(), length.as_secs())))
    }

    /// `-l --log-prefix=…` in an emptied log folder.
    fn log_args(&self, set: &ScriptSet, run: &str) -> Result<[String; 2]> {
        let _ = fs::remove_dir_all(&self.log_dir);
        fs::create_dir_all(&self.log_dir)
            .with_context(|| format!("creating {}", self.log_dir.display()))?;
        let prefix = self.log_dir.join(format!("{}-{run}", set.label.replace(' ', "-")));
        Ok(["-l".to_owned(), format!("--log-prefix={}", prefix.display())])
    }

    /// A new charge's script leaves one row as the service does; a replay's none.
    pub async fn check(&self, db: &Client) -> Result<()> {
        let count = |sql: &'static str| async move {
            let row = db
                .query_one(sql, &[])
                .await
                .with_context(|| format!("checking the scripts: {sql}"))?;
            anyhow::Ok(row.get::<_, i64>(0))
        };
        let like_service = "SELECT count(*) FROM charges c JOIN events e ON e.charge_id = c.id \
              WHERE c.client_idempotency_key LIKE 'pgb-check-%' \
                AND c.status = (SELECT status FROM charges WHERE client_idempotency_key = 'capture-0') \
                AND c.locked_until IS NULL";
        let final_rows = "SELECT count(*) FROM bench_charges WHERE status = 'succeeded'";
        for (set, workload, rows, made) in [
            (&self.own_sql, Workload::New, like_service, CHECK_RUNS),
            (&self.own_sql, Workload::Replay, "SELECT count(*) FROM charges", 0),
            (&self.floor, Workload::New, final_rows, CHECK_RUNS),
            (&self.floor, Workload::Replay, "SELECT count(*) FROM bench_charges", 0),
        ] {
            let before = count(rows).await?;
            let args =
                [vec!["-c1".to_owned(), format!("-t{CHECK_RUNS}")], set.args(workload, "check")];
            self.pgbench(&args.concat()).await?;
            let (made_now, label, flow) = (count(rows).await? - before, set.label, workload.name());
            let what = if made == 0 { "replay" } else { "new charge" };
            ensure!(
                made_now == made,
                "the {label} {flow} script made {made_now} rows in {CHECK_RUNS} runs, not {made}: \
                 it does not do what a {what} does"
            );
        }
        say("pgbench scripts checked: a new charge is made once, a replay makes nothing");
        Ok(())
    }
}

/// TPS and script runs from pgbench's summary (`tps = 2273.1 (without …`,
/// `number of transactions actually processed: 22731`).
fn summary(stdout: &str) -> Result<(f64, u64)> {
    let number = |prefix: &str| -> Option<f64> {
        let line = stdout.lines().find_map(|line| line.strip_prefix(prefix))?;
        line.split(|c: char| c.is_whitespace() || c == '/').next()?.parse().ok()
    };
    match (number("tps = "), number("number of transactions actually processed: ")) {
        (Some(tps), Some(runs)) => Ok((tps, runs as u64)),
        _ => bail!("no TPS or transactions in pgbench's output:\n{stdout}"),
    }
}

/// Latencies plus `--rate`'s lag from the logs' lines (`client transaction
/// latency_us script epoch_s epoch_us [lag_us]`), per minute of `run`
/// (start epoch second, length) or all in one.
fn logged_latencies(log_dir: &Path, run: Option<(u64, u64)>) -> Result<Vec<Tally>> {
    let mut minutes = vec![Tally::new()?];
    for entry in fs::read_dir(log_dir).with_context(|| format!("reading {}", log_dir.display()))? {
        let path = entry?.path();
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        for line in text.lines() {
            let fields: Vec<u64> =
                (line.split_whitespace().map(str::parse).collect::<Result<_, _>>())
                    .ok()
                    .filter(|fields: &Vec<u64>| fields.len() >= 6)
                    .with_context(|| format!("a line of {}: {line}", path.display()))?;
            let second = run.map_or(0, |(start, length)| {
                fields[4].saturating_sub(start).min(length.saturating_sub(1))
            });
            let minute = (second / 60) as usize;
            while minutes.len() <= minute {
                minutes.push(Tally::new()?);
            }
            minutes[minute].record_us(fields[2] + fields.get(6).copied().unwrap_or(0));
        }
    }
    ensure!(minutes[0].count() > 0, "pgbench logged no transactions in {}", log_dir.display());
    Ok(minutes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_and_the_logs_of_all_threads_are_read_with_their_stalls() {
        let stdout = "number of transactions actually processed: 6383\n\
                      latency average = 10.030 ms\ntps = 3191.2 (without initial connection time)\n";
        assert_eq!(summary(stdout).unwrap(), (3191.2, 6383));
        assert!(summary("nothing").is_err());
        let dir = std::env::temp_dir().join(format!("loadbench-logs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("floor-0.1"), "0 0 1000 0 1 1\n1 0 198188 0 1 2\n").unwrap();
        fs::write(dir.join("floor-0.1.1"), "2 0 2000 0 1 3\n3 0 100000 0 1 4\n").unwrap();
        let latencies = logged_latencies(&dir, None).unwrap().remove(0);
        // 100 ms itself is not over; 198 ms is.
        assert_eq!((latencies.count(), latencies.slow), (4, 1));
        // Open loop: plus the schedule lag, per minute from the start.
        fs::write(dir.join("floor-0.1"), "0 0 1000 0 100 1 5000\n1 0 2000 0 161 2 0\n").unwrap();
        fs::remove_file(dir.join("floor-0.1.1")).unwrap();
        let minutes = logged_latencies(&dir, Some((100, 90))).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(minutes.iter().map(Tally::count).collect::<Vec<_>>(), [1, 1]);
        assert!((minutes[0].max_ms() - 6.0).abs() < 0.01);
    }

    #[test]
    fn mixes_weigh_the_files_and_rounds_merge() {
        let set = ScriptSet {
            label: "floor",
            new: PathBuf::from("/x/floor-new.sql"),
            replay: PathBuf::from("/x/floor-replay.sql"),
            variables: Vec::new(),
        };
        assert_eq!(
            set.args(Workload::Mix, "r"),
            ["-f", "/x/floor-new.sql@90", "-f", "/x/floor-replay.sql@10"]
        );
        let run = |tps: f64, bytes: f64, micros: &[u64]| {
            let mut latencies = Tally::new().unwrap();
            micros.iter().for_each(|&us| latencies.record_us(us));
            let wal = Wal { bytes, requests: (tps * 2.0) as u64, ..Wal::default() };
            PgbenchRun { tps, latencies, wal, seconds: 2.0 }
        };
        let mut point = run(1_000.0, 4e6, &[1_000, 2_000]);
        point.merge(&run(3_000.0, 12e6, &[500, 150_000])).unwrap();
        // 2,000 and 6,000 transactions in 4 s.
        assert!((point.tps - 2_000.0).abs() < 1e-9);
        assert_eq!(point.wal.per_request(), Some(2_000.0));
        assert_eq!(point.latencies.slow, 1);
    }
}
