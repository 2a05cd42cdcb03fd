//! An event: a state change of a charge, a refund or a webhook endpoint,
//! byte for byte the body of its webhook deliveries.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// A state change of a charge, refund or webhook endpoint; byte for byte
/// the body of its webhook deliveries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Event<'a> {
    /// `evt_…`, made by the service.
    #[cfg_attr(feature = "schema", schema(pattern = "^evt_[0-9a-f]{32}$"))]
    pub id: String,
    /// Always `event`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub object: EventObject,
    /// What changed.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When it changed, RFC 3339 with microseconds.
    #[cfg_attr(feature = "schema", schema(format = DateTime))]
    pub created_at: String,
    /// The object the event is about.
    pub data: EventData<'a>,
}

/// The `data` member of an event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct EventData<'a> {
    /// The charge, refund or webhook endpoint as the change left it, as it
    /// was rendered then (a `Charge`, a `Refund` or a `WebhookEndpoint`):
    /// kept as JSON, so an event never changes.
    #[cfg_attr(feature = "schema", schema(value_type = EventSubject))]
    pub object: Cow<'a, serde_json::Value>,
}

/// The schema of an event's `data.object`.
#[cfg(feature = "schema")]
#[derive(utoipa::ToSchema)]
#[serde(untagged)]
pub enum EventSubject {
    /// A `charge.*` event's.
    Charge(crate::Charge<'static>),
    /// A `refund.*` event's.
    Refund(crate::Refund<'static>),
    /// A `webhook_endpoint.*` event's (never with its secret).
    WebhookEndpoint(crate::WebhookEndpoint),
}

/// The `object` member of an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum EventObject {
    /// `event`.
    #[default]
    Event,
}

/// The kinds of event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub enum EventType {
    /// A charge is pending: the processor's answer is not known yet.
    #[serde(rename = "charge.pending")]
    ChargePending,
    /// A charge succeeded.
    #[serde(rename = "charge.succeeded")]
    ChargeSucceeded,
    /// A charge failed.
    #[serde(rename = "charge.failed")]
    ChargeFailed,
    /// A refund is pending.
    #[serde(rename = "refund.pending")]
    RefundPending,
    /// A refund succeeded.
    #[serde(rename = "refund.succeeded")]
    RefundSucceeded,
    /// A refund failed.
    #[serde(rename = "refund.failed")]
    RefundFailed,
    /// The service disabled one of the merchant's webhook endpoints after
    /// its attempts kept failing for `webhooks.disable_after_secs`.
    #[serde(rename = "webhook_endpoint.disabled")]
    WebhookEndpointDisabled,
    /// A type this version does not know (read only).
    #[serde(other, skip_serializing)]
    Unknown,
}
