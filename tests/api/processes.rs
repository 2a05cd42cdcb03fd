//! Real processes: the `chargeonce` binary as a service and as psp-sim, each
//! started with a clean environment and killed when dropped.

use std::process::{Command, Output};

use chargeonce_testkit::{admin_url, server_address, Spawned, TestDatabase};
use serde_json::Value;

use crate::helpers::{migrated_database, through_pgbouncer};

pub const BIN: &str = env!("CARGO_BIN_EXE_chargeonce");

/// The binary with a clean environment: only what the test sets. It
/// connects to `database_url` as given, in both passes: directly for the
/// CLI tests that migrate (a migration holds a session lock, so never
/// through PgBouncer); `chargeonce_in_pass` for the rest.
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
pub const ANNOUNCING_LOG: &str =
    "warn,chargeonce::startup=info,chargeonce::processor::simulator=info";

/// A test database for the real binary, dropped with the value. `new` is
/// empty (the binary migrates it, as in production); `migrated` has the
/// schema already.
pub struct Database(TestDatabase);

impl std::ops::Deref for Database {
    type Target = TestDatabase;
    fn deref(&self) -> &TestDatabase {
        &self.0
    }
}

impl Database {
    pub async fn new() -> Self {
        Self(TestDatabase::empty().await)
    }

    pub async fn migrated() -> Self {
        Self(migrated_database().await)
    }

    /// Creates a merchant with the real CLI (through PgBouncer in the
    /// PgBouncer pass, so on a migrated database); returns its secret key.
    pub async fn create_merchant(&self) -> String {
        let mut command = chargeonce_in_pass(&self.url);
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

/// A real process (service or psp-sim), killed when dropped.
pub type Process = Spawned;

/// The binary connected the way this pass connects services: as
/// `chargeonce`, or in the PgBouncer pass (`TEST_PGBOUNCER`) as the
/// in-process services are (`helpers::test_settings`): through the run's
/// PgBouncer, with unnamed statements, no startup options and no
/// migrations (they hold a session lock), so the database must be migrated
/// already. A `database_url` on the test server is sent through PgBouncer;
/// any other address is a fault proxy, which must forward to
/// `helpers::database_address()`.
pub fn chargeonce_in_pass(database_url: &str) -> Command {
    let Some(pgbouncer) = through_pgbouncer() else {
        return chargeonce(database_url);
    };
    let mut command = if server_address(database_url) == server_address(&admin_url()) {
        chargeonce(&pgbouncer.url_for(database_url))
    } else {
        chargeonce(database_url)
    };
    command
        .env("CHARGEONCE__DATABASE__PREPARED_STATEMENTS", "false")
        .env("CHARGEONCE__DATABASE__STATEMENT_TIMEOUT_MS", "0")
        .env("CHARGEONCE__DATABASE__MIGRATE_ON_START", "false");
    command
}

/// `chargeonce serve` on a port of its choosing, ready when /readyz says so;
/// through PgBouncer in the PgBouncer pass (`chargeonce_in_pass`).
pub async fn start_service(database_url: &str, env: &[(&str, String)]) -> Process {
    let mut command = chargeonce_in_pass(database_url);
    command
        .env("CHARGEONCE__SERVER__PORT", "0")
        .env("RUST_LOG", ANNOUNCING_LOG);
    // The PgBouncer pass sends every replay to the database, as
    // `helpers::direct_settings` has the in-process services do.
    if std::env::var_os("TEST_NO_REPLAY_CACHE").is_some() {
        command.env("CHARGEONCE__IDEMPOTENCY__REPLAY_CACHE_BYTES", "0");
    }
    command.envs(env.iter().map(|(k, v)| (k, v))).arg("serve");
    Spawned::start(command, "/readyz").await
}

/// `chargeonce psp-sim` on a port of its choosing with the given options.
pub async fn start_psp_sim(options: &[&str]) -> Process {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("RUST_LOG", ANNOUNCING_LOG)
        .args(["psp-sim", "--port", "0"])
        .args(options);
    Spawned::start(command, "/healthz").await
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
