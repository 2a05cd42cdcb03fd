//! Real processes: the `chargeonce` binary as a service and as psp-sim, each
//! started with a clean environment and killed when dropped.

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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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
    async fn spawn(mut command: Command, port: u16, ready_path: &str) -> Self {
        let child = command
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("TEST_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawn chargeonce");
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

/// `chargeonce serve` on a free port, ready when /readyz says so.
pub async fn start_service(database_url: &str, env: &[(&str, String)]) -> Process {
    let port = free_port();
    let mut command = chargeonce(database_url);
    command
        .env("CHARGEONCE__SERVER__PORT", port.to_string())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("serve");
    Process::spawn(command, port, "/readyz").await
}

/// `chargeonce psp-sim` on a free port with the given options.
pub async fn start_psp_sim(options: &[&str]) -> Process {
    let port = free_port();
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("RUST_LOG", "warn")
        .args(["psp-sim", "--port", &port.to_string()])
        .args(options);
    Process::spawn(command, port, "/healthz").await
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
