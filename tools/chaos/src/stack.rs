//! What the run starts: the real `chargeonce` binary as three service
//! instances, each reaching PostgreSQL through a fault proxy of its own, and
//! as `psp-sim` with its faults on. Every process is a child of this one,
//! killed when its [`Spawned`] is dropped; nothing outside is touched.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use chargeonce_testkit::{Proxy, SpawnOptions, Spawned};

/// The log lines that announce the ports must be written.
const ANNOUNCING_LOG: &str = "warn,chargeonce::startup=info,chargeonce::processor::simulator=info";

/// psp-sim's fault rates: together 22 % of processor calls.
pub const PSP_ERROR_RATE: f64 = 0.10;
pub const PSP_LOST_RESPONSE_RATE: f64 = 0.06;
pub const PSP_TIMEOUT_RATE: f64 = 0.06;
/// How long a "timeout" answer hangs: past `processor.timeout_ms`.
pub const PSP_HANG_MS: u64 = 3000;

/// The service's settings for the run (environment variables), chosen so
/// that whatever a fault leaves pending settles within seconds: short
/// processor timeouts and lease, a fast recovery worker, webhook retries
/// every few hundred milliseconds instead of minutes.
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

/// The release binary: the one given, or `chargeonce` next to this program,
/// built first when the run was started by cargo (`cargo run`), so it is
/// always the binary of the sources at hand.
pub fn service_binary(chosen: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(path) = chosen {
        return Ok(path);
    }
    let path = std::env::current_exe()
        .context("finding this program's path")?
        .with_file_name("chargeonce");
    if let Some(cargo) = std::env::var_os("CARGO") {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let release = path
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|dir| dir == "release");
        let mut build = Command::new(cargo);
        build
            .current_dir(&workspace)
            .args(["build", "--bin", "chargeonce"]);
        // What `cargo run` set for this program is not the environment of a
        // build: build scripts that watch CARGO_MANIFEST_DIR (ring's) would
        // see it change and rebuild, here and again in the next plain build.
        for (name, _) in std::env::vars_os() {
            let set_by_cargo_run = name.to_str().is_some_and(|name| {
                [
                    "CARGO_PKG_",
                    "CARGO_MANIFEST_",
                    "CARGO_CRATE_",
                    "CARGO_BIN_",
                ]
                .iter()
                .any(|prefix| name.starts_with(prefix))
                    || name == "CARGO_PRIMARY_PACKAGE"
                    || name == "OUT_DIR"
            });
            if set_by_cargo_run {
                build.env_remove(&name);
            }
        }
        if release {
            build.arg("--release");
        }
        crate::say(&format!("building the service: {build:?}"));
        let status = build.status().context("running cargo build")?;
        if !status.success() {
            bail!("building the service binary failed ({status})");
        }
    }
    if !path.is_file() {
        bail!(
            "no service binary at {}: build it with `cargo build --release --bin chargeonce`, \
             or pass --service",
            path.display()
        );
    }
    Ok(path)
}

/// `chargeonce ARGS` with a clean environment, run to its end: its stdout.
pub async fn cli(binary: &Path, database_url: &str, args: &[&str], dir: &Path) -> Result<String> {
    let output = tokio::process::Command::new(binary)
        .env_clear()
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {}", binary.display()))?;
    if !output.status.success() {
        bail!(
            "`chargeonce {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Starts a process, waiting for `ready`; a start that fails is an error,
/// so the caller can try again.
pub async fn spawn(command: Command, ready: &'static str, log: PathBuf) -> Result<Spawned> {
    let options = SpawnOptions {
        log_file: Some(log),
        poll: Duration::from_millis(20),
    };
    Spawned::try_start_with(command, ready, options)
        .await
        .map_err(|e| anyhow::anyhow!("the process did not start: {e}"))
}

pub async fn start_psp_sim(binary: &Path, dir: &Path, seed: u64) -> Result<Spawned> {
    let mut command = Command::new(binary);
    command
        .env_clear()
        .env("RUST_LOG", ANNOUNCING_LOG)
        .current_dir(dir)
        .args(["psp-sim", "--port", "0"])
        .args(["--error-rate", &PSP_ERROR_RATE.to_string()])
        .args(["--lost-response-rate", &PSP_LOST_RESPONSE_RATE.to_string()])
        .args(["--timeout-rate", &PSP_TIMEOUT_RATE.to_string()])
        .args(["--hang-ms", &PSP_HANG_MS.to_string()])
        .args(["--seed", &seed.to_string()]);
    spawn(command, "/healthz", dir.join("psp-sim.log")).await
}

/// One service instance: its fixed HTTP port (kept across restarts, so the
/// clients keep their addresses), its proxy to PostgreSQL, the process
/// while it runs.
pub struct Instance {
    pub index: usize,
    pub port: u16,
    pub proxy: Proxy,
    pub process: Option<Spawned>,
    database_url: String,
    psp_url: String,
    binary: PathBuf,
    dir: PathBuf,
}

impl Instance {
    pub fn new(
        index: usize,
        proxy: Proxy,
        database_url: &str,
        psp_url: &str,
        binary: &Path,
        dir: &Path,
    ) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .context("finding a free port")?
            .port();
        Ok(Self {
            index,
            port,
            database_url: proxy.url_for(database_url),
            proxy,
            process: None,
            psp_url: psp_url.to_owned(),
            binary: binary.to_owned(),
            dir: dir.to_owned(),
        })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.binary);
        command
            .env_clear()
            .env("DATABASE_URL", &self.database_url)
            .env("RUST_LOG", ANNOUNCING_LOG)
            .env("CHARGEONCE__SERVER__PORT", self.port.to_string())
            .env("CHARGEONCE__PROCESSOR__URL", &self.psp_url)
            .envs(SERVICE_SETTINGS.iter().copied())
            .current_dir(&self.dir)
            .arg("serve");
        command
    }

    /// Starts the process and waits until `/readyz` answers 200; up to
    /// `tries` times (a start can fail while PostgreSQL restarts). Returns
    /// how many starts failed.
    pub async fn start(&mut self, tries: usize) -> Result<usize> {
        let log = self.dir.join(format!("instance-{}.log", self.index));
        let mut failed = 0;
        loop {
            match spawn(self.command(), "/readyz", log.clone()).await {
                Ok(process) => {
                    self.process = Some(process);
                    return Ok(failed);
                }
                Err(error) => {
                    failed += 1;
                    if failed >= tries {
                        return Err(error.context(format!(
                            "instance {} did not start {tries} times; its log: {}",
                            self.index,
                            log.display()
                        )));
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// SIGKILL, then reaps the process.
    pub fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            process.signal(chargeonce_testkit::Signal::SIGKILL);
            // Dropping reaps it.
            drop(process);
        }
    }
}
