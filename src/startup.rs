//! Wiring: builds the whole service from `Settings`. The binary and the tests
//! start the same `Application`.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{web, App};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{DatabaseSettings, Settings};
use crate::db::{self, Database, DbError};
use crate::http::metrics::Exporter;
use crate::http::server::ServerLimits;
use crate::http::HttpLimits;
use crate::metrics::Pools;
use crate::processor::{self, PaymentProcessor};
use crate::service::api_keys::ApiKeyCache;
use crate::service::charges::Charges;
use crate::service::dispatch::Dispatcher;
use crate::service::events::Events;
use crate::service::refunds::Refunds;
use crate::service::webhook_endpoints::WebhookEndpoints;
use crate::webhooks::{Sender, TargetPolicy};
use crate::{http, workers};

#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(transparent)]
    Database(#[from] DbError),
    #[error("processor client: {0}")]
    Processor(#[from] reqwest::Error),
    #[error("webhook client: {0}")]
    WebhookClient(#[source] reqwest::Error),
    #[error("cannot render the OpenAPI document: {0}")]
    OpenApi(#[source] serde_json::Error),
    #[error("cannot listen on {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
}

/// Connections of the background workers (recovery, key sweeper, event
/// retention), apart from the request handlers' `database.pool_size`.
pub const BACKGROUND_CONNECTIONS: usize = 4;

/// Connections of the webhook dispatcher (and of its backlog measurement,
/// `workers::backlog`), a pool of its own so deliveries and requests never
/// wait for each other's connections.
pub const DISPATCHER_CONNECTIONS: usize = 4;

/// Descriptors kept free beyond the HTTP connections: database connections,
/// log and pipe files, and room for connections being refused.
const RESERVED_DESCRIPTORS: u64 = 256;

/// The per-worker connection cap: `configured`, or less if the process may
/// not open that many files. The soft limit on open files is raised to the
/// hard limit first (the default soft limit, often 1024, is a leftover of
/// `select`). Half of what is left goes to held connections, so refusing
/// the excess (which takes a descriptor for a moment) never runs out.
fn connection_cap(configured: usize, workers: usize, pool_size: usize) -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let soft = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit; keeping http.max_connections");
            return configured;
        }
    };
    let spare = soft.saturating_sub(RESERVED_DESCRIPTORS + pool_size as u64);
    let fits = usize::try_from(spare / 2 / workers as u64)
        .unwrap_or(usize::MAX)
        .max(1);
    if fits < configured {
        tracing::info!(
            configured,
            per_worker = fits,
            open_file_limit = soft,
            "http.max_connections lowered to fit the open-file limit"
        );
    }
    configured.min(fits)
}

/// A server of its own for `GET /metrics` on `port` of `server.host`.
fn serve_metrics(
    settings: &Settings,
    port: u16,
    exporter: web::Data<Exporter>,
    limits: &ServerLimits,
) -> Result<Server, StartupError> {
    let address = format!("{}:{port}", settings.server.host);
    let bind_error = |source| StartupError::Bind {
        address: address.clone(),
        source,
    };
    let listener = TcpListener::bind(&address).map_err(bind_error)?;
    let limits = ServerLimits {
        workers: 1,
        ..limits.clone()
    };
    tracing::info!(%address, "metrics listening");
    http::server::serve(listener, &limits, move || {
        App::new()
            .app_data(exporter.clone())
            .configure(|cfg| http::routes::metrics_port().register(cfg))
    })
    .map_err(bind_error)
}

/// The pool of one HTTP worker thread, `connections` of the
/// `database.pool_size`. A connection's driving task runs on the thread that
/// opened it; with one pool shared by all threads, a request on one thread
/// would hand every query to a connection driven by another (or by the
/// background runtime) and wait for that thread to wake up, twice per query.
/// Per-thread pools keep a request and its connection on one thread: no
/// cross-thread wake-ups (BENCHMARKS.md, history, has the numbers).
fn worker_database(
    database: &DatabaseSettings,
    connections: usize,
    fallback: &Database,
) -> Database {
    // The same settings already built the background pool, so this cannot
    // fail in practice; if it did, sharing that pool is slower but correct.
    Database::new(database, connections).unwrap_or_else(|error| {
        tracing::error!(%error, "cannot build a worker's pool; sharing the background pool");
        fallback.clone()
    })
}

pub struct Application {
    port: u16,
    server: Server,
    /// The metrics port's own server (running), when `metrics.port` is set.
    metrics_server: Option<ServerHandle>,
    db: Database,
    stop: CancellationToken,
    background: Vec<JoinHandle<()>>,
}

impl Application {
    pub async fn build(settings: &Settings) -> Result<Self, StartupError> {
        let processor = processor::from_settings(&settings.processor)?;
        Self::build_with_processor(settings, processor).await
    }

    /// Like `build`, with a processor chosen by the caller (tests keep a
    /// handle on it to count calls).
    pub async fn build_with_processor(
        settings: &Settings,
        processor: Arc<dyn PaymentProcessor>,
    ) -> Result<Self, StartupError> {
        if settings.database.migrate_on_start {
            let applied = db::migrate(&settings.database).await?;
            tracing::info!(applied, "migrations up to date");
        }
        // The background workers' own pool; it also shows the settings make
        // a valid pool before any HTTP worker builds its own.
        let background_db = Database::new(&settings.database, BACKGROUND_CONNECTIONS)?;
        // Ids carry the database's time from the first one on
        // (`crate::clock`); a database not readable yet leaves the local
        // clock until the worker's next measurement.
        if let Err(error) = workers::clock::measure(&background_db).await {
            tracing::warn!(error = %crate::telemetry::error_chain(&error), "cannot read the database's clock yet");
        }
        let demo = settings.demo.enabled;
        if demo {
            http::demo::ensure_demo_merchant(&background_db).await?;
        }

        let address = format!("{}:{}", settings.server.host, settings.server.port);
        let bind_error = |source| StartupError::Bind {
            address: address.clone(),
            source,
        };
        let listener = TcpListener::bind(&address).map_err(bind_error)?;
        let port = listener.local_addr().map_err(bind_error)?.port();

        let api_keys = web::Data::new(ApiKeyCache::new(&settings.auth));
        let demo_page = web::Data::new(http::demo::DemoPage::new(settings.idempotency.retention()));
        let limits = web::Data::new(HttpLimits {
            max_body_bytes: settings.http.max_body_bytes,
            body_timeout: settings.http.body_timeout,
        });
        let charges = Charges::new(
            background_db.clone(),
            processor.clone(),
            &settings.idempotency,
            &settings.recovery,
        );
        let refunds = Refunds::new(
            background_db.clone(),
            processor,
            &settings.idempotency,
            &settings.recovery,
        );

        let exporter: Option<web::Data<Exporter>> = settings.metrics.enabled.then(|| {
            let pools = Pools::default();
            pools.register("background", background_db.pool().clone());
            web::Data::new(Exporter {
                handle: crate::metrics::handle(),
                pools,
            })
        });
        // On the API's port, or on one of its own.
        let api_exporter = exporter.clone().filter(|_| settings.metrics.port == 0);
        let exporter_for_port = exporter.clone();
        let next_worker = Arc::new(AtomicUsize::new(0));
        let served = http::routes::Served {
            demo,
            metrics: api_exporter.is_some(),
        };
        let document =
            web::Data::new(http::openapi::Rendered::new(served).map_err(StartupError::OpenApi)?);

        let workers = match settings.server.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let worker_connections = settings.database.pool_size.div_ceil(workers).max(1);
        let database = settings.database.clone();
        let (shared_db, shared_charges, shared_refunds) =
            (background_db.clone(), charges.clone(), refunds.clone());
        let endpoints = WebhookEndpoints::new(
            background_db.clone(),
            TargetPolicy::new(settings.webhooks.allow_private_targets),
        );
        // Runs once on each worker thread, so each worker gets a pool of its
        // own (see `worker_database`).
        let server_limits = ServerLimits {
            workers,
            max_connections: connection_cap(
                settings.http.max_connections,
                workers,
                settings.database.pool_size,
            ),
            header_timeout: settings.http.header_timeout,
            keep_alive: settings.http.keep_alive,
            shutdown_timeout_secs: settings.server.shutdown_timeout.as_secs(),
        };
        let server = http::server::serve(listener, &server_limits, move || {
            let db = worker_database(&database, worker_connections, &shared_db);
            if let Some(exporter) = &exporter {
                let worker = next_worker.fetch_add(1, Ordering::Relaxed);
                exporter
                    .pools
                    .register(format!("worker-{worker}"), db.pool().clone());
            }
            let api_exporter = api_exporter.clone();
            App::new()
                .app_data(web::Data::new(shared_charges.with_database(db.clone())))
                .app_data(web::Data::new(shared_refunds.with_database(db.clone())))
                .app_data(web::Data::new(Events::new(db.clone())))
                .app_data(web::Data::new(endpoints.with_database(db.clone())))
                .app_data(web::Data::new(db))
                .app_data(api_keys.clone())
                .app_data(limits.clone())
                .app_data(document.clone())
                .app_data(demo_page.clone())
                .wrap_fn(http::observe)
                .configure(|cfg| {
                    if let Some(exporter) = api_exporter {
                        cfg.app_data(exporter);
                    }
                    http::configure(cfg, served);
                })
        })
        .map_err(bind_error)?;
        let metrics_server = match (&exporter_for_port, settings.metrics.port) {
            (Some(exporter), port) if port != 0 => {
                let server = serve_metrics(settings, port, exporter.clone(), &server_limits)?;
                let handle = server.handle();
                tokio::spawn(server);
                Some(handle)
            }
            _ => None,
        };

        let dispatcher_db = Database::new(&settings.database, DISPATCHER_CONNECTIONS)?;
        let dispatcher = Dispatcher::new(
            dispatcher_db.clone(),
            Sender::new(&settings.webhooks).map_err(StartupError::WebhookClient)?,
            settings.webhooks.clone(),
        );
        let stop = CancellationToken::new();
        let mut background = vec![
            tokio::spawn(workers::sweeper::run(
                background_db.clone(),
                settings.idempotency.clone(),
                stop.clone(),
            )),
            tokio::spawn(workers::recovery::run(
                charges,
                refunds,
                settings.recovery.clone(),
                stop.clone(),
            )),
            tokio::spawn(workers::dispatcher::run(
                dispatcher,
                settings.webhooks.interval,
                stop.clone(),
            )),
            tokio::spawn(workers::clock::run(background_db.clone(), stop.clone())),
            tokio::spawn(workers::event_retention::run(
                background_db.clone(),
                settings.events.clone(),
                stop.clone(),
            )),
        ];
        // Only for the metrics: no measuring when nobody can read them.
        if settings.metrics.enabled {
            background.push(tokio::spawn(workers::backlog::run(
                dispatcher_db,
                stop.clone(),
            )));
        }
        tracing::info!(%address, port, "chargeonce listening");
        if demo {
            let url = format!("http://{}:{port}/demo", settings.server.host);
            tracing::info!(%url, "demo checkout (development only: demo.enabled)");
        }
        Ok(Self {
            port,
            server,
            metrics_server,
            db: background_db,
            stop,
            background,
        })
    }

    /// The port actually bound (useful with `server.port = 0`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The background workers' database (tests use it to look at rows).
    pub fn database(&self) -> &Database {
        &self.db
    }

    /// Stops the server gracefully (as SIGTERM does) when asked.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGTERM/SIGINT (or a `handle().stop(..)`): then stops
    /// accepting, lets in-flight requests finish within
    /// `server.shutdown_timeout_secs`, and stops the background workers.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let result = self.server.await;
        if let Some(metrics) = self.metrics_server {
            metrics.stop(true).await;
        }
        self.stop.cancel();
        for worker in self.background {
            let _ = worker.await;
        }
        self.db.close();
        result
    }
}
