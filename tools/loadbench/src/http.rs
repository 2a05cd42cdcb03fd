//! The load client: keep-alive HTTP/1.1 connections (hyper), one per
//! simulated client, and the one request the benchmark sends,
//! `POST /v1/charges`.
//!
//! A connection sends its next request only when the previous answer has
//! been read to its last byte (a closed loop, like wrk). A request's latency
//! runs from handing it to the connection until that last byte, so it
//! includes the time the service's answer waited in the socket for this
//! single-threaded client to read it; the report shows how busy the client
//! was.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Every charge request carries this body. The simulated processor treats
/// amounts ending in 02, 05 and 09 specially; 1000 simply succeeds.
pub const BODY: &str = r#"{"amount":1000,"currency":"USD"}"#;
/// The answer header that marks a replayed answer.
const REPLAYED: &str = "idempotent-replayed";

/// One keep-alive HTTP/1.1 connection.
pub struct Http {
    sender: SendRequest<Full<Bytes>>,
}

/// One answer: status, whether it was a replay, and timings.
pub struct Answer {
    pub status: StatusCode,
    pub replayed: bool,
    pub latency: Duration,
    pub finished: Instant,
}

impl Http {
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        // Requests are small and latency-bound: no Nagle delay.
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        tokio::spawn(async move {
            // An error ends the connection; the next send reports it.
            let _ = connection.await;
        });
        Ok(Self { sender })
    }

    /// Sends and reads the whole answer.
    pub async fn send(&mut self, request: Request<Full<Bytes>>) -> Result<Answer> {
        self.sender
            .ready()
            .await
            .context("the service closed the connection")?;
        let started = Instant::now();
        let response = self
            .sender
            .send_request(request)
            .await
            .context("the request got no answer")?;
        let status = response.status();
        let replayed = response
            .headers()
            .get(REPLAYED)
            .is_some_and(|value| value == "true");
        response
            .into_body()
            .collect()
            .await
            .context("reading the answer")?;
        let finished = Instant::now();
        Ok(Answer {
            status,
            replayed,
            latency: finished - started,
            finished,
        })
    }
}

/// `count` connections, opened one after the other.
pub async fn connect_many(addr: SocketAddr, count: usize) -> Result<Vec<Http>> {
    let mut connections = Vec::with_capacity(count);
    for _ in 0..count {
        connections.push(Http::connect(addr).await?);
    }
    Ok(connections)
}

/// POST /v1/charges for the bench merchant, with the headers built once.
pub struct Api {
    pub addr: SocketAddr,
    host: HeaderValue,
    authorization: HeaderValue,
    body: Bytes,
}

impl Api {
    pub fn new(port: u16, api_key: &str) -> Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Ok(Self {
            addr,
            host: HeaderValue::from_str(&addr.to_string()).context("Host header")?,
            authorization: HeaderValue::from_str(&format!("Bearer {api_key}"))
                .context("the API key is not a valid header value")?,
            body: Bytes::from_static(BODY.as_bytes()),
        })
    }

    /// A charge request with this idempotency key.
    pub fn charge(&self, key: &str) -> Result<Request<Full<Bytes>>> {
        Request::builder()
            .method(Method::POST)
            .uri("/v1/charges")
            .header(HOST, self.host.clone())
            .header(AUTHORIZATION, self.authorization.clone())
            .header("idempotency-key", key)
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(self.body.clone()))
            .context("building a charge request")
    }
}
