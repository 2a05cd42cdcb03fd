//! What request handlers and the background workers share.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use crate::processor::PaymentProcessor;
use crate::service::api_keys::ApiKeyCache;

/// One per HTTP worker thread, plus one for the background workers. All of
/// it is shared between them except `pool`: each worker thread has its own,
/// so the tasks that drive its connections run on that thread (see
/// `startup`).
#[derive(Clone)]
pub struct AppState {
    pub pool: Pool,
    pub processor: Arc<dyn PaymentProcessor>,
    /// How long a request owns a pending charge before others may take over.
    pub lease: Duration,
    /// How long a request waits for a concurrent one with the same key to
    /// finish before answering 409.
    pub in_flight_wait: Duration,
    pub max_body_bytes: usize,
    pub api_keys: Arc<ApiKeyCache>,
}
