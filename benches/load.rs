//! The load benchmark of issue 4. Run it with `scripts/bench [--quick]`,
//! which provides a PostgreSQL with pg_stat_statements and then runs
//! `cargo bench --bench load -- --admin-url URL [--quick]`. BENCHMARKS.md
//! explains the method and keeps the results.
//!
//! This program is the load generator and the orchestrator. It creates a
//! fresh database, starts the release `chargeonce` binary as a separate
//! process, drives it over HTTP, reads back from pg_stat_statements which
//! statements the service ran per request, turns exactly those statements
//! into pgbench scripts, and runs pgbench at the same client counts on the
//! same machine in the same run. The ratio service ÷ pgbench says how much of
//! what PostgreSQL alone can do for the same work the service delivers.
//!
//! Why our own load generator rather than wrk:
//! - the burst scenario needs exactly 50 requests with one idempotency key
//!   released at the same moment, by a barrier across 50 connections; wrk's
//!   threads and connections cannot be made to wait for each other;
//! - every request's latency is kept, and sorted, so p50/p99/p99.9 are exact
//!   order statistics, for the bursts as for the rest, with nothing
//!   summarised per thread;
//! - the keys are under our control: fresh for every request, drawn from the
//!   pool of existing charges, or mixed 90/10; in wrk that is per-thread Lua
//!   state, and its keys would be invisible to the pgbench side.
//!
//! Like wrk it is a closed loop: each simulated client owns one keep-alive
//! HTTP/1.1 connection and sends its next request when the answer to the
//! previous one has arrived. It runs on a current-thread runtime, so it uses
//! at most one of the machine's cores and leaves the rest to the service and
//! PostgreSQL.

// A measurement tool, not service code: a failed expectation may stop it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::{self, Display, Write as _};
use std::fs::{self, OpenOptions};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpStream;
use tokio::sync::Barrier;
use tokio_postgres::{Client, NoTls};

/// The release service binary (`cargo bench` builds in release mode).
const BIN: &str = env!("CARGO_BIN_EXE_chargeonce");

/// Every charge request carries this body. The simulated processor treats
/// amounts ending in 02, 05 and 09 specially; 1000 simply succeeds.
const BODY: &str = r#"{"amount":1000,"currency":"USD"}"#;
const AMOUNT: &str = "1000";
const CURRENCY: &str = "USD";
const METADATA: &str = "{}";
/// The service's default `idempotency.lease_ms`. The captured statement has
/// the lease as a parameter; any value costs PostgreSQL the same.
const LEASE_MS: &str = "30000";
/// The answer header that marks a replayed answer.
const REPLAYED: &str = "idempotent-replayed";

/// Requests of one key released together in the burst scenario.
const BURST: usize = 50;
/// Sequential requests whose statements are counted.
const CAPTURE_REQUESTS: usize = 500;
/// Starts of the service timed from spawn to ready.
const READY_SAMPLES: usize = 5;
/// How long one start may take before the benchmark gives up.
const READY_LIMIT: Duration = Duration::from_secs(15);
/// Share of new charges in the mix scenario; the rest are replays.
const MIX_NEW_PERCENT: u32 = 90;
/// Connections that create the pool of charges replays are drawn from.
const POOL_FILL_CONNECTIONS: usize = 32;
/// Bench databases left behind (a killed run) are dropped after this.
const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);
const DATABASE_PREFIX: &str = "chargeonce_bench_";

type BoxError = Box<dyn Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// `result.context("what was being done")?` for readable failures.
trait Context<T> {
    fn context(self, what: impl Display) -> Res<T>;
}

impl<T, E: Display> Context<T> for Result<T, E> {
    fn context(self, what: impl Display) -> Res<T> {
        self.map_err(|e| format!("{what}: {e}").into())
    }
}

fn say(message: impl Display) {
    eprintln!("bench: {message}");
}

// ---------------------------------------------------------------------------
// Options and plan

struct Options {
    admin_url: String,
    quick: bool,
}

fn parse_args() -> Res<Options> {
    const USAGE: &str = "usage: cargo bench --bench load -- --admin-url URL [--quick] \
                         (normally run through scripts/bench)";
    let mut admin_url = None;
    let mut quick = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--admin-url" => admin_url = Some(args.next().ok_or(USAGE)?),
            "--quick" => quick = true,
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => return Err(format!("unknown argument `{other}`; {USAGE}").into()),
        }
    }
    let admin_url = admin_url
        .or_else(|| std::env::var("BENCH_DATABASE_URL").ok())
        .ok_or(USAGE)?;
    Ok(Options { admin_url, quick })
}

/// How long and how wide each step runs.
struct Plan {
    quick: bool,
    connections: &'static [usize],
    warmup: Duration,
    measure: Duration,
    /// Charges created beforehand whose keys replays re-send.
    pool_size: usize,
}

impl Plan {
    fn new(quick: bool) -> Self {
        if quick {
            Self {
                quick,
                connections: &[1, 32],
                warmup: Duration::from_millis(300),
                measure: Duration::from_secs(1),
                pool_size: 2_000,
            }
        } else {
            Self {
                quick,
                connections: &[1, 32, 64],
                warmup: Duration::from_secs(2),
                measure: Duration::from_secs(10),
                pool_size: 20_000,
            }
        }
    }

    /// pgbench's -T takes whole seconds.
    fn pgbench_seconds(&self, duration: Duration) -> u64 {
        duration.as_secs().max(1)
    }
}

// ---------------------------------------------------------------------------
// Main

fn main() -> ExitCode {
    // `cargo test --all-targets` runs bench binaries too, without `--bench`:
    // building it is the check there; measuring is for `scripts/bench`.
    if !std::env::args().skip(1).any(|arg| arg == "--bench") {
        eprintln!("bench: not run by `cargo bench`; nothing to measure (see scripts/bench)");
        return ExitCode::SUCCESS;
    }
    let options = match parse_args() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("bench: {error}");
            return ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a current-thread tokio runtime");
    match runtime.block_on(run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("bench: FAILED: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(options: Options) -> Res<()> {
    let plan = Plan::new(options.quick);
    let started = Instant::now();
    let out_dir = output_dir()?;
    let admin = connect(&options.admin_url).await?;
    drop_stale_databases(&admin).await?;
    let database = BenchDatabase::create(&admin, &options.admin_url).await?;

    // The service (and any pgbench) lives inside `measure`: it is killed when
    // that future ends or is dropped, on every path, before the database goes.
    let outcome = tokio::select! {
        outcome = measure(&plan, &database, &admin, &out_dir) => outcome,
        _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
    };
    let dropped = database.drop(&admin).await;
    let report = outcome?;
    dropped?;

    let markdown = report.markdown(&plan);
    let report_path = out_dir.join("report.md");
    fs::write(&report_path, &markdown).context(format!("writing {}", report_path.display()))?;
    println!("{markdown}");
    say(format!(
        "done in {:.0} s; report written to {}",
        started.elapsed().as_secs_f64(),
        report_path.display()
    ));
    Ok(())
}

/// `target/bench`: the generated scripts, the report and the service's log.
fn output_dir() -> Res<PathBuf> {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .ok_or("CARGO_TARGET_TMPDIR has no parent")?;
    let dir = target.join("bench");
    fs::create_dir_all(&dir).context(format!("creating {}", dir.display()))?;
    // The service's log is per run.
    let _ = fs::remove_file(dir.join("service.log"));
    Ok(dir)
}

/// Steps b to f; the database exists and is dropped by the caller.
async fn measure(
    plan: &Plan,
    database: &BenchDatabase,
    admin: &Client,
    out_dir: &Path,
) -> Res<Report> {
    let machine = Machine::read(&database.client).await?;

    say("migrating and creating the merchant");
    chargeonce_cli(&database.url, &["migrate"], out_dir).await?;
    let api_key = chargeonce_cli(&database.url, &["merchant", "create", "Bench"], out_dir).await?;
    if api_key.is_empty() {
        return Err("`chargeonce merchant create` printed no API key".into());
    }

    // b. Start-to-ready.
    let ready = start_to_ready(&database.url, out_dir).await?;

    // c. What the service asks PostgreSQL per request: the same keys twice,
    // first as new charges, then as replays.
    let keys: Vec<String> = (0..CAPTURE_REQUESTS)
        .map(|i| format!("capture-{i}"))
        .collect();
    let capture = Capture {
        new: capture(database, &api_key, &keys, out_dir).await?,
        replay: capture(database, &api_key, &keys, out_dir).await?,
    };
    for (flow, captured) in [("new charge", &capture.new), ("replay", &capture.replay)] {
        say(format!(
            "round trips per {flow}: {:.2}",
            captured.round_trips()
        ));
        for statement in &captured.statements {
            say(format!(
                "  {:>5} calls ({:.3} per request)  {}",
                statement.calls, statement.per_request, statement.text
            ));
        }
    }
    capture
        .new
        .write(&out_dir.join("captured-new.txt"), "new charges")?;
    capture
        .replay
        .write(&out_dir.join("captured-replay.txt"), "replays")?;

    // The instance under load, from here to the end.
    let service = Service::start(&database.url, out_dir).await?;
    let api = Api::new(service.addr, &api_key)?;

    // The charges replays re-send.
    say(format!(
        "creating {} charges for the replay pool",
        plan.pool_size
    ));
    let pool_keys: Vec<String> = (0..plan.pool_size).map(pool_key).collect();
    send_all(&api, POOL_FILL_CONNECTIONS, &pool_keys)
        .await?
        .require_success("creating the replay pool")?;
    // Statistics, as autovacuum gathers them within a minute on a table in
    // use. Without them, a generic plan cached while the table was new may
    // look a replay's key up through the merchant's listing index (reading
    // every charge of the merchant) until the first autoanalyze, for the
    // service and for pgbench alike; ANALYZE drops those cached plans.
    database
        .client
        .batch_execute("ANALYZE")
        .await
        .context("ANALYZE after creating the replay pool")?;

    // d. pgbench scripts from the captured texts.
    let values = ScriptValues::read(&database.client).await?;
    let new_script = build_script(Flow::New, &capture.new, plan.pool_size)?;
    let replay_script = build_script(Flow::Replay, &capture.replay, plan.pool_size)?;
    let pgbench = Pgbench::new(database.url.clone(), values, out_dir);
    let new_path = out_dir.join("new.sql");
    let replay_path = out_dir.join("replay.sql");
    for (path, script) in [(&new_path, &new_script), (&replay_path, &replay_script)] {
        let text = format!("{}{}", pgbench.header(path), script.text);
        fs::write(path, text).context(format!("writing {}", path.display()))?;
        say(format!("pgbench script: {}", path.display()));
    }
    pgbench.check(&database.client).await?;

    // e. The scenarios.
    let mut rows = Vec::new();
    let checkpoint = Checkpointer::new(admin);
    for workload in [Workload::New, Workload::Replay, Workload::Mix] {
        for &connections in plan.connections {
            checkpoint.run().await;
            let sample = closed_loop(&api, workload, connections, plan, service.pid()).await?;
            checkpoint.run().await;
            let pgbench_run = pgbench
                .run(workload, connections, plan, service.pid())
                .await?;
            say(format!(
                "{} x {connections}: {:.0} req/s, p99 {:.2} ms, non-2xx {}; \
                 pgbench {:.0} TPS, p99 {:.2} ms",
                workload.name(),
                sample.rps(),
                sample.percentile_ms(0.99),
                sample.tally.non_2xx_text(),
                pgbench_run.tps,
                pgbench_run.p99_ms,
            ));
            rows.push(Row {
                scenario: workload.name().to_owned(),
                connections,
                sample,
                pgbench: Some(pgbench_run),
            });
        }
    }
    checkpoint.run().await;
    let (sample, bursts) = bursts(&api, plan, service.pid()).await?;
    say(format!(
        "burst: {} rounds, {:.0} req/s, p99 {:.2} ms, non-2xx {}, rounds not created exactly once {}",
        bursts.rounds,
        sample.rps(),
        sample.percentile_ms(0.99),
        sample.tally.non_2xx_text(),
        bursts.not_created_once
    ));
    rows.push(Row {
        scenario: format!("burst ({BURST} same-key requests per round)"),
        connections: BURST,
        sample,
        pgbench: None,
    });

    // f. Peak memory, after everything.
    let peak_rss = service.peak_rss_bytes()?;
    drop(service);

    Ok(Report {
        machine,
        rows,
        bursts,
        peak_rss,
        capture,
        new_script,
        replay_script,
        ready,
        pgbench_command: pgbench.command_line(),
    })
}

/// Spawns the service READY_SAMPLES times and times each start until ready;
/// sorted.
async fn start_to_ready(database_url: &str, out_dir: &Path) -> Res<Vec<Duration>> {
    let mut ready = Vec::with_capacity(READY_SAMPLES);
    for _ in 0..READY_SAMPLES {
        let (mut service, spawned) = Service::spawn(database_url, out_dir)?;
        ready.push(service.wait_ready(spawned).await?);
    }
    ready.sort();
    let listed: Vec<String> = ready.iter().map(|d| format!("{:.0} ms", ms(*d))).collect();
    say(format!("start-to-ready: {}", listed.join(", ")));
    Ok(ready)
}

// ---------------------------------------------------------------------------
// PostgreSQL

async fn connect(url: &str) -> Res<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .context(format!("cannot connect to {}", redact(url)))?;
    // A lost connection shows in the next query's error.
    tokio::spawn(connection);
    Ok(client)
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme_end + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// The same server URL with another database (its query string kept).
fn with_database(url: &str, database: &str) -> Res<String> {
    let (scheme, rest) = url
        .split_once("://")
        .filter(|(scheme, _)| matches!(*scheme, "postgres" | "postgresql"))
        .ok_or("the admin URL must be a postgres:// or postgresql:// URL")?;
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let authority = before_query
        .split_once('/')
        .map_or(before_query, |(authority, _)| authority);
    let mut url = format!("{scheme}://{authority}/{database}");
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    Ok(url)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Drops bench databases older than a day (runs that were killed).
async fn drop_stale_databases(admin: &Client) -> Res<()> {
    let rows = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'chargeonce\\_bench\\_%'",
            &[],
        )
        .await
        .context("listing old bench databases")?;
    for row in rows {
        let name: String = row.get(0);
        let created = name
            .strip_prefix(DATABASE_PREFIX)
            .and_then(|suffix| suffix.parse::<u64>().ok());
        if created.is_some_and(|at| unix_now().saturating_sub(at) > STALE_AFTER.as_secs()) {
            say(format!("dropping the stale database {name}"));
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await
                .context(format!("dropping {name}"))?;
        }
    }
    Ok(())
}

/// `chargeonce_bench_<unix time>`, with pg_stat_statements, dropped at the end.
struct BenchDatabase {
    name: String,
    url: String,
    client: Client,
}

impl BenchDatabase {
    async fn create(admin: &Client, admin_url: &str) -> Res<Self> {
        let name = format!("{DATABASE_PREFIX}{}", unix_now());
        admin
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .context(format!("creating the database {name}"))?;
        say(format!("created the database {name}"));
        let url = with_database(admin_url, &name)?;
        let database = match connect(&url).await {
            Ok(client) => Self { name, url, client },
            Err(error) => {
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\""))
                    .await;
                return Err(error);
            }
        };
        let ready = database
            .client
            .batch_execute(
                "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; \
                 SELECT count(*) FROM pg_stat_statements",
            )
            .await
            .context(
                "pg_stat_statements is not usable on this server; it must be in \
                 shared_preload_libraries (scripts/bench's own cluster has it)",
            );
        if let Err(error) = ready {
            database.drop(admin).await?;
            return Err(error);
        }
        Ok(database)
    }

    async fn drop(&self, admin: &Client) -> Res<()> {
        admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                self.name
            ))
            .await
            .context(format!("dropping the database {}", self.name))?;
        say(format!("dropped the database {}", self.name));
        Ok(())
    }
}

/// Where the numbers were taken.
struct Machine {
    cores: usize,
    cpu: String,
    postgres: String,
    settings: String,
}

impl Machine {
    async fn read(client: &Client) -> Res<Self> {
        let cpu = fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find_map(|line| line.strip_prefix("model name"))
                    .and_then(|rest| rest.split_once(':'))
                    .map(|(_, model)| model.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        let mut setting = Vec::new();
        for name in [
            "fsync",
            "synchronous_commit",
            "shared_buffers",
            "max_connections",
        ] {
            let row = client
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .context(format!("SHOW {name}"))?;
            setting.push(format!("{name}={}", row.get::<_, String>(0)));
        }
        let version = client
            .query_one("SHOW server_version", &[])
            .await
            .context("SHOW server_version")?;
        Ok(Self {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            postgres: version.get(0),
            settings: setting.join(", "),
        })
    }
}

/// CHECKPOINT before each measured run, so that neither the service nor
/// pgbench pays for the other's dirty pages. Needs superuser (or
/// pg_checkpoint); without it the runs go on unaligned, with a warning.
struct Checkpointer<'a> {
    admin: &'a Client,
    warned: std::cell::Cell<bool>,
}

impl<'a> Checkpointer<'a> {
    fn new(admin: &'a Client) -> Self {
        Self {
            admin,
            warned: std::cell::Cell::new(false),
        }
    }

    async fn run(&self) {
        if let Err(error) = self.admin.batch_execute("CHECKPOINT").await {
            if !self.warned.replace(true) {
                say(format!(
                    "warning: CHECKPOINT failed ({error}); runs are not aligned on checkpoints"
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The service process

/// Runs `chargeonce ARGS` to completion; returns its stdout.
async fn chargeonce_cli(database_url: &str, args: &[&str], out_dir: &Path) -> Res<String> {
    let output = tokio::process::Command::new(BIN)
        .env_clear()
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .current_dir(out_dir)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context(format!("cannot run {BIN}"))?;
    if !output.status.success() {
        return Err(format!(
            "`chargeonce {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn free_port() -> Res<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr().context("finding a free port")?.port())
}

/// `chargeonce serve`, killed when dropped.
struct Service {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Service {
    /// Spawns the service on a free port; returns it with the instant of the
    /// spawn. It runs from `out_dir`, where there is no config/ folder: the
    /// embedded defaults apply, not a developer's config/local.toml.
    fn spawn(database_url: &str, out_dir: &Path) -> Res<(Self, Instant)> {
        let port = free_port()?;
        let log = out_dir.join("service.log");
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .context(format!("opening {}", log.display()))?;
        let mut command = std::process::Command::new(BIN);
        command
            .env_clear()
            .env("DATABASE_URL", database_url)
            .env("CHARGEONCE__SERVER__PORT", port.to_string())
            .env("CHARGEONCE__PROCESSOR__KIND", "simulated")
            .env("CHARGEONCE__PROCESSOR__LATENCY_MS", "0")
            // The service's default log level (info: a line per request)
            // unless the benchmark is given RUST_LOG.
            .envs(std::env::var("RUST_LOG").map(|level| ("RUST_LOG", level)))
            // `CHARGEONCE__…` variables given to the benchmark reach the
            // service: a configuration change can be measured against the
            // defaults (BENCHMARKS.md, history).
            .envs(std::env::vars().filter(|(name, _)| name.starts_with("CHARGEONCE__")))
            .current_dir(out_dir)
            .arg("serve")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let spawned = Instant::now();
        let child = command
            .spawn()
            .context(format!("cannot start {BIN} serve"))?;
        let service = Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            log,
        };
        Ok((service, spawned))
    }

    /// Spawns the service and waits until it is ready.
    async fn start(database_url: &str, out_dir: &Path) -> Res<Self> {
        let (mut service, spawned) = Self::spawn(database_url, out_dir)?;
        service.wait_ready(spawned).await?;
        Ok(service)
    }

    /// Asks GET /readyz every millisecond until it answers 200; returns the
    /// time since `spawned`.
    async fn wait_ready(&mut self, spawned: Instant) -> Res<Duration> {
        let mut connection: Option<Http> = None;
        loop {
            if let Some(status) = self.child.try_wait().context("watching the service")? {
                return Err(format!(
                    "the service exited during start-up ({status}); see {}",
                    self.log.display()
                )
                .into());
            }
            if connection.is_none() {
                connection = Http::connect(self.addr).await.ok();
            }
            if let Some(http) = connection.as_mut() {
                match http.send(get_request(self.addr, "/readyz")?).await {
                    Ok(answer) if answer.status == StatusCode::OK => return Ok(spawned.elapsed()),
                    Ok(_) => {}
                    Err(_) => connection = None,
                }
            }
            if spawned.elapsed() > READY_LIMIT {
                return Err(format!(
                    "the service was not ready within {READY_LIMIT:?}; see {}",
                    self.log.display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// VmHWM: the most resident memory the process has had.
    fn peak_rss_bytes(&self) -> Res<u64> {
        let path = format!("/proc/{}/status", self.child.id());
        let status = fs::read_to_string(&path).context(format!("reading {path}"))?;
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix("VmHWM:"))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .ok_or_else(|| format!("no VmHWM in {path}"))?;
        Ok(kib * 1024)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// HTTP

/// One keep-alive HTTP/1.1 connection.
struct Http {
    sender: SendRequest<Full<Bytes>>,
}

/// One answer: status, whether it was a replay, and timings.
struct Answer {
    status: StatusCode,
    replayed: bool,
    latency: Duration,
    finished: Instant,
}

impl Http {
    async fn connect(addr: SocketAddr) -> Res<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .context(format!("connecting to {addr}"))?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(async move {
            // An error ends the connection; the next send reports it.
            let _ = connection.await;
        });
        Ok(Self { sender })
    }

    /// Sends and reads the whole answer. The latency runs from handing the
    /// request to the connection until the last byte of the body.
    async fn send(&mut self, request: Request<Full<Bytes>>) -> Res<Answer> {
        self.sender
            .ready()
            .await
            .context("the service closed the connection")?;
        let started = Instant::now();
        let response = self
            .sender
            .send_request(request)
            .await
            .context("the request got no answer")?;
        let status = response.status();
        let replayed = response
            .headers()
            .get(REPLAYED)
            .is_some_and(|value| value == "true");
        response
            .into_body()
            .collect()
            .await
            .context("reading the answer")?;
        let finished = Instant::now();
        Ok(Answer {
            status,
            replayed,
            latency: finished - started,
            finished,
        })
    }
}

async fn connect_many(addr: SocketAddr, count: usize) -> Res<Vec<Http>> {
    let mut connections = Vec::with_capacity(count);
    for _ in 0..count {
        connections.push(Http::connect(addr).await?);
    }
    Ok(connections)
}

fn get_request(addr: SocketAddr, path: &str) -> Res<Request<Full<Bytes>>> {
    Request::builder()
        .method(Method::GET)
        .uri(path)
        .header(HOST, addr.to_string())
        .body(Full::new(Bytes::new()))
        .context("building a request")
}

/// POST /v1/charges for the bench merchant.
struct Api {
    addr: SocketAddr,
    host: HeaderValue,
    authorization: HeaderValue,
    body: Bytes,
}

impl Api {
    fn new(addr: SocketAddr, api_key: &str) -> Res<Self> {
        Ok(Self {
            addr,
            host: HeaderValue::from_str(&addr.to_string()).context("Host header")?,
            authorization: HeaderValue::from_str(&format!("Bearer {api_key}"))
                .context("the API key is not a valid header value")?,
            body: Bytes::from_static(BODY.as_bytes()),
        })
    }

    fn charge(&self, key: &str) -> Res<Request<Full<Bytes>>> {
        Request::builder()
            .method(Method::POST)
            .uri("/v1/charges")
            .header(HOST, self.host.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header("idempotency-key", key)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(self.body.clone()))
            .context("building a charge request")
    }
}

fn pool_key(index: usize) -> String {
    format!("pool-{index}")
}

// ---------------------------------------------------------------------------
// Measurements

/// Every latency and every status of a run.
#[derive(Default)]
struct Tally {
    latencies_us: Vec<u32>,
    statuses: BTreeMap<u16, u64>,
}

impl Tally {
    fn record(&mut self, answer: &Answer) {
        let micros = u32::try_from(answer.latency.as_micros()).unwrap_or(u32::MAX);
        self.latencies_us.push(micros);
        *self.statuses.entry(answer.status.as_u16()).or_default() += 1;
    }

    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        for (status, count) in other.statuses {
            *self.statuses.entry(status).or_default() += count;
        }
    }

    fn non_2xx(&self) -> u64 {
        self.statuses
            .iter()
            .filter(|(status, _)| !(200..300).contains(*status))
            .map(|(_, count)| count)
            .sum()
    }

    /// "0", or e.g. "3 (409: 2, 503: 1)".
    fn non_2xx_text(&self) -> String {
        let failures: Vec<String> = self
            .statuses
            .iter()
            .filter(|(status, _)| !(200..300).contains(*status))
            .map(|(status, count)| format!("{status}: {count}"))
            .collect();
        if failures.is_empty() {
            "0".to_owned()
        } else {
            format!("{} ({})", self.non_2xx(), failures.join(", "))
        }
    }

    fn require_success(&self, what: &str) -> Res<()> {
        match self.non_2xx() {
            0 => Ok(()),
            _ => Err(format!("{what}: unexpected answers {}", self.non_2xx_text()).into()),
        }
    }
}

/// A measured run: its tally (latencies sorted) over `seconds`, and where
/// the machine's CPU went meanwhile.
struct Sample {
    tally: Tally,
    seconds: f64,
    cpu: Option<CpuShare>,
}

impl Sample {
    fn new(mut tally: Tally, seconds: f64, cpu: Option<CpuShare>) -> Self {
        tally.latencies_us.sort_unstable();
        Self {
            tally,
            seconds,
            cpu,
        }
    }

    fn rps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tally.latencies_us.len() as f64 / self.seconds
        } else {
            0.0
        }
    }

    fn percentile_ms(&self, quantile: f64) -> f64 {
        percentile_ms(&self.tally.latencies_us, quantile)
    }
}

/// Nearest-rank percentile of sorted microseconds, in milliseconds.
fn percentile_ms(sorted_us: &[u32], quantile: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let rank = ((quantile * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    f64::from(sorted_us[rank - 1]) / 1000.0
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// A fresh key for every request.
    New,
    /// Keys of the pool, same body: every request is a replay.
    Replay,
    /// 90 % new, 10 % replay.
    Mix,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Replay => "replay",
            Self::Mix => "mix",
        }
    }
}

/// The keys one simulated client sends.
struct Keys {
    workload: Workload,
    prefix: String,
    next: u64,
    pool_size: usize,
    rng: StdRng,
}

impl Keys {
    fn new(workload: Workload, connections: usize, client: usize, pool_size: usize) -> Self {
        Self {
            workload,
            prefix: format!("{}-{connections}-{client}", workload.name()),
            next: 0,
            pool_size,
            rng: StdRng::seed_from_u64((connections * 1000 + client) as u64),
        }
    }

    fn next_key(&mut self) -> String {
        let fresh = match self.workload {
            Workload::New => true,
            Workload::Replay => false,
            Workload::Mix => self.rng.gen_range(0..100) < MIX_NEW_PERCENT,
        };
        if fresh {
            self.next += 1;
            format!("{}-{}", self.prefix, self.next)
        } else {
            pool_key(self.rng.gen_range(0..self.pool_size))
        }
    }
}

/// `connections` clients in a closed loop for warm-up + measure; only answers
/// that arrive within the measured window count.
async fn closed_loop(
    api: &Api,
    workload: Workload,
    connections: usize,
    plan: &Plan,
    service_pid: u32,
) -> Res<Sample> {
    let clients = connect_many(api.addr, connections).await?;
    let measured_from = Instant::now() + plan.warmup;
    let until = measured_from + plan.measure;
    let runs = clients.into_iter().enumerate().map(|(client, http)| {
        let keys = Keys::new(workload, connections, client, plan.pool_size);
        client_loop(api, http, keys, measured_from, until)
    });
    let (results, cpu) = tokio::join!(
        join_all(runs),
        cpu_between(measured_from, until, service_pid)
    );
    let mut tally = Tally::default();
    for result in results {
        tally.merge(result?);
    }
    Ok(Sample::new(tally, plan.measure.as_secs_f64(), Some(cpu?)))
}

async fn client_loop(
    api: &Api,
    mut http: Http,
    mut keys: Keys,
    measured_from: Instant,
    until: Instant,
) -> Res<Tally> {
    let mut tally = Tally::default();
    while Instant::now() < until {
        let answer = http.send(api.charge(&keys.next_key())?).await?;
        if (measured_from..=until).contains(&answer.finished) {
            tally.record(&answer);
        }
    }
    Ok(tally)
}

/// Sends each key once, spread over `connections` sequential clients.
async fn send_all(api: &Api, connections: usize, keys: &[String]) -> Res<Tally> {
    let clients = connect_many(api.addr, connections).await?;
    let runs = clients
        .into_iter()
        .enumerate()
        .map(|(client, mut http)| async move {
            let mut tally = Tally::default();
            for key in keys.iter().skip(client).step_by(connections) {
                tally.record(&http.send(api.charge(key)?).await?);
            }
            Res::Ok(tally)
        });
    let mut tally = Tally::default();
    for result in join_all(runs).await {
        tally.merge(result?);
    }
    Ok(tally)
}

struct BurstCounts {
    rounds: u64,
    /// Rounds in which not exactly one request created the charge (the
    /// others must all be replays of it).
    not_created_once: u64,
}

/// Rounds of BURST requests with one fresh key, one per connection, released
/// together by a barrier; the next round starts when all have answered.
/// The width is the burst's, so the scenario is reported once, not per
/// client count.
async fn bursts(api: &Api, plan: &Plan, service_pid: u32) -> Res<(Sample, BurstCounts)> {
    let mut connections = connect_many(api.addr, BURST).await?;
    let measured_from = Instant::now() + plan.warmup;
    let until = measured_from + plan.measure;
    let mut cpu_clock = None;
    let mut tally = Tally::default();
    let mut counts = BurstCounts {
        rounds: 0,
        not_created_once: 0,
    };
    let mut window: Option<(Instant, Instant)> = None;
    let mut round = 0u64;
    while Instant::now() < until {
        round += 1;
        let key = format!("burst-{round}");
        let requests = (0..BURST)
            .map(|_| api.charge(&key))
            .collect::<Res<Vec<_>>>()?;
        let barrier = Barrier::new(BURST);
        let started = Instant::now();
        let sends = connections.iter_mut().zip(requests).map(|(http, request)| {
            let barrier = &barrier;
            async move {
                barrier.wait().await;
                http.send(request).await
            }
        });
        let answers = join_all(sends).await.into_iter().collect::<Res<Vec<_>>>()?;
        if started < measured_from {
            continue;
        }
        if cpu_clock.is_none() {
            cpu_clock = Some(CpuClock::read(service_pid)?);
        }
        let finished = Instant::now();
        window = Some((window.map_or(started, |(first, _)| first), finished));
        counts.rounds += 1;
        let created = answers
            .iter()
            .filter(|answer| answer.status.is_success() && !answer.replayed)
            .count();
        if created != 1 {
            counts.not_created_once += 1;
        }
        for answer in &answers {
            tally.record(answer);
        }
    }
    let seconds = window.map_or(0.0, |(first, last)| (last - first).as_secs_f64());
    let cpu = match cpu_clock {
        Some(start) => Some(CpuShare::between(&start, &CpuClock::read(service_pid)?)),
        None => None,
    };
    Ok((Sample::new(tally, seconds, cpu), counts))
}

// ---------------------------------------------------------------------------
// Where the CPU goes

/// CPU time so far, in the kernel's clock ticks: the whole machine's (all
/// cores, busy and in total), the service's and this load generator's.
struct CpuClock {
    busy: u64,
    total: u64,
    service: u64,
    generator: u64,
}

impl CpuClock {
    fn read(service_pid: u32) -> Res<Self> {
        let stat = fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
        // cpu user nice system idle iowait irq softirq steal (guest is in user)
        let ticks: Vec<u64> = stat
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("cpu "))
            .ok_or("no cpu line in /proc/stat")?
            .split_whitespace()
            .take(8)
            .map(|n| n.parse().context("parsing /proc/stat"))
            .collect::<Res<_>>()?;
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
fn process_ticks(pid: &str) -> Res<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = fs::read_to_string(&path).context(format!("reading {path}"))?;
    // Fields after the command name's closing parenthesis: state is the
    // 3rd field of the line, utime the 14th and stime the 15th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let field = |index: usize| -> Res<u64> {
        fields
            .get(index)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("no field {} in {path}", index + 3).into())
    };
    Ok(field(11)? + field(12)?)
}

/// Shares of all cores' time over an interval, in percent: 100 is every
/// core busy. `rest` is PostgreSQL, pgbench, the kernel's work for them, and
/// anything else on the machine.
#[derive(Clone, Copy)]
struct CpuShare {
    busy: f64,
    service: f64,
    generator: f64,
}

impl CpuShare {
    fn between(start: &CpuClock, end: &CpuClock) -> Self {
        let total = end.total.saturating_sub(start.total).max(1) as f64;
        let share = |from: u64, to: u64| 100.0 * to.saturating_sub(from) as f64 / total;
        Self {
            busy: share(start.busy, end.busy),
            service: share(start.service, end.service),
            generator: share(start.generator, end.generator),
        }
    }

    fn rest(&self) -> f64 {
        (self.busy - self.service - self.generator).max(0.0)
    }
}

/// The CPU shares between two instants (waits for both).
async fn cpu_between(from: Instant, until: Instant, service_pid: u32) -> Res<CpuShare> {
    tokio::time::sleep_until(from.into()).await;
    let start = CpuClock::read(service_pid)?;
    tokio::time::sleep_until(until.into()).await;
    Ok(CpuShare::between(&start, &CpuClock::read(service_pid)?))
}

// ---------------------------------------------------------------------------
// Capture: which statements a request costs

/// One statement as pg_stat_statements normalised it.
struct Statement {
    text: String,
    calls: i64,
    per_request: f64,
}

struct Captured {
    statements: Vec<Statement>,
    requests: usize,
}

struct Capture {
    new: Captured,
    replay: Captured,
}

impl Captured {
    fn new(raw: Vec<(String, i64)>, requests: usize) -> Self {
        let statements = raw
            .into_iter()
            .map(|(text, calls)| Statement {
                per_request: calls as f64 / requests as f64,
                text,
                calls,
            })
            .collect();
        Self {
            statements,
            requests,
        }
    }

    fn round_trips(&self) -> f64 {
        let calls: i64 = self.statements.iter().map(|s| s.calls).sum();
        calls as f64 / self.requests as f64
    }

    fn write(&self, path: &Path, what: &str) -> Res<()> {
        let mut text = format!(
            "-- pg_stat_statements after {} {what} (calls, then the normalised text)\n",
            self.requests
        );
        for statement in &self.statements {
            let _ = writeln!(text, "\n-- {} calls\n{};", statement.calls, statement.text);
        }
        fs::write(path, text).context(format!("writing {}", path.display()))
    }
}

/// Starts a service, resets pg_stat_statements, sends each key once in
/// sequence on one connection, and returns what the database executed
/// meanwhile, without the statements about pg_stat_statements (ours).
///
/// Each capture has a fresh service so that all its statements are prepared
/// after the reset: pg_stat_statements then stores them normalised, constants
/// as $n too. (A statement prepared before a reset comes back with its
/// constants as written.)
async fn capture(
    database: &BenchDatabase,
    api_key: &str,
    keys: &[String],
    out_dir: &Path,
) -> Res<Captured> {
    let service = Service::start(&database.url, out_dir).await?;
    let api = Api::new(service.addr, api_key)?;
    let db = &database.client;
    db.batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .context("resetting pg_stat_statements")?;
    send_all(&api, 1, keys)
        .await?
        .require_success("the captured requests")?;
    let rows = db
        .query(
            "SELECT query, calls FROM pg_stat_statements \
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                AND query NOT ILIKE '%pg_stat_statements%' \
              ORDER BY calls DESC, query",
            &[],
        )
        .await
        .context("reading pg_stat_statements")?;
    let statements = rows
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1)))
        .collect();
    Ok(Captured::new(statements, keys.len()))
}

// ---------------------------------------------------------------------------
// pgbench scripts from the captured statements
//
// pg_stat_statements keeps each statement with its parameters as $1..$n and
// also replaces its constants ('pending', true, NULL...) by further $n. To
// run a statement in pgbench every $n needs a value, so each statement the
// service may run per request is known here by its shape (`Kind`), with the
// meaning of each placeholder found by the text around it. What is not known
// fails the benchmark with the statement's text rather than guessing.

/// Where a placeholder stands.
#[derive(Clone, Copy)]
enum At {
    /// The value of this column in the statement's INSERT ... VALUES.
    Column(&'static str),
    /// Text around the placeholder, `$` marking it: "SET status = $".
    Text(&'static str),
}

impl Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Column(column) => write!(f, "the VALUES entry of column `{column}`"),
            Self::Text(pattern) => write!(f, "`{pattern}`"),
        }
    }
}

/// What a placeholder stands for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Val {
    /// A new UUIDv7-like id (time-ordered, as the service's ids).
    NewId,
    MerchantId,
    /// The idempotency key: fresh for a new charge, from the pool for a replay.
    Key,
    Fingerprint,
    Amount,
    Currency,
    Metadata,
    LeaseMs,
    ApiKeyHash,
    /// The charge id returned by this script's claim_key statement.
    ChargeId,
    /// The processor's payment id, distinct per charge.
    PaymentId,
    /// The outbox event's payload.
    Payload,
    /// A constant of the service's SQL, normalised away by pg_stat_statements.
    Sql(&'static str),
}

/// A statement the service may run per request.
struct Kind {
    name: &'static str,
    /// Its place in a request: statements run in this order.
    step: u8,
    starts_with: &'static str,
    contains: &'static [&'static str],
    binds: &'static [(At, Val)],
}

const KINDS: &[Kind] = &[
    Kind {
        name: "authenticate",
        step: 0,
        starts_with: "SELECT",
        contains: &["FROM api_keys", "key_hash = $"],
        binds: &[(At::Text("key_hash = $"), Val::ApiKeyHash)],
    },
    Kind {
        name: "claim_key",
        step: 1,
        starts_with: "WITH inserted AS",
        contains: &["INSERT INTO charges", "ON CONFLICT"],
        binds: &[
            (At::Column("id"), Val::NewId),
            (At::Column("merchant_id"), Val::MerchantId),
            (At::Column("client_idempotency_key"), Val::Key),
            (At::Column("request_fingerprint"), Val::Fingerprint),
            (At::Column("amount"), Val::Amount),
            (At::Column("currency"), Val::Currency),
            (At::Column("customer"), Val::Sql("NULL")),
            (At::Column("description"), Val::Sql("NULL")),
            (At::Column("metadata"), Val::Metadata),
            (At::Column("status"), Val::Sql("'pending'")),
            (At::Text("$::bigint * interval"), Val::LeaseMs),
            (At::Text("interval $"), Val::Sql("'1 millisecond'")),
            // The alias only names the column, for pgbench's \gset.
            (
                At::Text("created_at, $ FROM inserted"),
                Val::Sql("true AS created"),
            ),
            (At::Text("created_at, $ FROM charges"), Val::Sql("false")),
            (At::Text("SELECT $ FROM inserted"), Val::Sql("1")),
            (At::Text("WHERE merchant_id = $"), Val::MerchantId),
            (At::Text("client_idempotency_key = $"), Val::Key),
        ],
    },
    Kind {
        name: "find_by_key",
        step: 2,
        starts_with: "SELECT",
        contains: &[
            "FROM charges WHERE merchant_id = $",
            "client_idempotency_key = $",
        ],
        binds: &[
            (At::Text("merchant_id = $"), Val::MerchantId),
            (At::Text("client_idempotency_key = $"), Val::Key),
        ],
    },
    Kind {
        name: "record_outcome",
        step: 3,
        starts_with: "WITH updated AS",
        contains: &["UPDATE charges", "INSERT INTO events"],
        binds: &[
            (At::Text("SET status = $"), Val::Sql("'succeeded'")),
            (At::Text("failure_code = $"), Val::Sql("NULL")),
            (At::Text("failure_message = $"), Val::Sql("NULL")),
            (At::Text("processor_payment_id = $"), Val::PaymentId),
            (At::Text("locked_until = $"), Val::Sql("NULL")),
            (At::Text("WHERE id = $"), Val::ChargeId),
            (At::Text("AND status = $"), Val::Sql("'pending'")),
            (At::Text("SELECT $, merchant_id"), Val::NewId),
            (At::Text("$ || status"), Val::Sql("'charge.'")),
            (At::Text("status, $ FROM updated"), Val::Payload),
        ],
    },
];

/// pgbench variable the charge id of `claim_key` lands in (its `\gset`).
const CHARGE_ID_VARIABLE: &str = "claim_key_id";

/// A time-ordered id like the service's UUIDv7: milliseconds, then random.
/// Random (v4) ids would scatter the primary-key inserts over the index.
const NEW_ID_SQL: &str =
    "(lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') \
                          || left(md5(random()::text), 20))::uuid";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flow {
    New,
    Replay,
}

impl Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::New => "new charge",
            Self::Replay => "replay",
        })
    }
}

/// A generated pgbench script (without its header) and what it holds.
struct Script {
    text: String,
    /// (kind, times per request) in script order.
    statements: Vec<(&'static str, f64)>,
}

fn recognise(text: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|kind| {
        text.starts_with(kind.starts_with) && kind.contains.iter().all(|c| text.contains(c))
    })
}

/// The statement on one line with single spaces, so patterns match however
/// the service's source lays its SQL out.
fn one_line(text: &str) -> Res<String> {
    if text.contains("--") || text.contains("/*") {
        return Err(format!(
            "a captured statement has a comment; cannot put it on one line: {text}"
        )
        .into());
    }
    Ok(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Every `$n` in the text: (start, end, n).
fn placeholders(text: &str) -> Vec<(usize, usize, u32)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' {
            let digits = bytes[i + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
            if let Ok(n) = text[i + 1..i + 1 + digits].parse() {
                found.push((i, i + 1 + digits, n));
            }
            i += 1 + digits;
        } else {
            i += 1;
        }
    }
    found
}

/// `(a, (b), c) rest` → ("a, (b), c", " rest"); the text must start with '('.
fn parenthesised(text: &str) -> Option<(&str, &str)> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some((&text[1..i], &text[i + 1..]));
                }
            }
            _ if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// Splits on the commas outside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(text[start..].trim());
    parts
}

/// `INSERT INTO t (c1, c2) VALUES (v1, v2)` → [(c1, v1), (c2, v2)].
fn insert_columns(text: &str) -> Option<Vec<(&str, &str)>> {
    let insert = &text[text.find("INSERT INTO ")?..];
    let (columns, rest) = parenthesised(&insert[insert.find('(')?..])?;
    let (values, _) = parenthesised(rest.trim_start().strip_prefix("VALUES")?.trim_start())?;
    let (columns, values) = (split_top_level(columns), split_top_level(values));
    (columns.len() == values.len()).then(|| columns.into_iter().zip(values).collect())
}

/// The meaning of every placeholder of a statement of this kind.
fn bind(kind: &Kind, text: &str) -> Res<BTreeMap<u32, Val>> {
    let changed = |why: String| -> BoxError {
        format!(
            "the `{}` statement is not what the benchmark knows ({why}); the service's SQL \
             changed: update KINDS in benches/load.rs. The statement: {text}",
            kind.name
        )
        .into()
    };
    let found = placeholders(text);
    let columns = insert_columns(text);
    let mut bound = BTreeMap::new();
    for &(at, val) in kind.binds {
        let numbers: Vec<u32> = match at {
            At::Column(column) => {
                let value = columns
                    .as_ref()
                    .and_then(|columns| columns.iter().find(|(c, _)| *c == column))
                    .map(|(_, value)| *value)
                    .ok_or_else(|| changed(format!("no INSERT value for column `{column}`")))?;
                match (placeholders(value).as_slice(), val) {
                    ([(0, end, n)], _) if *end == value.len() => vec![*n],
                    // A constant that pg_stat_statements kept as written.
                    ([], Val::Sql(constant)) if value == constant => continue,
                    _ => return Err(changed(format!("{at} is `{value}`, not a parameter"))),
                }
            }
            At::Text(pattern) => {
                let (before, after) = pattern
                    .split_once('$')
                    .ok_or_else(|| changed(format!("pattern {at} has no `$`")))?;
                found
                    .iter()
                    .filter(|(start, end, _)| {
                        text[..*start].ends_with(before) && text[*end..].starts_with(after)
                    })
                    .map(|(_, _, n)| *n)
                    .collect()
            }
        };
        if numbers.is_empty() {
            // pg_stat_statements replaces a statement's constants by $n only
            // when it sees the statement parsed; one prepared before its last
            // reset keeps them as written, so a constant may have no $n.
            if matches!(val, Val::Sql(_)) {
                continue;
            }
            return Err(changed(format!("nothing at {at}")));
        }
        for n in numbers {
            if let Some(other) = bound.insert(n, val).filter(|other| *other != val) {
                return Err(changed(format!("${n} would be both {other:?} and {val:?}")));
            }
        }
    }
    for (start, end, n) in found {
        if !bound.contains_key(&n) {
            let context = &text[start.saturating_sub(40)..(end + 20).min(text.len())];
            return Err(changed(format!(
                "nothing gives ${n} a value, in `…{context}…`"
            )));
        }
    }
    Ok(bound)
}

/// The pgbench text for a value in a script of this flow.
fn render(val: Val, flow: Flow, has_charge_id: bool) -> Res<String> {
    Ok(match val {
        Val::NewId => NEW_ID_SQL.to_owned(),
        Val::MerchantId => ":merchant_id".to_owned(),
        Val::Key => match flow {
            Flow::New => "('pgb-' || :run || '-' || :k)".to_owned(),
            Flow::Replay => "('pool-' || :i)".to_owned(),
        },
        Val::Fingerprint => ":fingerprint".to_owned(),
        Val::Amount => ":amount".to_owned(),
        Val::Currency => ":currency".to_owned(),
        Val::Metadata => ":metadata".to_owned(),
        Val::LeaseMs => ":lease_ms".to_owned(),
        Val::ApiKeyHash => ":key_hash".to_owned(),
        Val::ChargeId if has_charge_id => format!(":{CHARGE_ID_VARIABLE}"),
        Val::ChargeId => {
            return Err(format!(
                "a {flow} uses a charge id before any claim_key statement returned one"
            )
            .into())
        }
        Val::PaymentId => "('sim_' || left(md5(random()::text), 24))".to_owned(),
        Val::Payload => ":payload".to_owned(),
        Val::Sql(sql) => sql.to_owned(),
    })
}

/// The script of one flow: each statement a request runs (about) once or
/// more per request, in request order, each its own transaction as in the
/// service; every `$n` replaced by its pgbench value. Statements run by fewer
/// than half the requests (a cached lookup, the background workers) are left
/// out; they are in the round-trip count.
fn build_script(flow: Flow, captured: &Captured, pool_size: usize) -> Res<Script> {
    let mut chosen = Vec::new();
    for statement in &captured.statements {
        let copies = statement.per_request.round() as usize;
        if copies == 0 {
            continue;
        }
        let text = one_line(&statement.text)?;
        let kind = recognise(&text).ok_or_else(|| {
            format!(
                "every {flow} runs a statement the benchmark cannot map to pgbench \
                 ({:.2} per request), so it cannot build a script doing the same work; \
                 teach KINDS in benches/load.rs its parameters. The statement: {text}",
                statement.per_request
            )
        })?;
        let bound = bind(kind, &text)?;
        for _ in 0..copies {
            chosen.push((kind, text.clone(), bound.clone(), statement.per_request));
        }
    }
    if chosen.is_empty() {
        return Err(format!("no statement ran once per {flow}: nothing to compare with").into());
    }
    chosen.sort_by_key(|(kind, ..)| kind.step);

    let mut script = String::new();
    let uses = |val: Val| {
        chosen
            .iter()
            .any(|(_, _, bound, _)| bound.values().any(|v| *v == val))
    };
    if uses(Val::Key) {
        match flow {
            Flow::New => script.push_str("\\set k random(1, 9223372036854775806)\n"),
            Flow::Replay => {
                let _ = writeln!(script, "\\set i random(0, {})", pool_size.saturating_sub(1));
            }
        }
    }
    let mut has_charge_id = false;
    let total = chosen.len();
    let mut statements = Vec::new();
    for (index, (kind, text, bound, per_request)) in chosen.into_iter().enumerate() {
        let mut sql = String::new();
        let mut last = 0;
        for (start, end, n) in placeholders(&text) {
            sql.push_str(&text[last..start]);
            sql.push_str(&render(bound[&n], flow, has_charge_id)?);
            last = end;
        }
        sql.push_str(&text[last..]);
        // \gset keeps the row's columns, as the service reads them, and makes
        // pgbench fail if the statement found no row.
        let _ = write!(
            script,
            "\n-- {}/{total} {} ({per_request:.2} per {flow})\n{sql}\n\\gset {}_\n",
            index + 1,
            kind.name,
            kind.name
        );
        has_charge_id |= kind.name == "claim_key";
        statements.push((kind.name, per_request));
    }
    Ok(Script {
        text: script,
        statements,
    })
}

/// Values the scripts take from the database, as pgbench variables (-D), so
/// that they reach PostgreSQL as parameters, as the service's do.
struct ScriptValues {
    merchant_id: String,
    fingerprint: String,
    key_hash: String,
    payload: String,
}

impl ScriptValues {
    /// From the first captured charge, made by the service.
    async fn read(db: &Client) -> Res<Self> {
        let row = db
            .query_one(
                "SELECT c.merchant_id::text, '\\x' || encode(c.request_fingerprint, 'hex'), \
                        '\\x' || encode(k.key_hash, 'hex'), e.payload::text \
                   FROM charges c \
                   JOIN api_keys k ON k.merchant_id = c.merchant_id \
                   JOIN events e ON e.charge_id = c.id \
                  WHERE c.client_idempotency_key = 'capture-0'",
                &[],
            )
            .await
            .context("reading the merchant, fingerprint, key hash and event payload of a charge")?;
        Ok(Self {
            merchant_id: row.get(0),
            fingerprint: row.get(1),
            key_hash: row.get(2),
            payload: row.get(3),
        })
    }
}

/// What one measured pgbench run gave.
struct PgbenchRun {
    tps: f64,
    /// pgbench's mean latency per script run.
    mean_ms: f64,
    /// From pgbench's per-transaction log (`-l`): the 99th percentile.
    p99_ms: f64,
    /// Share of all cores busy during the run (pgbench itself included).
    cpu_busy: f64,
}

/// pgbench against the bench database with the generated scripts.
struct Pgbench {
    url: String,
    variables: Vec<(&'static str, String)>,
    new: PathBuf,
    replay: PathBuf,
    /// Where pgbench writes its per-transaction logs.
    log_dir: PathBuf,
}

impl Pgbench {
    fn new(url: String, values: ScriptValues, out_dir: &Path) -> Self {
        let variables = vec![
            ("merchant_id", values.merchant_id),
            ("fingerprint", values.fingerprint),
            ("key_hash", values.key_hash),
            ("payload", values.payload),
            ("amount", AMOUNT.to_owned()),
            ("currency", CURRENCY.to_owned()),
            ("metadata", METADATA.to_owned()),
            ("lease_ms", LEASE_MS.to_owned()),
        ];
        Self {
            url,
            variables,
            new: out_dir.join("new.sql"),
            replay: out_dir.join("replay.sql"),
            log_dir: out_dir.join("pgbench-log"),
        }
    }

    fn variable_args(&self, run: &str) -> Vec<String> {
        let mut args = Vec::new();
        for (name, value) in &self.variables {
            args.push("-D".to_owned());
            args.push(format!("{name}={value}"));
        }
        args.push("-D".to_owned());
        args.push(format!("run={run}"));
        args
    }

    fn script_args(&self, workload: Workload) -> Vec<String> {
        let file = |path: &Path, weight: &str| {
            vec!["-f".to_owned(), format!("{}{weight}", path.display())]
        };
        match workload {
            Workload::New => file(&self.new, ""),
            Workload::Replay => file(&self.replay, ""),
            Workload::Mix => {
                let replay_weight = 100 - MIX_NEW_PERCENT;
                let mut args = file(&self.new, &format!("@{MIX_NEW_PERCENT}"));
                args.extend(file(&self.replay, &format!("@{replay_weight}")));
                args
            }
        }
    }

    /// A comment for the top of a script: how to run it by hand.
    fn header(&self, path: &Path) -> String {
        let quoted: Vec<String> = self
            .variable_args("byhand")
            .iter()
            .map(|arg| shell_quote(arg))
            .collect();
        format!(
            "-- pgbench script generated by benches/load.rs (scripts/bench) from the statements\n\
             -- the service ran, as captured by pg_stat_statements. Each statement is its own\n\
             -- transaction, as in the service. Run by hand (database of that run):\n\
             --   pgbench -n -M prepared -c 1 -T 5 {} -f {} DATABASE_URL\n",
            quoted.join(" "),
            path.display()
        )
    }

    fn command_line(&self) -> String {
        "pgbench -n -M prepared -c C -j min(C,2) -T D -D merchant_id=… -D fingerprint=… \
         -D key_hash=… -D payload=… -D amount=1000 -D currency=USD -D metadata={} \
         -D lease_ms=30000 -D run=… -f target/bench/new.sql (replay: -f target/bench/replay.sql; \
         mix: -f target/bench/new.sql@9 -f target/bench/replay.sql@1) BENCH_DATABASE"
            .to_owned()
    }

    async fn pgbench(&self, mut args: Vec<String>) -> Res<String> {
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
            return Err(format!(
                "pgbench failed ({}): {}\n{}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim(),
                stdout.trim()
            )
            .into());
        }
        Ok(stdout)
    }

    /// Throughput at `clients` connections, after a warm-up as long as the
    /// service's (full mode).
    async fn run(
        &self,
        workload: Workload,
        clients: usize,
        plan: &Plan,
        service_pid: u32,
    ) -> Res<PgbenchRun> {
        let run = format!("{}-{clients}", workload.name());
        let mut args = vec![
            "-c".to_owned(),
            clients.to_string(),
            "-j".to_owned(),
            clients.min(2).to_string(),
        ];
        args.extend(self.script_args(workload));
        args.extend(self.variable_args(&run));
        if !plan.quick {
            let mut warmup = args.clone();
            warmup.extend([
                "-T".to_owned(),
                plan.pgbench_seconds(plan.warmup).to_string(),
            ]);
            self.pgbench(warmup).await?;
        }
        args.extend([
            "-T".to_owned(),
            plan.pgbench_seconds(plan.measure).to_string(),
        ]);
        // Every script run's latency, for the percentiles (one file per
        // pgbench thread, `<prefix>.<pid>[.<thread>]`).
        let _ = fs::remove_dir_all(&self.log_dir);
        fs::create_dir_all(&self.log_dir)
            .context(format!("creating {}", self.log_dir.display()))?;
        args.extend([
            "-l".to_owned(),
            format!("--log-prefix={}", self.log_dir.join(&run).display()),
        ]);
        let start = CpuClock::read(service_pid)?;
        let stdout = self.pgbench(args).await?;
        let cpu = CpuShare::between(&start, &CpuClock::read(service_pid)?);
        let latencies = self.logged_latencies()?;
        // "tps = 2273.1 (without initial connection time)", "latency average = 14.0 ms"
        let number = |prefix: &str| -> Option<f64> {
            stdout
                .lines()
                .find_map(|line| line.strip_prefix(prefix))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        };
        match (number("tps = "), number("latency average = ")) {
            (Some(tps), Some(mean_ms)) => Ok(PgbenchRun {
                tps,
                mean_ms,
                p99_ms: percentile_ms(&latencies, 0.99),
                cpu_busy: cpu.busy,
            }),
            _ => Err(format!("no TPS or latency in pgbench's output:\n{stdout}").into()),
        }
    }

    /// The latencies (µs, sorted) in pgbench's per-transaction logs, whose
    /// lines read `client transaction latency_us script epoch_s epoch_us`.
    fn logged_latencies(&self) -> Res<Vec<u32>> {
        let mut latencies = Vec::new();
        let entries =
            fs::read_dir(&self.log_dir).context(format!("reading {}", self.log_dir.display()))?;
        for entry in entries {
            let path = entry.context("reading pgbench's logs")?.path();
            let text = fs::read_to_string(&path).context(format!("reading {}", path.display()))?;
            for line in text.lines() {
                let latency = line.split_whitespace().nth(2).and_then(|f| f.parse().ok());
                match latency {
                    Some(us) => latencies.push(us),
                    None => {
                        return Err(format!("unexpected line in {}: {line}", path.display()).into())
                    }
                }
            }
        }
        if latencies.is_empty() {
            return Err(format!(
                "pgbench logged no transactions in {}",
                self.log_dir.display()
            )
            .into());
        }
        latencies.sort_unstable();
        Ok(latencies)
    }

    /// Runs each script a few times and checks its effect against the
    /// service's: a new-charge script leaves charges in the state the
    /// service's new charges are in; a replay script creates nothing.
    async fn check(&self, db: &Client) -> Res<()> {
        const RUNS: i64 = 20;
        let count = |sql: &'static str| async move {
            db.query_one(sql, &[])
                .await
                .map(|row| row.get::<_, i64>(0))
                .context("checking the scripts")
        };
        // One client running `workload`'s script RUNS times.
        let run_script = |workload| {
            let mut args = vec![
                "-c".to_owned(),
                "1".to_owned(),
                "-t".to_owned(),
                RUNS.to_string(),
            ];
            args.extend(self.script_args(workload));
            args.extend(self.variable_args("check"));
            self.pgbench(args)
        };
        run_script(Workload::New).await?;
        let like_service = count(
            "SELECT count(*) FROM charges c \
              WHERE c.client_idempotency_key LIKE 'pgb-check-%' \
                AND c.status = (SELECT status FROM charges WHERE client_idempotency_key = 'capture-0')",
        )
        .await?;
        if like_service != RUNS {
            return Err(format!(
                "{} made {like_service} charges like the service's out of {RUNS} runs: \
                 it does not do what a new charge does",
                self.new.display()
            )
            .into());
        }

        let before = count("SELECT count(*) FROM charges").await?;
        run_script(Workload::Replay).await?;
        let after = count("SELECT count(*) FROM charges").await?;
        if after != before {
            return Err(format!(
                "{} created {} charges: a replay creates none",
                self.replay.display(),
                after - before
            )
            .into());
        }
        say("pgbench scripts checked: a new charge is made once, a replay makes nothing");
        Ok(())
    }
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

// ---------------------------------------------------------------------------
// The report

struct Row {
    scenario: String,
    connections: usize,
    sample: Sample,
    pgbench: Option<PgbenchRun>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        self.pgbench
            .as_ref()
            .filter(|run| run.tps > 0.0)
            .map(|run| self.sample.rps() / run.tps)
    }
}

struct Report {
    machine: Machine,
    rows: Vec<Row>,
    bursts: BurstCounts,
    peak_rss: u64,
    capture: Capture,
    new_script: Script,
    replay_script: Script,
    ready: Vec<Duration>,
    pgbench_command: String,
}

/// One target of issue 4 and whether it was met.
struct Target {
    name: String,
    measured: String,
    met: Option<bool>,
}

impl Report {
    fn row(&self, scenario: &str, connections: usize) -> Option<&Row> {
        self.rows
            .iter()
            .find(|row| row.scenario == scenario && row.connections == connections)
    }

    fn targets(&self) -> Vec<Target> {
        let mut targets = Vec::new();
        let mut ratio_target = |scenario: &str, connections: usize, floor: f64| {
            let ratio = self.row(scenario, connections).and_then(Row::ratio);
            targets.push(Target {
                name: format!("{scenario} ≥ {floor} × pgbench at {connections}"),
                measured: ratio.map_or("not measured".to_owned(), |r| format!("{r:.2}")),
                met: ratio.map(|r| r >= floor),
            });
        };
        ratio_target("new", 32, 0.8);
        ratio_target("new", 64, 0.8);
        for connections in [1, 32, 64] {
            ratio_target("replay", connections, 0.6);
        }
        let new_32 = self.row("new", 32);
        let p99 = new_32.map(|row| row.sample.percentile_ms(0.99));
        // PostgreSQL's own p99 for the same statements at the same count
        // says whether the target can be met on this machine at all.
        let pgbench_p99 = new_32
            .and_then(|row| row.pgbench.as_ref())
            .map_or(String::new(), |run| {
                format!(" (pgbench alone: {:.2} ms)", run.p99_ms)
            });
        targets.push(Target {
            name: "p99 of new at 32 ≤ 15 ms".to_owned(),
            measured: p99.map_or("not measured".to_owned(), |p| {
                format!("{p:.2} ms{pgbench_p99}")
            }),
            met: p99.map(|p| p <= 15.0),
        });
        let failures: u64 = self.rows.iter().map(|row| row.sample.tally.non_2xx()).sum();
        targets.push(Target {
            name: "zero non-2xx answers".to_owned(),
            measured: failures.to_string(),
            met: Some(failures == 0),
        });
        let rss_mb = self.peak_rss as f64 / (1024.0 * 1024.0);
        targets.push(Target {
            name: "peak RSS ≤ 64 MB".to_owned(),
            measured: format!("{rss_mb:.1} MB"),
            met: Some(rss_mb <= 64.0),
        });
        let slowest = self.ready.iter().max().copied().unwrap_or_default();
        targets.push(Target {
            name: "start-to-ready ≤ 300 ms (slowest of the starts)".to_owned(),
            measured: format!("{:.0} ms", ms(slowest)),
            met: Some(slowest <= Duration::from_millis(300)),
        });
        targets
    }

    fn markdown(&self, plan: &Plan) -> String {
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
             {:.1} s warm-up, then {:.0} s measured; pgbench likewise, at the same client \
             count, right after.\n",
            m.cores,
            m.cpu,
            m.postgres,
            m.settings,
            plan.warmup.as_secs_f64(),
            plan.measure.as_secs_f64()
        );

        md.push_str(
            "| scenario | connections | requests/s | p50 ms | p99 ms | p99.9 ms | non-2xx \
             | pgbench TPS | pgbench mean ms | pgbench p99 ms | service ÷ pgbench |\n",
        );
        md.push_str("|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|\n");
        let dash = || "—".to_owned();
        for row in &self.rows {
            let s = &row.sample;
            let pgbench = row.pgbench.as_ref();
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |",
                row.scenario,
                row.connections,
                s.rps(),
                s.percentile_ms(0.50),
                s.percentile_ms(0.99),
                s.percentile_ms(0.999),
                s.tally.non_2xx_text(),
                pgbench.map_or_else(dash, |run| format!("{:.0}", run.tps)),
                pgbench.map_or_else(dash, |run| format!("{:.2}", run.mean_ms)),
                pgbench.map_or_else(dash, |run| format!("{:.2}", run.p99_ms)),
                row.ratio().map_or_else(dash, |r| format!("{r:.2}")),
            );
        }

        md.push_str(
            "\nWhere the CPU went, in % of all cores' time during the measured seconds \
             (from /proc; \"rest\" is PostgreSQL, the kernel and anything else):\n\n\
             | scenario | connections | service run: busy | service | load generator \
             | rest | pgbench run: busy |\n|---|---:|---:|---:|---:|---:|---:|\n",
        );
        for row in &self.rows {
            let Some(cpu) = row.sample.cpu else { continue };
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {} |",
                row.scenario,
                row.connections,
                cpu.busy,
                cpu.service,
                cpu.generator,
                cpu.rest(),
                row.pgbench
                    .as_ref()
                    .map_or_else(dash, |run| format!("{:.0}", run.cpu_busy)),
            );
        }
        let _ = writeln!(
            md,
            "\nBurst: {} measured rounds; rounds in which not exactly one request created the \
             charge: {}.\n",
            self.bursts.rounds, self.bursts.not_created_once
        );

        md.push_str("| measure | value |\n|---|---|\n");
        let _ = writeln!(
            md,
            "| peak RSS of the service (VmHWM, after all scenarios) | {:.1} MB |",
            self.peak_rss as f64 / (1024.0 * 1024.0)
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

        md.push_str("\nStatements per request (pg_stat_statements):\n\n");
        md.push_str("| flow | calls | per request | statement | in pgbench script |\n|---|---:|---:|---|---|\n");
        for (flow, captured, script) in [
            ("new", &self.capture.new, &self.new_script),
            ("replay", &self.capture.replay, &self.replay_script),
        ] {
            for statement in &captured.statements {
                let text = one_line(&statement.text).unwrap_or_else(|_| statement.text.clone());
                let kind = recognise(&text).map(|kind| kind.name);
                let in_script =
                    kind.is_some_and(|name| script.statements.iter().any(|(n, _)| *n == name));
                let _ = writeln!(
                    md,
                    "| {flow} | {} | {:.3} | {}`{}` | {} |",
                    statement.calls,
                    statement.per_request,
                    kind.map_or(String::new(), |name| format!("{name}: ")),
                    abbreviate(&text, 60),
                    if in_script {
                        "yes"
                    } else {
                        "no (not per request)"
                    }
                );
            }
        }
        let _ = writeln!(md, "\npgbench: `{}`\n", self.pgbench_command);

        md.push_str("Targets of issue 4:\n\n| target | measured | result |\n|---|---|---|\n");
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
}

fn abbreviate(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_owned()
    } else {
        format!("{}…", text.chars().take(chars).collect::<String>())
    }
}
