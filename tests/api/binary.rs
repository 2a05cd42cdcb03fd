//! The real `chargeonce` binary: CLI, configuration errors, migrations from
//! several processes at once, start-up and graceful shutdown on SIGTERM.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::processes::{chargeonce, run, start_service, Database};

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
