//! Logging: `tracing` to stderr, text or JSON, levels from `RUST_LOG`.
//! Lines are written by a background thread, so a slow or full stderr never
//! blocks a request on the async executor.

use tracing_appender::non_blocking::WorkerGuard;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

const DEFAULT_FILTER: &str = "info,tokio_postgres=warn,refinery_core=warn";

/// Installs the subscriber. Keep the guard alive until exit: dropping it
/// flushes what is still buffered.
pub fn init(format: LogFormat) -> Option<WorkerGuard> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let (writer, guard) = tracing_appender::non_blocking(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    // A second init (tests start several apps) keeps the first subscriber.
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.ok().map(|()| guard)
}
