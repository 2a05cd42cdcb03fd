//! The API's resources as Rust types. What the service answers and what the
//! client sends are `chargeonce_api`'s types, the ones the service itself
//! writes (see that crate for how they are read leniently and written
//! strictly); here are their names as this crate shows them, the listing
//! parameters, and what the client needs to know of a resource.

use chargeonce_api as api;

/// A charge as the service reports it.
pub type Charge = api::Charge<'static>;

/// A refund as the service reports it.
pub type Refund = api::Refund<'static>;

/// Where a charge stands.
pub type ChargeStatus = api::Status;

/// Where a refund stands.
pub type RefundStatus = api::Status;

/// One page of a listing, as the service sends it.
pub(crate) type Page<T> = api::List<T>;

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

    #[test]
    fn a_pending_resource_says_so() {
        let refund: Refund = serde_json::from_value(json!({
            "id": "re_1", "object": "refund", "charge": "ch_1", "amount": 500,
            "currency": "USD", "status": "pending", "reason": "requested_by_customer",
            "metadata": {"ticket": "T-77"}, "failure_code": null, "failure_message": null,
            "created_at": "2026-11-30T19:59:39.452451Z"
        }))
        .expect("a refund");
        assert!(refund.is_pending());
        assert_eq!(refund.id(), "re_1");
        let charge: Charge = serde_json::from_value(json!({
            "id": "ch_1", "amount": 1999, "currency": "USD", "status": "disputed",
            "created_at": "2026-11-30T19:59:39.452451Z"
        }))
        .expect("a charge");
        assert_eq!(charge.status, ChargeStatus::Unknown);
        assert!(!charge.is_pending());
    }
}
