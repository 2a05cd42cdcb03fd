//! The outbound side of webhooks, as `processor` is for payments: signing
//! (`signature`), which addresses may be connected to (`targets`), and the
//! HTTP client that makes one delivery attempt (`sender`). What is sent when
//! is decided by `service::dispatch`.

pub mod sender;
pub mod signature;
pub mod targets;

pub use sender::{AttemptKind, AttemptOutcome, Sender};
pub use targets::TargetPolicy;
