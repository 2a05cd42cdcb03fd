//! A webhook receiver under the test's control: a real HTTP/1.1 server on a
//! free port (hyper's, because it can also drop a connection without
//! answering), which answers what the test scripts, after a delay if asked,
//! records every request, and notes when one `webhook-id` arrives while
//! another request with the same id is still being handled (an overlap,
//! which the dispatcher's leases must never cause). Plus the API calls the
//! webhook tests share.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// What the receiver does with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Status(u16),
    /// Close the connection without answering.
    Drop,
}

/// One request as it arrived.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub timestamp: String,
    pub signature: String,
    pub content_type: String,
    pub body: Vec<u8>,
    /// The sender's address (its local port tells instances apart).
    pub peer: SocketAddr,
    pub answer: Answer,
    pub at: Instant,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The headers a Standard Webhooks verifier needs.
    pub fn headers(&self) -> Value {
        serde_json::json!({
            "webhook-id": self.id,
            "webhook-timestamp": self.timestamp,
            "webhook-signature": self.signature,
        })
    }
}

struct State {
    /// Answers for the next requests, in order; then `otherwise`.
    script: VecDeque<Answer>,
    otherwise: Answer,
    delay: Duration,
    received: Vec<Received>,
    /// How many requests of each id are being handled right now.
    in_flight: HashMap<String, usize>,
    /// Ids that arrived while a request with the same id was in flight.
    overlaps: Vec<String>,
}

pub struct Receiver {
    pub url: String,
    pub port: u16,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Receiver {
    /// A receiver answering 200 to everything until told otherwise.
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let url = format!("http://{address}/hooks");
        let state = Arc::new(Mutex::new(State {
            script: VecDeque::new(),
            otherwise: Answer::Status(200),
            delay: Duration::ZERO,
            received: Vec::new(),
            in_flight: HashMap::new(),
            overlaps: Vec::new(),
        }));
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, peer)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        handle(state.clone(), peer, request)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            url,
            port: address.port(),
            state,
            accept,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    /// The next requests get these answers, in order; later ones the
    /// `otherwise` answer.
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.state().script.extend(answers);
    }

    pub fn otherwise(&self, answer: Answer) {
        self.state().otherwise = answer;
    }

    /// How long each request is held before its answer.
    pub fn delay(&self, delay: Duration) {
        self.state().delay = delay;
    }

    pub fn received(&self) -> Vec<Received> {
        self.state().received.clone()
    }

    pub fn overlaps(&self) -> Vec<String> {
        self.state().overlaps.clone()
    }

    /// Requests being handled right now.
    pub fn in_flight(&self) -> usize {
        self.state().in_flight.values().sum()
    }

    /// How many requests arrived per webhook-id.
    pub fn arrivals(&self) -> HashMap<String, usize> {
        let mut arrivals = HashMap::new();
        for received in &self.state().received {
            *arrivals.entry(received.id.clone()).or_insert(0) += 1;
        }
        arrivals
    }

    /// Waits up to `limit` until a request is being handled (held by the
    /// receiver's delay).
    pub async fn wait_for_in_flight(&self, limit: Duration) {
        let started = Instant::now();
        while self.in_flight() == 0 {
            assert!(
                started.elapsed() < limit,
                "nothing in flight within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until `done` holds for what arrived so far.
    pub async fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let received = self.received();
            if done(&received) {
                return received;
            }
            assert!(
                started.elapsed() < limit,
                "waited {limit:?} for {what}; received {} requests: {:?}",
                received.len(),
                received
                    .iter()
                    .map(|r| (&r.id, r.answer))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Marks an id in flight for as long as it lives, even if hyper drops the
/// handler because the sender went away.
struct InFlight {
    state: Arc<Mutex<State>>,
    id: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = state.in_flight.get_mut(&self.id) {
            *count -= 1;
            if *count == 0 {
                state.in_flight.remove(&self.id);
            }
        }
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    peer: SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let header = |name: &str| {
        request
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let (id, timestamp, signature, content_type) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
        header("content-type"),
    );
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let (answer, delay, _in_flight) = {
        let mut locked = state.lock().unwrap();
        let answer = locked.script.pop_front().unwrap_or(locked.otherwise);
        let count = locked.in_flight.entry(id.clone()).or_insert(0);
        *count += 1;
        if *count > 1 {
            locked.overlaps.push(id.clone());
        }
        locked.received.push(Received {
            id: id.clone(),
            timestamp,
            signature,
            content_type,
            body,
            peer,
            answer,
            at: Instant::now(),
        });
        let guard = InFlight {
            state: state.clone(),
            id,
        };
        (answer, locked.delay, guard)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match answer {
        Answer::Status(status) => Ok(Response::builder()
            .status(status)
            .body(Full::new(Bytes::from_static(b"ok")))
            .unwrap()),
        // An error from the service makes hyper close the connection
        // without writing an answer.
        Answer::Drop => Err(std::io::Error::other("dropping the connection")),
    }
}

// The API calls of the webhook tests.

/// POST /v1/webhook_endpoints: (status, Idempotent-Replayed, body).
pub async fn post_endpoint(
    base_url: &str,
    api_key: &str,
    idempotency_key: &str,
    body: &str,
) -> (u16, Option<String>, String) {
    let response = reqwest::Client::new()
        .post(format!("{base_url}/v1/webhook_endpoints"))
        .bearer_auth(api_key)
        .header("Idempotency-Key", idempotency_key)
        .header("Content-Type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (status, replayed, response.text().await.expect("body"))
}

/// Creates an endpoint for `url` (all types unless `event_types`); returns
/// the creation answer.
pub async fn create_endpoint(
    base_url: &str,
    api_key: &str,
    url: &str,
    event_types: Option<&[&str]>,
) -> Value {
    let body = serde_json::json!({"url": url, "event_types": event_types}).to_string();
    let key = uuid::Uuid::new_v4().to_string();
    let (status, _, answer) = post_endpoint(base_url, api_key, &key, &body).await;
    assert_eq!(status, 201, "{answer}");
    serde_json::from_str(&answer).unwrap()
}

/// DELETE /v1/webhook_endpoints/{id}: (status, body).
pub async fn delete_endpoint(base_url: &str, api_key: &str, id: &str) -> (u16, Value) {
    let response = reqwest::Client::new()
        .delete(format!("{base_url}/v1/webhook_endpoints/{id}"))
        .bearer_auth(api_key)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    (status, response.json().await.expect("JSON"))
}

/// GET `path` as `api_key`: (status, body text).
pub async fn get(base_url: &str, api_key: &str, path: &str) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(format!("{base_url}{path}"))
        .bearer_auth(api_key)
        .send()
        .await
        .expect("request sent");
    let status = response.status().as_u16();
    (status, response.text().await.expect("body"))
}

/// Ids that arrived more than once.
pub fn duplicates(arrivals: &HashMap<String, usize>) -> HashSet<String> {
    arrivals
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(id, _)| id.clone())
        .collect()
}

/// A receiver that accepts connections and never answers (a hung server),
/// counting the connections it holds: how many at most at once, and how
/// many in all. A connection ends when the sender gives up and closes it.
pub struct Hung {
    pub url: String,
    counts: Arc<Mutex<HungCounts>>,
    accept: JoinHandle<()>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct HungCounts {
    pub open: usize,
    pub most_open: usize,
    pub accepted: usize,
}

impl Drop for Hung {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Hung {
    pub async fn start() -> Self {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hooks", listener.local_addr().unwrap());
        let counts = Arc::new(Mutex::new(HungCounts::default()));
        let shared = counts.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                {
                    let mut counts = shared.lock().unwrap();
                    counts.open += 1;
                    counts.accepted += 1;
                    counts.most_open = counts.most_open.max(counts.open);
                }
                let shared = shared.clone();
                tokio::spawn(async move {
                    // Read (and ignore) until the sender closes.
                    let mut buffer = [0u8; 4096];
                    while matches!(socket.read(&mut buffer).await, Ok(n) if n > 0) {}
                    shared.lock().unwrap().open -= 1;
                });
            }
        });
        Self {
            url,
            counts,
            accept,
        }
    }

    pub fn counts(&self) -> HungCounts {
        *self.counts.lock().unwrap()
    }
}
