//! The load client: one keep-alive HTTP/1.1 connection per client, a latency
//! from the request's write to the answer's last byte. Not hyper's client:
//! 12–17 µs per request against pgbench's and this one's 5 (BENCHMARKS.md).
//! It speaks only what the service answers: `Content-Length` bodies.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _, Result};
use futures_util::future::try_join_all;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The simulated processor lets 1000 succeed.
pub const BODY: &str = r#"{"amount":1000,"currency":"USD"}"#;
/// Longer is not the service's.
const MAX_HEAD_BYTES: usize = 16 * 1024;
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// `buffer[..filled]` is read and not consumed.
pub struct Http {
    stream: TcpStream,
    buffer: Vec<u8>,
    filled: usize,
    /// The service said `Connection: close`.
    closed: bool,
}

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

impl Http {
    pub async fn connect(addr: SocketAddr) -> Result<Self> {
        let stream =
            TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        Ok(Self { stream, buffer: vec![0; 4096], filled: 0, closed: false })
    }

    pub async fn connect_many(addr: SocketAddr, count: usize) -> Result<Vec<Self>> {
        try_join_all((0..count).map(|_| Self::connect(addr))).await
    }

    pub async fn send(&mut self, request: &[u8]) -> Result<Answer> {
        ensure!(!self.closed, "the service closed the connection");
        let started = Instant::now();
        self.stream.write_all(request).await.context("sending the request")?;
        let (status, replayed, length, close) = loop {
            if let Some(head) = parse_head(&self.buffer[..self.filled])? {
                break head;
            }
            ensure!(self.filled < MAX_HEAD_BYTES, "an answer head of over {MAX_HEAD_BYTES} bytes");
            self.read_more().await?;
        };
        while self.filled < length {
            self.read_more().await?;
        }
        let finished = Instant::now();
        self.buffer.copy_within(length..self.filled, 0);
        self.filled -= length;
        self.closed = close;
        Ok(Answer { status, replayed, latency: finished - started, finished })
    }

    async fn read_more(&mut self) -> Result<()> {
        if self.filled == self.buffer.len() {
            self.buffer.resize(self.buffer.len() * 2, 0);
        }
        let read = self.stream.read(&mut self.buffer[self.filled..]).await?;
        ensure!(read > 0, "the service closed the connection");
        self.filled += read;
        Ok(())
    }
}

/// (status, replayed, head + body length, close), None if incomplete.
fn parse_head(bytes: &[u8]) -> Result<Option<(u16, bool, usize, bool)>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let httparse::Status::Complete(head_length) =
        response.parse(bytes).context("an answer that is not HTTP")?
    else {
        return Ok(None);
    };
    let status = response.code.context("an answer without a status")?;
    let (mut body, mut replayed, mut close) = (None, false, false);
    for header in response.headers.iter() {
        let value = std::str::from_utf8(header.value).unwrap_or("").trim();
        match header.name.to_ascii_lowercase().as_str() {
            "content-length" => body = Some(value.parse::<usize>().context("Content-Length")?),
            "idempotent-replayed" => replayed = value == "true",
            "connection" => close = value.eq_ignore_ascii_case("close"),
            "transfer-encoding" => bail!("an answer in Transfer-Encoding {value:?}"),
            _ => {}
        }
    }
    let body = match (body, status) {
        (Some(length), _) if length > MAX_BODY_BYTES => {
            bail!("a {status} answer of {length} bytes")
        }
        (Some(length), _) => length,
        (None, 204 | 304) => 0,
        (None, _) => bail!("a {status} answer without Content-Length"),
    };
    Ok(Some((status, replayed, head_length + body, close)))
}

/// POST /v1/charges, written once up to the key.
pub struct Api {
    pub addr: SocketAddr,
    before_key: String,
}

impl Api {
    pub fn new(port: u16, api_key: &str) -> Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        ensure!(header_safe(api_key), "the API key is not a valid header value");
        let before_key = format!(
            "POST /v1/charges HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {api_key}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nidempotency-key: ",
            BODY.len()
        );
        Ok(Self { addr, before_key })
    }

    pub fn charge(&self, key: &str) -> Result<Vec<u8>> {
        ensure!(header_safe(key), "the idempotency key {key:?} is not a valid header value");
        Ok([self.before_key.as_str(), key, "\r\n\r\n", BODY].concat().into_bytes())
    }
}

fn header_safe(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers each request with the next of `answers`, byte by byte; what it read.
    async fn server(answers: Vec<&'static [u8]>) -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut seen = Vec::new();
            for answer in answers {
                while !String::from_utf8_lossy(&seen).ends_with(BODY) {
                    let mut byte = [0u8; 1];
                    if socket.read(&mut byte).await.unwrap() == 0 {
                        break;
                    }
                    seen.push(byte[0]);
                }
                for byte in answer {
                    socket.write_all(&[*byte]).await.unwrap();
                }
                seen.push(b'|');
            }
            String::from_utf8(seen).unwrap()
        });
        (addr, task)
    }

    #[tokio::test]
    async fn answers_read_in_pieces_keep_alive_and_close() {
        let replay = b"HTTP/1.1 201 Created\r\ncontent-length: 7\r\nidempotent-replayed: true\r\n\r\n{\"a\":1}";
        let closing =
            b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        let (addr, server) = server(vec![replay, closing]).await;
        let api = Api::new(addr.port(), "sk_test").unwrap();
        let mut http = Http::connect(addr).await.unwrap();
        let first = http.send(&api.charge("k-1").unwrap()).await.unwrap();
        assert_eq!((first.status, first.replayed, first.is_success()), (201, true, true));
        assert_eq!(http.send(&api.charge("k-2").unwrap()).await.unwrap().status, 503);
        let error = http.send(&api.charge("k-3").unwrap()).await.err().unwrap();
        assert!(error.to_string().contains("closed the connection"), "{error}");
        let seen = server.await.unwrap();
        assert!(seen.starts_with("POST /v1/charges HTTP/1.1\r\n"), "{seen}");
        assert!(seen.contains("\r\nauthorization: Bearer sk_test\r\n"), "{seen}");
        assert!(seen.contains(&format!("idempotency-key: k-2\r\n\r\n{BODY}|")), "{seen}");
    }

    #[test]
    fn heads_it_cannot_frame_and_keys_that_break_a_header_are_errors() {
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap().is_some());
        assert!(parse_head(b"HTTP/1.1 201 Cre").unwrap().is_none());
        let api = Api::new(8080, "sk_test").unwrap();
        for bad in ["", "two words", "line\r\nx-injected: 1", "ключ"] {
            assert!(api.charge(bad).is_err(), "{bad:?}");
        }
    }
}
