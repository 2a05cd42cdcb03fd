//! The HTTP server: actix-web's `HttpServer` around the `App`, used through
//! its documented settings only, plus a connection cap per worker.
//!
//! **The cap** (`http.max_connections`, lowered to fit the process's file
//! descriptors). Each connection is counted as actix-web hands it over
//! (`HttpServer::on_connect`), and one over the cap is marked; `admission`,
//! a middleware in front of the App, answers a marked connection's request
//! with `503 service_unavailable` and closes it, so slow clients holding
//! every slot cannot make a new client wait without an answer. Behind that,
//! `HttpServer::max_connections` (twice the cap and some) stops accepting
//! altogether, so descriptors stay bounded whatever clients do. Slow clients
//! are bounded in time too: `http.header_timeout_ms` for the request head,
//! `http.body_timeout_ms` for the body (`super::body`).
//!
//! A request head actix-http cannot parse, one too large, or one that does
//! not arrive in time never reaches the App: actix-http answers it itself
//! (a bare `400`, `431` or `408`, no body) and closes the connection. A
//! chunked body whose framing breaks as it arrives with the head ends the
//! connection without an answer.

use std::any::Any;
use std::cell::Cell;
use std::io;
use std::time::Duration;

use actix_web::body::BoxBody;
use actix_web::dev::{
    Extensions, Server, Service, ServiceFactory, ServiceRequest, ServiceResponse,
};
use actix_web::http::ConnectionType;
use actix_web::{App, HttpServer, ResponseError};
use futures_util::future::{self, Either, Ready};

use crate::config::Settings;
use crate::error::ApiError;

/// How the server treats connections.
#[derive(Debug, Clone)]
pub struct ServerLimits {
    pub workers: usize,
    /// Most connections one worker holds at once.
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub keep_alive: Duration,
    pub shutdown_timeout_secs: u64,
}

impl ServerLimits {
    /// The limits `settings` ask for, with `server.workers = 0` resolved to
    /// the number of cores and the cap lowered to fit the open-file limit.
    pub fn new(settings: &Settings) -> Self {
        let workers = match settings.server.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        Self {
            workers,
            max_connections: connection_cap(
                settings.http.max_connections.get(),
                workers,
                settings.database.pool_size,
            ),
            header_timeout: settings.http.header_timeout,
            keep_alive: settings.http.keep_alive,
            shutdown_timeout_secs: settings.server.shutdown_timeout.as_secs(),
        }
    }
}

/// Serves the App that `app` builds (once per worker) on `listener`, with
/// the cap answered in front of it (`admission`).
pub fn serve<F, T>(
    listener: std::net::TcpListener,
    limits: &ServerLimits,
    app: F,
) -> io::Result<Server>
where
    F: Fn() -> App<T> + Send + Clone + 'static,
    T: ServiceFactory<
            ServiceRequest,
            Config = (),
            Response = ServiceResponse<BoxBody>,
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
{
    let cap = limits.max_connections;
    Ok(HttpServer::new(move || app().wrap_fn(admission))
        .workers(limits.workers)
        .shutdown_timeout(limits.shutdown_timeout_secs)
        .keep_alive(limits.keep_alive)
        .client_request_timeout(limits.header_timeout)
        .tcp_nodelay(true)
        // After an answer sent before the request's body was read (503 over
        // the cap, 413, the body deadline's 408), actix-http keeps reading
        // and dropping what the client still sends before it closes, so the
        // close is not a reset that could destroy the answer before the
        // client reads it; this long at most, so a refused connection's
        // descriptor is soon free again.
        .client_disconnect_timeout(LINGER)
        // Above our own cap, so connections over it are taken and answered
        // 503 instead of waiting in the backlog; and a bound for
        // descriptors, since one over the cap is held until its first
        // request head arrives or `http.header_timeout_ms` passes.
        .max_connections(cap * 2 + 64)
        .on_connect(move |_connection: &dyn Any, data: &mut Extensions| count(cap, data))
        .listen(listener)?
        .run())
}

/// How long a connection closed after an early answer is drained.
const LINGER: Duration = Duration::from_millis(500);

thread_local! {
    /// Connections the worker on this thread holds. A connection lives on
    /// the worker thread that took it from the start to the end, so a
    /// counter per thread is a counter per worker.
    static OPEN: Cell<usize> = const { Cell::new(0) };
}

/// Counts a connection against its worker's cap until the connection ends.
struct Slot;

impl Drop for Slot {
    fn drop(&mut self) {
        // `try_with`: a connection dropped while the thread exits finds the
        // counter gone, and then there is nothing left to count.
        let _ = OPEN.try_with(|open| open.set(open.get().saturating_sub(1)));
    }
}

/// Marks a connection that came when every slot of its worker was taken.
struct OverCap;

/// Called for each new connection: takes a slot, or marks it over the cap.
fn count(cap: usize, data: &mut Extensions) {
    let admitted = OPEN.with(|open| {
        let held = open.get();
        if held < cap {
            open.set(held + 1);
        }
        held < cap
    });
    if admitted {
        data.insert(Slot);
    } else {
        data.insert(OverCap);
    }
}

/// The App's outermost middleware: a request on a connection over the cap
/// gets `503 service_unavailable` without reaching the App, and its
/// connection is closed after the answer.
fn admission<S>(
    request: ServiceRequest,
    service: &S,
) -> Either<Ready<Result<ServiceResponse, actix_web::Error>>, S::Future>
where
    S: Service<ServiceRequest, Response = ServiceResponse<BoxBody>, Error = actix_web::Error>,
{
    if request.conn_data::<OverCap>().is_none() {
        return Either::Right(service.call(request));
    }
    tracing::debug!("refused a connection over the cap");
    let error =
        ApiError::ServiceUnavailable("every connection slot of this worker is taken".into());
    let mut response = error.error_response();
    response
        .head_mut()
        .set_connection_type(ConnectionType::Close);
    Either::Left(future::ok(request.into_response(response)))
}

/// Descriptors kept free beyond the HTTP connections: database connections,
/// log and pipe files, and room for connections over the cap.
const RESERVED_DESCRIPTORS: u64 = 256;

/// The per-worker connection cap: `configured`, or less if the process may
/// not open that many files. The soft limit on open files is raised to the
/// hard limit first (the default soft limit, often 1024, is a leftover of
/// `select`). Half of what is left goes to held connections, so the
/// connections over the cap (at most as many again) never run out.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_admits_up_to_its_cap_and_frees_a_slot_when_a_connection_ends() {
        std::thread::spawn(|| {
            let mut connections: Vec<Extensions> = (0..3)
                .map(|_| {
                    let mut data = Extensions::new();
                    count(2, &mut data);
                    data
                })
                .collect();
            let over: Vec<bool> = connections
                .iter()
                .map(|c| c.contains::<OverCap>())
                .collect();
            assert_eq!(over, [false, false, true]);
            connections.remove(0);
            let mut next = Extensions::new();
            count(2, &mut next);
            assert!(next.contains::<Slot>(), "a slot was given back");
            drop(connections);
            assert_eq!(OPEN.with(Cell::get), 1);
        })
        .join()
        .expect("the test thread");
    }
}
