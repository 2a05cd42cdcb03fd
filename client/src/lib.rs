//! An async client for the chargeonce payment API that makes every charge
//! and refund **at most once** however often it has to retry, and retries
//! until the outcome is known whenever that is safe.
//!
//! The service deduplicates by `Idempotency-Key`: a retry with the same key
//! and body gets the first answer again (or finishes a pending charge),
//! never a second charge. This crate keeps its side of that contract:
//!
//! - **One key per logical operation.** [`Client::charge_operation`] makes
//!   the key once; every attempt of [`ChargeOperation::send`] sends it with
//!   the same body bytes. [`Client::create_charge`] is the same thing in
//!   one call. To survive a restart, store [`ChargeOperation::key`] before
//!   sending and resume with [`Client::create_charge_with_key`].
//! - **Retry only what is safe and useful**: no answer, `5xx`, `429`,
//!   `409 idempotency_key_in_use`, and `202` pending; never a `4xx`
//!   answer that would not change. `Retry-After` is honoured; otherwise
//!   exponential backoff with full jitter; bounded by attempts and by a
//!   total deadline ([`RetryPolicy`]).
//! - **Typed outcomes**: a decline is [`Error::Declined`] with the failed
//!   charge; a charge still pending when the policy runs out is
//!   [`Error::Pending`]; every error keeps the idempotency key
//!   ([`Error::idempotency_key`]) so the operation can be sent again later.
//!
//! ```no_run
//! use chargeonce_client::{Client, Error, NewCharge};
//!
//! # async fn run() -> Result<(), Error> {
//! let client = Client::new("http://127.0.0.1:8080", "sk_...")?;
//! let order = NewCharge::new(1999, "USD").description("Order 1001");
//!
//! match client.create_charge(&order).await {
//!     Ok(charge) => println!("charged: {}", charge.id),
//!     Err(Error::Declined { code, .. }) => println!("declined: {code}"),
//!     Err(e) => {
//!         // Not charged, or not known yet: e.idempotency_key() resumes it.
//!         eprintln!("{e}; key {:?}", e.idempotency_key());
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! The retry rules in full are on [`RetryPolicy`].
#![deny(missing_docs)]

mod client;
mod error;
mod key;
mod model;
mod retry;

pub use chargeonce_api::{FieldError, NewCharge, NewRefund, RefundReason};
pub use client::{
    ChargeOperation, Client, ClientBuilder, RefundOperation, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_REQUEST_TIMEOUT,
};
pub use error::Error;
pub use key::IdempotencyKey;
pub use model::{Charge, ChargeStatus, ListParams, Refund, RefundStatus};

/// Every type of the API's JSON (events, webhook endpoints, problem
/// documents, …), the ones the service itself writes.
pub use chargeonce_api as api;
pub use retry::RetryPolicy;

/// The HTTP status type used in errors (re-exported from `reqwest`).
pub use reqwest::StatusCode;

// The README's examples are compiled as doctests too, so they cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
