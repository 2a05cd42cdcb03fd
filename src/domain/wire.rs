//! The public form of the domain's values: the `chargeonce_api` types built
//! from them. What the API answers, what an event records and what a
//! webhook carries all come from here, so a member added to a wire type is
//! filled in here once. Charges, refunds and events borrow their texts
//! rather than copy them: they are rendered on every charge and delivery.

use std::borrow::Cow;

use chargeonce_api as api;
use chrono::{DateTime, SecondsFormat, Utc};

use super::{
    Charge, Delivery, DeliveryAttempt, DeliveryStatus, Event, EventType, Refund, RefundReason,
    Status, WebhookEndpoint,
};

/// A time as every answer shows it: RFC 3339 in UTC, with microseconds.
fn time(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn text(text: &Option<String>) -> Option<Cow<'_, str>> {
    text.as_deref().map(Cow::Borrowed)
}

/// The charge as it is, refunds included.
impl<'a> From<&'a Charge> for api::Charge<'a> {
    fn from(charge: &'a Charge) -> Self {
        charge_with(charge, charge.amount_refunded)
    }
}

/// `charge` showing `amount_refunded` (0 for the form of its creation, see
/// `Charge::into_created`). Only fields that are fixed once the charge is
/// final are shown, besides the refund totals.
pub(super) fn charge_with(charge: &Charge, amount_refunded: i64) -> api::Charge<'_> {
    api::Charge {
        id: charge.id.to_string(),
        object: api::ChargeObject::Charge,
        amount: charge.amount,
        currency: Cow::Borrowed(&charge.currency),
        status: charge.status.into(),
        customer: text(&charge.customer),
        description: text(&charge.description),
        metadata: Cow::Borrowed(&charge.metadata),
        failure_code: text(&charge.failure_code),
        failure_message: text(&charge.failure_message),
        amount_refunded,
        refunded: amount_refunded == charge.amount,
        created_at: time(charge.created_at),
        idempotency_key: None,
        idempotency_key_expires_at: None,
    }
}

impl<'a> From<&'a Refund> for api::Refund<'a> {
    fn from(refund: &'a Refund) -> Self {
        api::Refund {
            id: refund.id.to_string(),
            object: api::RefundObject::Refund,
            charge: refund.charge_id.to_string(),
            amount: refund.amount,
            currency: Cow::Borrowed(&refund.currency),
            status: refund.status.into(),
            reason: refund.reason.map(Into::into),
            metadata: Cow::Borrowed(&refund.metadata),
            failure_code: text(&refund.failure_code),
            failure_message: text(&refund.failure_message),
            created_at: time(refund.created_at),
            idempotency_key: None,
            idempotency_key_expires_at: None,
        }
    }
}

/// A charge as a lookup by its key shows it: as it is, with the key and
/// when the key's replay window ends.
pub fn charge_found_by_key<'a>(
    charge: &'a Charge,
    key: &'a str,
    window_end: DateTime<Utc>,
) -> api::Charge<'a> {
    api::Charge {
        idempotency_key: Some(Cow::Borrowed(key)),
        idempotency_key_expires_at: Some(time(window_end)),
        ..api::Charge::from(charge)
    }
}

/// A refund as a lookup by its key shows it (see `charge_found_by_key`).
pub fn refund_found_by_key<'a>(
    refund: &'a Refund,
    key: &'a str,
    window_end: DateTime<Utc>,
) -> api::Refund<'a> {
    api::Refund {
        idempotency_key: Some(Cow::Borrowed(key)),
        idempotency_key_expires_at: Some(time(window_end)),
        ..api::Refund::from(refund)
    }
}

impl<'a> From<&'a Event> for api::Event<'a> {
    fn from(event: &'a Event) -> Self {
        api::Event {
            id: event.id.to_string(),
            object: api::EventObject::Event,
            kind: event.event_type.into(),
            created_at: time(event.created_at),
            data: api::EventData {
                object: Cow::Borrowed(&event.data),
            },
        }
    }
}

/// The public form of an endpoint: never the secret. A deleted endpoint
/// shows `"enabled": false, "deleted": true`; one the circuit breaker
/// disabled, `"enabled": false`.
impl From<&WebhookEndpoint> for api::WebhookEndpoint {
    fn from(endpoint: &WebhookEndpoint) -> Self {
        let deleted = endpoint.deleted_at.is_some();
        api::WebhookEndpoint {
            id: endpoint.id.to_string(),
            object: api::WebhookEndpointObject::WebhookEndpoint,
            url: endpoint.url.clone(),
            event_types: endpoint
                .event_types
                .as_ref()
                .map(|types| types.iter().map(|&t| t.into()).collect()),
            secret: None,
            enabled: !deleted && endpoint.disabled_at.is_none(),
            created_at: time(endpoint.created_at),
            deleted,
        }
    }
}

impl WebhookEndpoint {
    /// The answer to the endpoint's creation: the public form plus the
    /// secret, from fields fixed at creation only, so a replay is the first
    /// answer byte for byte (even after the endpoint was deleted).
    pub fn as_created(&self) -> api::WebhookEndpoint {
        api::WebhookEndpoint {
            secret: Some(self.secret.expose_secret().to_owned()),
            enabled: true,
            deleted: false,
            ..self.into()
        }
    }
}

impl From<&Delivery> for api::Delivery {
    fn from(delivery: &Delivery) -> Self {
        api::Delivery {
            object: api::DeliveryObject::WebhookDelivery,
            event: delivery.event_id.to_string(),
            endpoint: delivery.endpoint_id.to_string(),
            url: delivery.url.clone(),
            status: delivery.status.into(),
            attempts: delivery.attempts,
            // Only a pending delivery has a next attempt.
            next_attempt_at: (delivery.status == DeliveryStatus::Pending)
                .then(|| time(delivery.next_attempt_at)),
            last_status_code: delivery.last_status_code,
            last_error: delivery.last_error.clone(),
            created_at: time(delivery.created_at),
            updated_at: time(delivery.updated_at),
            attempt_log: delivery.attempt_log.iter().map(Into::into).collect(),
        }
    }
}

impl From<&DeliveryAttempt> for api::DeliveryAttempt {
    fn from(attempt: &DeliveryAttempt) -> Self {
        api::DeliveryAttempt {
            attempt: attempt.attempt,
            status_code: attempt.status_code,
            error: attempt.error.clone(),
            duration_ms: attempt.duration_ms,
            created_at: time(attempt.created_at),
        }
    }
}

impl From<Status> for api::Status {
    fn from(status: Status) -> Self {
        match status {
            Status::Pending => Self::Pending,
            Status::Succeeded => Self::Succeeded,
            Status::Failed => Self::Failed,
        }
    }
}

impl From<RefundReason> for api::RefundReason {
    fn from(reason: RefundReason) -> Self {
        match reason {
            RefundReason::Duplicate => Self::Duplicate,
            RefundReason::Fraudulent => Self::Fraudulent,
            RefundReason::RequestedByCustomer => Self::RequestedByCustomer,
        }
    }
}

impl From<EventType> for api::EventType {
    fn from(event_type: EventType) -> Self {
        match event_type {
            EventType::ChargePending => Self::ChargePending,
            EventType::ChargeSucceeded => Self::ChargeSucceeded,
            EventType::ChargeFailed => Self::ChargeFailed,
            EventType::RefundPending => Self::RefundPending,
            EventType::RefundSucceeded => Self::RefundSucceeded,
            EventType::RefundFailed => Self::RefundFailed,
            EventType::WebhookEndpointDisabled => Self::WebhookEndpointDisabled,
        }
    }
}

impl From<DeliveryStatus> for api::DeliveryStatus {
    fn from(status: DeliveryStatus) -> Self {
        match status {
            DeliveryStatus::Pending => Self::Pending,
            DeliveryStatus::Delivered => Self::Delivered,
            DeliveryStatus::Failed => Self::Failed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EventId, Fingerprint, MerchantId, WebhookEndpointId, WebhookSecret};
    use serde_json::{json, Value};

    /// The string a wire enum value is written as.
    fn shown(value: impl serde::Serialize) -> String {
        match serde_json::to_value(value) {
            Ok(Value::String(text)) => text,
            other => format!("{other:?}"),
        }
    }

    /// Every wire enum value is the name the domain stores: the database,
    /// the answers and the document agree.
    #[test]
    fn every_enum_shows_the_name_the_domain_stores() {
        for status in [Status::Pending, Status::Succeeded, Status::Failed] {
            assert_eq!(shown(api::Status::from(status)), status.as_str());
        }
        for reason in [
            RefundReason::Duplicate,
            RefundReason::Fraudulent,
            RefundReason::RequestedByCustomer,
        ] {
            assert_eq!(shown(api::RefundReason::from(reason)), reason.as_str());
        }
        for event_type in EventType::ALL {
            assert_eq!(shown(api::EventType::from(event_type)), event_type.as_str());
        }
        for status in [
            DeliveryStatus::Pending,
            DeliveryStatus::Delivered,
            DeliveryStatus::Failed,
        ] {
            assert_eq!(shown(api::DeliveryStatus::from(status)), status.as_str());
        }
    }

    #[test]
    fn the_public_form_of_an_event_wraps_the_object() {
        let event = Event {
            id: EventId::new(),
            merchant_id: MerchantId::new(),
            event_type: EventType::ChargeSucceeded,
            data: json!({"id": "ch_1", "object": "charge"}),
            created_at: DateTime::from_timestamp(1_700_000_000, 123_456_789).expect("valid"),
        };
        let json: Value = serde_json::from_slice(&event.to_json().expect("renders")).expect("json");
        assert_eq!(
            json,
            json!({
                "id": event.id.to_string(),
                "object": "event",
                "type": "charge.succeeded",
                "created_at": "2023-11-14T22:13:20.123456Z",
                "data": {"object": {"id": "ch_1", "object": "charge"}},
            })
        );
    }

    #[test]
    fn only_a_pending_delivery_shows_its_next_attempt() {
        let at = |seconds| DateTime::from_timestamp(seconds, 250_000).expect("time");
        let mut delivery = Delivery {
            event_id: EventId::new(),
            endpoint_id: WebhookEndpointId::new(),
            url: "https://example.com/hooks".to_owned(),
            status: DeliveryStatus::Pending,
            attempts: 1,
            next_attempt_at: at(1_700_000_060),
            last_status_code: Some(500),
            last_error: None,
            created_at: at(1_700_000_000),
            updated_at: at(1_700_000_001),
            attempt_log: Vec::new(),
        };
        let json = |delivery: &Delivery| {
            serde_json::to_value(api::Delivery::from(delivery)).expect("json")
        };
        let pending = json(&delivery);
        assert_eq!(pending["next_attempt_at"], "2023-11-14T22:14:20.000250Z");
        assert_eq!(pending["created_at"], "2023-11-14T22:13:20.000250Z");
        assert_eq!(pending["status"], "pending");
        delivery.status = DeliveryStatus::Delivered;
        assert_eq!(json(&delivery)["next_attempt_at"], Value::Null);
    }

    #[test]
    fn only_the_creation_answer_shows_the_secret() {
        let endpoint = WebhookEndpoint {
            id: WebhookEndpointId::new(),
            merchant_id: MerchantId::new(),
            url: "https://x.test/".into(),
            event_types: None,
            secret: WebhookSecret::generate(),
            fingerprint: Fingerprint::ZERO,
            created_at: Utc::now(),
            deleted_at: None,
            disabled_at: None,
        };
        let json = |endpoint: api::WebhookEndpoint| serde_json::to_value(endpoint).expect("json");
        let created = json(endpoint.as_created());
        assert_eq!(created["secret"], endpoint.secret.expose_secret());
        assert_eq!(created["enabled"], true);
        let public = json((&endpoint).into());
        assert!(public.get("secret").is_none() && public.get("deleted").is_none());
        let deleted = WebhookEndpoint {
            deleted_at: Some(Utc::now()),
            ..endpoint.clone()
        };
        let shown = json((&deleted).into());
        assert_eq!(
            (shown["enabled"].clone(), shown["deleted"].clone()),
            (json!(false), json!(true))
        );
        // The creation answer does not change when the endpoint is deleted.
        assert_eq!(
            serde_json::to_string(&deleted.as_created()).expect("json"),
            serde_json::to_string(&endpoint.as_created()).expect("json")
        );
        // Disabled by the circuit breaker: listed, not enabled, not deleted.
        let disabled = WebhookEndpoint {
            disabled_at: Some(Utc::now()),
            ..endpoint.clone()
        };
        let shown = json((&disabled).into());
        assert_eq!(shown["enabled"], json!(false));
        assert!(shown.get("deleted").is_none() && shown.get("secret").is_none());
    }
}
