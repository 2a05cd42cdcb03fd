//! Settings: the embedded `config/default.toml`, then the files in the config
//! folder, then `CHARGEONCE__SECTION__KEY` variables, then `DATABASE_URL`.
//! Everything is validated here, before anything binds or connects, and an
//! error always names the key at fault.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

const DEFAULTS: &str = include_str!("../config/default.toml");

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("configuration: {0}")]
    Load(#[from] config::ConfigError),
    #[error("configuration key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub http: HttpSettings,
    pub idempotency: IdempotencySettings,
    pub processor: ProcessorSettings,
    pub recovery: RecoverySettings,
    pub auth: AuthSettings,
    pub log: LogSettings,
    pub demo: DemoSettings,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    pub cache_ttl_ms: u64,
    pub unknown_key_ttl_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    pub host: String,
    pub port: u16,
    pub workers: usize,
    pub shutdown_timeout_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// May carry a password: `Debug` prints it redacted, and code must ask
    /// for it explicitly (`expose_secret`).
    pub url: SecretString,
    pub pool_size: usize,
    pub connect_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub query_timeout_ms: u64,
    pub migrate_on_start: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub max_body_bytes: usize,
    pub max_connections: usize,
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub keep_alive_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    pub lease_ms: u64,
    pub in_flight_wait_ms: u64,
    pub retention_hours: u64,
    pub sweep_interval_ms: u64,
    pub sweep_batch_size: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessorKind {
    Simulated,
    Http,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSettings {
    pub kind: ProcessorKind,
    pub latency_ms: u64,
    pub url: String,
    pub timeout_ms: u64,
    pub retries: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverySettings {
    pub interval_ms: u64,
    pub batch_size: i64,
    pub max_backoff_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    pub format: LogFormat,
}

/// The demo checkout (`src/http/demo.rs`): development only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoSettings {
    pub enabled: bool,
}

impl Settings {
    /// Loads the settings the way the binary does: the config folder from
    /// `CHARGEONCE_CONFIG_DIR` (default `config`), variables from the process.
    pub fn load() -> Result<Self, SettingsError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        let dir = vars
            .get("CHARGEONCE_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("config"));
        Self::load_from(&dir, &vars)
    }

    /// Loads from an explicit folder and variable set (tests use this, so
    /// they never touch the process environment).
    pub fn load_from(dir: &Path, vars: &HashMap<String, String>) -> Result<Self, SettingsError> {
        let environment = vars.get("CHARGEONCE_ENV").cloned();
        let env_file = dir.join(environment.as_deref().unwrap_or("local"));
        let mut builder = Config::builder()
            .add_source(File::from_str(DEFAULTS, FileFormat::Toml))
            .add_source(File::from(dir.join("default")).required(false))
            // An environment that was asked for by name must have its file.
            .add_source(File::from(env_file).required(environment.is_some()))
            .add_source(
                Environment::with_prefix("CHARGEONCE")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true)
                    .source(Some(vars.clone().into_iter().collect())),
            );
        if let Some(url) = vars.get("DATABASE_URL").filter(|url| !url.is_empty()) {
            builder = builder.set_override("database.url", url.as_str())?;
        }
        let settings: Settings = builder.build()?.try_deserialize()?;
        settings.validate()?;
        Ok(settings)
    }

    /// Rules the types alone do not express.
    pub fn validate(&self) -> Result<(), SettingsError> {
        fn invalid(key: &'static str, message: impl Into<String>) -> SettingsError {
            SettingsError::Invalid {
                key,
                message: message.into(),
            }
        }
        if self.server.host.trim().is_empty() {
            return Err(invalid("server.host", "must not be empty"));
        }
        if let Err(e) = self
            .database
            .url
            .expose_secret()
            .parse::<tokio_postgres::Config>()
        {
            return Err(invalid(
                "database.url",
                format!("not a PostgreSQL URL: {e}"),
            ));
        }
        if !(1..=1000).contains(&self.database.pool_size) {
            return Err(invalid("database.pool_size", "must be between 1 and 1000"));
        }
        if self.database.connect_timeout_ms == 0 {
            return Err(invalid("database.connect_timeout_ms", "must be at least 1"));
        }
        if self.database.query_timeout_ms == 0 {
            return Err(invalid("database.query_timeout_ms", "must be at least 1"));
        }
        if self.database.statement_timeout_ms == 0 {
            return Err(invalid(
                "database.statement_timeout_ms",
                "must be at least 1",
            ));
        }
        if self.http.max_body_bytes < 1024 {
            return Err(invalid("http.max_body_bytes", "must be at least 1024"));
        }
        if self.http.max_connections == 0 {
            return Err(invalid("http.max_connections", "must be at least 1"));
        }
        // actix-http measures the head and keep-alive deadlines against a
        // clock it refreshes every 500 ms: shorter ones fire at random.
        for (key, value) in [
            ("http.header_timeout_ms", self.http.header_timeout_ms),
            ("http.keep_alive_ms", self.http.keep_alive_ms),
        ] {
            if value < 1000 {
                return Err(invalid(key, "must be at least 1000"));
            }
        }
        if self.http.body_timeout_ms == 0 {
            return Err(invalid("http.body_timeout_ms", "must be at least 1"));
        }
        if self.idempotency.lease_ms == 0 {
            return Err(invalid("idempotency.lease_ms", "must be at least 1"));
        }
        if self.processor.kind == ProcessorKind::Http {
            let url = self.processor.url.as_str();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(
                    "processor.url",
                    "must be an http:// or https:// URL",
                ));
            }
            if self.processor.timeout_ms == 0 {
                return Err(invalid("processor.timeout_ms", "must be at least 1"));
            }
            if self.processor.retries > 10 {
                return Err(invalid("processor.retries", "must be at most 10"));
            }
        }
        if self.idempotency.lease() <= self.processor.longest_call() {
            return Err(invalid(
                "idempotency.lease_ms",
                format!(
                    "must exceed the longest processor call ({} ms with these processor \
                     settings), or a slow call would lose its lease",
                    self.processor.longest_call().as_millis()
                ),
            ));
        }
        if self.recovery.interval_ms == 0 {
            return Err(invalid("recovery.interval_ms", "must be at least 1"));
        }
        if self.recovery.max_backoff_ms == 0 {
            return Err(invalid("recovery.max_backoff_ms", "must be at least 1"));
        }
        if !(1..=10_000).contains(&self.recovery.batch_size) {
            return Err(invalid(
                "recovery.batch_size",
                "must be between 1 and 10000",
            ));
        }
        if self.idempotency.in_flight_wait_ms > 10_000 {
            return Err(invalid(
                "idempotency.in_flight_wait_ms",
                "must be at most 10000",
            ));
        }
        if self.auth.unknown_key_ttl_ms > 60_000 {
            return Err(invalid(
                "auth.unknown_key_ttl_ms",
                "must be at most 60000 (one minute)",
            ));
        }
        if self.auth.cache_ttl_ms > 3_600_000 {
            return Err(invalid(
                "auth.cache_ttl_ms",
                "must be at most 3600000 (one hour)",
            ));
        }
        if self.idempotency.retention_hours == 0 {
            return Err(invalid("idempotency.retention_hours", "must be at least 1"));
        }
        if self.idempotency.sweep_interval_ms == 0 {
            return Err(invalid(
                "idempotency.sweep_interval_ms",
                "must be at least 1",
            ));
        }
        if self.idempotency.sweep_batch_size < 1 {
            return Err(invalid(
                "idempotency.sweep_batch_size",
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

impl DatabaseSettings {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    pub fn query_timeout(&self) -> Duration {
        Duration::from_millis(self.query_timeout_ms)
    }
}

impl ProcessorSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Pause before retry number `attempt` (1-based) of one processor call.
    pub fn backoff(attempt: u32) -> Duration {
        Duration::from_millis(50 << attempt.min(6))
    }

    /// The longest one charge's processor call can take, retries included.
    pub fn longest_call(&self) -> Duration {
        match self.kind {
            ProcessorKind::Simulated => Duration::from_millis(self.latency_ms),
            ProcessorKind::Http => {
                let attempts = self.timeout() * (self.retries + 1);
                (1..=self.retries).map(Self::backoff).sum::<Duration>() + attempts
            }
        }
    }
}

impl HttpSettings {
    pub fn header_timeout(&self) -> Duration {
        Duration::from_millis(self.header_timeout_ms)
    }

    pub fn body_timeout(&self) -> Duration {
        Duration::from_millis(self.body_timeout_ms)
    }

    pub fn keep_alive(&self) -> Duration {
        Duration::from_millis(self.keep_alive_ms)
    }
}

impl IdempotencySettings {
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms)
    }

    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.retention_hours * 3600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
        let vars = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::load_from(Path::new("/nonexistent-config-dir"), &vars)
    }

    #[test]
    fn embedded_defaults_load_without_a_config_folder() {
        let settings = load(&[]).expect("defaults are valid");
        assert_eq!(settings.server.port, 8080);
        assert_eq!(settings.http.max_body_bytes, 64 * 1024);
        assert_eq!(settings.processor.kind, ProcessorKind::Simulated);
    }

    #[test]
    fn environment_variables_override_defaults() {
        let settings = load(&[
            ("CHARGEONCE__SERVER__PORT", "9001"),
            ("CHARGEONCE__DATABASE__POOL_SIZE", "3"),
            ("CHARGEONCE__PROCESSOR__LATENCY_MS", "25"),
        ])
        .expect("valid");
        assert_eq!(settings.server.port, 9001);
        assert_eq!(settings.database.pool_size, 3);
        assert_eq!(settings.processor.latency_ms, 25);
    }

    #[test]
    fn database_url_wins_over_the_config_key() {
        let settings = load(&[
            ("CHARGEONCE__DATABASE__URL", "postgres://a@localhost/one"),
            ("DATABASE_URL", "postgres://b@localhost/two"),
        ])
        .expect("valid");
        assert_eq!(
            settings.database.url.expose_secret(),
            "postgres://b@localhost/two"
        );
    }

    #[test]
    fn a_bad_value_names_its_key() {
        let cases = [
            ("CHARGEONCE__SERVER__PORT", "eighty", "server.port"),
            ("CHARGEONCE__DATABASE__POOL_SIZE", "0", "database.pool_size"),
            ("CHARGEONCE__PROCESSOR__KIND", "magic", "processor.kind"),
            (
                "CHARGEONCE__HTTP__MAX_BODY_BYTES",
                "10",
                "http.max_body_bytes",
            ),
            ("DATABASE_URL", "mysql://nope", "database.url"),
        ];
        for (var, value, key) in cases {
            let error = load(&[(var, value)]).expect_err(var).to_string();
            assert!(
                error.contains(key),
                "{var}={value}: `{error}` does not name {key}"
            );
        }
    }

    #[test]
    fn the_lease_must_outlast_the_processor_call_with_its_retries() {
        let http = [
            ("CHARGEONCE__PROCESSOR__KIND", "http"),
            ("CHARGEONCE__PROCESSOR__TIMEOUT_MS", "1000"),
            ("CHARGEONCE__PROCESSOR__RETRIES", "2"),
        ];
        // 3 attempts of 1 s plus 100 + 200 ms of backoff.
        let ok = [
            http.as_slice(),
            &[("CHARGEONCE__IDEMPOTENCY__LEASE_MS", "3301")],
        ]
        .concat();
        assert!(load(&ok).is_ok());
        let short = [
            http.as_slice(),
            &[("CHARGEONCE__IDEMPOTENCY__LEASE_MS", "3300")],
        ]
        .concat();
        let error = load(&short).expect_err("lease too short").to_string();
        assert!(
            error.contains("idempotency.lease_ms") && error.contains("3300"),
            "{error}"
        );
    }

    #[test]
    fn an_unknown_key_is_rejected() {
        let error = load(&[("CHARGEONCE__SERVER__PROT", "1")]).expect_err("unknown key");
        assert!(error.to_string().contains("prot"), "{error}");
    }

    #[test]
    fn a_named_environment_needs_its_file() {
        let error = load(&[("CHARGEONCE_ENV", "staging")]).expect_err("missing file");
        assert!(error.to_string().contains("staging"), "{error}");
    }

    #[test]
    fn debug_output_hides_the_database_url() {
        let settings = load(&[("DATABASE_URL", "postgres://u:hunter2@h/d")]).expect("valid");
        assert!(!format!("{settings:?}").contains("hunter2"));
    }
}
