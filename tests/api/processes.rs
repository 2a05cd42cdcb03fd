//! Real processes: the `chargeonce` binary as a service and as psp-sim, each
//! started with a clean environment and killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_postgres::NoTls;

use crate::helpers::{create_database, drop_database};

pub const BIN: &str = env!("CARGO_BIN_EXE_chargeonce");

/// The binary with a clean environment: only what the test sets.
pub fn chargeonce(database_url: &str) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    command
}

pub async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run chargeonce"))
        .await
        .unwrap()
}

/// The log level of spawned services: warnings, plus the line that
/// announces the port (`chargeonce listening` / `psp-sim listening`).
const ANNOUNCING_LOG: &str = "warn,chargeonce::startup=info,chargeonce::processor::simulator=info";

/// The port in a `… listening … port=N` log line.
fn announced_port(line: &str) -> Option<u16> {
    if !line.contains(" listening") {
        return None;
    }
    line.split_whitespace()
        .find_map(|field| field.strip_prefix("port="))
        .and_then(|port| port.parse().ok())
        .filter(|&port| port != 0)
}

/// A test database, dropped with the value.
pub struct Database {
    pub name: String,
    pub url: String,
}

impl Database {
    pub async fn new() -> Self {
        let (name, url) = create_database().await;
        Self { name, url }
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }

    /// Creates a merchant with the real CLI; returns its secret key.
    pub async fn create_merchant(&self) -> String {
        let mut command = chargeonce(&self.url);
        command.args(["merchant", "create", "Test merchant"]);
        let output = run(command).await;
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        drop_database(&self.name);
    }
}

/// A child process that is killed when dropped.
pub struct Process {
    pub child: Child,
    pub url: String,
}

impl Process {
    /// Starts `command`, which listens on port 0, learns the port the
    /// process bound from its log, and waits until `ready_path` answers 200.
    /// (Picking a free port first and passing it on raced with the other
    /// tests: another process could take the port in between, and the test
    /// then talked to someone else's service.)
    async fn spawn(mut command: Command, ready_path: &str) -> Self {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn chargeonce");
        let stderr = child.stderr.take().expect("piped stderr");
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        // Reads stderr to the end (so the pipe never fills), passing it on
        // with TEST_LOG set.
        std::thread::spawn(move || {
            let show = std::env::var_os("TEST_LOG").is_some();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if show {
                    eprintln!("{line}");
                }
                if let Some(port) = announced_port(&line) {
                    let _ = port_tx.send(port);
                }
            }
        });
        let started = Instant::now();
        let port = loop {
            if let Ok(port) = port_rx.try_recv() {
                break port;
            }
            if let Some(status) = child.try_wait().unwrap() {
                panic!("chargeonce exited before listening: {status} (TEST_LOG=1 shows why)");
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "chargeonce never said which port it listens on"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let process = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        process.wait_ready(ready_path).await;
        process
    }

    async fn wait_ready(&self, path: &str) {
        let started = Instant::now();
        let url = format!("{}{path}", self.url);
        loop {
            if let Ok(reply) = reqwest::get(&url).await {
                if reply.status() == 200 {
                    return;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(15),
                "{url} never became ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the process to exit by itself.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if started.elapsed() > limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `chargeonce serve` on a port of its choosing, ready when /readyz says so.
pub async fn start_service(database_url: &str, env: &[(&str, String)]) -> Process {
    let mut command = chargeonce(database_url);
    command
        .env("CHARGEONCE__SERVER__PORT", "0")
        .env("RUST_LOG", ANNOUNCING_LOG)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("serve");
    Process::spawn(command, "/readyz").await
}

/// `chargeonce psp-sim` on a port of its choosing with the given options.
pub async fn start_psp_sim(options: &[&str]) -> Process {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("RUST_LOG", ANNOUNCING_LOG)
        .args(["psp-sim", "--port", "0"])
        .args(options);
    Process::spawn(command, "/healthz").await
}

/// Every payment psp-sim recorded.
pub async fn psp_payments(psp: &Process) -> Vec<Value> {
    let list: Value = reqwest::get(format!("{}/v1/payments", psp.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    list["data"].as_array().unwrap().clone()
}

/// Settings (as environment) for a service that uses psp-sim with short
/// timeouts and leases, so takeovers happen within a test's patience.
pub fn http_processor_env(psp: &Process) -> Vec<(&'static str, String)> {
    vec![
        ("CHARGEONCE__PROCESSOR__KIND", "http".to_owned()),
        ("CHARGEONCE__PROCESSOR__URL", psp.url.clone()),
        ("CHARGEONCE__PROCESSOR__TIMEOUT_MS", "300".to_owned()),
        ("CHARGEONCE__PROCESSOR__RETRIES", "1".to_owned()),
        ("CHARGEONCE__IDEMPOTENCY__LEASE_MS", "1000".to_owned()),
    ]
}
