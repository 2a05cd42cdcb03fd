//! The processes: `chargeonce` as service instances, each through its own
//! fault proxy, and as `psp-sim`; each killed when its [`Spawned`] drops.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use chargeonce_testkit::{Chargeonce, Proxy, Server, SpawnOptions, Spawned};

/// psp-sim's fault rates: 22 % of calls.
pub const PSP_ERROR_RATE: f64 = 0.10;
pub const PSP_LOST_RESPONSE_RATE: f64 = 0.06;
pub const PSP_TIMEOUT_RATE: f64 = 0.06;
/// Past `processor.timeout_ms`.
pub const PSP_HANG_MS: u64 = 3000;

/// Settings so that whatever a fault leaves pending settles within seconds.
pub const SERVICE_SETTINGS: &[(&str, &str)] = &[
    ("CHARGEONCE__PROCESSOR__KIND", "http"),
    ("CHARGEONCE__PROCESSOR__TIMEOUT_MS", "1000"),
    ("CHARGEONCE__PROCESSOR__RETRIES", "1"),
    ("CHARGEONCE__IDEMPOTENCY__LEASE_MS", "5000"),
    ("CHARGEONCE__RECOVERY__INTERVAL_MS", "250"),
    ("CHARGEONCE__RECOVERY__MAX_BACKOFF_MS", "2000"),
    ("CHARGEONCE__WEBHOOKS__INTERVAL_MS", "200"),
    ("CHARGEONCE__WEBHOOKS__TIMEOUT_MS", "2000"),
    ("CHARGEONCE__WEBHOOKS__BACKOFF_BASE_MS", "250"),
    ("CHARGEONCE__WEBHOOKS__MAX_BACKOFF_MS", "2000"),
    ("CHARGEONCE__WEBHOOKS__MAX_ATTEMPTS", "100"),
    ("CHARGEONCE__DATABASE__POOL_SIZE", "8"),
    ("CHARGEONCE__DEMO__ENABLED", "false"),
];

pub async fn spawn(command: Command, ready: &'static str, log: PathBuf) -> Result<Spawned> {
    let options = SpawnOptions { log_file: Some(log), poll: Duration::from_millis(20) };
    let spawned = Spawned::try_start_with(command, ready, options).await;
    spawned.map_err(|e| anyhow::anyhow!("the process did not start: {e}"))
}

pub async fn start_psp_sim(binary: &Chargeonce, dir: &Path, seed: u64) -> Result<Spawned> {
    let args = format!(
        "--error-rate {PSP_ERROR_RATE} --lost-response-rate {PSP_LOST_RESPONSE_RATE} \
         --timeout-rate {PSP_TIMEOUT_RATE} --hang-ms {PSP_HANG_MS} --seed {seed}"
    );
    let command = binary.psp_sim_command(&args.split_whitespace().collect::<Vec<_>>());
    spawn(command, "/healthz", dir.join("psp-sim.log")).await
}

/// The Citus worker port of merchant `$1`'s shards.
const WORKER_OF: &str = "SELECT n.nodeport FROM merchants m \
    JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('charges', m.id) \
    JOIN pg_dist_node n ON n.groupid = p.groupid WHERE m.name = $1";

/// Each merchant's secret and whether its shards are on the worker that
/// stops: one, or on Citus until each worker has two.
pub async fn create_merchants(
    binary: &Chargeonce,
    db: &tokio_postgres::Client,
    url: &str,
    workers: &[Server],
) -> Result<Vec<(String, bool)>> {
    let mut merchants = Vec::new();
    let mut per_worker = vec![0; workers.len()];
    while merchants.is_empty() || per_worker.iter().any(|&count| count < 2) {
        if merchants.len() == 40 {
            bail!("40 merchants, and still not two on every worker: {per_worker:?}");
        }
        let name = format!("Chaos {}", merchants.len());
        let secret = binary.run(url, &["merchant", "create", &name]).await;
        let secret = secret.map_err(anyhow::Error::msg)?;
        let mut worker = None;
        if !workers.is_empty() {
            let port: i32 = db.query_one(WORKER_OF, &[&name]).await?.get(0);
            worker = workers.iter().position(|w| i32::from(w.node().port()) == port);
            per_worker[worker.context("a merchant on no worker")?] += 1;
        }
        merchants.push((secret, worker == Some(0)));
    }
    Ok(merchants)
}

/// One service instance; its port is kept across restarts.
pub struct Instance {
    pub index: usize,
    pub port: u16,
    pub proxy: Proxy,
    pub process: Option<Spawned>,
    database_url: String,
    psp_url: String,
    binary: Chargeonce,
    dir: PathBuf,
}

impl Instance {
    pub fn new(
        index: usize,
        proxy: Proxy,
        database_url: &str,
        psp_url: &str,
        binary: &Chargeonce,
        dir: &Path,
    ) -> Self {
        Self {
            index,
            port: chargeonce_testkit::free_port(),
            database_url: proxy.url_for(database_url),
            proxy,
            process: None,
            psp_url: psp_url.to_owned(),
            binary: binary.clone(),
            dir: dir.to_owned(),
        }
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn command(&self) -> Command {
        let mut command = self.binary.serve_command(&self.database_url);
        command
            .env("CHARGEONCE__SERVER__PORT", self.port.to_string())
            .env("CHARGEONCE__PROCESSOR__URL", &self.psp_url)
            .envs(SERVICE_SETTINGS.iter().copied());
        command
    }

    /// Up to `tries` starts (PostgreSQL may be restarting); how many failed.
    pub async fn start(&mut self, tries: usize) -> Result<usize> {
        let log = self.dir.join(format!("instance-{}.log", self.index));
        let mut failed = 0;
        loop {
            match spawn(self.command(), "/readyz", log.clone()).await {
                Ok(process) => {
                    self.process = Some(process);
                    return Ok(failed);
                }
                Err(error) if failed + 1 >= tries => {
                    let (index, log) = (self.index, log.display());
                    let context =
                        format!("instance {index} did not start {tries} times; its log: {log}");
                    return Err(error.context(context));
                }
                Err(_) => failed += 1,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    pub fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            process.signal(chargeonce_testkit::Signal::SIGKILL);
        }
    }
}
