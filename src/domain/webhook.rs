//! Webhooks: an endpoint request (`NewWebhookEndpoint`, validated with every
//! offending field reported), the stored endpoint and its signing secret, and
//! the deliveries of an event to the endpoints with their attempts.
//!
//! The secret is shown in the answer to the endpoint's creation (and its
//! replays) only (`WebhookEndpoint::as_created` in `super::wire`): the
//! public form of an endpoint never carries it, and `WebhookSecret`'s
//! `Debug` is redacted, so it cannot reach a log line by accident.

use chrono::{DateTime, Utc};
use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;
use url::Url;

use super::fields::{object, FieldError};
use super::{EventId, EventType, Fingerprint, MerchantId, WebhookEndpointId};

/// Longest endpoint URL, as the database allows (`webhook_endpoints_url_format`).
pub const MAX_URL_CHARS: usize = 2048;

/// A validated endpoint request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWebhookEndpoint {
    /// http or https, parsed and normalised (lower-case scheme and host, a
    /// path of at least `/`): what is stored and connected to.
    pub url: Url,
    /// `None`: every type. Otherwise non-empty, each type once, in
    /// `EventType::ALL` order.
    pub event_types: Option<Vec<EventType>>,
}

impl NewWebhookEndpoint {
    /// Parses `{"url": "...", "event_types"?: [...]}`; unknown members,
    /// like any other problem, are reported with their field.
    pub fn parse(body: &Value) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let Some(object) = object(body, &["url", "event_types"], &mut errors) else {
            return Err(errors);
        };
        let url = parse_url(object.get("url"), &mut errors);
        let event_types = parse_event_types(object.get("event_types"), &mut errors);
        match url {
            Some(url) if errors.is_empty() => Ok(Self { url, event_types }),
            _ => Err(errors),
        }
    }

    /// The canonical form the fingerprint is taken of: the normalised URL,
    /// and the types as stored (`null` for every type).
    pub fn normalised(&self) -> Value {
        serde_json::json!({
            "url": self.url.as_str(),
            "event_types": self.event_types.as_ref().map(|types| type_names(types)),
        })
    }
}

fn type_names(types: &[EventType]) -> Vec<&'static str> {
    types.iter().map(|t| t.as_str()).collect()
}

fn parse_url(value: Option<&Value>, errors: &mut Vec<FieldError>) -> Option<Url> {
    let message = match value {
        None | Some(Value::Null) => {
            "required: the http:// or https:// URL to send events to".into()
        }
        Some(Value::String(text)) if text.chars().count() > MAX_URL_CHARS => {
            format!("must be at most {MAX_URL_CHARS} characters")
        }
        Some(Value::String(text)) => match Url::parse(text) {
            Ok(url) if !matches!(url.scheme(), "http" | "https") => {
                "must be an http:// or https:// URL".into()
            }
            Ok(url) if url.host().is_none() => "must name a host".into(),
            // Normalising may percent-encode and so lengthen it.
            Ok(url) if url.as_str().chars().count() > MAX_URL_CHARS => {
                format!("must be at most {MAX_URL_CHARS} characters once normalised")
            }
            Ok(url) => return Some(url),
            Err(error) => format!("must be an absolute http:// or https:// URL ({error})"),
        },
        Some(_) => "must be a string".into(),
    };
    errors.push(FieldError::new("url", message));
    None
}

fn parse_event_types(
    value: Option<&Value>,
    errors: &mut Vec<FieldError>,
) -> Option<Vec<EventType>> {
    let items = match value {
        None | Some(Value::Null) => return None,
        Some(Value::Array(items)) => items,
        Some(_) => {
            errors.push(FieldError::new(
                "event_types",
                "must be a list of event types",
            ));
            return None;
        }
    };
    if items.is_empty() {
        errors.push(FieldError::new(
            "event_types",
            "must not be empty: leave it out (or null) for every event type",
        ));
        return None;
    }
    let mut types = Vec::new();
    for (index, item) in items.iter().enumerate() {
        match item.as_str().and_then(EventType::parse) {
            Some(t) => types.push(t),
            None => errors.push(FieldError::new(
                format!("event_types[{index}]"),
                format!("must be one of {}", EventType::names()),
            )),
        }
    }
    // A set: each type once, in one order, so equal sets store (and
    // fingerprint) the same.
    types.sort_unstable();
    types.dedup();
    Some(types)
}

/// An endpoint's signing secret: `whsec_` and the base64 of 32 random bytes
/// (Standard Webhooks). The bytes are the HMAC key. `Debug` is redacted.
#[derive(Debug, Clone)]
pub struct WebhookSecret(SecretString);

impl WebhookSecret {
    pub const PREFIX: &'static str = "whsec_";
    /// As long as the SHA-256 block the HMAC works on needs no padding of:
    /// the full strength of HMAC-SHA256.
    const KEY_BYTES: usize = 32;

    pub fn generate() -> Self {
        use base64::Engine as _;
        let mut key = [0u8; Self::KEY_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut key);
        let encoded = base64::engine::general_purpose::STANDARD.encode(key);
        Self(format!("{}{encoded}", Self::PREFIX).into())
    }

    /// A secret as stored.
    pub fn from_stored(text: String) -> Self {
        Self(text.into())
    }

    pub fn expose_secret(&self) -> &str {
        self.0.expose_secret()
    }

    /// The HMAC key: the base64-decoded part after `whsec_`. `None` for a
    /// malformed secret (the database's CHECK should make that impossible).
    pub fn signing_key(&self) -> Option<Vec<u8>> {
        use base64::Engine as _;
        let encoded = self.expose_secret().strip_prefix(Self::PREFIX)?;
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .filter(|key| !key.is_empty())
    }
}

/// A stored endpoint.
#[derive(Debug, Clone)]
pub struct WebhookEndpoint {
    pub id: WebhookEndpointId,
    pub merchant_id: MerchantId,
    pub url: String,
    pub event_types: Option<Vec<EventType>>,
    pub secret: WebhookSecret,
    pub fingerprint: Fingerprint,
    pub created_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    /// Not delivered yet; attempted again at `next_attempt_at`.
    Pending,
    /// A 2xx answer.
    Delivered,
    /// Given up: out of attempts, or its endpoint was deleted.
    Failed,
}

impl DeliveryStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(Self::Pending),
            "delivered" => Some(Self::Delivered),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// One event's delivery to one endpoint, with every attempt so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub event_id: EventId,
    pub endpoint_id: WebhookEndpointId,
    pub url: String,
    pub status: DeliveryStatus,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub last_status_code: Option<i32>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub attempt_log: Vec<DeliveryAttempt>,
}

/// What one attempt got: the receiver's status code, or why there was none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryAttempt {
    pub attempt: i32,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: i32,
    pub created_at: DateTime<Utc>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(body: Value) -> Vec<String> {
        let mut fields: Vec<_> = NewWebhookEndpoint::parse(&body)
            .expect_err("invalid")
            .into_iter()
            .map(|e| e.field)
            .collect();
        fields.sort();
        fields
    }

    #[test]
    fn parses_and_normalises() {
        let endpoint = NewWebhookEndpoint::parse(&json!({
            "url": "HTTPS://Example.COM",
            "event_types": ["charge.failed", "charge.succeeded", "charge.failed"]
        }))
        .expect("valid");
        assert_eq!(endpoint.url.as_str(), "https://example.com/");
        assert_eq!(
            endpoint.event_types,
            Some(vec![EventType::ChargeSucceeded, EventType::ChargeFailed])
        );
        let all =
            NewWebhookEndpoint::parse(&json!({"url": "http://a.test/x", "event_types": null}))
                .expect("valid");
        assert_eq!(all.event_types, None);
        assert_eq!(
            all.normalised(),
            json!({"url": "http://a.test/x", "event_types": null})
        );
        assert_eq!(
            endpoint.normalised(),
            json!({"url": "https://example.com/", "event_types": ["charge.succeeded", "charge.failed"]})
        );
    }

    #[test]
    fn delivery_statuses_round_trip_under_their_public_names() {
        for (status, name) in [
            (DeliveryStatus::Pending, "pending"),
            (DeliveryStatus::Delivered, "delivered"),
            (DeliveryStatus::Failed, "failed"),
        ] {
            assert_eq!(status.as_str(), name);
            assert_eq!(DeliveryStatus::parse(name), Some(status));
        }
        assert_eq!(DeliveryStatus::parse("succeeded"), None);
    }

    #[test]
    fn the_url_limit_holds_at_its_exact_edge() {
        let url = |chars: usize| {
            let prefix = "https://example.com/";
            format!("{prefix}{}", "a".repeat(chars - prefix.len()))
        };
        assert!(NewWebhookEndpoint::parse(&json!({ "url": url(MAX_URL_CHARS) })).is_ok());
        let errors = NewWebhookEndpoint::parse(&json!({ "url": url(MAX_URL_CHARS + 1) }))
            .expect_err("too long");
        assert_eq!(
            errors,
            [FieldError::new(
                "url",
                format!("must be at most {MAX_URL_CHARS} characters")
            )]
        );
        // A space is three characters once percent-encoded: the raw URL is
        // within the limit, the normalised one at it or one over.
        let spaced = |chars: usize| url(chars - 3).replacen(".com/", ".com/ ", 1);
        let endpoint = NewWebhookEndpoint::parse(&json!({ "url": spaced(MAX_URL_CHARS) }))
            .expect("at the limit once normalised");
        assert_eq!(endpoint.url.as_str().chars().count(), MAX_URL_CHARS);
        assert_eq!(
            NewWebhookEndpoint::parse(&json!({ "url": spaced(MAX_URL_CHARS + 1) }))
                .expect_err("over the limit once normalised"),
            [FieldError::new(
                "url",
                format!("must be at most {MAX_URL_CHARS} characters once normalised")
            )]
        );
    }

    #[test]
    fn equal_requests_have_equal_canonical_forms() {
        let a = NewWebhookEndpoint::parse(
            &json!({"url": "https://EXAMPLE.com", "event_types": ["refund.failed", "charge.pending"]}),
        )
        .expect("valid");
        let b = NewWebhookEndpoint::parse(
            &json!({"event_types": ["charge.pending", "refund.failed"], "url": "https://example.com/"}),
        )
        .expect("valid");
        assert_eq!(a.normalised(), b.normalised());
    }

    #[test]
    fn reports_every_offending_field() {
        assert_eq!(fields(json!({})), ["url"]);
        assert_eq!(fields(json!({"url": "ftp://x.test/"})), ["url"]);
        assert_eq!(fields(json!({"url": "/relative"})), ["url"]);
        assert_eq!(fields(json!({"url": 5})), ["url"]);
        assert_eq!(
            fields(json!({"url": format!("https://x.test/{}", "a".repeat(2048))})),
            ["url"]
        );
        assert_eq!(
            fields(json!({"url": "https://x.test/", "event_types": []})),
            ["event_types"]
        );
        assert_eq!(
            fields(json!({"url": "https://x.test/", "event_types": "charge.failed"})),
            ["event_types"]
        );
        assert_eq!(
            fields(
                json!({"url": "https://x.test/", "event_types": ["charge.failed", "charge.refunded", 3]})
            ),
            ["event_types[1]", "event_types[2]"]
        );
        assert_eq!(
            fields(json!({"url": "https://x.test/", "enabled": false, "secret": "whsec_x"})),
            ["enabled", "secret"]
        );
        assert_eq!(fields(json!(["https://x.test/"])), [""]);
    }

    #[test]
    fn secrets_have_the_standard_form_and_decode_to_32_bytes() {
        let secret = WebhookSecret::generate();
        let text = secret.expose_secret();
        assert!(text.starts_with("whsec_") && text.len() == 6 + 44, "{text}");
        assert_eq!(secret.signing_key().map(|k| k.len()), Some(32));
        assert_ne!(text, WebhookSecret::generate().expose_secret());
        assert!(!format!("{secret:?}").contains(&text[6..]));
        assert_eq!(
            WebhookSecret::from_stored("whsec_!!".into()).signing_key(),
            None
        );
    }
}
