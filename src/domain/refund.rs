//! Refunds: the request (`NewRefund`, validated with every offending field
//! reported) and the stored refund (`Refund`). Its public JSON form
//! (`chargeonce_api::Refund`, built in `super::wire`) is the same for
//! answers, replays, reads and events.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::ser::{Serialize, Serializer};
use serde_json::Value;

use super::fields::{object, parse_metadata, FieldError};
use super::lifecycle::{Lease, Record};
use super::{Amount, ChargeId, Fingerprint, MerchantId, Outcome, RefundId, Status};

/// Why a merchant refunds; optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefundReason {
    Duplicate,
    Fraudulent,
    RequestedByCustomer,
}

impl RefundReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Duplicate => "duplicate",
            Self::Fraudulent => "fraudulent",
            Self::RequestedByCustomer => "requested_by_customer",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "duplicate" => Some(Self::Duplicate),
            "fraudulent" => Some(Self::Fraudulent),
            "requested_by_customer" => Some(Self::RequestedByCustomer),
            _ => None,
        }
    }
}

/// A validated refund request. Without `amount`, the refund is for what is
/// left of the charge when it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRefund {
    pub amount: Option<Amount>,
    pub reason: Option<RefundReason>,
    pub metadata: BTreeMap<String, String>,
}

impl NewRefund {
    /// Parses a request body (every member optional; `null` is absent).
    pub fn parse(body: &Value) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let Some(object) = object(body, &["amount", "reason", "metadata"], &mut errors) else {
            return Err(errors);
        };
        let amount = match object.get("amount") {
            None | Some(Value::Null) => None,
            Some(value) => {
                let amount = value.as_i64().and_then(Amount::new);
                if amount.is_none() {
                    errors.push(FieldError::new(
                        "amount",
                        format!(
                            "must be an integer number of minor units from 1 to {}",
                            Amount::MAX
                        ),
                    ));
                }
                amount
            }
        };
        let reason = match object.get("reason") {
            None | Some(Value::Null) => None,
            Some(value) => {
                let reason = value.as_str().and_then(RefundReason::parse);
                if reason.is_none() {
                    errors.push(FieldError::new(
                        "reason",
                        "must be \"duplicate\", \"fraudulent\" or \"requested_by_customer\"",
                    ));
                }
                reason
            }
        };
        let metadata = parse_metadata(object.get("metadata"), &mut errors);
        if errors.is_empty() {
            Ok(Self {
                amount,
                reason,
                metadata,
            })
        } else {
            Err(errors)
        }
    }

    /// The canonical, normalised form the fingerprint is taken of.
    pub fn normalised(&self) -> Value {
        serde_json::json!({
            "amount": self.amount.map(Amount::minor_units),
            "reason": self.reason.map(RefundReason::as_str),
            "metadata": self.metadata,
        })
    }
}

/// A stored refund.
#[derive(Debug, Clone, PartialEq)]
pub struct Refund {
    pub id: RefundId,
    pub merchant_id: MerchantId,
    pub charge_id: ChargeId,
    pub fingerprint: Fingerprint,
    pub amount: i64,
    pub currency: String,
    pub reason: Option<RefundReason>,
    pub metadata: BTreeMap<String, String>,
    pub status: Status,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub lease: Lease,
    /// The processor's id of the charge's payment, which this refunds.
    pub processor_payment_id: String,
    pub created_at: DateTime<Utc>,
}

impl Refund {
    /// About what the refund holds on the heap (for the replay cache's bound).
    pub fn heap_bytes(&self) -> usize {
        super::fields::heap_bytes(
            [
                Some(self.currency.as_str()),
                self.failure_code.as_deref(),
                self.failure_message.as_deref(),
                Some(self.processor_payment_id.as_str()),
            ],
            &self.metadata,
        )
    }

    /// The normalised request this refund was created from, as its
    /// fingerprint was taken: with the amount it names, or without one (the
    /// rest of the charge, which came to this amount). `None` for a key
    /// stored under an older fingerprint scheme.
    pub fn first_request(&self) -> Option<Value> {
        let metadata = self.metadata.clone();
        let with_amount = NewRefund {
            amount: Amount::new(self.amount),
            reason: self.reason,
            metadata: metadata.clone(),
        };
        let the_rest = NewRefund {
            amount: None,
            reason: self.reason,
            metadata,
        };
        super::differences::first_request(
            &self.fingerprint,
            vec![with_amount.normalised(), the_rest.normalised()],
        )
    }

    /// The refund as it will be once `outcome` is recorded.
    pub fn with_outcome(&self, outcome: &Outcome) -> Refund {
        let mut refund = self.clone();
        refund.status = outcome.status();
        refund.lease.locked_until = None;
        if let Outcome::Declined { code, message, .. } = outcome {
            refund.failure_code = Some(code.clone());
            refund.failure_message = Some(message.clone());
        }
        refund
    }
}

impl Record for Refund {
    fn uuid(&self) -> uuid::Uuid {
        *self.id.as_uuid()
    }

    fn public_id(&self) -> String {
        self.id.to_string()
    }

    fn merchant(&self) -> MerchantId {
        self.merchant_id
    }

    fn status(&self) -> Status {
        self.status
    }

    fn lease(&self) -> &Lease {
        &self.lease
    }

    fn created_at(&self) -> DateTime<Utc> {
        self.created_at
    }

    fn heap_bytes(&self) -> usize {
        Refund::heap_bytes(self)
    }

    /// A refund never changes after it is final: its form as created is
    /// its form.
    fn created_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// The public form (`chargeonce_api::Refund`), as answers and events show it.
impl Serialize for Refund {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        chargeonce_api::Refund::from(self).serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(body: Value) -> Vec<String> {
        let mut fields: Vec<_> = NewRefund::parse(&body)
            .expect_err("invalid")
            .into_iter()
            .map(|e| e.field)
            .collect();
        fields.sort();
        fields
    }

    #[test]
    fn every_reason_round_trips_under_its_public_name() {
        for (reason, name) in [
            (RefundReason::Duplicate, "duplicate"),
            (RefundReason::Fraudulent, "fraudulent"),
            (RefundReason::RequestedByCustomer, "requested_by_customer"),
        ] {
            assert_eq!(reason.as_str(), name);
            assert_eq!(RefundReason::parse(name), Some(reason));
        }
        assert_eq!(RefundReason::parse("Duplicate"), None);
    }

    #[test]
    fn heap_bytes_counts_the_texts_and_the_metadata() {
        let metadata = BTreeMap::from([("ticket".to_owned(), "7".to_owned())]);
        let refund = Refund {
            id: RefundId::new(),
            merchant_id: MerchantId::from_uuid(uuid::Uuid::nil()),
            charge_id: ChargeId::new(),
            fingerprint: Fingerprint::of(&json!({})),
            amount: 250,
            currency: "EUR".to_owned(),
            reason: None,
            metadata: metadata.clone(),
            status: Status::Failed,
            failure_code: Some("expired".to_owned()),
            failure_message: None,
            lease: Lease::default(),
            processor_payment_id: "pay_1".to_owned(),
            created_at: DateTime::from_timestamp(1_700_000_000, 0).expect("time"),
        };
        // "EUR" + "expired" + "pay_1", and the metadata.
        assert_eq!(
            refund.heap_bytes(),
            3 + 7 + 5 + crate::domain::fields::heap_bytes([], &metadata)
        );
    }

    #[test]
    fn every_member_is_optional() {
        let refund = NewRefund::parse(&json!({})).expect("valid");
        assert_eq!(refund.amount, None);
        assert_eq!(refund.reason, None);
        let full = NewRefund::parse(&json!({
            "amount": 250, "reason": "requested_by_customer", "metadata": {"ticket": "7"}
        }))
        .expect("valid");
        assert_eq!(full.amount.map(Amount::minor_units), Some(250));
        assert_eq!(full.reason, Some(RefundReason::RequestedByCustomer));
        assert_eq!(
            NewRefund::parse(&json!({"amount": null, "reason": null}))
                .ok()
                .map(|r| r.amount),
            Some(None)
        );
    }

    #[test]
    fn reports_every_offending_field() {
        assert_eq!(
            fields(json!({"amount": 0, "reason": "because", "metadata": {"k": 1}, "x": 1})),
            ["amount", "metadata.k", "reason", "x"]
        );
        assert_eq!(fields(json!({"amount": "10"})), ["amount"]);
        assert_eq!(fields(json!({"amount": 1.5})), ["amount"]);
        assert_eq!(fields(json!([])), [""]);
    }

    #[test]
    fn equivalent_requests_normalise_alike() {
        let a = NewRefund::parse(&json!({"amount": 5})).expect("valid");
        let b =
            NewRefund::parse(&json!({"amount": 5, "metadata": {}, "reason": null})).expect("valid");
        assert_eq!(a.normalised(), b.normalised());
        let c = NewRefund::parse(&json!({})).expect("valid");
        assert_ne!(a.normalised(), c.normalised());
    }
}
