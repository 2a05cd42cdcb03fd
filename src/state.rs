//! What every request handler shares.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;

use crate::processor::PaymentProcessor;

pub struct AppState {
    pub pool: Pool,
    pub processor: Arc<dyn PaymentProcessor>,
    /// How long a request owns a pending charge before others may take over.
    pub lease: Duration,
    pub max_body_bytes: usize,
}
