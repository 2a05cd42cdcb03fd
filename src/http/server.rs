//! The HTTP/1.1 server around the actix-web `App`: actix-server accepts,
//! actix-http speaks the protocol, and two things of ours sit between them.
//!
//! - **A connection cap per worker** (`http.max_connections`, lowered to fit
//!   the process's file descriptors). A connection over it is answered at once
//!   with `503 service_unavailable` and closed, rather than left in the
//!   kernel's backlog, so slow clients holding every slot cannot exhaust
//!   descriptors or make new clients wait without an answer. Slow clients
//!   are bounded in time too: `http.header_timeout_ms` for the request head,
//!   `http.body_timeout_ms` for the body (`super::body`).
//! - **Problem documents for what actix-http rejects by itself.** A request
//!   head it cannot parse (a control character in a header, conflicting
//!   `Content-Length` and `Transfer-Encoding`), one too large, or one that
//!   did not arrive in time never reaches the `App`: actix-http writes a bare
//!   `400`/`431`/`408` with no body. `Guarded`, the connection's IO, spots
//!   those heads as they are written and writes the same status as
//!   `application/problem+json` instead, with a detail diagnosed from the
//!   bytes the request sent. (actix-web's `HttpServer` offers no hook for
//!   either, hence this module instead of it.)

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use actix_http::body::MessageBody;
use actix_http::{HttpService, Request, Response};
use actix_server::Server;
use actix_service::{
    fn_service, map_config, IntoServiceFactory, ServiceFactory, ServiceFactoryExt,
};
use actix_web::dev::AppConfig;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::domain::KeyError;
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

/// Serves `app` (built once per worker) on `listener`.
pub fn serve<F, I, S, B>(
    listener: std::net::TcpListener,
    limits: &ServerLimits,
    app: F,
) -> io::Result<Server>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: std::fmt::Debug,
    S::Response: Into<Response<B>> + 'static,
    <S::Service as actix_service::Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let local = listener.local_addr()?;
    let builder = Server::build();
    let shutdown = builder.graceful_shutdown_signal();
    let per_worker = limits.clone();
    let server = builder
        .workers(limits.workers)
        .shutdown_timeout(limits.shutdown_timeout_secs)
        // Above our own cap, so every connection reaches `admit`, which
        // answers the excess instead of leaving it in the backlog.
        .max_concurrent_connections(limits.max_connections * 2 + 64)
        .listen("chargeonce", listener, move || {
            let limits = per_worker.clone();
            let shutdown = shutdown.clone();
            let open = Rc::new(Cell::new(0usize));
            let app = app()
                .into_factory()
                .map_err(|error| error.into().error_response());
            let http = HttpService::<Guarded, _, _>::build()
                .keep_alive(limits.keep_alive)
                .client_request_timeout(limits.header_timeout)
                .local_addr(local)
                // Idle keep-alive connections close as soon as a graceful
                // stop begins, as with actix-web's own server. The hook is
                // what HttpServer itself uses (hidden from its docs).
                .graceful_shutdown_signal(move || {
                    let shutdown = shutdown.clone();
                    async move { shutdown.notified().await }
                })
                .h1(map_config(app, |_| AppConfig::default()))
                .map_err(|_| ());
            let header_timeout = limits.header_timeout;
            let cap = limits.max_connections;
            fn_service(move |stream: TcpStream| admit(stream, open.clone(), cap, header_timeout))
                .and_then(http)
        })?
        .run();
    Ok(server)
}

/// Lets a connection in if the worker has room, else answers 503 and closes.
async fn admit(
    stream: TcpStream,
    open: Rc<Cell<usize>>,
    cap: usize,
    header_timeout: Duration,
) -> Result<(Guarded, Option<SocketAddr>), ()> {
    if open.get() >= cap {
        refuse(stream);
        return Err(());
    }
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    open.set(open.get() + 1);
    Ok((
        Guarded {
            stream,
            _slot: Slot(open),
            recent: Vec::new(),
            replacement: None,
            header_timeout,
            replaced: false,
            linger: None,
        },
        peer,
    ))
}

/// Longest a refused connection is kept to answer it.
const REFUSAL_TIME: Duration = Duration::from_millis(200);

/// Answers a connection over the cap with 503 and closes it. What the client
/// sent is read and dropped for a moment first, so the close is not a reset
/// that would destroy the answer before the client reads it.
fn refuse(stream: TcpStream) {
    let answer = raw_response(&ApiError::ServiceUnavailable(
        "every connection slot of this worker is taken".into(),
    ));
    tokio::task::spawn_local(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = stream;
        let mut sink = [0u8; 4096];
        let answer_and_drain = async {
            stream.write_all(&answer).await?;
            stream.shutdown().await?;
            while stream.read(&mut sink).await? > 0 {}
            io::Result::Ok(())
        };
        let _ = tokio::time::timeout(REFUSAL_TIME, answer_and_drain).await;
    });
    tracing::debug!("refused a connection over the cap");
}

/// Counts a connection against its worker's cap until dropped.
struct Slot(Rc<Cell<usize>>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// Most bytes of a request kept to diagnose a head actix-http rejects.
const RECENT_BYTES: usize = 16 * 1024;

/// A connection's socket, as actix-http sees it. Passes bytes through,
/// remembering what the client sent since the last answer, and replaces
/// actix-http's bodiless error answers with problem documents.
pub struct Guarded {
    stream: TcpStream,
    _slot: Slot,
    recent: Vec<u8>,
    /// A problem answer standing in for actix-http's bare one, and how much
    /// of it is written.
    replacement: Option<(Vec<u8>, usize)>,
    header_timeout: Duration,
    /// Whether an answer of ours already replaced one of actix-http's.
    replaced: bool,
    /// While closing: until when to keep reading (see `poll_shutdown`).
    linger: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// How long a closing connection keeps reading what the client still sends.
const LINGER: Duration = Duration::from_millis(500);

impl Guarded {
    /// Writes what is left of the replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, written)) = &mut self.replacement {
            if *written == bytes.len() {
                self.replacement = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.stream).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }
}

/// actix-http may also give up on a request without answering at all (a
/// body whose chunked encoding breaks while the handler reads it): the
/// connection is dropped with the request read and nothing written. Then the
/// client still gets a problem document, best effort: the socket takes it
/// or the client is gone anyway.
impl Drop for Guarded {
    fn drop(&mut self) {
        if self.recent.is_empty() || self.replacement.is_some() || self.linger.is_some() {
            return;
        }
        let error = ApiError::MalformedRequest {
            detail: "the request could not be read to its end: its body does not match its \
                     framing (Content-Length or chunked encoding)"
                .to_owned(),
        };
        tracing::info!(status = 400, detail = %error, "rejected a request actix-http dropped");
        let _ = self.stream.try_write(&raw_response(&error));
        // Read what has arrived, so the close is not a reset.
        let mut scratch = [0u8; 4096];
        while matches!(self.stream.try_read(&mut scratch), Ok(n) if n > 0) {}
    }
}

impl AsyncRead for Guarded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        let room = RECENT_BYTES.saturating_sub(this.recent.len());
        let read = &buf.filled()[before..];
        this.recent.extend_from_slice(&read[..read.len().min(room)]);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        if let Some((head, error)) = framework_error(buf, &this.recent, this.header_timeout) {
            if this.replaced {
                // actix-http can queue a second error for a connection it is
                // closing (a timeout and a parse error); one answer is enough.
                return Poll::Ready(Ok(head));
            }
            this.replaced = true;
            tracing::info!(
                status = error.status().as_u16(),
                detail = %error,
                "rejected a request actix-http could not take"
            );
            this.replacement = Some((raw_response(&error), 0));
            this.recent.clear();
            // The bare head counts as written; our answer goes out instead,
            // now or in the flush or shutdown that follows.
            let _ = this.poll_replacement(cx)?;
            return Poll::Ready(Ok(head));
        }
        this.recent.clear();
        Pin::new(&mut this.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.stream).poll_flush(cx)
    }

    /// Closes the write side, then reads and drops what the client still
    /// sends, until it closes too or `LINGER` passes. A server that closes a
    /// socket with unread input (a body it refused, say after 408 or 413)
    /// makes the kernel answer with a reset, and a reset can destroy the
    /// answer before the client has read it.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        if this.linger.is_none() {
            ready!(Pin::new(&mut this.stream).poll_shutdown(cx))?;
            this.linger = Some(Box::pin(tokio::time::sleep(LINGER)));
        }
        let mut scratch = [0u8; 4096];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.stream).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
                // End of input, or the client is gone: done.
                Poll::Ready(_) => return Poll::Ready(Ok(())),
                Poll::Pending => break,
            }
        }
        match this.linger.as_mut().map(|sleep| sleep.as_mut().poll(cx)) {
            Some(Poll::Pending) => Poll::Pending,
            _ => Poll::Ready(Ok(())),
        }
    }
}

/// If `written` begins with one of actix-http's own bodiless error answers,
/// its length and the error to answer instead. Our application never sends
/// a 400, 408, 431 or 500 without a body, so the match cannot hit one of
/// ours.
///
/// Every answer passes through here, so the status line is looked at first
/// and only those four statuses are searched further: the head is not
/// scanned, decoded and lowercased for a 201.
fn framework_error(
    written: &[u8],
    request: &[u8],
    header_timeout: Duration,
) -> Option<(usize, ApiError)> {
    let status = written.strip_prefix(b"HTTP/1.")?.get(2..5)?;
    if ![b"400", b"408", b"431", b"500"].contains(&status.try_into().ok()?) {
        return None;
    }
    let head_end = find(written, b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&written[..head_end]).ok()?;
    let lower = head.to_ascii_lowercase();
    if !lower.contains("\r\ncontent-length: 0\r\n") || lower.contains("\r\ncontent-type:") {
        return None;
    }
    let error = match status {
        b"400" => diagnose(request),
        b"431" => ApiError::HeaderFieldsTooLarge,
        b"408" => ApiError::RequestTimeout {
            detail: format!(
                "the request head did not arrive within {} ms",
                header_timeout.as_millis()
            ),
        },
        _ => ApiError::Internal("actix-http failed while handling the request".into()),
    };
    Some((head_end, error))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// What is wrong with a request head actix-http refused to parse, as far as
/// the bytes tell. A bad `Idempotency-Key` is reported as what it is.
fn diagnose(request: &[u8]) -> ApiError {
    match diagnose_head(request) {
        Ok(()) => ApiError::MalformedRequest {
            detail: "the request could not be parsed as HTTP/1.1".to_owned(),
        },
        Err(Bad::Header(name)) if name.eq_ignore_ascii_case(b"idempotency-key") => {
            ApiError::IdempotencyKeyInvalid(KeyError::BadCharacter)
        }
        Err(Bad::Header(name)) => ApiError::MalformedRequest {
            detail: format!("the header {} contains a control character", shown(&name)),
        },
        Err(Bad::Other(detail)) => ApiError::MalformedRequest { detail },
    }
}

enum Bad {
    /// A header whose value has a control character.
    Header(Vec<u8>),
    Other(String),
}

fn diagnose_head(request: &[u8]) -> Result<(), Bad> {
    let head = match find(request, b"\r\n\r\n") {
        Some(end) => &request[..end],
        None => request,
    };
    let mut lines = head
        .split(|&b| b == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next().unwrap_or_default();
    let parts: Vec<&[u8]> = request_line.split(|&b| b == b' ').collect();
    if parts.len() != 3 || !parts[2].starts_with(b"HTTP/1.") {
        return Err(Bad::Other(
            "the request line is not `METHOD /path HTTP/1.1`".to_owned(),
        ));
    }
    let (mut content_lengths, mut transfer_encoding) = (0, false);
    for line in lines {
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Err(Bad::Other(format!(
                "the header line {} has no `:`",
                shown(line)
            )));
        };
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        let token = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
        if name.is_empty() || !name.iter().all(token) {
            return Err(Bad::Other(format!(
                "the header name {} is not a valid token",
                shown(name)
            )));
        }
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(Bad::Header(name.to_vec()));
        }
        if name.eq_ignore_ascii_case(b"content-length") {
            content_lengths += 1;
        }
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            transfer_encoding = true;
        }
    }
    if content_lengths > 0 && transfer_encoding {
        return Err(Bad::Other(
            "both Content-Length and Transfer-Encoding were sent; send one".to_owned(),
        ));
    }
    if content_lengths > 1 {
        return Err(Bad::Other(
            "Content-Length was sent more than once".to_owned(),
        ));
    }
    Ok(())
}

/// Bytes from a request, quoted for a message: at most 64 of them, escaped.
fn shown(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]);
    format!("{:?}", text.as_ref())
}

/// `error` as a whole HTTP/1.1 answer that closes the connection.
fn raw_response(error: &ApiError) -> Vec<u8> {
    let (status, headers, body) = error.parts();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        crate::error::PROBLEM_JSON,
        body.len()
    );
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body.as_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    const BARE_400: &[u8] =
        b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\ndate: x\r\n\r\n";

    #[test]
    fn only_bare_framework_answers_are_replaced() {
        let timeout = Duration::from_secs(5);
        let (length, error) = framework_error(BARE_400, b"", timeout).expect("bare 400");
        assert_eq!(length, BARE_400.len());
        assert_eq!(error.code(), "malformed_request");
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 120\r\ncontent-type: application/problem+json\r\n\r\n{}";
        assert!(framework_error(ours, b"", timeout).is_none());
        let empty_ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert!(framework_error(empty_ok, b"", timeout).is_none());
        let too_large = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        assert_eq!(
            framework_error(too_large, b"", timeout).map(|(_, e)| e.code()),
            Some("request_header_fields_too_large")
        );
    }

    #[test]
    fn malformed_heads_are_diagnosed() {
        let key = diagnose(b"POST /v1/charges HTTP/1.1\r\nIdempotency-Key: a\x01b\r\n\r\n");
        assert_eq!(key.code(), "idempotency_key_invalid");
        let cases: [(&[u8], &str); 6] = [
            (
                b"POST /v1/charges HTTP/1.1\r\nX-Note: a\x01b\r\n\r\n",
                "\"X-Note\" contains a control character",
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
                "both Content-Length and Transfer-Encoding",
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
                "more than once",
            ),
            (b"GARBAGE\r\n\r\n", "request line"),
            (
                b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
                "not a valid token",
            ),
            (b"GET / HTTP/1.1\r\nno-colon\r\n\r\n", "has no `:`"),
        ];
        for (request, expected) in cases {
            let error = diagnose(request);
            assert_eq!(error.code(), "malformed_request");
            assert!(error.to_string().contains(expected), "{error}");
        }
    }

    #[test]
    fn a_raw_answer_is_a_complete_problem_response() {
        let bytes = raw_response(&ApiError::HeaderFieldsTooLarge);
        let text = String::from_utf8(bytes).expect("utf-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("head and body");
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("connection: close"));
        let problem: serde_json::Value = serde_json::from_str(body).expect("json");
        assert_eq!(problem["status"], 431);
        assert_eq!(problem["code"], "request_header_fields_too_large");
    }
}
