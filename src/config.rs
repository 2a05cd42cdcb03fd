//! Settings: the embedded `config/default.toml`, then the files in the config
//! folder, then `CHARGEONCE__SECTION__KEY` variables, then `DATABASE_URL`.
//! Everything is validated here, before anything binds or connects, and an
//! error always names the key at fault.

use std::collections::HashMap;
use std::num::{NonZeroU64, NonZeroUsize};
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, Environment, File, FileFormat};
use secrecy::{ExposeSecret, SecretString};
use serde::de::{self, Deserializer};
use serde::Deserialize;
use serde_with::{serde_as, DeserializeAs, DurationMilliSeconds, DurationSeconds};

use crate::backoff::Backoff;

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
    pub metrics: MetricsSettings,
    pub demo: DemoSettings,
    pub webhooks: WebhookSettings,
    pub events: EventSettings,
}

// Durations are `Duration`s in the code; in the files and variables they
// keep their documented names and units (`lease_ms = 30000`). A value's
// bounds are on its field (`Within`, `Millis`, `NonZero*`, see the end of
// the file): it is checked as it is read, and the error names its key.

#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    #[serde(rename = "cache_ttl_ms")]
    #[serde_as(as = "Millis<0, HOUR_MS>")]
    pub cache_ttl: Duration,
    #[serde(rename = "unknown_key_ttl_ms")]
    #[serde_as(as = "Millis<0, 60_000>")]
    pub unknown_key_ttl: Duration,
}

#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    #[serde_as(as = "NonEmpty")]
    pub host: String,
    pub port: u16,
    /// actix-server's own limit is 512 threads.
    #[serde_as(as = "Within<0, 512>")]
    pub workers: usize,
    #[serde(rename = "shutdown_timeout_secs")]
    #[serde_as(as = "DurationSeconds<u64>")]
    pub shutdown_timeout: Duration,
}

#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    /// May carry a password: `Debug` prints it redacted, and code must ask
    /// for it explicitly (`expose_secret`).
    #[serde_as(as = "PostgresUrl")]
    pub url: SecretString,
    #[serde_as(as = "Within<1, 1000>")]
    pub pool_size: usize,
    #[serde(rename = "connect_timeout_ms")]
    #[serde_as(as = "Millis<1>")]
    pub connect_timeout: Duration,
    /// 0 leaves it to the server: behind PgBouncer, which refuses the
    /// startup option that would carry it.
    #[serde(rename = "statement_timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub statement_timeout: Duration,
    #[serde(rename = "query_timeout_ms")]
    #[serde_as(as = "Millis<1>")]
    pub query_timeout: Duration,
    pub prepared_statements: bool,
    /// The most requests whose inserts (or outcomes) share one statement
    /// (`db::batch`); 1 sends each alone.
    #[serde_as(as = "Within<1, 1000>")]
    pub batch_rows: usize,
    pub migrate_on_start: bool,
    /// How long the migrations at start-up keep trying to reach a
    /// PostgreSQL that is not up yet (`db::connect_at_start`); 0 tries
    /// once, as a one-off command may want.
    #[serde(rename = "startup_wait_ms")]
    #[serde_as(as = "Millis<0, HOUR_MS>")]
    pub startup_wait: Duration,
}

#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    #[serde_as(as = "Within<1024>")]
    pub max_body_bytes: usize,
    pub max_connections: NonZeroUsize,
    // actix-http measures the head and keep-alive deadlines against a clock
    // it refreshes every 500 ms: shorter ones would fire at random.
    #[serde(rename = "header_timeout_ms")]
    #[serde_as(as = "Millis<1000>")]
    pub header_timeout: Duration,
    #[serde(rename = "body_timeout_ms")]
    #[serde_as(as = "Millis<1>")]
    pub body_timeout: Duration,
    #[serde(rename = "keep_alive_ms")]
    #[serde_as(as = "Millis<1000>")]
    pub keep_alive: Duration,
}

#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencySettings {
    #[serde(rename = "lease_ms")]
    #[serde_as(as = "Millis<1>")]
    pub lease: Duration,
    #[serde(rename = "in_flight_wait_ms")]
    #[serde_as(as = "Millis<0, 10_000>")]
    pub in_flight_wait: Duration,
    pub retention_hours: NonZeroU64,
    /// How long a key stays held after its replay window, answering 422
    /// `idempotency_key_expired`, before it is released for reuse.
    #[serde_as(as = "Within<0, 3650>")]
    pub expired_key_hold_days: u64,
    /// About how many bytes of final answers to keep in memory for replays
    /// (`service::replay_cache`); 0 turns the cache off.
    pub replay_cache_bytes: u64,
    #[serde(rename = "sweep_interval_ms")]
    #[serde_as(as = "Millis<1>")]
    pub sweep_interval: Duration,
    #[serde_as(as = "Within<1>")]
    pub sweep_batch_size: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessorKind {
    Simulated,
    Http,
}

#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessorSettings {
    pub kind: ProcessorKind,
    #[serde(rename = "latency_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub latency: Duration,
    pub url: String,
    /// At least 1 ms when `kind = "http"` (`Settings::validate`).
    #[serde(rename = "timeout_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub timeout: Duration,
    #[serde_as(as = "Within<0, 10>")]
    pub retries: u32,
}

#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecoverySettings {
    #[serde(rename = "interval_ms")]
    #[serde_as(as = "Millis<1>")]
    pub interval: Duration,
    #[serde_as(as = "Within<1, 10_000>")]
    pub batch_size: i64,
    #[serde(rename = "max_backoff_ms")]
    #[serde_as(as = "Millis<1>")]
    pub max_backoff: Duration,
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

/// `GET /metrics` (Prometheus).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    pub enabled: bool,
    /// 0: served on the API's port; else a listener of its own on this port
    /// (same host), e.g. to keep it off a public load balancer.
    pub port: u16,
}

/// The demo checkout (`src/http/demo.rs`): development only.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemoSettings {
    pub enabled: bool,
}

/// Webhook delivery: the dispatcher's pace and retry rules, and which
/// targets it may connect to.
#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// Bound on one delivery attempt: resolving, connecting, sending, the
    /// answer.
    #[serde(rename = "timeout_ms")]
    #[serde_as(as = "Millis<1, HOUR_MS>")]
    pub timeout: Duration,
    /// Attempts of one delivery before it is `failed`.
    #[serde_as(as = "Within<1, 100>")]
    pub max_attempts: u32,
    /// Whether endpoints may be (or resolve to) loopback, private,
    /// link-local or unspecified addresses.
    pub allow_private_targets: bool,
    #[serde(rename = "interval_ms")]
    #[serde_as(as = "Millis<1>")]
    pub interval: Duration,
    #[serde_as(as = "Within<1, 1000>")]
    pub batch_size: i64,
    #[serde(rename = "backoff_base_ms")]
    #[serde_as(as = "Millis<1>")]
    pub backoff_base: Duration,
    /// At least `backoff_base` (`Settings::validate`).
    #[serde(rename = "max_backoff_ms")]
    #[serde_as(as = "DurationMilliSeconds<u64>")]
    pub max_backoff: Duration,
    /// Live endpoints one merchant may have; the next creation is refused.
    #[serde_as(as = "Within<1, 1000>")]
    pub max_endpoints_per_merchant: i32,
    /// Deliveries to one endpoint one instance attempts at once.
    #[serde_as(as = "Within<1, 1000>")]
    pub max_in_flight_per_endpoint: usize,
    /// Failed attempts in a row after which an endpoint's attempts are
    /// spaced out (the circuit breaker trips).
    #[serde_as(as = "Within<1, 1000>")]
    pub trip_after_failures: i32,
    /// How long an endpoint may keep failing (no attempt delivered) before
    /// it is disabled.
    #[serde(rename = "disable_after_ms")]
    #[serde_as(as = "Millis<1>")]
    pub disable_after: Duration,
}

/// How long delivered events are kept, and the pace of their removal.
#[serde_as]
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventSettings {
    #[serde_as(as = "Within<1, 36_500>")]
    pub retention_days: u64,
    #[serde(rename = "sweep_interval_ms")]
    #[serde_as(as = "Millis<1>")]
    pub sweep_interval: Duration,
    #[serde_as(as = "Within<1, 100_000>")]
    pub sweep_batch_size: i64,
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

    /// The rules that tie several keys together; each value's own bounds
    /// were checked as it was read.
    pub fn validate(&self) -> Result<(), SettingsError> {
        fn invalid(key: &'static str, message: impl Into<String>) -> SettingsError {
            SettingsError::Invalid {
                key,
                message: message.into(),
            }
        }
        let processor = &self.processor;
        if processor.kind == ProcessorKind::Http {
            let url = processor.url.as_str();
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(
                    "processor.url",
                    "must be an http:// or https:// URL",
                ));
            }
            if processor.timeout.is_zero() {
                return Err(invalid("processor.timeout_ms", "must be at least 1"));
            }
        }
        if self.idempotency.lease <= processor.longest_call() {
            return Err(invalid(
                "idempotency.lease_ms",
                format!(
                    "must exceed the longest processor call ({} ms with these processor \
                     settings), or a slow call would lose its lease",
                    processor.longest_call().as_millis()
                ),
            ));
        }
        let hooks = &self.webhooks;
        if hooks.max_backoff < hooks.backoff_base {
            return Err(invalid(
                "webhooks.max_backoff_ms",
                format!(
                    "must be at least {} (webhooks.backoff_base_ms)",
                    hooks.backoff_base.as_millis()
                ),
            ));
        }
        Ok(())
    }
}

impl ProcessorSettings {
    /// Pauses before the retries of one processor call: 100 ms, doubling,
    /// at most 3.2 s.
    pub const RETRY_BACKOFF: Backoff =
        Backoff::new(Duration::from_millis(100), Duration::from_millis(3200));

    /// The longest one charge's processor call can take, retries included.
    pub fn longest_call(&self) -> Duration {
        match self.kind {
            ProcessorKind::Simulated => self.latency,
            ProcessorKind::Http => {
                let attempts = self.timeout * (self.retries + 1);
                let pauses = Self::RETRY_BACKOFF.pauses().take(self.retries as usize);
                pauses.sum::<Duration>() + attempts
            }
        }
    }
}

impl IdempotencySettings {
    /// How long after a key's first use a retry replays
    /// (`retention_hours`).
    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.retention_hours.get().saturating_mul(3600))
    }

    /// How long after its first use a key is released for reuse: its
    /// replay window and then the hold.
    pub fn release_after(&self) -> Duration {
        self.retention().saturating_add(Duration::from_secs(
            self.expired_key_hold_days.saturating_mul(86_400),
        ))
    }
}

/// How much longer than `webhooks.timeout_ms` a delivery's lease lasts: the
/// attempt itself is cut at the timeout, and this covers starting it (a
/// pooled connection, a busy scheduler). While the lease lasts no other
/// dispatcher sends the delivery.
pub const DELIVERY_LEASE_MARGIN: Duration = Duration::from_secs(5);

impl WebhookSettings {
    /// How long a dispatcher owns a delivery it claimed (see
    /// `DELIVERY_LEASE_MARGIN`).
    pub fn lease(&self) -> Duration {
        self.timeout + DELIVERY_LEASE_MARGIN
    }

    /// Deliveries of one merchant one instance attempts at once: half of
    /// its `batch_size`, so the other merchants always have the other half.
    pub fn max_in_flight_per_merchant(&self) -> usize {
        usize::try_from(self.batch_size / 2).unwrap_or(1).max(1)
    }
}

impl EventSettings {
    pub fn retention(&self) -> Duration {
        Duration::from_secs(self.retention_days.saturating_mul(86_400))
    }
}

const HOUR_MS: u64 = 3_600_000;

/// Why a number is out of its bounds, in the words of `config/default.toml`.
fn within<E: de::Error>(value: u64, least: u64, most: u64) -> Result<u64, E> {
    if (least..=most).contains(&value) {
        return Ok(value);
    }
    Err(E::custom(match (least, most) {
        (_, u64::MAX) => format!("must be at least {least}"),
        (0, _) => format!("must be at most {most}"),
        _ => format!("must be between {least} and {most}"),
    }))
}

/// A whole number from `LEAST` to `MOST`, read into the field's integer
/// type (`#[serde_as(as = "Within<1, 1000>")]`).
pub struct Within<const LEAST: u64, const MOST: u64 = { u64::MAX }>;

impl<'de, T: TryFrom<u64>, const LEAST: u64, const MOST: u64> DeserializeAs<'de, T>
    for Within<LEAST, MOST>
{
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<T, D::Error> {
        let value = within(u64::deserialize(deserializer)?, LEAST, MOST)?;
        T::try_from(value).map_err(|_| de::Error::custom(format!("{value} is too large")))
    }
}

/// Whole milliseconds from `LEAST` to `MOST`, read into a `Duration`.
pub struct Millis<const LEAST: u64, const MOST: u64 = { u64::MAX }>;

impl<'de, const LEAST: u64, const MOST: u64> DeserializeAs<'de, Duration> for Millis<LEAST, MOST> {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
        let millis = within(u64::deserialize(deserializer)?, LEAST, MOST)?;
        Ok(Duration::from_millis(millis))
    }
}

/// A string with something besides white space in it.
pub struct NonEmpty;

impl<'de> DeserializeAs<'de, String> for NonEmpty {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim().is_empty() {
            return Err(de::Error::custom("must not be empty"));
        }
        Ok(text)
    }
}

/// A URL tokio-postgres can connect with, kept secret from then on.
pub struct PostgresUrl;

impl<'de> DeserializeAs<'de, SecretString> for PostgresUrl {
    fn deserialize_as<D: Deserializer<'de>>(deserializer: D) -> Result<SecretString, D::Error> {
        let url = SecretString::from(String::deserialize(deserializer)?);
        match url.expose_secret().parse::<tokio_postgres::Config>() {
            Ok(_) => Ok(url),
            Err(e) => Err(de::Error::custom(format!("not a PostgreSQL URL: {e}"))),
        }
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
        assert_eq!(settings.processor.latency, Duration::from_millis(25));
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

    /// Each value is checked against its bounds as it is read, and the
    /// message says which key and what is allowed.
    #[test]
    fn an_out_of_bounds_value_says_its_key_and_its_bounds() {
        let cases = [
            (
                "CHARGEONCE__DATABASE__POOL_SIZE",
                "1001",
                "must be between 1 and 1000 for key `database.pool_size`",
            ),
            (
                "CHARGEONCE__HTTP__MAX_BODY_BYTES",
                "1023",
                "must be at least 1024 for key `http.max_body_bytes`",
            ),
            (
                "CHARGEONCE__HTTP__HEADER_TIMEOUT_MS",
                "999",
                "must be at least 1000 for key `http.header_timeout_ms`",
            ),
            (
                "CHARGEONCE__IDEMPOTENCY__IN_FLIGHT_WAIT_MS",
                "10001",
                "must be at most 10000 for key `idempotency.in_flight_wait_ms`",
            ),
            (
                "CHARGEONCE__IDEMPOTENCY__SWEEP_BATCH_SIZE",
                "0",
                "must be at least 1 for key `idempotency.sweep_batch_size`",
            ),
            (
                "CHARGEONCE__HTTP__MAX_CONNECTIONS",
                "0",
                "for key `http.max_connections`",
            ),
            (
                "CHARGEONCE__SERVER__WORKERS",
                "513",
                "must be at most 512 for key `server.workers`",
            ),
            (
                "CHARGEONCE__SERVER__HOST",
                " ",
                "must not be empty for key `server.host`",
            ),
        ];
        for (var, value, expected) in cases {
            let error = load(&[(var, value)]).expect_err(var).to_string();
            assert!(error.contains(expected), "{var}={value}: `{error}`");
        }
        let edges = [
            ("CHARGEONCE__DATABASE__POOL_SIZE", "1000"),
            ("CHARGEONCE__HTTP__HEADER_TIMEOUT_MS", "1000"),
            ("CHARGEONCE__IDEMPOTENCY__IN_FLIGHT_WAIT_MS", "0"),
            ("CHARGEONCE__DATABASE__STARTUP_WAIT_MS", "3600000"),
        ];
        for (var, value) in edges {
            assert!(load(&[(var, value)]).is_ok(), "{var}={value}");
        }
    }

    /// What docs/operations.md's "Running behind PgBouncer" asks for is
    /// accepted.
    #[test]
    fn the_settings_for_pgbouncer_load() {
        let settings = load(&[
            ("CHARGEONCE__DATABASE__PREPARED_STATEMENTS", "false"),
            ("CHARGEONCE__DATABASE__STATEMENT_TIMEOUT_MS", "0"),
            ("CHARGEONCE__DATABASE__MIGRATE_ON_START", "false"),
        ])
        .expect("valid");
        assert!(!settings.database.prepared_statements);
        assert_eq!(settings.database.statement_timeout, Duration::ZERO);
        assert!(!settings.database.migrate_on_start);
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
    fn private_webhook_targets_are_allowed_in_development_only() {
        assert!(load(&[]).expect("defaults").webhooks.allow_private_targets);
        let repo_config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
        let vars = HashMap::from([("CHARGEONCE_ENV".to_owned(), "production".to_owned())]);
        let production = Settings::load_from(&repo_config, &vars).expect("production loads");
        assert!(!production.webhooks.allow_private_targets);
    }

    #[test]
    fn webhook_backoff_cap_must_not_be_below_its_base() {
        let error = load(&[
            ("CHARGEONCE__WEBHOOKS__BACKOFF_BASE_MS", "1000"),
            ("CHARGEONCE__WEBHOOKS__MAX_BACKOFF_MS", "999"),
        ])
        .expect_err("cap below base")
        .to_string();
        assert!(
            error.contains("webhooks.max_backoff_ms") && error.contains("1000"),
            "{error}"
        );
        let error = load(&[("CHARGEONCE__EVENTS__RETENTION_DAYS", "0")])
            .expect_err("no retention")
            .to_string();
        assert!(error.contains("events.retention_days"), "{error}");
    }

    #[test]
    fn debug_output_hides_the_database_url() {
        let settings = load(&[("DATABASE_URL", "postgres://u:hunter2@h/d")]).expect("valid");
        assert!(!format!("{settings:?}").contains("hunter2"));
    }
}
