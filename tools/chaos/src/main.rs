//! The chaos run of chargeonce (RELIABILITY.md): three instances behind fault
//! proxies to a private PostgreSQL or Citus, psp-sim and a webhook receiver
//! failing, customers; then the invariants. Exit status: 0 all hold, 1 a
//! violation, 2 the run could not be made.

mod checks;
mod faults;
mod receiver;
mod stack;
mod workload;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use chargeonce_testkit::{Chargeonce, Citus, Proxy, Server, TestDatabase};
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Mutex;
use tokio_postgres::Client;

use crate::checks::{Ledger, Snapshot};
use crate::receiver::Receiver;
use crate::stack::Instance;
use crate::workload::{lock, Shared};

const INSTANCES: usize = 3;
/// Offenders printed per invariant (all of them go to the report file).
const SHOWN: usize = 20;

/// Faults against real chargeonce processes, then the invariants.
#[derive(Debug, Parser)]
#[command(name = "chaos")]
struct Args {
    /// How long the faults run, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Concurrent customers.
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// Seconds after the faults within which everything must be final.
    #[arg(long, default_value_t = 60)]
    settle_secs: u64,
    /// Seed of psp-sim's and the receiver's fault draws (default: random).
    #[arg(long)]
    seed: Option<u64>,
    /// The service binary (default: `chargeonce` beside this program).
    #[arg(long)]
    service: Option<PathBuf>,
    /// Where logs and the report go (default: target/chaos).
    #[arg(long)]
    out: Option<PathBuf>,
    /// On a private Citus cluster, one of its two workers stopped a while.
    #[arg(long)]
    citus: bool,
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

pub fn say(message: &str) {
    let elapsed = START.get_or_init(Instant::now).elapsed();
    eprintln!("chaos [{:6.1}s] {message}", elapsed.as_secs_f64());
}

fn main() -> ExitCode {
    let args = Args::parse();
    START.get_or_init(Instant::now);
    // Ctrl-C or SIGTERM (a CI timeout): the runtime drops what it holds.
    let runtime = tokio::runtime::Runtime::new().context("a tokio runtime");
    let result = runtime.and_then(|runtime| {
        runtime.block_on(async {
            let mut terminate = signal(SignalKind::terminate())?;
            tokio::select! {
                result = run(args) => result,
                _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
                _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
            }
        })
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("chaos: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<bool> {
    let seed = args.seed.unwrap_or_else(rand::random);
    let default_out = || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/chaos");
    let out = args.out.clone().unwrap_or_else(default_out);
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let binary = match args.service.clone() {
        Some(path) => Chargeonce::new(path, &out),
        None => Chargeonce::beside_this_program(&out).map_err(anyhow::Error::msg)?,
    };
    for entry in std::fs::read_dir(&out)?.filter_map(Result::ok) {
        if entry.path().extension().is_some_and(|ext| ext == "log") {
            std::fs::remove_file(entry.path())?;
        }
    }
    say(&format!("seed {seed}; service {}; logs in {}", binary.path().display(), out.display()));

    let (mut server, mut workers) = if args.citus {
        say("starting a private Citus cluster: a coordinator and 2 workers");
        let citus = Citus::start(2).await;
        (citus.coordinator, citus.workers)
    } else {
        say("starting a private PostgreSQL server");
        (Server::start().await, Vec::new())
    };
    let database = TestDatabase::empty_on(&server.node().url("postgres")).await;
    let direct_url = database.url.clone();
    binary.run(&direct_url, &["migrate"]).await.map_err(anyhow::Error::msg)?;
    let merchants =
        stack::create_merchants(&binary, &connect(&direct_url).await?, &direct_url, &workers)
            .await?;
    let on_stopped = merchants.iter().filter(|(_, stopped)| *stopped).count();
    if args.citus {
        say(&format!("{} merchants, {on_stopped} on the worker that stops", merchants.len()));
    }

    let psp = stack::start_psp_sim(&binary, &out, seed).await?;
    let receiver = Receiver::start(seed).await?;
    let mut instances = Vec::new();
    for index in 0..INSTANCES {
        let listen = "127.0.0.1:0".parse().context("an address")?;
        let proxy =
            Proxy::start_on(listen, server.node().address(), seed.wrapping_add(index as u64)).await;
        let mut instance = Instance::new(index, proxy, &direct_url, &psp.url, &binary, &out);
        instance.start(3).await?;
        say(&format!("instance {index} on {}", instance.url()));
        instances.push(instance);
    }
    let urls: Vec<String> = instances.iter().map(Instance::url).collect();
    for (secret, _) in &merchants {
        create_endpoint(&urls[0], secret, &receiver.url).await?;
    }
    let instances: faults::Instances = Arc::new(instances.into_iter().map(Mutex::new).collect());

    let shared = Arc::new(Shared::new(&urls, &merchants)?);
    let counts = Arc::new(faults::Counts::default());
    let started = Instant::now();
    let until = started + Duration::from_secs(args.seconds);
    let clients = args.clients.max(merchants.len());
    say(&format!("{} s of faults with {clients} customers", args.seconds));
    let network = tokio::spawn(faults::network(instances.clone(), counts.clone(), until));
    let crashes = tokio::spawn(faults::crashes(instances.clone(), counts.clone(), until));
    let mut customers = tokio::task::JoinSet::new();
    for customer in 0..clients {
        customers.spawn(workload::customer(shared.clone(), customer % merchants.len(), until));
    }

    // Half-way a PostgreSQL (coordinator) restart; on Citus a worker's outage.
    tokio::time::sleep_until((started + Duration::from_secs(args.seconds / 2)).into()).await;
    say("PostgreSQL: immediate restart");
    let pg_down = server.restart_immediate().await;
    say(&format!("PostgreSQL back after {pg_down:.1?}"));
    let mut worker_down = None;
    if let Some(worker) = workers.first_mut() {
        let down = Duration::from_secs((args.seconds / 4).clamp(2, 10));
        say(&format!("other faults pause; then the worker on port {} stops", worker.node().port()));
        worker_down = Some(faults::worker_outage(worker, &counts, &shared, down).await);
        say("the worker runs again; other faults resume");
    }

    network.await.context("the network fault task")?;
    crashes.await.context("the crash task")??;
    for instance in instances.iter() {
        let instance = instance.lock().await;
        if instance.process.is_none() {
            bail!("instance {} is not running after the faults", instance.index);
        }
        instance.proxy.set_mode(chargeonce_testkit::ProxyMode::Forward);
    }
    receiver.stop_failing();
    let calm = Instant::now();
    lock(&shared.seen).calm_since = Some(calm);
    say("faults stopped; customers finish what they were doing");
    while customers.join_next().await.is_some() {}

    let bound = Duration::from_secs(args.settle_secs);
    let unfinished = shared.unfinished().len();
    say(&format!("resuming {unfinished} operations without a final answer, with their keys"));
    shared.resume_unfinished(calm + bound).await;

    // A new connection: the first ended with the restart.
    let (settled, snapshot) = settle(&connect(&direct_url).await?, &receiver, calm + bound).await?;
    let settle_time = calm.elapsed();
    let ledger = Ledger::read(&psp.url).await?;

    let seen = std::mem::take(&mut *lock(&shared.seen));
    let (records, outage) = (&seen.records, &seen.outage);
    let tally = receiver.tally();
    let mut verdicts = checks::check(&snapshot, &ledger, &tally, &seen, settled);
    if worker_down.is_some() {
        verdicts.push(checks::worker_outage(outage));
    }

    let operations = records.values().filter_map(|r| r.operation.as_ref());
    let charges = operations.clone().filter(|o| o.kind == "charge").count();
    let (bursts, refunds) = (operations.filter(|o| o.burst).count(), records.len() - charges);
    let n = |count: &std::sync::atomic::AtomicUsize| count.load(Ordering::Relaxed);
    let (races, attempts) = (seen.refund_races, seen.attempts);
    let (cuts, stalls, kills) = (n(&counts.cuts), n(&counts.stalls), n(&counts.kills));
    let (restarts, failed_starts) = (n(&counts.restarts), n(&counts.failed_starts));
    let statuses = describe(&seen.statuses);
    let (restarted, on_citus) = match args.citus {
        true => ("the Citus coordinator", format!(" on Citus, {} merchants", merchants.len())),
        false => ("PostgreSQL", String::new()),
    };
    let psp = [stack::PSP_ERROR_RATE, stack::PSP_LOST_RESPONSE_RATE, stack::PSP_TIMEOUT_RATE];
    let [errors, lost, timeouts] = psp.map(|rate| rate * 100.0);
    let (hang, psp_requests) = (stack::PSP_HANG_MS, ledger.requests());
    let (payments, psp_refunds) = (ledger.payments.len(), ledger.refunds.len());
    let (answered_500, dropped, arrived) = (tally.answered_500, tally.dropped, tally.arrived);
    let acknowledged = tally.acknowledged.len();
    let by_status = |rows: &[checks::Row]| {
        let mut counts = BTreeMap::<_, u64>::new();
        rows.iter().for_each(|row| *counts.entry(row.status.clone()).or_default() += 1);
        describe(&counts)
    };
    let (charge_statuses, refund_statuses) =
        (by_status(&snapshot.charges), by_status(&snapshot.refunds));
    let (events, deliveries) = (snapshot.events.len(), &snapshot.deliveries);
    let within = if settled { "in" } else { "NOT within" };
    let (seconds, settle_secs) = (args.seconds, args.settle_secs);
    let mut report = format!(
        "\n## chaos run{on_citus}: {seconds} s of faults, {clients} customers, seed {seed}\n\n\
         | what | |\n|---|---|\n\
         | operations               | {} logical: {charges} charges ({bursts} sent as bursts to \
           all {INSTANCES} instances at once), {refunds} refunds ({races} refund races); \
           {attempts} attempts |\n\
         | answers by status        | {statuses} |\n\
         | database faults          | {cuts} cuts, {stalls} stalls (partitions) of an instance's \
           connections; 1 immediate restart of {restarted} (down {pg_down:.1?}) |\n\
         | instance crashes         | {kills} SIGKILLs, {restarts} restarts ({failed_starts} failed \
           starts retried) |\n\
         | processor faults         | psp-sim: {errors:.0} % errors, {lost:.0} % lost responses, \
           {timeouts:.0} % timeouts ({hang} ms); {psp_requests} requests for {payments} payments \
           and {psp_refunds} refunds |\n\
         | webhook faults           | receiver: {answered_500} answered 500, {dropped} dropped, of \
           {arrived} deliveries; {acknowledged} events acknowledged |\n\
         | database at the end      | charges {charge_statuses}; refunds {refund_statuses}; \
           {events} events; deliveries {deliveries:?} |\n\
         | settled                  | {within} {settle_time:.1?} after the faults stopped (bound \
           {settle_secs} s) |\n",
        records.len()
    );
    if let Some(down) = worker_down {
        let [stopped, others] = &outage.answers;
        let (stopped, others) = (describe(stopped), describe(others));
        let served = merchants.len() - on_stopped;
        writeln!(
            report,
            "| worker outage (Citus)    | a worker stopped (immediate) for {down:.1?}, other \
             faults paused: its {on_stopped} merchants got {stopped}; the other {served} got \
             {others} |"
        )?;
    }
    writeln!(report, "\n| invariant | checked | result |\n|---|---|---|")?;
    for verdict in &verdicts {
        let count = verdict.violations.len();
        let result = if count == 0 { "ok".to_owned() } else { format!("VIOLATED ({count})") };
        writeln!(report, "| {} | {} | {result} |", verdict.name, verdict.checked)?;
    }
    let mut offenders = String::new();
    for verdict in verdicts.iter().filter(|v| !v.violations.is_empty()) {
        writeln!(offenders, "\n{}:\n  {}", verdict.name, verdict.violations.join("\n  "))?;
        for violation in verdict.violations.iter().take(SHOWN) {
            writeln!(report, "- {}: {violation}", verdict.name)?;
        }
    }
    println!("{report}");
    std::fs::write(out.join("report.md"), format!("{report}{offenders}"))?;
    let ok = verdicts.iter().all(|verdict| verdict.violations.is_empty());
    let verdict = if ok { "every invariant holds" } else { "INVARIANTS VIOLATED" };
    say(&format!("{verdict}; report in {}", out.join("report.md").display()));
    Ok(ok)
}

/// `{"201": 10, …}` as `201 ×10, …`.
fn describe<T: std::fmt::Display>(counts: &BTreeMap<String, T>) -> String {
    let counts: Vec<String> = counts.iter().map(|(status, n)| format!("{status} ×{n}")).collect();
    Some(counts.join(", ")).filter(|text| !text.is_empty()).unwrap_or_else(|| "none".to_owned())
}

async fn connect(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connecting to the run's PostgreSQL")?;
    tokio::spawn(connection);
    Ok(client)
}

/// Until nothing is pending and every event acknowledged, or `deadline`.
async fn settle(db: &Client, receiver: &Receiver, deadline: Instant) -> Result<(bool, Snapshot)> {
    loop {
        let snapshot = Snapshot::read(db).await?;
        let received = |id: &String| receiver.tally().acknowledged.contains_key(id);
        let settled = snapshot.pending() == 0
            && snapshot.undelivered.is_empty()
            && snapshot.events.iter().all(|event| received(&event.id));
        if settled || Instant::now() > deadline {
            return Ok((settled, snapshot));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn create_endpoint(base: &str, secret: &str, url: &str) -> Result<()> {
    let response = reqwest::Client::new()
        .post(format!("{base}/v1/webhook_endpoints"))
        .bearer_auth(secret)
        .header("Idempotency-Key", "chaos-webhook-endpoint")
        .json(&serde_json::json!({ "url": url }))
        .send()
        .await
        .context("creating the webhook endpoint")?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    ensure!(status.is_success(), "creating the webhook endpoint: {status} {body}");
    Ok(())
}
