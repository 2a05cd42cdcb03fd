//! The webhook receiver of the run: a real HTTP/1.1 server (hyper's, which
//! can drop a connection without answering) on a free port. While faults
//! are on it fails a share of deliveries, answering 500 or closing the
//! connection without an answer; afterwards it accepts everything. It
//! records each `webhook-id` that arrived and each it acknowledged (2xx).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context as _, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Share of deliveries answered 500 while faults are on.
pub const FAIL_RATE: f64 = 0.15;
/// Share of deliveries dropped without an answer while faults are on.
pub const DROP_RATE: f64 = 0.10;

#[derive(Default)]
pub struct Tally {
    /// Requests per `webhook-id`, whatever the answer.
    pub arrived: HashMap<String, u64>,
    /// 2xx answers per `webhook-id`.
    pub acknowledged: HashMap<String, u64>,
    /// Bodies whose `id` was not the `webhook-id` header.
    pub mismatched: Vec<String>,
}

struct State {
    failing: AtomicBool,
    rng: Mutex<StdRng>,
    tally: Mutex<Tally>,
    answered_500: AtomicU64,
    dropped: AtomicU64,
}

pub struct Receiver {
    pub url: String,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

enum Verdict {
    Accept,
    Fail,
    Drop,
}

impl Receiver {
    pub async fn start(seed: u64) -> Result<Self> {
        let listener =
            TcpListener::bind("127.0.0.1:0").await.context("binding the webhook receiver")?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(State {
            failing: AtomicBool::new(true),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            tally: Mutex::new(Tally::default()),
            answered_500: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        });
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { handle(&state, request).await }
                    });
                    // An error is a dropped connection: ours, on purpose.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { url: format!("http://127.0.0.1:{port}/hooks"), state, accept })
    }

    /// From now on, every delivery is accepted.
    pub fn stop_failing(&self) {
        self.state.failing.store(false, Ordering::SeqCst);
    }

    pub fn answered_500(&self) -> u64 {
        self.state.answered_500.load(Ordering::SeqCst)
    }

    pub fn dropped(&self) -> u64 {
        self.state.dropped.load(Ordering::SeqCst)
    }

    /// Runs `f` on what was received so far.
    pub fn with_tally<T>(&self, f: impl FnOnce(&Tally) -> T) -> T {
        f(&self.state.tally.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The error that makes hyper close the connection without an answer.
#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

async fn handle(
    state: &State,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let id = request
        .headers()
        .get("webhook-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = match request.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Err(Dropped),
    };
    let verdict = if state.failing.load(Ordering::SeqCst) {
        let roll: f64 = state.rng.lock().unwrap_or_else(|p| p.into_inner()).gen();
        if roll < FAIL_RATE {
            Verdict::Fail
        } else if roll < FAIL_RATE + DROP_RATE {
            Verdict::Drop
        } else {
            Verdict::Accept
        }
    } else {
        Verdict::Accept
    };
    {
        let mut tally = state.tally.lock().unwrap_or_else(|p| p.into_inner());
        *tally.arrived.entry(id.clone()).or_default() += 1;
        let body_id = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|event| event["id"].as_str().map(str::to_owned));
        if body_id.as_deref() != Some(id.as_str()) {
            tally.mismatched.push(id.clone());
        }
        if matches!(verdict, Verdict::Accept) {
            *tally.acknowledged.entry(id).or_default() += 1;
        }
    }
    let status = match verdict {
        Verdict::Accept => StatusCode::NO_CONTENT,
        Verdict::Fail => {
            state.answered_500.fetch_add(1, Ordering::SeqCst);
            StatusCode::INTERNAL_SERVER_ERROR
        }
        Verdict::Drop => {
            state.dropped.fetch_add(1, Ordering::SeqCst);
            return Err(Dropped);
        }
    };
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    Ok(response)
}
