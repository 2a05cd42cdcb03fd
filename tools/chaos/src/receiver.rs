//! The webhook receiver (hyper's server can drop a connection unanswered):
//! while faults run it fails a share of deliveries; it counts each `webhook-id`.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context as _, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::net::TcpListener;

use crate::workload::lock;

/// Shares of deliveries answered 500 and dropped while faults are on.
pub const FAIL_RATE: f64 = 0.15;
pub const DROP_RATE: f64 = 0.10;

#[derive(Default)]
pub struct Tally {
    /// Requests, whatever the answer; of them, answered 500 and dropped.
    pub arrived: u64,
    pub answered_500: u64,
    pub dropped: u64,
    /// 2xx answers per `webhook-id`.
    pub acknowledged: HashMap<String, u64>,
    /// Bodies whose `id` was not the `webhook-id` header.
    pub mismatched: Vec<String>,
}

struct State {
    failing: AtomicBool,
    rng: Mutex<StdRng>,
    tally: Mutex<Tally>,
}

pub struct Receiver {
    pub url: String,
    state: Arc<State>,
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
        });
        let shared = state.clone();
        tokio::spawn(async move {
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
        Ok(Self { url: format!("http://127.0.0.1:{port}/hooks"), state })
    }

    pub fn stop_failing(&self) {
        self.state.failing.store(false, Ordering::SeqCst);
    }

    pub fn tally(&self) -> MutexGuard<'_, Tally> {
        lock(&self.state.tally)
    }
}

/// 204, or while failing at random 500 or an error (hyper drops the connection).
async fn handle(state: &State, request: Request<Incoming>) -> io::Result<Response<Full<Bytes>>> {
    let id = request.headers().get("webhook-id").and_then(|v| v.to_str().ok());
    let id = id.unwrap_or_default().to_owned();
    let body = request.into_body().collect().await.map_err(io::Error::other)?.to_bytes();
    let roll: f64 = if state.failing.load(Ordering::SeqCst) { lock(&state.rng).gen() } else { 1.0 };
    let mut tally = lock(&state.tally);
    tally.arrived += 1;
    let event = serde_json::from_slice::<serde_json::Value>(&body).unwrap_or_default();
    if event["id"].as_str() != Some(id.as_str()) {
        tally.mismatched.push(id.clone());
    }
    let mut response = Response::new(Full::new(Bytes::new()));
    if roll < FAIL_RATE {
        tally.answered_500 += 1;
        *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    } else if roll < FAIL_RATE + DROP_RATE {
        tally.dropped += 1;
        return Err(io::Error::other("dropped on purpose"));
    } else {
        *tally.acknowledged.entry(id).or_default() += 1;
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    Ok(response)
}
