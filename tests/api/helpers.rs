//! The test harness: every test gets its own PostgreSQL database, a real
//! `Application` on a free port, a merchant with an API key, and typed helpers
//! for the requests of the API contract (docs/api.md, `GET /openapi.json`).
//! The database is dropped when the `TestApp` is.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chargeonce::config::{ProcessorKind, Settings};
use chargeonce::db::Database;
use chargeonce::processor::{PaymentProcessor, SimulatedProcessor};
use chargeonce::startup::Application;
use chargeonce_testkit::{PgBouncer, TestDatabase};
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;

/// A database of its own for a test, with the schema, cloned from the
/// migrated template (the test kit migrates it once per run).
pub async fn migrated_database() -> TestDatabase {
    let migrations = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    TestDatabase::migrated(&migrations, |url| async move {
        chargeonce::db::migrate(&direct_settings(&url).database)
            .await
            .map(|_| ())
            .map_err(|e| chargeonce::telemetry::error_chain(&e))
    })
    .await
}

/// With `TEST_PGBOUNCER` set, the suite runs the way many deployments run
/// the service: through a PgBouncer in transaction pooling mode (one for the
/// whole run), with unnamed statements and no startup options. Migrations
/// go to PostgreSQL directly (the template), as they must: they hold a
/// session lock.
pub fn through_pgbouncer() -> Option<&'static PgBouncer> {
    static PGBOUNCER: std::sync::OnceLock<PgBouncer> = std::sync::OnceLock::new();
    std::env::var_os("TEST_PGBOUNCER")?;
    Some(PGBOUNCER.get_or_init(|| {
        let admin = chargeonce_testkit::admin_url();
        let config: tokio_postgres::Config = admin.parse().expect("TEST_DATABASE_URL");
        PgBouncer::start(&admin, config.get_user().unwrap_or("postgres"))
    }))
}

/// Where the service's database connections go: PgBouncer in the PgBouncer
/// pass, else PostgreSQL. A fault proxy between a service and its database
/// forwards here, so the service behind it runs through PgBouncer too.
pub fn database_address() -> std::net::SocketAddr {
    match through_pgbouncer() {
        Some(pgbouncer) => pgbouncer.address(),
        None => chargeonce_testkit::server_address(&chargeonce_testkit::admin_url()),
    }
}

/// Settings for a test: embedded defaults, this database, a free port.
pub fn test_settings(database_url: &str) -> Settings {
    let mut settings = direct_settings(database_url);
    if let Some(pgbouncer) = through_pgbouncer() {
        settings.database.url = pgbouncer.url_for(database_url).into();
        settings.database.prepared_statements = false;
        settings.database.statement_timeout = Duration::ZERO;
        settings.database.migrate_on_start = false;
    }
    settings
}

/// Settings for a test that talk to PostgreSQL itself.
pub fn direct_settings(database_url: &str) -> Settings {
    let mut settings =
        Settings::load_from(Path::new("/nonexistent"), &HashMap::new()).expect("default settings");
    settings.database.url = database_url.into();
    settings.server.host = "127.0.0.1".to_owned();
    settings.server.port = 0;
    settings.server.workers = 2;
    // No demo merchant in the way of tests that count merchants; the demo's
    // own tests (demo.rs) turn it on.
    settings.demo.enabled = false;
    // The PgBouncer pass of `scripts/dev test` also sends every replay to
    // the database, so the suite covers both ways a replay is answered.
    if std::env::var_os("TEST_NO_REPLAY_CACHE").is_some() {
        settings.idempotency.replay_cache_bytes = 0;
    }
    settings
}

/// The replay cache's default size, for tests that rely on it being on.
pub const REPLAY_CACHE_BYTES: u64 = 32 << 20;

pub struct TestApp {
    pub address: String,
    /// Dropped (with the database) when the app is.
    database: TestDatabase,
    /// The service's own pool, for calling `chargeonce::db` directly.
    pub db: Database,
    pub api_key: String,
    pub processor: Arc<SimulatedProcessor>,
    pub http: reqwest::Client,
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Asserts a problem+json answer with this status and code.
    pub fn assert_problem(&self, status: u16, code: &str) -> Value {
        assert_eq!(self.status.as_u16(), status, "body: {}", self.body);
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "{}",
            self.body
        );
        let problem = self.json();
        assert_eq!(problem["code"], code, "{problem}");
        assert_eq!(problem["status"], status, "{problem}");
        for member in ["type", "title", "detail"] {
            assert!(problem[member].is_string(), "{member} missing: {problem}");
        }
        problem
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts the real application with settings adjusted by `adjust`.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Settings)) -> TestApp {
    let database = migrated_database().await;
    let mut settings = test_settings(&database.url);
    adjust(&mut settings);
    // The simulated processor is built here so tests can count its calls;
    // other kinds come from the settings as in production.
    let processor = Arc::new(SimulatedProcessor::new(settings.processor.latency));
    let chosen: Arc<dyn PaymentProcessor> = match settings.processor.kind {
        ProcessorKind::Simulated => processor.clone(),
        _ => chargeonce::processor::from_settings(&settings.processor).expect("processor"),
    };
    let app = Application::build_with_processor(&settings, chosen)
        .await
        .expect("build application");
    let address = format!("http://127.0.0.1:{}", app.port());
    let db = app.database().clone();
    tokio::spawn(app.run_until_stopped());
    let mut test_app = TestApp {
        address,
        database,
        db,
        api_key: String::new(),
        processor,
        http: reqwest::Client::new(),
    };
    test_app.api_key = test_app.create_merchant("Test merchant").await;
    test_app
}

/// The constraint a statement broke: the error's own field, or, when a
/// Citus worker raised it (the coordinator passes on the message only),
/// the name in its message without the shard's suffix
/// (`charges_refunds_within_amount_102008` is `charges_refunds_within_amount`).
pub fn broken_constraint(error: &tokio_postgres::Error) -> Option<String> {
    let db_error = error.as_db_error()?;
    if let Some(name) = db_error.constraint() {
        return Some(name.to_owned());
    }
    let (_, rest) = db_error.message().split_once(" constraint \"")?;
    let (name, _) = rest.split_once('"')?;
    let unsuffixed = name
        .rsplit_once('_')
        .filter(|(_, shard)| !shard.is_empty() && shard.bytes().all(|b| b.is_ascii_digit()))
        .map_or(name, |(base, _)| base);
    Some(unsuffixed.to_owned())
}

/// Whether the test must stop here because it runs on Citus (the Citus
/// pass) and checks what only plain PostgreSQL has: says so, with
/// `reason`, so the skip is never silent. docs/scaling.md lists each.
pub async fn skipped_on_citus(test: &str, reason: &str) -> bool {
    let citus = chargeonce_testkit::on_citus().await;
    if citus {
        eprintln!("{test}: skipped on Citus: {reason}");
    }
    citus
}

pub fn charge_body(amount: i64) -> String {
    format!(r#"{{"amount":{amount},"currency":"USD"}}"#)
}

impl TestApp {
    pub async fn create_merchant(&self, name: &str) -> String {
        let conn = self.db.conn().await.expect("db");
        let (_, key) = chargeonce::db::merchants::create(&conn, name)
            .await
            .expect("create merchant");
        key.expose_secret().to_owned()
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request.send().await.expect("request sent");
        Reply {
            status: response.status(),
            headers: response.headers().clone(),
            body: response.text().await.expect("body"),
        }
    }

    /// POST /v1/charges as this app's merchant with a JSON body.
    pub async fn post_charge(&self, key: &str, body: &str) -> Reply {
        self.post_charge_as(&self.api_key, key, body).await
    }

    pub async fn post_charge_as(&self, api_key: &str, key: &str, body: &str) -> Reply {
        self.send(
            self.http
                .post(format!("{}/v1/charges", self.address))
                .bearer_auth(api_key)
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body(body.to_owned()),
        )
        .await
    }

    /// POST /v1/charges/{charge}/refunds as this app's merchant.
    pub async fn post_refund(&self, charge: &str, key: &str, body: &str) -> Reply {
        self.post_refund_as(&self.api_key, charge, key, body).await
    }

    pub async fn post_refund_as(
        &self,
        api_key: &str,
        charge: &str,
        key: &str,
        body: &str,
    ) -> Reply {
        self.send(
            self.http
                .post(format!("{}/v1/charges/{charge}/refunds", self.address))
                .bearer_auth(api_key)
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body(body.to_owned()),
        )
        .await
    }

    /// A succeeded charge of `amount`; its id.
    pub async fn succeeded_charge(&self, key: &str, amount: i64) -> String {
        let reply = self.post_charge(key, &charge_body(amount)).await;
        assert_eq!(reply.status, 201, "{}", reply.body);
        reply.json()["id"].as_str().unwrap().to_owned()
    }

    /// POST /v1/charges with exactly the given headers.
    pub async fn post_charge_raw(&self, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
        let mut request = self
            .http
            .post(format!("{}/v1/charges", self.address))
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.get_as(&self.api_key, path).await
    }

    pub async fn get_as(&self, api_key: &str, path: &str) -> Reply {
        self.send(
            self.http
                .get(format!("{}{path}", self.address))
                .bearer_auth(api_key),
        )
        .await
    }

    /// The name of the app's database (on PostgreSQL, and at PgBouncer).
    pub fn database_name(&self) -> &str {
        &self.database.name
    }

    /// A plain connection to the app's database, for any SQL a test needs.
    pub async fn sql(&self) -> tokio_postgres::Client {
        self.database.client().await
    }

    pub async fn count(&self, sql: &str) -> i64 {
        self.sql()
            .await
            .query_one(sql, &[])
            .await
            .expect(sql)
            .get(0)
    }

    pub async fn charge_rows(&self) -> i64 {
        self.count("SELECT count(*) FROM charges").await
    }
}
