//! The problem document of every error answer.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

/// A problem document (RFC 9457, `application/problem+json`). `code` is
/// stable and what to act on; `detail` is for people.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(example = json!({"type": "urn:chargeonce:problem:idempotency_key_missing", "title": "Idempotency-Key missing", "status": 400, "detail": "the Idempotency-Key header is required on this request", "code": "idempotency_key_missing"})))]
pub struct Problem<'a> {
    /// `urn:chargeonce:problem:<code>`.
    #[serde(rename = "type", default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub kind: String,
    /// A short summary of the kind of problem.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(value_type = String, required))]
    pub title: Cow<'a, str>,
    /// The HTTP status.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub status: u16,
    /// What happened, for people.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(value_type = String, required))]
    pub detail: Cow<'a, str>,
    /// What happened, for programs: stable.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(value_type = String, required))]
    pub code: Cow<'a, str>,
    /// `invalid_request` only: every offending field.
    #[serde(default, skip_serializing_if = "no_errors")]
    #[cfg_attr(feature = "schema", schema(value_type = Vec<FieldError>))]
    pub errors: Cow<'a, [FieldError]>,
    /// `refund_exceeds_charge` only: what can still be refunded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(nullable = false))]
    pub refundable_amount: Option<i64>,
    /// `idempotency_key_reused` only: the names (never the values) of the
    /// request's fields that differ from the request the key was first used
    /// with (`amount`, `metadata.order`, …; `charge` for a refund of another
    /// charge). Absent when they cannot be told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(nullable = false))]
    pub differing_fields: Option<Vec<String>>,
}

// serde hands `skip_serializing_if` a reference to the field as it is.
#[allow(clippy::ptr_arg)]
fn no_errors(errors: &Cow<'_, [FieldError]>) -> bool {
    errors.is_empty()
}

/// One field's problem in an `invalid_request` answer. `field` is a member
/// name, a path such as `metadata.k` or `event_types[1]`, or "" for the body
/// as a whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct FieldError {
    /// The field, e.g. `amount` or `metadata.order_id`; empty for the body
    /// as a whole.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub field: String,
    /// What is wrong with it.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub message: String,
}

impl FieldError {
    /// The error `message` about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}
