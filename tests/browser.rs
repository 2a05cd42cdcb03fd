//! The browser side: `web/chargeonce.js` and the demo checkout page, in Node
//! and in headless Chromium, against the real `chargeonce serve` binary and
//! a database of its own.
//!
//! The tests themselves are Node scripts in web/tests/ (playwright-core drives
//! Debian's Chromium; no browser download). This file provides what they need
//! and fails, never skips, when something is missing: Chromium
//! (`apt-get install -y chromium`), Node.js, or web/node_modules (installed
//! here with `npm ci` from the committed lock file if absent).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use chargeonce::config::Settings;
use chargeonce_testkit::{Chargeonce, Spawned, TestDatabase};

/// Where Chromium is: `CHROMIUM_PATH`, else Debian's package.
fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM_PATH")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// A simulated processor this slow keeps a charge in flight long enough to
/// double-click and to reload the page in the middle of it.
const PROCESSOR_LATENCY_MS: &str = "1500";

/// Bound on one Node run: the browser cases take about 15 s.
const NODE_LIMIT: Duration = Duration::from_secs(120);

fn web_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("web")
}

fn require_node() {
    let found = Command::new("node").arg("--version").output();
    match found {
        Ok(output) if output.status.success() => {}
        _ => panic!(
            "Node.js (20 or newer) is needed for the browser tests and was not found: \
             apt-get install -y nodejs npm"
        ),
    }
}

fn require_chromium() -> PathBuf {
    let path = chromium();
    assert!(
        path.exists(),
        "Chromium is needed for the browser tests and {} does not exist: \
         apt-get install -y chromium (or set CHROMIUM_PATH)",
        path.display()
    );
    path
}

/// Installs web/node_modules from the lock file unless it is there already.
fn require_node_modules() {
    let modules = web_dir().join("node_modules");
    let installed = ["playwright-core", "pg"]
        .iter()
        .all(|name| modules.join(name).join("package.json").exists());
    if installed {
        return;
    }
    eprintln!("web/node_modules is missing: running npm ci in web/");
    let output = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(web_dir())
        .output()
        .unwrap_or_else(|e| panic!("cannot run npm (install Node.js and npm): {e}"));
    assert!(
        output.status.success(),
        "npm ci in web/ failed:\n{}",
        text(&output)
    );
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs the Node test files (paths relative to web/) with `env`, bounded by
/// `NODE_LIMIT`, and fails with their whole report if any test failed.
async fn node_test(files: &[&str], env: &[(&str, String)]) {
    let mut command = tokio::process::Command::new("node");
    command
        .args(["--test", "--test-reporter=spec"])
        .args(files)
        .current_dir(web_dir())
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let started = Instant::now();
    let output = tokio::time::timeout(NODE_LIMIT, command.output())
        .await
        .unwrap_or_else(|_| panic!("node --test {files:?} took longer than {NODE_LIMIT:?}"))
        .unwrap_or_else(|e| panic!("cannot run node: {e}"));
    let report = text(&output);
    assert!(
        output.status.success(),
        "node --test {files:?} failed:\n{report}"
    );
    eprintln!("{report}node --test {files:?}: {:?}", started.elapsed());
}

/// A database with the schema, as tests/api's `migrated_database` makes it.
async fn migrated_database() -> TestDatabase {
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    TestDatabase::migrated(&migrations, |url| async move {
        let mut settings = Settings::load_from(Path::new("/nonexistent"), &HashMap::new())
            .map_err(|e| e.to_string())?;
        settings.database.url = url.into();
        chargeonce::db::migrate(&settings.database)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await
}

/// `chargeonce serve` with the demo on, a slow simulated processor, and a
/// port of its choosing (announced in its log, as tests/api's
/// `start_service` does).
async fn start_service(database_url: &str) -> Spawned {
    Chargeonce::new(env!("CARGO_BIN_EXE_chargeonce"), env!("CARGO_MANIFEST_DIR"))
        .serve(
            database_url,
            &[
                ("CHARGEONCE__DEMO__ENABLED", "true"),
                ("CHARGEONCE__PROCESSOR__LATENCY_MS", PROCESSOR_LATENCY_MS),
            ],
        )
        .await
}

/// The module's own rules (retries, backoff, storage, expiry) in Node, with
/// a fake fetch and storage: no browser, no service.
#[tokio::test]
async fn browser_module_rules_in_node() {
    require_node();
    node_test(&["tests/chargeonce.test.mjs"], &[]).await;
}

/// The demo checkout page in headless Chromium against the real binary:
/// a double click, a reload mid-payment, a second payment, a decline, an
/// expired stored payment; each checked on the page and in the database.
#[tokio::test]
async fn checkout_page_in_headless_chromium() {
    let chromium = require_chromium();
    require_node();
    require_node_modules();
    let database = migrated_database().await;
    let service = start_service(&database.url).await;
    node_test(
        &["tests/checkout.test.mjs"],
        &[
            ("CHARGEONCE_URL", service.url.clone()),
            ("DATABASE_URL", database.url.clone()),
            ("CHROMIUM_PATH", chromium.display().to_string()),
        ],
    )
    .await;
}
