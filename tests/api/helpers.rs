//! The test harness: every test gets its own PostgreSQL database, a real
//! `Application` on a free port, a merchant with an API key, and typed helpers
//! for the requests the spec talks about. The database is dropped when the
//! `TestApp` is.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chargeonce::config::{ProcessorKind, Settings};
use chargeonce::processor::{PaymentProcessor, SimulatedProcessor};
use chargeonce::startup::Application;
use deadpool_postgres::Pool;
use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::OnceCell;
use tokio_postgres::NoTls;

/// Where tests create their databases: `TEST_DATABASE_URL`, else the
/// machine's PostgreSQL on 127.0.0.1:5432.
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (url, String::new()),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let host_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    format!("{}/{database}{query}", &base[..host_end])
}

pub async fn admin_client() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&admin_url(), NoTls)
        .await
        .expect("connect to the test PostgreSQL (set TEST_DATABASE_URL)");
    tokio::spawn(connection);
    client
}

const PREFIX: &str = "chargeonce_test_";

/// A fresh, empty database; leftovers of crashed runs older than two hours
/// are dropped on first use.
pub async fn create_database() -> (String, String) {
    static SWEPT: OnceCell<()> = OnceCell::const_new();
    let admin = admin_client().await;
    SWEPT
        .get_or_init(|| async { drop_stale_databases(&admin).await })
        .await;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let name = format!(
        "{PREFIX}{now}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create test database");
    let url = with_database(&admin_url(), &name);
    (name, url)
}

async fn drop_stale_databases(admin: &tokio_postgres::Client) {
    let rows = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'chargeonce\\_test\\_%'",
            &[],
        )
        .await
        .expect("list databases");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    for row in rows {
        let name: String = row.get(0);
        let created: u64 = name[PREFIX.len()..]
            .split('_')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if now.saturating_sub(created) > 2 * 3600 {
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    }
}

/// Drops a database from a thread of its own, so it works from `Drop`.
pub fn drop_database(name: &str) {
    let name = name.to_owned();
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let admin = admin_client().await;
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        });
    })
    .join();
}

/// Settings for a test: embedded defaults, this database, a free port.
pub fn test_settings(database_url: &str) -> Settings {
    let mut settings =
        Settings::load_from(Path::new("/nonexistent"), &HashMap::new()).expect("default settings");
    settings.database.url = database_url.to_owned();
    settings.server.host = "127.0.0.1".to_owned();
    settings.server.port = 0;
    settings.server.workers = 2;
    settings
}

pub struct TestApp {
    pub address: String,
    pub database_name: String,
    pub pool: Pool,
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
    let (database_name, database_url) = create_database().await;
    let mut settings = test_settings(&database_url);
    adjust(&mut settings);
    // The simulated processor is built here so tests can count its calls;
    // other kinds come from the settings as in production.
    let processor = Arc::new(SimulatedProcessor::new(Duration::from_millis(
        settings.processor.latency_ms,
    )));
    let chosen: Arc<dyn PaymentProcessor> = match settings.processor.kind {
        ProcessorKind::Simulated => processor.clone(),
        _ => chargeonce::processor::from_settings(&settings.processor).expect("processor"),
    };
    let app = Application::build_with_processor(&settings, chosen)
        .await
        .expect("build application");
    let address = format!("http://127.0.0.1:{}", app.port());
    let pool = app.pool().clone();
    tokio::spawn(app.run_until_stopped());
    let mut test_app = TestApp {
        address,
        database_name,
        pool,
        api_key: String::new(),
        processor,
        http: reqwest::Client::new(),
    };
    test_app.api_key = test_app.create_merchant("Test merchant").await;
    test_app
}

impl Drop for TestApp {
    fn drop(&mut self) {
        drop_database(&self.database_name);
    }
}

pub fn charge_body(amount: i64) -> String {
    format!(r#"{{"amount":{amount},"currency":"USD"}}"#)
}

impl TestApp {
    pub async fn create_merchant(&self, name: &str) -> String {
        let mut client = self.pool.get().await.expect("db");
        let (_, key) = chargeonce::db::merchants::create(&mut client, name)
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

    pub async fn count(&self, sql: &str) -> i64 {
        let client = self.pool.get().await.expect("db");
        client.query_one(sql, &[]).await.expect(sql).get(0)
    }

    pub async fn charge_rows(&self) -> i64 {
        self.count("SELECT count(*) FROM charges").await
    }
}
