//! The domain: values parsed once at the edge and trusted behind it. Pure
//! code, no IO, no HTTP types.

pub mod api_key;
pub mod charge;
pub mod fingerprint;
pub mod idempotency_key;
pub mod ids;
pub mod money;
mod properties;
pub mod strict_json;

pub use api_key::ApiKey;
pub use charge::{Charge, ChargeStatus, FieldError, NewCharge, Outcome};
pub use fingerprint::{Fingerprint, RequestFingerprint};
pub use idempotency_key::{IdempotencyKey, KeyError};
pub use ids::{ChargeId, MerchantId};
pub use money::{Amount, Currency};
