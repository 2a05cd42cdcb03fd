//! The binary under test: the release `chargeonce`, run as a separate
//! process as it runs in production, never linked in.
//!
//! It is always started with a clean environment: only the database, port
//! 0 (it announces the port it bound), the simulated processor answering at
//! once, the caller's `CHARGEONCE__…` variables (so a setting can be
//! measured against the defaults) and `RUST_LOG` if the caller set one. It
//! runs from the output folder, where there is no config/ folder: the
//! embedded defaults apply, not a developer's config/local.toml. Its log
//! goes to `service.log` there, written by the service itself, so its
//! access-log lines cost the load generator nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use chargeonce_testkit::{SpawnOptions, Spawned};

use crate::say;

/// Starts of the service timed from spawn to ready.
const READY_SAMPLES: usize = 5;
/// How long a failed request waits for the service to exit, to tell a
/// stopped service from a broken connection.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// The log line that says which port the service bound must be written
/// whatever level the caller chose.
const ANNOUNCEMENT: &str = "chargeonce::startup=info";

pub struct ServiceBinary {
    path: PathBuf,
}

impl ServiceBinary {
    /// The binary given, or `chargeonce` next to this program (both are
    /// built into target/release by scripts/bench).
    pub fn find(chosen: Option<PathBuf>) -> Result<Self> {
        let path = match chosen {
            Some(path) => path,
            None => std::env::current_exe()
                .context("finding this program's path")?
                .with_file_name("chargeonce"),
        };
        if !path.is_file() {
            bail!(
                "no service binary at {}: build it with `cargo build --release --bin chargeonce` \
                 (scripts/bench does), or pass --service",
                path.display()
            );
        }
        Ok(Self { path })
    }

    /// Runs `chargeonce ARGS` to completion; returns its stdout.
    pub async fn cli(&self, database_url: &str, args: &[&str], out_dir: &Path) -> Result<String> {
        let output = tokio::process::Command::new(&self.path)
            .env_clear()
            .env("DATABASE_URL", database_url)
            .env("RUST_LOG", "warn")
            .current_dir(out_dir)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.path.display()))?;
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

    fn serve_command(&self, database_url: &str, out_dir: &Path) -> Command {
        let mut command = Command::new(&self.path);
        command
            .env_clear()
            .env("DATABASE_URL", database_url)
            .env("CHARGEONCE__SERVER__PORT", "0")
            .env("CHARGEONCE__PROCESSOR__KIND", "simulated")
            .env("CHARGEONCE__PROCESSOR__LATENCY_MS", "0")
            // The service's default level (info: a line per request) unless
            // the benchmark is given RUST_LOG.
            .envs(
                std::env::var("RUST_LOG")
                    .map(|level| ("RUST_LOG", format!("{level},{ANNOUNCEMENT}"))),
            )
            .envs(std::env::vars().filter(|(name, _)| name.starts_with("CHARGEONCE__")))
            .current_dir(out_dir)
            .arg("serve")
            .stdin(Stdio::null());
        command
    }

    /// `chargeonce serve`, ready; killed when dropped. `poll` is how often
    /// it is asked whether it is ready yet.
    async fn spawn(&self, database_url: &str, out_dir: &Path, poll: Duration) -> Spawned {
        let options = SpawnOptions {
            log_file: Some(out_dir.join("service.log")),
            poll,
        };
        Spawned::start_with(
            self.serve_command(database_url, out_dir),
            "/readyz",
            options,
        )
        .await
    }

    pub async fn start(&self, database_url: &str, out_dir: &Path) -> Spawned {
        self.spawn(database_url, out_dir, Duration::from_millis(10))
            .await
    }

    /// `error`, explained if the service is stopping: a request that fails
    /// because the service died (or was signalled by something else on the
    /// machine) should say so, not just that a connection closed. A service
    /// told to stop finishes its open requests first, so it gets a moment
    /// to exit.
    pub async fn explain(
        &self,
        service: &mut Spawned,
        error: anyhow::Error,
        out_dir: &Path,
    ) -> anyhow::Error {
        match service.wait_exit(EXIT_GRACE).await {
            Some(status) => error.context(format!(
                "the service exited during the run ({status}); see {}",
                out_dir.join("service.log").display()
            )),
            None => error,
        }
    }

    /// Spawns the service READY_SAMPLES times, one after the other, and
    /// times each from the spawn until GET /readyz answers 200 (asked every
    /// millisecond); sorted.
    pub async fn start_to_ready(&self, database_url: &str, out_dir: &Path) -> Vec<Duration> {
        let mut ready = Vec::with_capacity(READY_SAMPLES);
        for _ in 0..READY_SAMPLES {
            let spawned = Instant::now();
            let service = self
                .spawn(database_url, out_dir, Duration::from_millis(1))
                .await;
            ready.push(spawned.elapsed());
            drop(service);
        }
        ready.sort();
        let listed: Vec<String> = ready
            .iter()
            .map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
            .collect();
        say(format!("start-to-ready: {}", listed.join(", ")));
        ready
    }
}
