//! Logging: `tracing` to stderr, text or JSON, levels from `RUST_LOG`.
//!
//! Lines go into a memory buffer that a background thread writes to stderr
//! every `FLUSH_INTERVAL`. So a request neither blocks on a slow or full
//! stderr (a pipe nobody drains) nor wakes another thread for every line,
//! which on a busy 2-core machine cost a quarter of the replay throughput
//! (BENCHMARKS.md, "The access log's cost"). If stderr stalls for long, the buffer stops at
//! `MAX_BUFFERED` bytes and later lines are counted and dropped, not queued
//! without bound.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

const DEFAULT_FILTER: &str = "info,tokio_postgres=warn,refinery_core=warn";

/// actix-http logs a request head it cannot parse as an ERROR; it is the
/// client's mistake, answered with a problem document and logged at info by
/// `http::server`. Silenced unless `RUST_LOG` names actix_http itself.
const QUIET_DISPATCHER: &str = "actix_http::h1::dispatcher=off";

/// tokio-postgres writes every statement's parameters at debug level, and
/// some parameters are secrets (a webhook endpoint's signing secret when it
/// is created). So `RUST_LOG=debug` (or trace) does not reach that module
/// unless `RUST_LOG` names tokio_postgres itself.
const QUIET_PARAMETERS: &str = "tokio_postgres::query=info";

/// How long a line may wait in memory before it reaches stderr.
const FLUSH_INTERVAL: Duration = Duration::from_millis(20);

/// Most bytes held while stderr does not keep up.
const MAX_BUFFERED: usize = 8 * 1024 * 1024;

/// Records a field of the current span: a request's `merchant`, `id` or
/// `idempotency` (see `http::observe`) once the code knows it. Outside such
/// a span it does nothing.
pub fn record(field: &'static str, value: &dyn std::fmt::Display) {
    tracing::Span::current().record(field, tracing::field::display(value));
}

/// An error and its causes, `: `-separated, for a log line. A cause whose
/// text its error already shows (`#[error("…: {0}")]`) is not repeated.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Installs the subscriber. Keep the guard alive until exit: dropping it
/// writes out what is still buffered. `None` when a subscriber was already
/// installed (tests start several apps; the first one stays).
pub fn init(format: LogFormat) -> Option<LogGuard> {
    let asked = std::env::var("RUST_LOG").unwrap_or_default();
    let mut filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    for (named, quiet) in [
        ("actix_http", QUIET_DISPATCHER),
        ("tokio_postgres", QUIET_PARAMETERS),
    ] {
        if !asked.contains(named) {
            if let Ok(quiet) = quiet.parse() {
                filter = filter.add_directive(quiet);
            }
        }
    }
    let buffer = Arc::new(Buffer::default());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Plain text, at a terminal too: the colour styles cost every line
        // (see Cargo.toml).
        .with_ansi(false)
        .with_timer(Clock)
        .with_writer(BufferedStderr(buffer.clone()));
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        // Every span a line was written in, outermost first: a line deep in a
        // charge's processor call still carries the request's fields.
        LogFormat::Json => builder
            .json()
            .with_current_span(false)
            .with_span_list(true)
            .try_init(),
    };
    installed.ok()?;
    let flusher = buffer.clone();
    let thread = std::thread::Builder::new()
        .name("log-writer".to_owned())
        .spawn(move || flusher.run())
        .ok();
    Some(LogGuard { buffer, thread })
}

/// Each line's timestamp as tracing-subscriber's default timer writes it
/// (RFC 3339, UTC, microseconds: `2026-12-03T00:03:23.610168Z`), with the
/// part up to the second formatted once a second per thread rather than
/// for every line: that formatting was 2.4k of a cached replay's 105k
/// instructions (BENCHMARKS.md, "The access log's cost").
struct Clock;

thread_local! {
    /// The second last formatted, and its text up to the seconds.
    static SECOND: std::cell::RefCell<(u64, String)> = const { std::cell::RefCell::new((u64::MAX, String::new())) };
}

impl FormatTime for Clock {
    fn format_time(&self, w: &mut Writer<'_>) -> std::fmt::Result {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let cached = SECOND.try_with(|second| {
            let mut second = second.try_borrow_mut().ok()?;
            Some(write_time(now, &mut second, w))
        });
        match cached {
            Ok(Some(written)) => written,
            // A line written while the thread's storage is torn down.
            _ => write_time(now, &mut (u64::MAX, String::new()), w),
        }
    }
}

/// Writes `since_epoch` as the timestamp, reusing `second`'s text if it is
/// of the same second.
fn write_time(
    since_epoch: Duration,
    second: &mut (u64, String),
    out: &mut impl std::fmt::Write,
) -> std::fmt::Result {
    let seconds = since_epoch.as_secs();
    if second.0 != seconds {
        let time = i64::try_from(seconds)
            .ok()
            .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0))
            .unwrap_or_default();
        second.1.clear();
        std::fmt::Write::write_fmt(
            &mut second.1,
            format_args!("{}", time.format("%Y-%m-%dT%H:%M:%S")),
        )?;
        second.0 = seconds;
    }
    let mut fraction = *b".000000Z";
    let mut micros = since_epoch.subsec_micros();
    for digit in fraction[1..7].iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    out.write_str(&second.1)?;
    // ASCII digits, a dot and a letter.
    out.write_str(std::str::from_utf8(&fraction).unwrap_or(".000000Z"))
}

#[derive(Default)]
struct Buffer {
    lines: Mutex<Vec<u8>>,
    dropped: AtomicU64,
    stop: AtomicBool,
}

impl Buffer {
    fn push(&self, line: &[u8]) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() + line.len() > MAX_BUFFERED {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            lines.extend_from_slice(line);
        }
    }

    /// Writes out what has gathered; the lock is held only for the swap.
    fn flush(&self, spare: &mut Vec<u8>) {
        {
            let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::swap(&mut *lines, spare);
        }
        let mut stderr = std::io::stderr().lock();
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            let _ = writeln!(
                stderr,
                "chargeonce: {dropped} log lines dropped: stderr did not keep up"
            );
        }
        // Nothing sensible is left to do if stderr itself fails.
        let _ = stderr.write_all(spare);
        let _ = stderr.flush();
        spare.clear();
    }

    fn run(&self) {
        let mut spare = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(FLUSH_INTERVAL);
            self.flush(&mut spare);
        }
        self.flush(&mut spare);
    }
}

/// The writer the subscriber formats each event into, one `write` per line.
struct BufferedStderr(Arc<Buffer>);

impl<'a> MakeWriter<'a> for BufferedStderr {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter(&self.0)
    }
}

struct LineWriter<'a>(&'a Buffer);

impl Write for LineWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.push(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Stops the log writer thread after a last flush.
pub struct LogGuard {
    buffer: Arc<Buffer>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.buffer.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(thread) => {
                thread.thread().unpark();
                let _ = thread.join();
            }
            // No writer thread could be started: write out here.
            None => self.buffer.flush(&mut Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("cannot connect")]
        Hides(#[source] std::io::Error),
        #[error("processor client: {0}")]
        Shows(#[source] std::io::Error),
    }

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let refused = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(
            error_chain(&Outer::Hides(refused())),
            "cannot connect: refused"
        );
        assert_eq!(
            error_chain(&Outer::Shows(refused())),
            "processor client: refused"
        );
    }

    #[test]
    fn timestamps_are_rfc3339_in_utc_with_microseconds() {
        let mut second = (u64::MAX, String::new());
        for (seconds, micros) in [
            (0, 0),
            (1_796_256_203, 610_168),
            (1_796_256_203, 999_999),
            (1_796_256_204, 7),
            (1_709_164_800, 123_456), // 2024-02-29
            (253_402_300_799, 1),     // 9999-12-31T23:59:59
        ] {
            let since_epoch = Duration::new(seconds, micros * 1000);
            let mut written = String::new();
            write_time(since_epoch, &mut second, &mut written).unwrap();
            let expected = chrono::DateTime::from_timestamp(seconds as i64, micros * 1000)
                .unwrap()
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            assert_eq!(written, expected);
        }
    }

    #[test]
    fn lines_are_kept_in_order_until_flushed() {
        let buffer = Buffer::default();
        buffer.push(b"one\n");
        buffer.push(b"two\n");
        assert_eq!(&*buffer.lines.lock().unwrap(), b"one\ntwo\n");
        buffer.flush(&mut Vec::new());
        assert!(buffer.lines.lock().unwrap().is_empty());
    }

    #[test]
    fn a_full_buffer_counts_and_drops_lines() {
        let buffer = Buffer::default();
        let big = vec![b'x'; MAX_BUFFERED - 2];
        buffer.push(&big);
        buffer.push(b"no room\n");
        buffer.push(b"y\n");
        assert_eq!(buffer.lines.lock().unwrap().len(), MAX_BUFFERED);
        assert_eq!(buffer.dropped.load(Ordering::Relaxed), 1);
    }
}
