//! Wiring: builds the whole service from `Settings`. The binary and the tests
//! start the same `Application`.

use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use actix_web::body::BoxBody;
use actix_web::dev::{
    Server, ServerHandle, Service, ServiceFactory, ServiceRequest, ServiceResponse,
};
use actix_web::{web, App};
use tokio::sync::watch;
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
use crate::webhooks::Sender;
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

/// Connections of the webhook dispatcher, pools of its own so deliveries
/// and requests never wait for each other's connections: one for its
/// rounds, the rest for the attempts' records (and for the backlog
/// measurement, `workers::backlog`), so a burst of records never delays a
/// round (`service::dispatch`).
pub const DISPATCHER_CONNECTIONS: usize = 4;

/// The pool of one HTTP worker thread, `connections` of the
/// `database.pool_size`. A connection's driving task runs on the thread that
/// opened it; with one pool shared by all threads, a request on one thread
/// would hand every query to a connection driven by another (or by the
/// background runtime) and wait for that thread to wake up, twice per query.
/// Per-thread pools keep a request and its connection on one thread: no
/// cross-thread wake-ups (BENCHMARKS.md, "A pool per HTTP worker thread").
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

/// Opens every connection of a worker's pool and prepares each of the
/// service's statements on it, so that the first requests after a start do
/// not pay for connecting, a new backend's catalog caches and a round trip
/// per statement. A task on the worker's own runtime (the connections'
/// driving tasks belong there; the worker starts serving meanwhile); it
/// counts itself warm in `warm` whatever happened: a database that does not
/// answer yet leaves the connections to open on demand, as without it.
async fn warm_up(db: Database, connections: usize, prepare: bool, warm: watch::Sender<usize>) {
    use futures_util::future::join_all;
    let clients = join_all((0..connections).map(|_| db.pool().get())).await;
    let opened: Vec<_> = clients.into_iter().filter_map(Result::ok).collect();
    // Every statement on every connection at once: pipelined per connection.
    let mut prepares = Vec::new();
    for client in opened.iter().filter(|_| prepare) {
        for (_, statement) in db::ALL_STATEMENTS {
            prepares.push(client.prepare_typed_cached(statement.sql, statement.params));
        }
    }
    let failed = join_all(prepares)
        .await
        .iter()
        .filter(|prepared| prepared.is_err())
        .count();
    if opened.len() < connections || failed > 0 {
        tracing::warn!(
            opened = opened.len(),
            connections,
            failed,
            "warming up a worker's pool: connections left to open on demand"
        );
    }
    drop(opened);
    warm.send_modify(|workers| *workers += 1);
}

/// Holds `GET /readyz` until every worker's pool is warm (`warm_up`), at
/// most as long as the readiness check waits for the database; then that
/// check answers.
async fn when_warm(mut warm: watch::Receiver<usize>, workers: usize) {
    let bound = std::time::Duration::from_secs(1);
    let _ = tokio::time::timeout(bound, warm.wait_for(|warm| *warm >= workers)).await;
}

/// A listener on `host:port`, and that address (for messages).
fn listen(host: &str, port: u16) -> Result<(TcpListener, String), StartupError> {
    let address = format!("{host}:{port}");
    let listener = TcpListener::bind(&address).map_err(bind_error(&address))?;
    Ok((listener, address))
}

fn bind_error(address: &str) -> impl Fn(std::io::Error) -> StartupError + '_ {
    move |source| StartupError::Bind {
        address: address.to_owned(),
        source,
    }
}

/// Migrations (when `database.migrate_on_start`), then the background
/// workers' own pool, which also shows the settings make a valid pool before
/// any HTTP worker builds its own; and the demo merchant when the demo is on.
async fn background_database(settings: &Settings) -> Result<Database, StartupError> {
    if settings.database.migrate_on_start {
        let applied = db::migrate(&settings.database).await?;
        tracing::info!(applied, "migrations up to date");
    }
    let background_db = Database::new(&settings.database, BACKGROUND_CONNECTIONS)?;
    // Ids carry the database's time from the first one on (`crate::clock`);
    // a database not readable yet leaves the local clock until the worker's
    // next measurement.
    if let Err(error) = workers::clock::measure(&background_db).await {
        tracing::warn!(error = %crate::telemetry::error_chain(&error), "cannot read the database's clock yet");
    }
    if settings.demo.enabled {
        http::demo::ensure_demo_merchant(&background_db).await?;
    }
    Ok(background_db)
}

/// The metrics exporter, when `metrics.enabled`; the background pool is
/// the first it reports on.
fn exporter(settings: &Settings, background_db: &Database) -> Option<web::Data<Exporter>> {
    settings.metrics.enabled.then(|| {
        let pools = Pools::default();
        pools.register("background", background_db.pool().clone());
        web::Data::new(Exporter {
            handle: crate::metrics::handle(),
            pools,
        })
    })
}

/// What every HTTP worker builds its `App` from. Cloned into each worker,
/// which gives the services a pool of its own (`worker_database`).
#[derive(Clone)]
struct ApiFactory {
    database: DatabaseSettings,
    worker_connections: usize,
    background_db: Database,
    charges: Charges,
    refunds: Refunds,
    endpoints: WebhookEndpoints,
    api_keys: web::Data<ApiKeyCache>,
    limits: web::Data<HttpLimits>,
    document: web::Data<http::openapi::Rendered>,
    demo_page: web::Data<http::demo::DemoPage>,
    /// Registers each worker's pool; also served on the API's port when
    /// `served.metrics`.
    exporter: Option<web::Data<Exporter>>,
    served: http::routes::Served,
    next_worker: Arc<AtomicUsize>,
    /// How many workers have warmed their pool (`warm_up`), of `workers`.
    warm: watch::Sender<usize>,
    workers: usize,
}

impl ApiFactory {
    fn new(
        settings: &Settings,
        background_db: &Database,
        processor: Arc<dyn PaymentProcessor>,
        exporter: Option<web::Data<Exporter>>,
        workers: usize,
    ) -> Result<Self, StartupError> {
        let served = http::routes::Served {
            demo: settings.demo.enabled,
            metrics: exporter.is_some() && settings.metrics.port == 0,
        };
        let document = http::openapi::Rendered::new(served).map_err(StartupError::OpenApi)?;
        let (keys, recovery) = (&settings.idempotency, &settings.recovery);
        Ok(Self {
            database: settings.database.clone(),
            worker_connections: settings.database.pool_size.div_ceil(workers).max(1),
            background_db: background_db.clone(),
            charges: Charges::new(background_db.clone(), processor.clone(), keys, recovery),
            refunds: Refunds::new(background_db.clone(), processor, keys, recovery),
            endpoints: WebhookEndpoints::new(background_db.clone(), &settings.webhooks),
            api_keys: web::Data::new(ApiKeyCache::new(&settings.auth)),
            limits: web::Data::new(HttpLimits {
                max_body_bytes: settings.http.max_body_bytes,
                body_timeout: settings.http.body_timeout,
            }),
            document: web::Data::new(document),
            demo_page: web::Data::new(http::demo::DemoPage::new(keys.retention())),
            exporter,
            served,
            next_worker: Arc::new(AtomicUsize::new(0)),
            warm: watch::Sender::new(0),
            workers,
        })
    }

    /// One worker's `App`; runs on that worker's thread.
    fn app(
        &self,
    ) -> App<
        impl ServiceFactory<
            ServiceRequest,
            Config = (),
            Response = ServiceResponse<BoxBody>,
            Error = actix_web::Error,
            InitError = (),
        >,
    > {
        let db = worker_database(&self.database, self.worker_connections, &self.background_db);
        let (connections, prepare) = (self.worker_connections, self.database.prepared_statements);
        actix_web::rt::spawn(warm_up(db.clone(), connections, prepare, self.warm.clone()));
        let (warm, workers) = (self.warm.clone(), self.workers);
        if let Some(exporter) = &self.exporter {
            let worker = self.next_worker.fetch_add(1, Ordering::Relaxed);
            let name = format!("worker-{worker}");
            exporter.pools.register(name, db.pool().clone());
        }
        let api_exporter = self.exporter.clone().filter(|_| self.served.metrics);
        let served = self.served;
        App::new()
            .app_data(web::Data::new(self.charges.with_database(db.clone())))
            .app_data(web::Data::new(self.refunds.with_database(db.clone())))
            .app_data(web::Data::new(Events::new(db.clone())))
            .app_data(web::Data::new(self.endpoints.with_database(db.clone())))
            .app_data(web::Data::new(db))
            .app_data(self.api_keys.clone())
            .app_data(self.limits.clone())
            .app_data(self.document.clone())
            .app_data(self.demo_page.clone())
            .wrap_fn(http::observe)
            .wrap_fn(move |request, service| {
                let warming = (request.path() == "/readyz").then(|| warm.subscribe());
                let call = service.call(request);
                async move {
                    if let Some(warm) = warming {
                        when_warm(warm, workers).await;
                    }
                    call.await
                }
            })
            .configure(|cfg| {
                if let Some(exporter) = api_exporter {
                    cfg.app_data(exporter);
                }
                http::configure(cfg, served);
            })
    }
}

/// A server of its own for `GET /metrics` on `metrics.port` of
/// `server.host`, when metrics are on and that port is set. Runs until
/// stopped through its handle.
fn metrics_server(
    settings: &Settings,
    exporter: Option<web::Data<Exporter>>,
    limits: &ServerLimits,
) -> Result<Option<ServerHandle>, StartupError> {
    let (Some(exporter), port @ 1..) = (exporter, settings.metrics.port) else {
        return Ok(None);
    };
    let (listener, address) = listen(&settings.server.host, port)?;
    let limits = ServerLimits {
        workers: 1,
        ..limits.clone()
    };
    tracing::info!(%address, "metrics listening");
    let server = http::server::serve(listener, &limits, move || {
        App::new()
            .app_data(exporter.clone())
            .configure(|cfg| http::routes::metrics_port().register(cfg))
    })
    .map_err(bind_error(&address))?;
    let handle = server.handle();
    tokio::spawn(server);
    Ok(Some(handle))
}

/// The background workers, stopped by `stop`: key sweeper, recovery (of
/// the charges and refunds the API serves), webhook dispatcher, event
/// retention, and (for the metrics only) the delivery backlog measurement.
fn start_workers(
    settings: &Settings,
    background_db: &Database,
    (charges, refunds): (Charges, Refunds),
    stop: &CancellationToken,
) -> Result<Vec<JoinHandle<()>>, StartupError> {
    let dispatcher_settings = crate::service::dispatch::database_settings(&settings.database);
    let dispatcher_db = Database::new(&dispatcher_settings, DISPATCHER_CONNECTIONS - 1)?;
    let dispatcher = Dispatcher::new(
        Database::new(&dispatcher_settings, 1)?,
        dispatcher_db.clone(),
        Sender::new(&settings.webhooks).map_err(StartupError::WebhookClient)?,
        settings.webhooks.clone(),
    );
    let (db, stop) = (background_db, stop);
    let mut background = vec![
        tokio::spawn(workers::sweeper::run(
            db.clone(),
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
            db.clone(),
            settings.events.clone(),
            stop.clone(),
        )),
    ];
    // No measuring when nobody can read the measurements.
    if settings.metrics.enabled {
        let backlog = workers::backlog::run(dispatcher_db, stop.clone());
        background.push(tokio::spawn(backlog));
    }
    Ok(background)
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
        let background_db = background_database(settings).await?;
        let (listener, address) = listen(&settings.server.host, settings.server.port)?;
        let port = listener.local_addr().map_err(bind_error(&address))?.port();
        let exporter = exporter(settings, &background_db);
        let limits = ServerLimits::new(settings);
        let api = ApiFactory::new(
            settings,
            &background_db,
            processor,
            exporter.clone(),
            limits.workers,
        )?;
        let recovered = (api.charges.clone(), api.refunds.clone());
        let server = http::server::serve(listener, &limits, move || api.app())
            .map_err(bind_error(&address))?;
        let metrics_server = metrics_server(settings, exporter, &limits)?;
        let stop = CancellationToken::new();
        let background = start_workers(settings, &background_db, recovered, &stop)?;
        tracing::info!(%address, port, "chargeonce listening");
        if settings.demo.enabled {
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
