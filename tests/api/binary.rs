//! The real `chargeonce` binary: CLI, configuration errors, migrations from
//! several processes at once, start-up and graceful shutdown on SIGTERM.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_postgres::NoTls;

use crate::helpers::{create_database, drop_database};

const BIN: &str = env!("CARGO_BIN_EXE_chargeonce");

/// The binary with a clean environment: only what the test sets.
fn chargeonce(database_url: &str) -> Command {
    let mut command = Command::new(BIN);
    command
        .env_clear()
        .env("DATABASE_URL", database_url)
        .env("RUST_LOG", "warn")
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    command
}

async fn run(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run chargeonce"))
        .await
        .unwrap()
}

struct Database {
    name: String,
    url: String,
}

impl Database {
    async fn new() -> Self {
        let (name, url) = create_database().await;
        Self { name, url }
    }

    async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await.unwrap();
        tokio::spawn(connection);
        client
    }
}

impl Drop for Database {
    fn drop(&mut self) {
        drop_database(&self.name);
    }
}

#[tokio::test]
async fn merchant_create_prints_only_the_secret_and_stores_only_its_digest() {
    let db = Database::new().await;
    let mut command = chargeonce(&db.url);
    command.args(["merchant", "create", "Acme Books"]);
    let output = run(command).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let secret = stdout.strip_suffix('\n').expect("one line");
    assert!(
        secret.starts_with("sk_") && secret.len() == 51,
        "stdout was {stdout:?}"
    );
    assert!(secret[3..].bytes().all(|b| b.is_ascii_hexdigit()));

    let client = db.client().await;
    let digest = Sha256::digest(secret.as_bytes()).to_vec();
    let row = client
        .query_one(
            "SELECT m.name, count(*) OVER () FROM api_keys k JOIN merchants m ON m.id = k.merchant_id \
             WHERE k.key_hash = $1",
            &[&digest],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "Acme Books");
    assert_eq!(row.get::<_, i64>(1), 1);
    let plain: i64 = client
        .query_one(
            "SELECT count(*) FROM api_keys WHERE position($1::text::bytea IN key_hash) > 0",
            &[&secret],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0, "the secret itself is never stored");
}

#[tokio::test]
async fn a_bad_configuration_value_stops_start_up_naming_the_key() {
    let cases = [
        ("CHARGEONCE__SERVER__PORT", "eighty", "server.port"),
        ("CHARGEONCE__DATABASE__POOL_SIZE", "0", "database.pool_size"),
        ("CHARGEONCE__PROCESSOR__KIND", "paypal", "processor.kind"),
        (
            "CHARGEONCE__IDEMPOTENCY__LEASE_MS",
            "-5",
            "idempotency.lease_ms",
        ),
    ];
    for (variable, value, key) in cases {
        let mut command = chargeonce("postgres://postgres@127.0.0.1:1/none");
        command.env(variable, value).arg("serve");
        let output = run(command).await;
        assert_eq!(output.status.code(), Some(2), "{variable}={value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(key),
            "{variable}={value}: stderr does not name {key}: {stderr}"
        );
    }
}

#[tokio::test]
async fn migrations_are_safe_when_several_instances_start_at_once() {
    let db = Database::new().await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let mut command = chargeonce(&db.url);
            command.arg("migrate");
            run(command)
        })
        .collect();
    for output in futures_util::future::join_all(runs).await {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let client = db.client().await;
    let applied: i64 = client
        .query_one("SELECT count(*) FROM refinery_schema_history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        applied,
        i64::from(u32::try_from(chargeonce::db::latest_migration()).unwrap())
    );
    client
        .query("SELECT 1 FROM charges", &[])
        .await
        .expect("schema exists");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn serve_drains_in_flight_requests_on_sigterm() {
    let db = Database::new().await;
    let mut create = chargeonce(&db.url);
    create.args(["merchant", "create", "Shop"]);
    let secret = String::from_utf8(run(create).await.stdout)
        .unwrap()
        .trim()
        .to_owned();

    let port = free_port();
    let mut server = chargeonce(&db.url)
        .env("CHARGEONCE__SERVER__PORT", port.to_string())
        .env("CHARGEONCE__PROCESSOR__LATENCY_MS", "1500")
        .arg("serve")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();

    let started = Instant::now();
    loop {
        if let Ok(reply) = http.get(format!("{base}/readyz")).send().await {
            if reply.status() == 200 {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never became ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let in_flight = tokio::spawn({
        let http = http.clone();
        let url = format!("{base}/v1/charges");
        async move {
            http.post(url)
                .bearer_auth(secret)
                .header("Idempotency-Key", "drain-me")
                .header("Content-Type", "application/json")
                .body(r#"{"amount":1000,"currency":"USD"}"#)
                .send()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let pid = server.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());

    let reply = in_flight
        .await
        .unwrap()
        .expect("the in-flight request is answered");
    assert_eq!(reply.status(), 201);

    let exit = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = server.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = server.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
    .expect("the server exits after draining");
    assert!(exit.success(), "exit status {exit:?}");

    let client = db.client().await;
    let status: String = client
        .query_one("SELECT status FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "succeeded");
    assert!(
        http.get(format!("{base}/healthz")).send().await.is_err(),
        "no longer listening"
    );
}
