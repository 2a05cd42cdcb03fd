//! Real processes: the `chargeonce` binary as a service and as psp-sim,
//! started through the test kit's one helper (`chargeonce_testkit::Chargeonce`:
//! a clean environment) and killed when dropped.

use std::process::{Command, Output};

use chargeonce_testkit::{admin_url, server_address, Chargeonce, Spawned, TestDatabase};
use serde_json::Value;

use crate::helpers::{migrated_database, through_pgbouncer};

/// The binary this test build made, run from the repository root.
pub fn binary() -> Chargeonce {
    Chargeonce::new(env!("CARGO_BIN_EXE_chargeonce"), env!("CARGO_MANIFEST_DIR"))
}

/// The binary with a clean environment: only what the test sets. It
/// connects to `database_url` as given, in both passes: directly for the
/// CLI tests that migrate (a migration holds a session lock, so never
/// through PgBouncer); `chargeonce_in_pass` for the rest.
pub fn chargeonce(database_url: &str) -> Command {
    binary().command(database_url)
}

pub async fn run(command: Command) -> Output {
    chargeonce_testkit::chargeonce::output(command)
        .await
        .expect("run chargeonce")
}

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

/// The database URL and settings of the binary as this pass connects
/// services: as given, or in the PgBouncer pass (`TEST_PGBOUNCER`) as the
/// in-process services are (`helpers::test_settings`): through the run's
/// PgBouncer, with unnamed statements, no startup options and no
/// migrations (they hold a session lock), so the database must be migrated
/// already. A `database_url` on the test server is sent through PgBouncer;
/// any other address is a fault proxy, which must forward to
/// `helpers::database_address()`.
fn in_pass(database_url: &str) -> (String, &'static [(&'static str, &'static str)]) {
    let Some(pgbouncer) = through_pgbouncer() else {
        return (database_url.to_owned(), &[]);
    };
    let url = if server_address(database_url) == server_address(&admin_url()) {
        pgbouncer.url_for(database_url)
    } else {
        database_url.to_owned()
    };
    let settings = &[
        ("CHARGEONCE__DATABASE__PREPARED_STATEMENTS", "false"),
        ("CHARGEONCE__DATABASE__STATEMENT_TIMEOUT_MS", "0"),
        ("CHARGEONCE__DATABASE__MIGRATE_ON_START", "false"),
    ];
    (url, settings)
}

/// The binary connected the way this pass connects services (`in_pass`).
pub fn chargeonce_in_pass(database_url: &str) -> Command {
    let (url, settings) = in_pass(database_url);
    let mut command = chargeonce(&url);
    command.envs(settings.iter().copied());
    command
}

/// `chargeonce serve` on a port of its choosing, ready when /readyz says so;
/// through PgBouncer in the PgBouncer pass (`in_pass`).
pub async fn start_service(database_url: &str, env: &[(&str, String)]) -> Process {
    let (url, settings) = in_pass(database_url);
    let mut command = binary().serve_command(&url);
    command.envs(settings.iter().copied());
    // The PgBouncer pass sends every replay to the database, as
    // `helpers::direct_settings` has the in-process services do.
    if std::env::var_os("TEST_NO_REPLAY_CACHE").is_some() {
        command.env("CHARGEONCE__IDEMPOTENCY__REPLAY_CACHE_BYTES", "0");
    }
    command.envs(env.iter().map(|(k, v)| (k, v)));
    Spawned::start(command, "/readyz").await
}

/// `chargeonce psp-sim` on a port of its choosing with the given options.
pub async fn start_psp_sim(options: &[&str]) -> Process {
    binary().psp_sim(options).await
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
