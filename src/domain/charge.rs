//! Charges: the request a client makes (`NewCharge`, parsed and validated
//! here with every offending field reported) and the stored charge
//! (`Charge`). Its public JSON form (`chargeonce_api::Charge`, built in
//! `super::wire`) is the same for the first answer, replays, reads and
//! events.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::ser::{Serialize, Serializer};
use serde_json::Value;

use super::fields::{limits, object, optional_text, parse_metadata, FieldError};
use super::lifecycle::{Lease, Record};
use super::{Amount, ChargeId, Currency, Fingerprint, MerchantId, Outcome, Status};

/// A validated charge request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCharge {
    pub amount: Amount,
    pub currency: Currency,
    pub customer: Option<String>,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
}

impl NewCharge {
    /// Parses a request body. Collects every problem rather than stopping at
    /// the first, so a client can fix them all at once. `null` counts as
    /// absent for the optional fields.
    pub fn parse(body: &Value) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let known = ["amount", "currency", "customer", "description", "metadata"];
        let Some(object) = object(body, &known, &mut errors) else {
            return Err(errors);
        };
        let amount = parse_amount(object.get("amount"), &mut errors);
        let currency = parse_currency(object.get("currency"), &mut errors);
        let customer = optional_text(object, "customer", limits::CUSTOMER_CHARS, &mut errors);
        let description = optional_text(
            object,
            "description",
            limits::DESCRIPTION_CHARS,
            &mut errors,
        );
        let metadata = parse_metadata(object.get("metadata"), &mut errors);
        match (amount, currency) {
            (Some(amount), Some(currency)) if errors.is_empty() => Ok(Self {
                amount,
                currency,
                customer,
                description,
                metadata,
            }),
            _ => Err(errors),
        }
    }

    /// The request in its canonical, normalised form: every field present
    /// (absent is `null`, no metadata is `{}`), the currency in upper case.
    /// Two bodies that mean the same request have the same form; it is what
    /// the fingerprint is taken of.
    pub fn normalised(&self) -> Value {
        serde_json::json!({
            "amount": self.amount.minor_units(),
            "currency": self.currency.as_str(),
            "customer": self.customer,
            "description": self.description,
            "metadata": self.metadata,
        })
    }
}

fn parse_amount(value: Option<&Value>, errors: &mut Vec<FieldError>) -> Option<Amount> {
    let message = match value {
        None | Some(Value::Null) => "required: an integer amount in minor units",
        Some(Value::Number(n)) => match n.as_i64() {
            Some(units) => match Amount::new(units) {
                Some(amount) => return Some(amount),
                None if units <= 0 => "must be greater than 0",
                None => "must be at most 99999999999",
            },
            None if n.is_u64() => "must be at most 99999999999",
            None => "must be an integer number of minor units",
        },
        Some(_) => "must be an integer number of minor units",
    };
    errors.push(FieldError::new("amount", message));
    None
}

fn parse_currency(value: Option<&Value>, errors: &mut Vec<FieldError>) -> Option<Currency> {
    let message = match value {
        None | Some(Value::Null) => "required: an ISO 4217 currency code such as \"USD\"",
        Some(Value::String(code)) => match Currency::parse(code) {
            Some(currency) => return Some(currency),
            None => "must be an active ISO 4217 currency code, such as \"USD\"",
        },
        Some(_) => "must be a string",
    };
    errors.push(FieldError::new("currency", message));
    None
}

/// A stored charge.
#[derive(Debug, Clone, PartialEq)]
pub struct Charge {
    pub id: ChargeId,
    pub merchant_id: MerchantId,
    pub fingerprint: Fingerprint,
    pub amount: i64,
    pub currency: String,
    pub customer: Option<String>,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub status: Status,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub lease: Lease,
    /// Pending and succeeded refunds together: never more than `amount`.
    pub refunds_reserved: i64,
    /// Succeeded refunds.
    pub amount_refunded: i64,
    /// The processor's id of the payment, once it succeeded (refunds name it).
    pub processor_payment_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl Charge {
    /// About what the charge holds on the heap (for the replay cache's bound).
    pub fn heap_bytes(&self) -> usize {
        super::fields::heap_bytes(
            [
                Some(self.currency.as_str()),
                self.customer.as_deref(),
                self.description.as_deref(),
                self.failure_code.as_deref(),
                self.failure_message.as_deref(),
                self.processor_payment_id.as_deref(),
            ],
            &self.metadata,
        )
    }

    /// The charge as the answer to its creation shows it: before any refund,
    /// which can only follow. A replay of `POST /v1/charges` is rendered from
    /// this, so it stays byte for byte the first answer while refunds change
    /// the charge; `GET` shows the charge as it is.
    pub fn into_created(self) -> Charge {
        Charge {
            refunds_reserved: 0,
            amount_refunded: 0,
            ..self
        }
    }

    /// The charge as it will be once `outcome` is recorded.
    pub fn with_outcome(&self, outcome: &Outcome) -> Charge {
        let mut charge = self.clone();
        charge.status = outcome.status();
        charge.lease.locked_until = None;
        if let Outcome::Declined { code, message, .. } = outcome {
            charge.failure_code = Some(code.clone());
            charge.failure_message = Some(message.clone());
        }
        charge
    }

    /// The normalised request this charge was created from, as its
    /// fingerprint was taken (`None` for a key stored under an older
    /// fingerprint scheme): what a reuse of its key is compared with.
    pub fn first_request(&self) -> Option<Value> {
        let request = NewCharge {
            amount: Amount::new(self.amount)?,
            currency: Currency::parse(&self.currency)?,
            customer: self.customer.clone(),
            description: self.description.clone(),
            metadata: self.metadata.clone(),
        };
        super::differences::first_request(&self.fingerprint, vec![request.normalised()])
    }

    /// The public JSON of `into_created`, without a copy of the charge: what
    /// the replay cache keeps, so a replay is not rendered again.
    pub fn created_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(&super::wire::charge_with(self, 0))
    }
}

impl Record for Charge {
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
        Charge::heap_bytes(self)
    }

    fn created_json(&self) -> Result<String, serde_json::Error> {
        Charge::created_json(self)
    }
}

/// The public form (`chargeonce_api::Charge`), as events record it.
impl Serialize for Charge {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        chargeonce_api::Charge::from(self).serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Map};

    fn fields(body: Value) -> Vec<String> {
        let mut fields: Vec<_> = NewCharge::parse(&body)
            .expect_err("invalid")
            .into_iter()
            .map(|e| e.field)
            .collect();
        fields.sort();
        fields
    }

    /// The messages of `body`'s errors, by field.
    fn messages(body: Value) -> Vec<(String, String)> {
        NewCharge::parse(&body)
            .expect_err("invalid")
            .into_iter()
            .map(|e| (e.field, e.message))
            .collect()
    }

    fn amount_message(amount: Value) -> String {
        let errors = messages(json!({"amount": amount, "currency": "USD"}));
        assert_eq!(errors.len(), 1, "{errors:?}");
        errors[0].1.clone()
    }

    #[test]
    fn each_bad_amount_gets_the_message_that_says_why() {
        assert!(amount_message(Value::Null).starts_with("required"));
        assert_eq!(amount_message(json!(0)), "must be greater than 0");
        assert_eq!(amount_message(json!(-5)), "must be greater than 0");
        assert_eq!(
            amount_message(json!(100_000_000_000i64)),
            "must be at most 99999999999"
        );
        assert_eq!(
            amount_message(json!(u64::MAX)),
            "must be at most 99999999999"
        );
        assert_eq!(
            amount_message(json!(12.5)),
            "must be an integer number of minor units"
        );
        assert_eq!(
            amount_message(json!("12")),
            "must be an integer number of minor units"
        );
        let missing = messages(json!({"currency": "USD"}));
        assert!(missing[0].1.starts_with("required"), "{missing:?}");
        for ok in [1, 99_999_999_999i64] {
            assert!(NewCharge::parse(&json!({"amount": ok, "currency": "USD"})).is_ok());
        }
    }

    /// Every limit at its exact edge: the limit passes, one more fails.
    #[test]
    fn limits_hold_at_their_exact_edges() {
        let with = |member: &str, value: Value| {
            let mut body = json!({"amount": 100, "currency": "USD"});
            body[member] = value;
            NewCharge::parse(&body)
                .map(|_| ())
                // The field, without the entry a metadata error names.
                .map_err(|errors| {
                    errors
                        .into_iter()
                        .map(|e| e.field.split('.').next().unwrap_or_default().to_owned())
                        .collect::<Vec<_>>()
                })
        };
        let entries = |n: usize, key_len: usize, value_len: usize| -> Value {
            (0..n)
                .map(|i| {
                    let key = format!("{i:0>width$}", width = key_len);
                    (key, json!("v".repeat(value_len)))
                })
                .collect::<Map<String, Value>>()
                .into()
        };
        assert!(with("metadata", entries(50, 3, 1)).is_ok());
        assert_eq!(
            with("metadata", entries(51, 3, 1)),
            Err(vec!["metadata".to_owned()])
        );
        assert!(with("metadata", entries(1, 40, 1)).is_ok());
        assert_eq!(
            with("metadata", entries(1, 41, 1)),
            Err(vec!["metadata".to_owned()])
        );
        assert!(with("metadata", json!({"": "v"})).is_err(), "an empty key");
        assert!(with("metadata", entries(1, 3, 500)).is_ok());
        assert_eq!(
            with("metadata", entries(1, 3, 501)),
            Err(vec!["metadata".to_owned()])
        );
        assert!(
            with("metadata", json!({"k": 1})).is_err(),
            "values are strings"
        );
        assert!(with("customer", json!("c".repeat(255))).is_ok());
        assert_eq!(
            with("customer", json!("c".repeat(256))),
            Err(vec!["customer".to_owned()])
        );
        assert!(with("description", json!("d".repeat(1000))).is_ok());
        assert_eq!(
            with("description", json!("d".repeat(1001))),
            Err(vec!["description".to_owned()])
        );
        // Characters, not bytes.
        assert!(with("customer", json!("é".repeat(255))).is_ok());
    }

    #[test]
    fn every_status_parses_and_nothing_else_does() {
        use crate::domain::Status;
        for status in [Status::Pending, Status::Succeeded, Status::Failed] {
            assert_eq!(Status::parse(status.as_str()), Some(status));
        }
        for other in ["", "Pending", "refunded", "succeeded "] {
            assert_eq!(Status::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn parses_a_full_request() {
        let charge = NewCharge::parse(&json!({
            "amount": 1999, "currency": "EUR", "customer": "cus_1",
            "description": "Order 7", "metadata": {"order": "7"}
        }))
        .expect("valid");
        assert_eq!(charge.amount.minor_units(), 1999);
        assert_eq!(charge.currency.as_str(), "EUR");
        assert_eq!(charge.customer.as_deref(), Some("cus_1"));
        assert_eq!(charge.metadata.get("order").map(String::as_str), Some("7"));
    }

    #[test]
    fn null_optional_fields_are_absent() {
        let charge = NewCharge::parse(&json!({
            "amount": 1, "currency": "USD", "customer": null, "description": null, "metadata": null
        }))
        .expect("valid");
        assert_eq!(charge.customer, None);
        assert!(charge.metadata.is_empty());
    }

    #[test]
    fn reports_every_offending_field() {
        assert_eq!(
            fields(
                json!({"amount": -5, "currency": "dollar", "colour": "red", "metadata": {"k": 1}})
            ),
            ["amount", "colour", "currency", "metadata.k"]
        );
        assert_eq!(fields(json!({})), ["amount", "currency"]);
        assert_eq!(fields(json!([1, 2])), [""]);
    }

    #[test]
    fn amount_must_be_a_positive_bounded_integer() {
        for bad in [
            json!(0),
            json!(-1),
            json!(1.5),
            json!("100"),
            json!(100000000000_i64),
            json!(u64::MAX),
            json!(1e3),
            json!(true),
        ] {
            assert_eq!(
                fields(json!({"amount": bad, "currency": "USD"})),
                ["amount"],
                "{bad}"
            );
        }
    }

    #[test]
    fn strings_and_metadata_have_size_limits() {
        let long = |n: usize| "x".repeat(n);
        assert_eq!(
            fields(json!({"amount": 1, "currency": "USD", "customer": long(256)})),
            ["customer"]
        );
        assert_eq!(
            fields(json!({"amount": 1, "currency": "USD", "description": long(1001)})),
            ["description"]
        );
        let too_many: Map<String, Value> = (0..51).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert_eq!(
            fields(json!({"amount": 1, "currency": "USD", "metadata": too_many})),
            ["metadata"]
        );
        let key = long(41);
        assert_eq!(
            fields(json!({"amount": 1, "currency": "USD", "metadata": {key.clone(): "v"}})),
            [format!("metadata.{key}")]
        );
        assert_eq!(
            fields(json!({"amount": 1, "currency": "USD", "metadata": {"k": long(501)}})),
            ["metadata.k"]
        );
        // Limits count characters, not bytes.
        assert!(NewCharge::parse(
            &json!({"amount": 1, "currency": "USD", "customer": "é".repeat(255)})
        )
        .is_ok());
    }

    fn stored(amount: i64, amount_refunded: i64) -> Charge {
        Charge {
            id: ChargeId::new(),
            merchant_id: MerchantId::from_uuid(uuid::Uuid::nil()),
            fingerprint: Fingerprint::of(&json!({"amount": amount})),
            amount,
            currency: "USD".to_owned(),
            customer: Some("cus_1".to_owned()),
            description: None,
            metadata: BTreeMap::from([("order".to_owned(), "42".to_owned())]),
            status: Status::Succeeded,
            failure_code: None,
            failure_message: None,
            lease: Lease::default(),
            refunds_reserved: amount_refunded + 100,
            amount_refunded,
            processor_payment_id: Some("pay_1".to_owned()),
            created_at: DateTime::from_timestamp(1_700_000_000, 0).expect("time"),
        }
    }

    #[test]
    fn the_created_form_has_no_refunds_and_nothing_else_changed() {
        let charge = stored(1000, 300);
        let created = charge.clone().into_created();
        assert_eq!((created.refunds_reserved, created.amount_refunded), (0, 0));
        assert_eq!(
            Charge {
                refunds_reserved: 400,
                amount_refunded: 300,
                ..created
            },
            charge
        );
    }

    /// What the replay cache keeps is what the answer to the creation
    /// renders: the same bytes, refunds or not.
    #[test]
    fn the_created_json_is_the_created_form_rendered() {
        for refunded in [0, 300, 1000] {
            let charge = stored(1000, refunded);
            assert_eq!(
                charge.created_json().expect("renders"),
                serde_json::to_string(&charge.clone().into_created()).expect("renders"),
                "{refunded} refunded"
            );
        }
    }

    #[test]
    fn refunded_means_refunded_in_full() {
        let json = |charge: &Charge| serde_json::to_value(charge).expect("json");
        assert_eq!(json(&stored(1000, 300))["refunded"], json!(false));
        assert_eq!(json(&stored(1000, 1000))["refunded"], json!(true));
        assert_eq!(json(&stored(1000, 1000))["amount_refunded"], json!(1000));
    }

    #[test]
    fn heap_bytes_counts_the_texts_and_the_metadata() {
        // "USD" + "cus_1" + "pay_1", and one metadata entry.
        let expected = 3 + 5 + 5 + crate::domain::fields::heap_bytes([], &stored(1, 0).metadata);
        assert_eq!(stored(1, 0).heap_bytes(), expected);
    }
}
