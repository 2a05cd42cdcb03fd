//! The API's resources as Rust types: what the client sends (`NewCharge`,
//! `NewRefund`, `ListParams`) and what the service answers (`Charge`,
//! `Refund`).
//!
//! Invariants:
//! - Responses are read leniently: unknown members are ignored, members added
//!   by later service versions (`amount_refunded`, `refunded`) default when
//!   absent, and an unknown status or reason becomes `Unknown` instead of
//!   failing the whole call. A newer service never breaks an older client.
//! - Requests are written strictly to the contract: absent optional fields
//!   are left out, because the service rejects unknown fields and the same
//!   logical request must serialise to the same JSON on every attempt (the
//!   service compares a fingerprint of the body).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A charge as the service reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Charge {
    /// `ch_…`, made by the service.
    pub id: String,
    /// In minor units (cents for USD).
    pub amount: i64,
    /// ISO 4217 code, upper case.
    pub currency: String,
    /// Where the payment stands.
    pub status: ChargeStatus,
    /// The caller's customer reference, if one was sent.
    #[serde(default)]
    pub customer: Option<String>,
    /// The description sent with the charge.
    #[serde(default)]
    pub description: Option<String>,
    /// The metadata sent with the charge.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Why a failed charge failed (`card_declined`, …).
    #[serde(default)]
    pub failure_code: Option<String>,
    /// A human-readable reason for a failed charge.
    #[serde(default)]
    pub failure_message: Option<String>,
    /// When the service created it, RFC 3339 (e.g. `2026-11-30T19:59:39.452451Z`).
    pub created_at: String,
    /// How much of it has been refunded, in minor units; 0 from services
    /// without refunds.
    #[serde(default)]
    pub amount_refunded: i64,
    /// Whether it has been refunded in full; `false` from services without
    /// refunds.
    #[serde(default)]
    pub refunded: bool,
}

/// Where a charge stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ChargeStatus {
    /// The processor's answer is not known yet. The service finishes the
    /// charge by itself; a retry with the same key asks again at once.
    Pending,
    /// The money moved.
    Succeeded,
    /// The processor declined it; see `failure_code`.
    Failed,
    /// A status this version of the client does not know.
    #[serde(other)]
    Unknown,
}

/// A request for a new charge.
///
/// ```
/// use chargeonce_client::NewCharge;
///
/// let order = NewCharge::new(1999, "USD")
///     .description("Order 1001")
///     .customer("cus_42")
///     .metadata("order_id", "1001");
/// assert_eq!(order.amount, 1999);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct NewCharge {
    /// In minor units, 1 to 99 999 999 999.
    pub amount: i64,
    /// An active ISO 4217 code in upper case, e.g. `"USD"`.
    pub currency: String,
    /// The caller's customer reference, at most 255 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub customer: Option<String>,
    /// At most 1000 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// At most 50 entries; keys 1 to 40 characters, values at most 500.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

impl NewCharge {
    /// A charge of `amount` minor units of `currency`.
    pub fn new(amount: i64, currency: impl Into<String>) -> Self {
        Self {
            amount,
            currency: currency.into(),
            customer: None,
            description: None,
            metadata: BTreeMap::new(),
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

/// A refund as the service reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Refund {
    /// `re_…`, made by the service.
    pub id: String,
    /// The refunded charge, `ch_…`.
    pub charge: String,
    /// In minor units.
    pub amount: i64,
    /// The charge's currency.
    pub currency: String,
    /// Where the refund stands.
    pub status: RefundStatus,
    /// Why it was asked for, if a reason was given.
    #[serde(default)]
    pub reason: Option<RefundReason>,
    /// The metadata sent with the refund.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Why a failed refund failed.
    #[serde(default)]
    pub failure_code: Option<String>,
    /// A human-readable reason for a failed refund.
    #[serde(default)]
    pub failure_message: Option<String>,
    /// When the service created it, RFC 3339.
    pub created_at: String,
}

/// Where a refund stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefundStatus {
    /// The processor's answer is not known yet.
    Pending,
    /// The money went back.
    Succeeded,
    /// The processor declined it; see `failure_code`.
    Failed,
    /// A status this version of the client does not know.
    #[serde(other)]
    Unknown,
}

/// Why a refund is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RefundReason {
    /// The customer was charged twice.
    Duplicate,
    /// The charge was fraudulent.
    Fraudulent,
    /// The customer asked for it.
    RequestedByCustomer,
    /// A reason this version of the client does not know (only ever read
    /// from the service; the service rejects it in a request).
    #[serde(other)]
    Unknown,
}

/// A request for a refund. The default refunds whatever is left of the
/// charge, with no reason and no metadata.
///
/// ```
/// use chargeonce_client::{NewRefund, RefundReason};
///
/// let whole = NewRefund::new();
/// let part = NewRefund::new()
///     .amount(500)
///     .reason(RefundReason::RequestedByCustomer)
///     .metadata("ticket", "T-77");
/// assert_eq!(whole.amount, None);
/// assert_eq!(part.amount, Some(500));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct NewRefund {
    /// In minor units; `None` refunds the whole remaining amount.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amount: Option<i64>,
    /// Why the refund is asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<RefundReason>,
    /// Free-form string entries.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
}

impl NewRefund {
    /// A refund of the whole remaining amount.
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
            .get_or_insert_with(BTreeMap::new)
            .insert(key.into(), value.into());
        self
    }
}

/// One offending field of a `400 invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FieldError {
    /// The field, e.g. `amount` or `metadata.order_id`; empty for the body
    /// as a whole.
    #[serde(default)]
    pub field: String,
    /// What is wrong with it.
    #[serde(default)]
    pub message: String,
}

/// Where a listing starts and how many items each page request asks for.
/// Listings are newest first.
///
/// ```
/// use chargeonce_client::ListParams;
///
/// let params = ListParams::new().limit(100).starting_after("ch_0192f1c2a3b47c5d8e9f0a1b2c3d4e5f");
/// assert_eq!(params.limit, Some(100));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListParams {
    /// Items per page request, 1 to 100; the service's default (10) when
    /// `None`. It does not bound the stream, which runs to the last item:
    /// use `StreamExt::take` for that.
    pub limit: Option<u32>,
    /// Start after this id (exclusive), e.g. the last one seen before.
    pub starting_after: Option<String>,
}

impl ListParams {
    /// From the newest item, pages of the service's default size.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the page size.
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Starts after `id`.
    pub fn starting_after(mut self, id: impl Into<String>) -> Self {
        self.starting_after = Some(id.into());
        self
    }
}

/// One page of a listing, as the service sends it.
#[derive(Debug, Deserialize)]
pub(crate) struct Page<T> {
    pub data: Vec<T>,
    #[serde(default)]
    pub has_more: bool,
}

/// What the client needs to know of a resource it creates or lists.
pub(crate) trait Resource: serde::de::DeserializeOwned + Send + 'static {
    /// The resource's id, the cursor of the next page.
    fn id(&self) -> &str;
    /// Whether the processor's answer is still outstanding.
    fn is_pending(&self) -> bool;
    /// The error a create call ends with when it is still pending.
    fn into_pending_error(self, idempotency_key: Option<crate::IdempotencyKey>) -> crate::Error;
}

impl Resource for Charge {
    fn id(&self) -> &str {
        &self.id
    }

    fn is_pending(&self) -> bool {
        self.status == ChargeStatus::Pending
    }

    fn into_pending_error(self, idempotency_key: Option<crate::IdempotencyKey>) -> crate::Error {
        crate::Error::Pending {
            charge: Box::new(self),
            idempotency_key,
        }
    }
}

impl Resource for Refund {
    fn id(&self) -> &str {
        &self.id
    }

    fn is_pending(&self) -> bool {
        self.status == RefundStatus::Pending
    }

    fn into_pending_error(self, idempotency_key: Option<crate::IdempotencyKey>) -> crate::Error {
        crate::Error::RefundPending {
            refund: Box::new(self),
            idempotency_key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CHARGE_V1: &str = r#"{"id":"ch_01a22e0aa5bb74d9865a7ed01c640be2","object":"charge","amount":1999,"currency":"USD","status":"succeeded","customer":null,"description":"Order 1001","metadata":{},"failure_code":null,"failure_message":null,"created_at":"2026-11-30T19:59:39.452451Z"}"#;

    #[test]
    fn reads_a_charge_of_the_current_service() {
        let charge: Charge = serde_json::from_str(CHARGE_V1).expect("a charge");
        assert_eq!(charge.id, "ch_01a22e0aa5bb74d9865a7ed01c640be2");
        assert_eq!(charge.status, ChargeStatus::Succeeded);
        assert_eq!(charge.description.as_deref(), Some("Order 1001"));
        assert_eq!((charge.amount_refunded, charge.refunded), (0, false));
    }

    #[test]
    fn reads_a_charge_with_refund_fields_and_members_it_does_not_know() {
        let mut value: serde_json::Value = serde_json::from_str(CHARGE_V1).expect("json");
        value["amount_refunded"] = json!(500);
        value["refunded"] = json!(false);
        value["livemode"] = json!(true);
        value["status"] = json!("disputed");
        let charge: Charge = serde_json::from_value(value).expect("a charge");
        assert_eq!(charge.amount_refunded, 500);
        assert_eq!(charge.status, ChargeStatus::Unknown);
    }

    #[test]
    fn reads_a_refund() {
        let refund: Refund = serde_json::from_value(json!({
            "id": "re_1", "object": "refund", "charge": "ch_1", "amount": 500,
            "currency": "USD", "status": "pending", "reason": "requested_by_customer",
            "metadata": {"ticket": "T-77"}, "failure_code": null, "failure_message": null,
            "created_at": "2026-11-30T19:59:39.452451Z"
        }))
        .expect("a refund");
        assert_eq!(refund.status, RefundStatus::Pending);
        assert_eq!(refund.reason, Some(RefundReason::RequestedByCustomer));
        assert!(refund.is_pending());
    }

    #[test]
    fn requests_leave_out_what_is_absent() {
        let charge = serde_json::to_value(NewCharge::new(100, "USD")).expect("json");
        assert_eq!(charge, json!({"amount": 100, "currency": "USD"}));
        let full = NewCharge::new(100, "EUR")
            .customer("c")
            .description("d")
            .metadata("k", "v");
        assert_eq!(
            serde_json::to_value(full).expect("json"),
            json!({"amount": 100, "currency": "EUR", "customer": "c", "description": "d", "metadata": {"k": "v"}})
        );
        assert_eq!(
            serde_json::to_value(NewRefund::new()).expect("json"),
            json!({})
        );
        assert_eq!(
            serde_json::to_value(NewRefund::new().amount(5).reason(RefundReason::Duplicate))
                .expect("json"),
            json!({"amount": 5, "reason": "duplicate"})
        );
    }
}
