//! The payment processor boundary. Money moves on the far side of this trait,
//! outside any database transaction, so every call carries the charge's own
//! stable idempotency key and the processor deduplicates on it.

pub mod simulated;

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{ProcessorKind, ProcessorSettings};
use crate::domain::Outcome;

pub use simulated::SimulatedProcessor;

/// What a processor is asked to do. `idempotency_key` is the same on every
/// attempt for one charge.
#[derive(Debug, Clone)]
pub struct PaymentRequest<'a> {
    pub idempotency_key: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub customer: Option<&'a str>,
    pub description: Option<&'a str>,
}

/// The answer to one call. `Unknown` means the money may or may not have
/// moved (a timeout, a lost response, a processor error): the charge stays
/// pending and the same call is made again later with the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessorReply {
    Final(Outcome),
    Unknown { reason: String },
}

#[async_trait]
pub trait PaymentProcessor: Send + Sync + 'static {
    async fn charge(&self, request: &PaymentRequest<'_>) -> ProcessorReply;
}

/// The processor the settings ask for.
pub fn from_settings(settings: &ProcessorSettings) -> Arc<dyn PaymentProcessor> {
    match settings.kind {
        ProcessorKind::Simulated => Arc::new(SimulatedProcessor::new(
            std::time::Duration::from_millis(settings.latency_ms),
        )),
    }
}
