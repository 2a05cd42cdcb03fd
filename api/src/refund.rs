//! A refund, the request that creates one, and the 402 of a declined one.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{Metadata, Problem, Status};

/// A refund of a charge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(example = json!({"id": "re_0193a5c1e0b37f7aa1e0c2d4b5f6a7b9", "object": "refund", "charge": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8", "amount": 500, "currency": "USD", "status": "succeeded", "reason": "requested_by_customer", "metadata": {}, "failure_code": null, "failure_message": null, "created_at": "2026-12-01T06:01:00.000001Z"})))]
pub struct Refund<'a> {
    /// `re_…`, made by the service.
    #[cfg_attr(feature = "schema", schema(pattern = "^re_[0-9a-f]{32}$"))]
    pub id: String,
    /// Always `refund`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub object: RefundObject,
    /// The refunded charge's id.
    #[cfg_attr(feature = "schema", schema(pattern = "^ch_[0-9a-f]{32}$"))]
    pub charge: String,
    /// In minor units.
    pub amount: i64,
    /// The charge's currency.
    #[cfg_attr(feature = "schema", schema(value_type = String, pattern = "^[A-Z]{3}$"))]
    pub currency: Cow<'a, str>,
    /// Where the refund stands.
    pub status: Status,
    /// Why it was asked for, if a reason was given.
    #[cfg_attr(feature = "schema", schema(required))]
    pub reason: Option<RefundReason>,
    /// The metadata sent with the refund.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(value_type = crate::MetadataSchema, required))]
    pub metadata: Cow<'a, Metadata>,
    /// Set when `status` is `failed`: why, in the processor's words.
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>, required))]
    pub failure_code: Option<Cow<'a, str>>,
    /// A human-readable reason for a failed refund.
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>, required))]
    pub failure_message: Option<Cow<'a, str>>,
    /// When the service created it, RFC 3339 with microseconds.
    #[cfg_attr(feature = "schema", schema(format = DateTime))]
    pub created_at: String,
    /// Only in the answer to a lookup by key (`?idempotency_key=`): the key
    /// that created it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>, nullable = false))]
    pub idempotency_key: Option<Cow<'a, str>>,
    /// Only in the answer to a lookup by key: when that key's replay window
    /// ends (RFC 3339), after which a request with it gets 422
    /// `idempotency_key_expired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(format = DateTime, nullable = false))]
    pub idempotency_key_expires_at: Option<String>,
}

/// The `object` member of a refund.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum RefundObject {
    /// `refund`.
    #[default]
    Refund,
}

/// Why a refund is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefundReason {
    /// The customer was charged twice.
    Duplicate,
    /// The charge was fraudulent.
    Fraudulent,
    /// The customer asked for it.
    RequestedByCustomer,
    /// A reason this version does not know (read only; the service refuses
    /// it in a request).
    #[serde(other, skip_serializing)]
    Unknown,
}

/// `POST /v1/charges/{id}/refunds`: every member optional. Without `amount`,
/// the refund is for what remains refundable of the charge.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = RefundRequest, example = json!({"amount": 500, "reason": "requested_by_customer"})))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NewRefund {
    /// In minor units, 1 to 99999999999, written as a JSON integer (not
    /// `500.0`); left out or null: all that remains refundable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 99_999_999_999_i64))]
    pub amount: Option<i64>,
    /// Why the refund is asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<RefundReason>,
    /// Free-form string entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<crate::MetadataSchema>))]
    pub metadata: Option<Metadata>,
}

impl NewRefund {
    /// A refund of the whole remaining amount, with no reason and no
    /// metadata.
    ///
    /// ```
    /// use chargeonce_api::{NewRefund, RefundReason};
    ///
    /// let whole = NewRefund::new();
    /// let part = NewRefund::new()
    ///     .amount(500)
    ///     .reason(RefundReason::RequestedByCustomer)
    ///     .metadata("ticket", "T-77");
    /// assert_eq!(whole.amount, None);
    /// assert_eq!(part.amount, Some(500));
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Refunds only `amount` minor units.
    pub fn amount(mut self, amount: i64) -> Self {
        self.amount = Some(amount);
        self
    }

    /// Sets the reason.
    pub fn reason(mut self, reason: RefundReason) -> Self {
        self.reason = Some(reason);
        self
    }

    /// Adds one metadata entry.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata
            .get_or_insert_with(Metadata::new)
            .insert(key.into(), value.into());
        self
    }
}

/// `402`: the refund was declined; the refund exists (status `failed`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct RefundDeclined<'a> {
    /// The problem: `type`, `title`, `status`, `detail` and `code`.
    #[serde(flatten)]
    pub problem: Problem<'a>,
    /// The failed refund (its members in alphabetical order).
    #[serde(serialize_with = "crate::sorted")]
    pub refund: Refund<'a>,
    /// The failed refund's id.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required, pattern = "^re_[0-9a-f]{32}$"))]
    pub refund_id: String,
}
