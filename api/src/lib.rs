//! The JSON of the chargeonce API, one type per object: what the service
//! writes, what its OpenAPI document describes (feature `schema`, which
//! derives `utoipa::ToSchema`), and what clients read and send.
//!
//! Rules every type here keeps:
//! - **Member order is the order of the fields**, and which members are
//!   left out or `null` is fixed: an idempotent replay must be byte for byte
//!   the first answer, also when a newer version of the service gives it.
//! - **Answers are read leniently**: unknown members are ignored, members a
//!   later version added default when absent, and an enum value this
//!   version does not know becomes `Unknown` (which is never written:
//!   serialising it is an error).
//! - **Requests are written strictly**: absent optional members are left
//!   out, so the same logical request is the same JSON on every attempt
//!   (the service fingerprints the body and refuses unknown members).
//! - The objects a request's hot path renders (a charge, a refund, an
//!   event, a problem) borrow the service's values (`Cow`) rather than copy
//!   them; a client reads them as `'static`.
#![deny(missing_docs)]

mod charge;
mod event;
mod list;
mod problem;
mod refund;
mod webhook;

pub use charge::{Charge, ChargeDeclined, ChargeObject, NewCharge, Status};
#[cfg(feature = "schema")]
pub use event::EventSubject;
pub use event::{Event, EventData, EventObject, EventType};
pub use list::{List, ListObject};
pub use problem::{FieldError, Problem};
pub use refund::{NewRefund, Refund, RefundDeclined, RefundObject, RefundReason};
pub use webhook::{
    Delivery, DeliveryAttempt, DeliveryObject, DeliveryStatus, NewWebhookEndpoint, WebhookEndpoint,
    WebhookEndpointObject,
};

/// The metadata of a charge or a refund: string keys and values.
pub type Metadata = std::collections::BTreeMap<String, String>;

/// The schema of `Metadata`, with the limits the service enforces.
#[cfg(feature = "schema")]
pub struct MetadataSchema;

#[cfg(feature = "schema")]
impl utoipa::PartialSchema for MetadataSchema {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
        let text = |min, max| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(min)
                .max_length(Some(max))
                .build()
        };
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Up to 50 string values; keys of 1 to 40 characters, values of up to \
                 500; no NUL characters.",
            ))
            .property_names(Some(text(Some(1), 40)))
            .additional_properties(Some(utoipa::openapi::RefOr::T(Schema::Object(text(
                None, 500,
            )))))
            .max_properties(Some(50))
            .examples([serde_json::json!({"order": "1042"})])
            .into()
    }
}

#[cfg(feature = "schema")]
impl utoipa::ToSchema for MetadataSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        "Metadata".into()
    }
}

fn is_false(value: &bool) -> bool {
    !value
}

/// `value` with its members in alphabetical order, whatever order its
/// fields have: how a 402 has always shown the declined charge or refund
/// (it went through a JSON map on its way), kept so that its replays stay
/// byte for byte the first answer.
fn sorted<T: serde::Serialize, S: serde::Serializer>(
    value: &T,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    let json = serde_json::to_value(value).map_err(serde::ser::Error::custom)?;
    let members: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_value(json).map_err(serde::ser::Error::custom)?;
    members.serialize(serializer)
}

#[cfg(test)]
mod tests;
