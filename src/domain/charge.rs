//! Charges: the request a client makes (`NewCharge`, parsed and validated
//! here with every offending field reported), the stored charge (`Charge`),
//! and its public JSON form, which is the same for the first answer, replays,
//! reads and events.

use std::collections::BTreeMap;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::ser::{Serialize, SerializeStruct, Serializer};
use serde_json::{Map, Value};

use super::{Amount, ChargeId, Currency, Fingerprint, MerchantId};

/// Documented limits of a charge request.
pub mod limits {
    pub const CUSTOMER_CHARS: usize = 255;
    pub const DESCRIPTION_CHARS: usize = 1000;
    pub const METADATA_ENTRIES: usize = 50;
    pub const METADATA_KEY_CHARS: usize = 40;
    pub const METADATA_VALUE_CHARS: usize = 500;
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

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
        let Some(object) = body.as_object() else {
            return Err(vec![FieldError::new("", "the body must be a JSON object")]);
        };
        let mut errors = Vec::new();
        for field in object.keys() {
            if !matches!(
                field.as_str(),
                "amount" | "currency" | "customer" | "description" | "metadata"
            ) {
                errors.push(FieldError::new(field.clone(), "unknown field"));
            }
        }
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

/// PostgreSQL text cannot hold NUL, and no charge needs one.
const NUL_MESSAGE: &str = "must not contain NUL characters (\\u0000)";

fn optional_text(
    object: &Map<String, Value>,
    field: &str,
    max_chars: usize,
    errors: &mut Vec<FieldError>,
) -> Option<String> {
    match object.get(field) {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) if text.contains('\0') => {
            errors.push(FieldError::new(field, NUL_MESSAGE));
            None
        }
        Some(Value::String(text)) if text.chars().count() <= max_chars => Some(text.clone()),
        Some(Value::String(_)) => {
            errors.push(FieldError::new(
                field,
                format!("must be at most {max_chars} characters"),
            ));
            None
        }
        Some(_) => {
            errors.push(FieldError::new(field, "must be a string"));
            None
        }
    }
}

fn parse_metadata(value: Option<&Value>, errors: &mut Vec<FieldError>) -> BTreeMap<String, String> {
    let mut metadata = BTreeMap::new();
    let entries = match value {
        None | Some(Value::Null) => return metadata,
        Some(Value::Object(entries)) => entries,
        Some(_) => {
            errors.push(FieldError::new(
                "metadata",
                "must be an object of string values",
            ));
            return metadata;
        }
    };
    if entries.len() > limits::METADATA_ENTRIES {
        errors.push(FieldError::new(
            "metadata",
            format!("must have at most {} entries", limits::METADATA_ENTRIES),
        ));
        return metadata;
    }
    for (key, item) in entries {
        let field = format!("metadata.{key}");
        if key.contains('\0') || item.as_str().is_some_and(|text| text.contains('\0')) {
            errors.push(FieldError::new(field, NUL_MESSAGE));
            continue;
        }
        let key_chars = key.chars().count();
        if key_chars == 0 || key_chars > limits::METADATA_KEY_CHARS {
            errors.push(FieldError::new(
                field,
                format!(
                    "keys must be 1 to {} characters",
                    limits::METADATA_KEY_CHARS
                ),
            ));
            continue;
        }
        match item {
            Value::String(text) if text.chars().count() <= limits::METADATA_VALUE_CHARS => {
                metadata.insert(key.clone(), text.clone());
            }
            Value::String(_) => errors.push(FieldError::new(
                field,
                format!(
                    "must be at most {} characters",
                    limits::METADATA_VALUE_CHARS
                ),
            )),
            _ => errors.push(FieldError::new(field, "must be a string")),
        }
    }
    metadata
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChargeStatus {
    Pending,
    Succeeded,
    Failed,
}

impl ChargeStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(Self::Pending),
            "succeeded" => Some(Self::Succeeded),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// The processor's final word on a charge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded {
        payment_id: String,
    },
    Declined {
        payment_id: Option<String>,
        code: String,
        message: String,
    },
}

impl Outcome {
    pub fn status(&self) -> ChargeStatus {
        match self {
            Self::Succeeded { .. } => ChargeStatus::Succeeded,
            Self::Declined { .. } => ChargeStatus::Failed,
        }
    }
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
    pub status: ChargeStatus,
    pub failure_code: Option<String>,
    pub failure_message: Option<String>,
    pub locked_until: Option<DateTime<Utc>>,
    /// Processor calls that ended without a final answer; sets the pace of
    /// the next one (see `service::charges::retry_delay`).
    pub processor_attempts: i32,
    pub created_at: DateTime<Utc>,
}

impl Charge {
    /// The charge as it will be once `outcome` is recorded.
    pub fn with_outcome(&self, outcome: &Outcome) -> Charge {
        let mut charge = self.clone();
        charge.status = outcome.status();
        charge.locked_until = None;
        if let Outcome::Declined { code, message, .. } = outcome {
            charge.failure_code = Some(code.clone());
            charge.failure_message = Some(message.clone());
        }
        charge
    }
}

/// The public form. Only fields that are fixed once the charge is final are
/// shown, so a replay renders the same bytes as the first answer.
impl Serialize for Charge {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_struct("Charge", 10)?;
        out.serialize_field("id", &self.id.to_string())?;
        out.serialize_field("object", "charge")?;
        out.serialize_field("amount", &self.amount)?;
        out.serialize_field("currency", &self.currency)?;
        out.serialize_field("status", self.status.as_str())?;
        out.serialize_field("customer", &self.customer)?;
        out.serialize_field("description", &self.description)?;
        out.serialize_field("metadata", &self.metadata)?;
        out.serialize_field("failure_code", &self.failure_code)?;
        out.serialize_field("failure_message", &self.failure_message)?;
        out.serialize_field(
            "created_at",
            &self.created_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        )?;
        out.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(body: Value) -> Vec<String> {
        let mut fields: Vec<_> = NewCharge::parse(&body)
            .expect_err("invalid")
            .into_iter()
            .map(|e| e.field)
            .collect();
        fields.sort();
        fields
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
}
