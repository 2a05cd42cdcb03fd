//! The binary under test: the release `chargeonce` as a separate process,
//! from the output folder (no config/ there: the embedded defaults), with
//! the simulated processor answering at once, the caller's `CHARGEONCE__…`
//! variables and `RUST_LOG`. It writes its own log to `service.log`, so its
//! access log costs the load generator nothing.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use chargeonce_testkit::{Chargeonce, SpawnOptions, Spawned};

use crate::say;

/// Starts of the service timed from spawn to ready.
const READY_SAMPLES: usize = 5;
/// How long a failed request waits for the service to exit, to tell a
/// stopped service from a broken connection.
const EXIT_GRACE: Duration = Duration::from_secs(5);

pub struct ServiceBinary {
    binary: Chargeonce,
    out_dir: PathBuf,
}

impl ServiceBinary {
    /// The binary given, or `chargeonce` beside this program (built first
    /// when run by cargo), run from `out_dir`.
    pub fn find(chosen: Option<PathBuf>, out_dir: &Path) -> Result<Self> {
        let binary = match chosen {
            Some(path) => Chargeonce::new(path, out_dir),
            None => Chargeonce::beside_this_program(out_dir).map_err(anyhow::Error::msg)?,
        };
        Ok(Self { binary, out_dir: out_dir.to_owned() })
    }

    /// Runs `chargeonce ARGS` to completion; returns its stdout.
    pub async fn cli(&self, database_url: &str, args: &[&str]) -> Result<String> {
        self.binary.run(database_url, args).await.map_err(anyhow::Error::msg)
    }

    /// `chargeonce serve`, ready; killed when dropped. `poll` is how often
    /// it is asked whether it is ready yet.
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

    /// `result`, its error explained if the service is stopping: a request
    /// that fails because the service died (or was signalled by something
    /// else on the machine) should say so, not just that a connection
    /// closed. A service told to stop finishes its open requests first, so
    /// it gets a moment to exit.
    pub async fn explain<T>(&self, service: &mut Spawned, result: Result<T>) -> Result<T> {
        let Err(error) = result else { return result };
        Err(match service.wait_exit(EXIT_GRACE).await {
            Some(status) => error.context(format!(
                "the service exited during the run ({status}); see {}",
                self.out_dir.join("service.log").display()
            )),
            None => error,
        })
    }

    /// Spawns the service READY_SAMPLES times, one after the other, and
    /// times each from the spawn until GET /readyz answers 200 (asked every
    /// millisecond); sorted.
    pub async fn start_to_ready(&self, database_url: &str) -> Vec<Duration> {
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
