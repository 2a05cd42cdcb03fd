//! The real `chargeonce` binary: CLI, configuration errors, migrations from
//! several processes at once, start-up and graceful shutdown on SIGTERM.

use std::time::{Duration, Instant};

use chargeonce_testkit::{server_address, Proxy, ProxyMode, Spawned};
use sha2::{Digest, Sha256};

use crate::processes::{binary, chargeonce, run, start_service, Database};

#[tokio::test]
async fn merchant_create_prints_only_the_secret_and_stores_only_its_digest() {
    let db = Database::new().await;
    // Direct in both passes: the CLI migrates this empty database first.
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

/// How many migrations the database records as applied.
async fn applied_migrations(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT count(*) FROM refinery_schema_history", &[])
        .await
        .unwrap()
        .get(0)
}

/// The service and its database started together, the database not up
/// yet: `serve` keeps trying (`database.startup_wait_ms`), saying so in its
/// log, and migrates and serves once the database answers.
#[tokio::test]
async fn serve_waits_for_a_database_that_is_not_up_yet() {
    let db = Database::new().await;
    let proxy = Proxy::start(server_address(&db.url)).await;
    proxy.set_mode(ProxyMode::Cut);
    // Direct in both passes: it migrates.
    let mut command = binary().serve_command(&proxy.url_for(&db.url));
    command.env("CHARGEONCE__DATABASE__STARTUP_WAIT_MS", "20000");
    let starting = tokio::spawn(Spawned::start(command, "/readyz"));

    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !starting.is_finished(),
        "serve must still be waiting while the database is unreachable"
    );
    proxy.set_mode(ProxyMode::Forward);
    let service = starting.await.expect("serve became ready");

    let log = service.log().join("\n");
    assert!(
        log.contains("PostgreSQL cannot be reached yet"),
        "each failed try is logged: {log}"
    );
    let applied = applied_migrations(&db.client().await).await;
    assert_eq!(applied, chargeonce::db::latest_migration());
}

/// The wait is bounded, and only for what waiting can mend: nothing
/// listening is tried until `database.startup_wait_ms` runs out; a server
/// that answers "no such database" ends start-up at once.
#[tokio::test]
async fn start_up_waits_only_as_long_as_configured_and_only_for_what_can_change() {
    let nothing_listens = "postgres://postgres@127.0.0.1:1/none";
    let started = Instant::now();
    let mut command = chargeonce(nothing_listens);
    command
        .env("CHARGEONCE__DATABASE__STARTUP_WAIT_MS", "1500")
        .arg("migrate");
    let output = run(command).await;
    let waited = started.elapsed();
    assert!(!output.status.success());
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(15),
        "gave up after {waited:?}"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot connect to PostgreSQL"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let db = Database::new().await;
    let mut missing = url::Url::parse(&db.url).unwrap();
    missing.set_path(&format!("{}_missing", db.name));
    let started = Instant::now();
    let mut command = chargeonce(missing.as_str());
    command
        .env("CHARGEONCE__DATABASE__STARTUP_WAIT_MS", "60000")
        .arg("migrate");
    let output = run(command).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("does not exist"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "no waiting for a database that does not exist: {:?}",
        started.elapsed()
    );
}

/// A server that asks for a password the URL does not carry ends start-up
/// at once, as a wrong password does: waiting cannot mend the URL. (The
/// test's PostgreSQL trusts everyone, so a listener here answers every
/// connection as a server asking for a password would.)
#[tokio::test]
async fn a_url_without_the_password_the_server_asks_for_ends_start_up_at_once() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                // The startup message: its length, then the rest of it.
                let length = socket.read_i32().await.unwrap_or(8);
                let mut rest = vec![0; usize::try_from(length - 4).unwrap_or(0)];
                if socket.read_exact(&mut rest).await.is_ok() {
                    // AuthenticationCleartextPassword: 'R', length 8, code 3.
                    let asks = [b'R', 0, 0, 0, 8, 0, 0, 0, 3];
                    let _ = socket.write_all(&asks).await;
                    let _ = socket.read(&mut [0; 64]).await;
                }
            });
        }
    });
    let started = Instant::now();
    let mut command = chargeonce(&format!("postgres://postgres@127.0.0.1:{port}/x"));
    command
        .env("CHARGEONCE__DATABASE__STARTUP_WAIT_MS", "60000")
        .arg("migrate");
    let output = run(command).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("password missing"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "no waiting for a password the URL lacks: {:?}",
        started.elapsed()
    );
}

/// SIGTERM while start-up waits for the database ends the process at once:
/// `docker stop` or a rollout must not sit out `database.startup_wait_ms`.
#[tokio::test]
async fn sigterm_while_waiting_for_the_database_stops_at_once() {
    let mut command = chargeonce("postgres://postgres@127.0.0.1:1/none");
    command
        .env("CHARGEONCE__SERVER__PORT", "0")
        .env("CHARGEONCE__DATABASE__STARTUP_WAIT_MS", "60000")
        .arg("serve")
        .stderr(std::process::Stdio::null());
    let mut child = tokio::process::Command::from(command)
        .spawn()
        .expect("spawn");
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "still waiting for the database"
    );
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("stopped within 5 s of SIGTERM")
        .expect("wait");
    assert!(!status.success(), "{status}");
}

#[tokio::test]
async fn migrations_are_safe_when_several_instances_start_at_once() {
    let db = Database::new().await;
    let runs: Vec<_> = (0..4)
        .map(|_| {
            // Direct in both passes: a migration holds a session lock.
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
    let applied = applied_migrations(&client).await;
    assert_eq!(
        applied,
        i64::from(u32::try_from(chargeonce::db::latest_migration()).unwrap())
    );
    client
        .query("SELECT 1 FROM charges", &[])
        .await
        .expect("schema exists");
}

#[tokio::test]
async fn serve_drains_in_flight_requests_on_sigterm() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let mut server = start_service(
        &db.url,
        &[("CHARGEONCE__PROCESSOR__LATENCY_MS", "1500".to_owned())],
    )
    .await;
    let http = reqwest::Client::new();

    let in_flight = tokio::spawn({
        let request = http
            .post(format!("{}/v1/charges", server.url))
            .bearer_auth(secret)
            .header("Idempotency-Key", "drain-me")
            .header("Content-Type", "application/json")
            .body(r#"{"amount":1000,"currency":"USD"}"#);
        async move { request.send().await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    server.signal(chargeonce_testkit::Signal::SIGTERM);

    let reply = in_flight
        .await
        .unwrap()
        .expect("the in-flight request is answered");
    assert_eq!(reply.status(), 201);
    let exit = server
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the server exits after draining");
    assert!(exit.success(), "exit status {exit:?}");

    let status: String = db
        .client()
        .await
        .query_one("SELECT status FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(status, "succeeded");
    assert!(
        http.get(format!("{}/healthz", server.url))
            .send()
            .await
            .is_err(),
        "no longer listening"
    );
}
