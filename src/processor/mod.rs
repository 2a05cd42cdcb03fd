//! The payment processor boundary. Money moves on the far side of this trait,
//! outside any database transaction, so every call carries the charge's (or
//! the refund's) own stable idempotency key and the processor deduplicates
//! on it.

pub mod http;
pub mod simulated;
pub mod simulator;

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::{ProcessorKind, ProcessorSettings};
use crate::domain::Outcome;

pub use http::HttpProcessor;
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

/// A refund of (part of) a payment the processor made. `idempotency_key` is
/// the same on every attempt for one refund.
#[derive(Debug, Clone)]
pub struct RefundRequest<'a> {
    pub idempotency_key: &'a str,
    /// The processor's id of the payment, recorded when the charge succeeded.
    pub payment_id: &'a str,
    pub amount: i64,
    pub currency: &'a str,
}

/// The answer to one call, classified:
///
/// - `Final`: the processor decided. Succeeded or declined; also a request
///   it rejected as malformed (400), which proves no payment was made: a
///   decline with code `processor_rejected`.
/// - `Unknown`: the money may or may not have moved (a timeout, a lost
///   response, 5xx, 429, a conflict on the processor's key). The charge
///   stays pending and the same call is made again later with the same key.
///   `attention` marks answers that retrying alone will not fix (a key
///   conflict, an unexpected 4xx): logged as errors for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessorReply {
    Final(Outcome),
    Unknown { reason: String, attention: bool },
}

impl ProcessorReply {
    /// An unknown outcome that retrying may resolve.
    pub fn unknown(reason: impl Into<String>) -> Self {
        Self::Unknown {
            reason: reason.into(),
            attention: false,
        }
    }
}

/// The failure code of a charge the processor rejected as malformed.
pub const PROCESSOR_REJECTED: &str = "processor_rejected";

#[async_trait]
pub trait PaymentProcessor: Send + Sync + 'static {
    async fn charge(&self, request: &PaymentRequest<'_>) -> ProcessorReply;
    async fn refund(&self, request: &RefundRequest<'_>) -> ProcessorReply;
}

/// The processor the settings ask for.
pub fn from_settings(
    settings: &ProcessorSettings,
) -> Result<Arc<dyn PaymentProcessor>, reqwest::Error> {
    Ok(match settings.kind {
        ProcessorKind::Simulated => Arc::new(SimulatedProcessor::new(settings.latency)),
        ProcessorKind::Http => Arc::new(HttpProcessor::new(settings)?),
    })
}

/// The deterministic decline rules shared by the simulated processor and the
/// processor simulator: by the amount's last two digits, `02` is
/// `card_declined` and `05` is `insufficient_funds`.
pub fn simulated_decline(amount: i64) -> Option<(&'static str, &'static str)> {
    match amount % 100 {
        2 => Some(("card_declined", "The card was declined.")),
        5 => Some(("insufficient_funds", "The card has insufficient funds.")),
        _ => None,
    }
}

/// The same for refunds: an amount ending in `02` is declined
/// `refund_declined`.
pub fn simulated_refund_decline(amount: i64) -> Option<(&'static str, &'static str)> {
    (amount % 100 == 2).then_some(("refund_declined", "The refund was declined."))
}
