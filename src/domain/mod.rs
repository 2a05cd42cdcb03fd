//! The domain: values parsed once at the edge and trusted behind it. Pure
//! code, no IO, no HTTP types.

pub mod api_key;
pub mod charge;
pub mod differences;
pub mod event;
pub mod fields;
pub mod fingerprint;
pub mod idempotency_key;
pub mod ids;
pub mod lifecycle;
pub mod money;
mod properties;
pub mod refund;
pub mod strict_json;
pub mod webhook;
pub mod wire;

pub use api_key::ApiKey;
pub use charge::{Charge, NewCharge};
pub use event::{Event, EventType};
pub use fields::FieldError;
pub use fingerprint::{Fingerprint, RequestFingerprint};
pub use idempotency_key::{IdempotencyKey, KeyError};
pub use ids::{ChargeId, EventId, MerchantId, RefundId, WebhookEndpointId};
pub use lifecycle::{Outcome, Status};
pub use money::{Amount, Currency};
pub use refund::{NewRefund, Refund, RefundReason};
pub use webhook::{
    Delivery, DeliveryAttempt, DeliveryStatus, NewWebhookEndpoint, WebhookEndpoint, WebhookSecret,
};
