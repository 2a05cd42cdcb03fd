//! One full run on a fresh database (BENCHMARKS.md, "What a run does"), and
//! the binary under test, run in the output folder (no config/: defaults),
//! the simulated processor instant, its log in `service.log`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use chargeonce_testkit::{Chargeonce, SpawnOptions, Spawned};

use crate::capture::{self, Capture};
use crate::database::BenchDatabase;
use crate::http::Api;
use crate::pgbench::Pgbench;
use crate::report::{Report, Row};
use crate::scenario::{self, Workload};
use crate::sustain::{self, Offer, Sustained};
use crate::{say, script, Plan};

/// Sequential requests whose statements are counted, per flow.
const CAPTURE_REQUESTS: usize = 500;
/// Clients of the first round after the service's start.
const FIRST_CONNECTIONS: usize = 32;
/// Connections that create the charges replays are drawn from.
const POOL_FILL_CONNECTIONS: usize = 32;
/// Starts of the service timed from spawn to ready.
const READY_SAMPLES: usize = 5;
/// A failed request's wait for the service's exit (stopped, or broken?).
const EXIT_GRACE: Duration = Duration::from_secs(5);

pub struct ServiceBinary {
    binary: Chargeonce,
    pub out_dir: PathBuf,
}

impl ServiceBinary {
    pub fn find(chosen: Option<PathBuf>, out_dir: &Path) -> Result<Self> {
        let binary = match chosen {
            Some(path) => Chargeonce::new(path, out_dir),
            None => Chargeonce::beside_this_program(out_dir).map_err(anyhow::Error::msg)?,
        };
        Ok(Self { binary, out_dir: out_dir.to_owned() })
    }

    /// Migrates the database; the new merchant's API key.
    async fn migrate_and_create_merchant(&self, database: &BenchDatabase) -> Result<String> {
        say("migrating and creating the merchant");
        let run = |args| async move {
            self.binary.run(&database.url, args).await.map_err(anyhow::Error::msg)
        };
        run(&["migrate"]).await?;
        let api_key = run(&["merchant", "create", "Bench"]).await?;
        ensure!(!api_key.is_empty(), "`chargeonce merchant create` printed no API key");
        Ok(api_key)
    }

    /// `chargeonce serve`, ready (asked every `poll`); killed when dropped.
    async fn spawn(&self, database_url: &str, poll: Duration) -> Spawned {
        let mut command = self.binary.serve_command(database_url);
        command
            .env("CHARGEONCE__PROCESSOR__KIND", "simulated")
            .env("CHARGEONCE__PROCESSOR__LATENCY_MS", "0")
            .envs(std::env::vars().filter(|(name, _)| name.starts_with("CHARGEONCE__")));
        match std::env::var("RUST_LOG") {
            // The line that announces the port, whatever the level.
            Ok(level) => command.env("RUST_LOG", format!("{level},chargeonce::startup=info")),
            Err(_) => command.env_remove("RUST_LOG"),
        };
        let options = SpawnOptions { log_file: Some(self.out_dir.join("service.log")), poll };
        Spawned::start_with(command, "/readyz", options).await
    }

    pub async fn start(&self, database_url: &str) -> Spawned {
        self.spawn(database_url, Duration::from_millis(10)).await
    }

    /// `result`, its error saying so if the service died.
    async fn explain<T>(&self, service: &mut Spawned, result: Result<T>) -> Result<T> {
        let Err(error) = result else { return result };
        Err(match service.wait_exit(EXIT_GRACE).await {
            Some(status) => error.context(format!(
                "the service exited during the run ({status}); see {}",
                self.out_dir.join("service.log").display()
            )),
            None => error,
        })
    }

    /// READY_SAMPLES spawn-to-ready times (asked every ms), sorted.
    async fn start_to_ready(&self, database_url: &str) -> Vec<Duration> {
        let mut ready = Vec::with_capacity(READY_SAMPLES);
        for _ in 0..READY_SAMPLES {
            let spawned = Instant::now();
            let _service = self.spawn(database_url, Duration::from_millis(1)).await;
            ready.push(spawned.elapsed());
        }
        ready.sort();
        let listed: Vec<String> =
            ready.iter().map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0)).collect();
        say(format!("start-to-ready: {}", listed.join(", ")));
        ready
    }
}

async fn send_replay_pool(plan: &Plan, api: &Api, doing: &str) -> Result<()> {
    let keys: Vec<String> = (0..plan.pool_size).map(scenario::pool_key).collect();
    scenario::send_all(api, POOL_FILL_CONNECTIONS, &keys).await?.require_success(doing)
}

/// The floor's table, the replay pool, the pgbench scripts. ANALYZE as
/// autovacuum soon would: else a plan cached on the new table may find a
/// replay's key through the listing index, for both sides.
async fn prepare_load(
    plan: &Plan,
    (binary, service, api): (&ServiceBinary, &mut Spawned, &Api),
    db: &BenchDatabase,
) -> Result<Pgbench> {
    db.create_floor(plan.pool_size).await?;
    say(format!("creating {} charges for the replays", plan.pool_size));
    let doing = "creating the charges for the replays";
    binary.explain(service, send_replay_pool(plan, api, doing).await).await?;
    db.client.batch_execute("ANALYZE").await.context("ANALYZE after creating the replay pool")?;
    let variables = script::service_variables(&db.client).await?;
    Pgbench::write_scripts(db.url.clone(), variables, plan, &binary.out_dir)
}

pub async fn sustain(
    plan: &Plan,
    binary: &ServiceBinary,
    db: &BenchDatabase,
    (length, offer): (Duration, Offer),
) -> Result<Sustained> {
    let api_key = binary.migrate_and_create_merchant(db).await?;
    let mut service = binary.start(&db.url).await;
    let api = Api::new(service.port, &api_key)?;
    let pgbench = prepare_load(plan, (binary, &mut service, &api), db).await?;
    let run = sustain::run((&api, db, &pgbench), plan, service.pid(), length, offer).await;
    binary.explain(&mut service, run).await
}

pub async fn measure(plan: &Plan, binary: &ServiceBinary, db: &BenchDatabase) -> Result<Report> {
    let machine = db.machine().await?;
    let api_key = binary.migrate_and_create_merchant(db).await?;
    // Start-to-ready, before anything else loads the machine.
    let ready = binary.start_to_ready(&db.url).await;

    // The same keys twice: as new charges, then as replays.
    let keys: Vec<String> = (0..CAPTURE_REQUESTS).map(|i| format!("capture-{i}")).collect();
    let new = capture::capture(binary, db, &api_key, &keys).await?;
    let replay = capture::capture(binary, db, &api_key, &keys).await?;
    new.require_same_as(script::NEW_CHARGE_STATEMENTS, "new charge")?;
    replay.require_same_as(script::REPLAY_STATEMENTS, "replay")?;
    let capture = Capture { new, replay };

    // The instance under load, from here to the end.
    let mut service = binary.start(&db.url).await;
    let (api, pid) = (Api::new(service.port, &api_key)?, service.pid());
    // New charges as a start leaves the caches: no warm-up, own keys.
    let plan_first = Plan { warmup: Duration::ZERO, round: plan.rounds, ..plan.for_round(0) };
    let first = scenario::closed_loop(&api, Workload::New, FIRST_CONNECTIONS, &plan_first).await;
    let first = binary.explain(&mut service, first).await?;
    say(format!("first round after the start: {:.0} req/s", first.rps()));
    let pgbench = prepare_load(plan, (binary, &mut service, &api), db).await?;
    pgbench.check(&db.client).await?;

    let first_round = "new, first round after the start (no warm-up)";
    let mut rows = vec![Row::alone(first_round.to_owned(), FIRST_CONNECTIONS, first)];
    for workload in [Workload::New, Workload::Replay, Workload::Mix] {
        if workload == Workload::Replay {
            // Put the pool's answers back in the replay cache (BENCHMARKS.md).
            let doing = "replaying the pool's keys before the replay scenarios";
            binary.explain(&mut service, send_replay_pool(plan, &api, doing).await).await?;
        }
        for &connections in plan.connections {
            let mut rounds = Vec::new();
            for round in 0..plan.rounds {
                let plan = &plan.for_round(round);
                // Each side from a CHECKPOINT, its WAL read once settled.
                let mark = db.checkpoint().await?;
                let sample = scenario::closed_loop(&api, workload, connections, plan).await;
                let mut sample = binary.explain(&mut service, sample).await?;
                sample.wal = db.settled_wal_since(&mark, sample.wal.requests).await?;
                let mark = db.checkpoint().await?;
                let mut own = pgbench.run(&pgbench.own_sql, workload, connections, plan).await?;
                own.wal = db.settled_wal_since(&mark, own.wal.requests).await?;
                let mark = db.checkpoint().await?;
                let mut floor = pgbench.run(&pgbench.floor, workload, connections, plan).await?;
                floor.wal = db.settled_wal_since(&mark, floor.wal.requests).await?;
                rounds.push((sample, own, floor));
            }
            let row = Row::from_rounds(workload.name().to_owned(), connections, rounds)?;
            let (name, rps, tps) =
                (workload.name(), row.sample.rps(), row.floor.as_ref().map_or(0.0, |run| run.tps));
            say(format!("{name} x {connections}: {rps:.0} req/s; floor {tps:.0} TPS"));
            rows.push(row);
        }
    }
    db.checkpoint().await?;
    let bursts = scenario::bursts(&api, plan).await;
    let (sample, bursts) = binary.explain(&mut service, bursts).await?;
    let burst = format!("burst ({} same-key requests per round)", scenario::BURST);
    rows.push(Row::alone(burst, scenario::BURST, sample));

    let peak_rss = chargeonce_testkit::memory_bytes(&pid.to_string(), "VmHWM:")
        .context("the service's VmHWM")?;
    drop(service);
    Ok(Report { machine, rows, bursts, peak_rss, capture, ready })
}
