//! A charge, the request that creates one, and the 402 of a declined one.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::{Metadata, Problem};

/// A charge. The answer to its creation (and every replay) shows it as
/// created, before any refund; reads and events show it as it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(example = json!({"id": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8", "object": "charge", "amount": 1999, "currency": "USD", "status": "succeeded", "customer": "cus_42", "description": "Order 1042", "metadata": {"order": "1042"}, "failure_code": null, "failure_message": null, "amount_refunded": 0, "refunded": false, "created_at": "2026-12-01T06:00:00.123456Z"})))]
pub struct Charge<'a> {
    /// `ch_…`, made by the service.
    #[cfg_attr(feature = "schema", schema(pattern = "^ch_[0-9a-f]{32}$"))]
    pub id: String,
    /// Always `charge`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub object: ChargeObject,
    /// In minor units (cents for USD).
    pub amount: i64,
    /// ISO 4217 code, upper case.
    #[cfg_attr(feature = "schema", schema(value_type = String, pattern = "^[A-Z]{3}$"))]
    pub currency: Cow<'a, str>,
    /// Where the payment stands.
    pub status: Status,
    /// The caller's customer reference, if one was sent.
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>, required))]
    pub customer: Option<Cow<'a, str>>,
    /// The description sent with the charge.
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>, required))]
    pub description: Option<Cow<'a, str>>,
    /// The metadata sent with the charge.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(value_type = crate::MetadataSchema, required))]
    pub metadata: Cow<'a, Metadata>,
    /// Set when `status` is `failed`: why, in the processor's words
    /// (`card_declined`, …).
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>, required))]
    pub failure_code: Option<Cow<'a, str>>,
    /// A human-readable reason for a failed charge.
    #[cfg_attr(feature = "schema", schema(value_type = Option<String>, required))]
    pub failure_message: Option<Cow<'a, str>>,
    /// Succeeded refunds, in minor units; 0 from services without refunds.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub amount_refunded: i64,
    /// Whether `amount_refunded` is all of `amount`; `false` from services
    /// without refunds.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub refunded: bool,
    /// When the service created it, RFC 3339 with microseconds
    /// (`2026-11-30T19:59:39.452451Z`).
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

/// The `object` member of a charge.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ChargeObject {
    /// `charge`.
    #[default]
    Charge,
}

/// Where a charge or a refund stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Status {
    /// The processor's answer is not known yet. The service finishes it by
    /// itself; a retry with the same key asks again at once.
    Pending,
    /// The money moved.
    Succeeded,
    /// The processor declined it; see `failure_code`.
    Failed,
    /// A status this version does not know (read only).
    #[serde(other, skip_serializing)]
    Unknown,
}

/// `POST /v1/charges`: a request for a new charge. Unknown members are
/// refused; `null` is the same as leaving an optional member out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = ChargeRequest, example = json!({"amount": 1999, "currency": "USD", "customer": "cus_42", "description": "Order 1042", "metadata": {"order": "1042"}})))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NewCharge {
    /// In minor units (cents for USD), 1 to 99999999999, written as a JSON
    /// integer: `1999`, not `1999.0` or `1.999e3` (400).
    #[cfg_attr(feature = "schema", schema(minimum = 1, maximum = 99_999_999_999_i64))]
    pub amount: i64,
    /// An active ISO 4217 code. Lower case is accepted too (`usd` is
    /// `USD`), and answers show it in upper case.
    pub currency: String,
    /// The caller's customer reference: up to 255 characters, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(max_length = 255))]
    pub customer: Option<String>,
    /// Up to 1000 characters, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(max_length = 1000))]
    pub description: Option<String>,
    /// Free-form string entries.
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    #[cfg_attr(feature = "schema", schema(value_type = Option<crate::MetadataSchema>))]
    pub metadata: Metadata,
}

impl NewCharge {
    /// A charge of `amount` minor units of `currency`.
    ///
    /// ```
    /// use chargeonce_api::NewCharge;
    ///
    /// let order = NewCharge::new(1999, "USD")
    ///     .description("Order 1001")
    ///     .customer("cus_42")
    ///     .metadata("order_id", "1001");
    /// assert_eq!(order.amount, 1999);
    /// ```
    pub fn new(amount: i64, currency: impl Into<String>) -> Self {
        Self {
            amount,
            currency: currency.into(),
            customer: None,
            description: None,
            metadata: Metadata::new(),
        }
    }

    /// Sets the customer reference.
    pub fn customer(mut self, customer: impl Into<String>) -> Self {
        self.customer = Some(customer.into());
        self
    }

    /// Sets the description.
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = Some(description.into());
        self
    }

    /// Adds one metadata entry.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }
}

/// `402`: the charge was declined. A problem document carrying the charge,
/// which exists (status `failed`) and is what every replay of the request
/// answers. `code` is the processor's decline code (`declined` if it gave
/// none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(example = json!({"type": "urn:chargeonce:problem:card_declined", "title": "Payment declined", "status": 402, "detail": "The card was declined.", "code": "card_declined", "charge": {"amount": 1999, "amount_refunded": 0, "created_at": "2026-12-01T06:00:00.123456Z", "currency": "USD", "customer": null, "description": null, "failure_code": "card_declined", "failure_message": "The card was declined.", "id": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8", "metadata": {}, "object": "charge", "refunded": false, "status": "failed"}, "charge_id": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8"})))]
pub struct ChargeDeclined<'a> {
    /// The problem: `type`, `title`, `status`, `detail` and `code`.
    #[serde(flatten)]
    pub problem: Problem<'a>,
    /// The failed charge (its members in alphabetical order).
    #[serde(serialize_with = "crate::sorted")]
    pub charge: Charge<'a>,
    /// The failed charge's id.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required, pattern = "^ch_[0-9a-f]{32}$"))]
    pub charge_id: String,
}
