//! The load client: keep-alive HTTP/1.1 connections, one per simulated
//! client, and the one request the benchmark sends, `POST /v1/charges`.
//!
//! A connection sends its next request only when the previous answer has
//! been read to its last byte (a closed loop, like wrk). A request's latency
//! runs from handing it to the connection until that last byte, so it
//! includes the time the service's answer waited in the socket for this
//! single-threaded client to read it; the report shows how busy the client
//! was.
//!
//! Why not hyper's client (used until round 11): the load client shares the
//! machine with what it measures, and at one client its CPU is part of every
//! round trip. hyper's connection runs as a task of its own, fed through a
//! channel, and builds a header map per answer: 14–17 µs of user CPU per
//! request here, against 5 µs for pgbench's client, the floor's load
//! generator. This client writes a request prepared up to its key, reads
//! the answer's head with `httparse` (hyper's own parser) and skips the
//! body by its `Content-Length`: 5–6 µs (BENCHMARKS.md, round 11). It speaks
//! only what the service answers: a `Content-Length` body, keep-alive or
//! `Connection: close`.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Every charge request carries this body. The simulated processor treats
/// amounts ending in 02, 05 and 09 specially; 1000 simply succeeds.
pub const BODY: &str = r#"{"amount":1000,"currency":"USD"}"#;
/// The answer header that marks a replayed answer.
const REPLAYED: &str = "idempotent-replayed";
/// More header lines than any answer of the service has.
const MAX_HEADERS: usize = 32;
/// An answer head longer than this is not the service's.
const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Nor is a body longer than this (a list page is a few hundred kB at most).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// One keep-alive HTTP/1.1 connection.
pub struct Http {
    stream: TcpStream,
    /// Bytes read and not yet consumed: `buffer[..filled]`.
    buffer: Vec<u8>,
    filled: usize,
    /// The last answer said `Connection: close`.
    closed: bool,
}

/// One answer: status, whether it was a replay, and timings.
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    pub latency: Duration,
    pub finished: Instant,
}

impl Answer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// A request, ready to write.
pub struct Request(Vec<u8>);

/// What an answer's head says about the rest.
struct Head {
    status: u16,
    replayed: bool,
    /// Head and body.
    length: usize,
    close: bool,
}

impl Http {
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        // Requests are small and latency-bound: no Nagle delay.
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        Ok(Self {
            stream,
            buffer: vec![0; 4096],
            filled: 0,
            closed: false,
        })
    }

    /// Sends and reads the whole answer.
    pub async fn send(&mut self, request: Request) -> Result<Answer> {
        if self.closed {
            bail!("the service closed the connection");
        }
        let started = Instant::now();
        self.stream
            .write_all(&request.0)
            .await
            .context("sending the request")?;
        let head = loop {
            if let Some(head) = parse_head(&self.buffer[..self.filled])? {
                break head;
            }
            if self.filled >= MAX_HEAD_BYTES {
                bail!("an answer head of over {MAX_HEAD_BYTES} bytes");
            }
            self.read_more().await?;
        };
        while self.filled < head.length {
            self.read_more().await?;
        }
        let finished = Instant::now();
        // Anything after this answer stays for the next (never, in a closed
        // loop).
        self.buffer.copy_within(head.length..self.filled, 0);
        self.filled -= head.length;
        self.closed = head.close;
        Ok(Answer {
            status: head.status,
            replayed: head.replayed,
            latency: finished - started,
            finished,
        })
    }

    async fn read_more(&mut self) -> Result<()> {
        if self.filled == self.buffer.len() {
            self.buffer.resize(self.buffer.len() * 2, 0);
        }
        let read = self
            .stream
            .read(&mut self.buffer[self.filled..])
            .await
            .context("reading the answer")?;
        if read == 0 {
            bail!("the service closed the connection");
        }
        self.filled += read;
        Ok(())
    }
}

/// The head at the start of `bytes`, or `None` if it is not all there yet.
fn parse_head(bytes: &[u8]) -> Result<Option<Head>> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let head_length = match response
        .parse(bytes)
        .context("an answer that is not HTTP")?
    {
        httparse::Status::Complete(length) => length,
        httparse::Status::Partial => return Ok(None),
    };
    let status = response.code.context("an answer without a status")?;
    let mut body_length = None;
    let mut replayed = false;
    let mut close = false;
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value).unwrap_or("").trim();
        if header.name.eq_ignore_ascii_case("content-length") {
            body_length = Some(
                value
                    .parse::<usize>()
                    .with_context(|| format!("Content-Length {value:?}"))?,
            );
        } else if header.name.eq_ignore_ascii_case(REPLAYED) {
            replayed = value == "true";
        } else if header.name.eq_ignore_ascii_case("connection") {
            close = value.eq_ignore_ascii_case("close");
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            bail!("an answer in Transfer-Encoding {value:?}; this client reads Content-Length");
        }
    }
    // Only 204 and 304 may come without a length and a body.
    let body_length = match (body_length, status) {
        (Some(length), _) if length > MAX_BODY_BYTES => {
            bail!("a {status} answer of {length} bytes")
        }
        (Some(length), _) => length,
        (None, 204 | 304) => 0,
        (None, _) => bail!("a {status} answer without Content-Length"),
    };
    Ok(Some(Head {
        status,
        replayed,
        length: head_length + body_length,
        close,
    }))
}

/// `count` connections, opened one after the other.
pub async fn connect_many(addr: SocketAddr, count: usize) -> Result<Vec<Http>> {
    let mut connections = Vec::with_capacity(count);
    for _ in 0..count {
        connections.push(Http::connect(addr).await?);
    }
    Ok(connections)
}

/// POST /v1/charges for the bench merchant, with all but the key written
/// once.
pub struct Api {
    pub addr: SocketAddr,
    /// The request line and every header but the key's, ending with the
    /// key's name.
    before_key: String,
}

impl Api {
    pub fn new(port: u16, api_key: &str) -> Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        if !header_safe(api_key) {
            bail!("the API key is not a valid header value");
        }
        let before_key = format!(
            "POST /v1/charges HTTP/1.1\r\n\
             host: {addr}\r\n\
             authorization: Bearer {api_key}\r\n\
             content-type: application/json\r\n\
             content-length: {}\r\n\
             idempotency-key: ",
            BODY.len()
        );
        Ok(Self { addr, before_key })
    }

    /// A charge request with this idempotency key.
    pub fn charge(&self, key: &str) -> Result<Request> {
        if !header_safe(key) {
            bail!("the idempotency key {key:?} is not a valid header value");
        }
        let mut bytes = Vec::with_capacity(self.before_key.len() + key.len() + 4 + BODY.len());
        bytes.extend_from_slice(self.before_key.as_bytes());
        bytes.extend_from_slice(key.as_bytes());
        bytes.extend_from_slice(b"\r\n\r\n");
        bytes.extend_from_slice(BODY.as_bytes());
        Ok(Request(bytes))
    }
}

/// Visible ASCII only: nothing that could end a header line.
fn header_safe(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    const REPLAY: &[u8] =
        b"HTTP/1.1 201 Created\r\ncontent-length: 7\r\nidempotent-replayed: true\r\n\r\n{\"a\":1}";
    const FIRST: &[u8] = b"HTTP/1.1 402 Payment Required\r\nContent-Length: 2\r\n\r\n{}";

    /// A server on a real socket: reads `requests` requests (heads up to the
    /// blank line, then the body by its length), hands each one's bytes
    /// back, and writes the matching answer in chunks of `chunk` bytes.
    async fn server(
        answers: Vec<&'static [u8]>,
        chunk: usize,
    ) -> (SocketAddr, tokio::task::JoinHandle<Vec<Vec<u8>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            let mut pending = Vec::new();
            for answer in answers {
                let request = loop {
                    if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        let total = end + 4 + BODY.len();
                        if pending.len() >= total {
                            break pending.drain(..total).collect::<Vec<u8>>();
                        }
                    }
                    let mut bytes = [0u8; 512];
                    let read = socket.read(&mut bytes).await.unwrap();
                    assert!(read > 0, "the client hung up");
                    pending.extend_from_slice(&bytes[..read]);
                };
                seen.push(request);
                for piece in answer.chunks(chunk) {
                    socket.write_all(piece).await.unwrap();
                    socket.flush().await.unwrap();
                    tokio::task::yield_now().await;
                }
            }
            seen
        });
        (addr, task)
    }

    #[tokio::test]
    async fn answers_read_in_pieces_on_one_connection() {
        let (addr, server) = server(vec![FIRST, REPLAY, FIRST], 1).await;
        let api = Api::new(addr.port(), "sk_test").unwrap();
        let mut http = Http::connect(addr).await.unwrap();

        let first = http.send(api.charge("k-1").unwrap()).await.unwrap();
        assert_eq!((first.status, first.replayed), (402, false));
        assert!(!first.is_success());
        let second = http.send(api.charge("k-2").unwrap()).await.unwrap();
        assert_eq!((second.status, second.replayed), (201, true));
        assert!(second.is_success());
        let third = http.send(api.charge("k-3").unwrap()).await.unwrap();
        assert_eq!(third.status, 402);

        let seen = server.await.unwrap();
        let request = String::from_utf8(seen[1].clone()).unwrap();
        assert!(
            request.starts_with("POST /v1/charges HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(
            request.contains("\r\nauthorization: Bearer sk_test\r\n"),
            "{request}"
        );
        assert!(
            request.contains("\r\nidempotency-key: k-2\r\n"),
            "{request}"
        );
        assert!(request.ends_with(&format!("\r\n\r\n{BODY}")), "{request}");
        // The request parses as HTTP, and says how long its body is.
        let mut headers = [httparse::EMPTY_HEADER; 8];
        let mut parsed = httparse::Request::new(&mut headers);
        let head = parsed.parse(request.as_bytes()).unwrap().unwrap();
        assert_eq!(request.len() - head, BODY.len());
        let length = parsed
            .headers
            .iter()
            .find(|h| h.name == "content-length")
            .unwrap();
        assert_eq!(length.value, BODY.len().to_string().as_bytes());
    }

    #[tokio::test]
    async fn a_connection_the_service_closes_says_so() {
        let closing: &[u8] =
            b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        let (addr, server) = server(vec![closing], 7).await;
        let api = Api::new(addr.port(), "sk_test").unwrap();
        let mut http = Http::connect(addr).await.unwrap();
        assert_eq!(
            http.send(api.charge("k").unwrap()).await.unwrap().status,
            503
        );
        let error = http.send(api.charge("k").unwrap()).await.err().unwrap();
        assert!(
            error.to_string().contains("closed the connection"),
            "{error}"
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn an_answer_cut_short_is_an_error() {
        let cut: &[u8] = b"HTTP/1.1 201 Created\r\ncontent-length: 100\r\n\r\n{\"partial";
        let (addr, server) = server(vec![cut], 64).await;
        let api = Api::new(addr.port(), "sk_test").unwrap();
        let mut http = Http::connect(addr).await.unwrap();
        let sent = http.send(api.charge("k").unwrap());
        // The server drops its socket after writing: the body never completes.
        let (answer, _) = tokio::join!(sent, server);
        let error = answer.err().unwrap();
        assert!(
            error.to_string().contains("closed the connection"),
            "{error}"
        );
    }

    #[test]
    fn heads_it_cannot_frame_are_errors() {
        let chunked = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(parse_head(chunked).is_err());
        let unframed = b"HTTP/1.1 200 OK\r\n\r\n";
        assert!(parse_head(unframed).is_err());
        let huge = b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999\r\n\r\n";
        assert!(parse_head(huge).is_err());
        let no_content = b"HTTP/1.1 204 No Content\r\n\r\n";
        assert_eq!(
            parse_head(no_content).unwrap().unwrap().length,
            no_content.len()
        );
        assert!(parse_head(b"HTTP/1.1 201 Cre").unwrap().is_none());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn keys_that_could_break_the_request_are_refused() {
        let api = Api::new(8080, "sk_test").unwrap();
        assert!(api.charge("fine-key_1").is_ok());
        for bad in ["", "two words", "line\r\nx-injected: 1", "ключ"] {
            assert!(api.charge(bad).is_err(), "{bad:?}");
        }
        assert!(Api::new(8080, "sk bad").is_err());
    }
}
