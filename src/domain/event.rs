//! Events: the outbox as merchants see it. Every state change of a charge or
//! a refund is one event, written in the same transaction as the change
//! (`db::charges::RECORD_OUTCOME`, …), with `data` = the object as the change
//! left it; so is a webhook endpoint's disabling by the circuit breaker
//! (`db::webhook_endpoints::DISABLE`). The same JSON is the answer of `GET /v1/events/{id}` and the body
//! of every webhook delivery of the event, byte for byte.

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::{EventId, MerchantId};

/// The kinds of event; the database allows exactly these (the rule
/// `events_type_valid` of `events_rules`, `webhook_endpoints_types_valid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventType {
    ChargePending,
    ChargeSucceeded,
    ChargeFailed,
    RefundPending,
    RefundSucceeded,
    RefundFailed,
    /// The circuit breaker disabled one of the merchant's webhook endpoints.
    WebhookEndpointDisabled,
}

impl EventType {
    /// Every type, in the order lists show them.
    pub const ALL: [Self; 7] = [
        Self::ChargePending,
        Self::ChargeSucceeded,
        Self::ChargeFailed,
        Self::RefundPending,
        Self::RefundSucceeded,
        Self::RefundFailed,
        Self::WebhookEndpointDisabled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChargePending => "charge.pending",
            Self::ChargeSucceeded => "charge.succeeded",
            Self::ChargeFailed => "charge.failed",
            Self::RefundPending => "refund.pending",
            Self::RefundSucceeded => "refund.succeeded",
            Self::RefundFailed => "refund.failed",
            Self::WebhookEndpointDisabled => "webhook_endpoint.disabled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == text)
    }

    /// The valid names, for error messages.
    pub fn names() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

/// A stored event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub id: EventId,
    pub merchant_id: MerchantId,
    pub event_type: EventType,
    /// The charge, refund or webhook endpoint as the change left it (its
    /// public JSON).
    pub data: Value,
    pub created_at: DateTime<Utc>,
}

impl Event {
    /// The public JSON (`chargeonce_api::Event`, `{"id", "object": "event",
    /// "type", "created_at", "data": {"object": …}}`): what the API answers
    /// and what a webhook carries.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(&chargeonce_api::Event::from(self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_list_every_type() {
        assert_eq!(
            EventType::names(),
            "charge.pending, charge.succeeded, charge.failed, \
             refund.pending, refund.succeeded, refund.failed, webhook_endpoint.disabled"
        );
    }

    #[test]
    fn types_round_trip_and_nothing_else_parses() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
        }
        for bad in [
            "",
            "charge",
            "charge.refunded",
            "CHARGE.SUCCEEDED",
            "charge.succeeded ",
        ] {
            assert_eq!(EventType::parse(bad), None, "{bad:?}");
        }
    }
}
