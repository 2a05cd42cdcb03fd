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
    /// http or https, exactly as sent but for the normalisation
    /// `strict_url` allows (lower-case scheme and host, no default port, a
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
        Some(Value::String(text)) => match strict_url(text) {
            Ok(url) => return Some(url),
            Err(message) => message,
        },
        Some(_) => "must be a string".into(),
    };
    errors.push(FieldError::new("url", message));
    None
}

/// `text` as a URL, if it is one and is written the way it is read. The
/// WHATWG parser (`url::Url`) repairs what it can: it drops control
/// characters and white space, percent-encodes, resolves `..`, reads
/// `http:///x` as the host `x` and `0x7f000001` as `127.0.0.1`. An endpoint
/// stores what was sent, so a URL the parser would have to change is
/// refused, saying how it reads. The only changes made are the documented
/// normalisation (docs/api.md): scheme and host in lower case, the scheme's
/// default port left out, an empty path written `/`. User names and
/// passwords (`user:pass@host`) and fragments (`#…`, never sent) are
/// refused too.
fn strict_url(text: &str) -> Result<Url, String> {
    if text.chars().count() > MAX_URL_CHARS {
        return Err(format!("must be at most {MAX_URL_CHARS} characters"));
    }
    if let Some((at, c)) = text.char_indices().find(|(_, c)| c.is_control()) {
        return Err(format!(
            "must not contain control characters (U+{:04X} at byte {at})",
            u32::from(c)
        ));
    }
    if let Some((at, _)) = text.char_indices().find(|(_, c)| c.is_whitespace()) {
        return Err(format!(
            "must not contain white space (at byte {at}); percent-encode it"
        ));
    }
    let url = Url::parse(text).map_err(|error| match error {
        url::ParseError::EmptyHost => "must name a host (http://host/...)".to_owned(),
        error => format!("must be an absolute http:// or https:// URL ({error})"),
    })?;
    let scheme = url.scheme();
    if !matches!(scheme, "http" | "https") {
        return Err("must be an http:// or https:// URL".into());
    }
    // The parser took the scheme from the text, so it is its first
    // `scheme.len()` bytes, in some letter case, followed by ':'.
    let after_scheme = text.get(scheme.len() + 1..).unwrap_or("");
    let Some(after_slashes) = after_scheme.strip_prefix("//") else {
        return Err(format!("must start with {scheme}://"));
    };
    let authority_ends = after_slashes
        .find(['/', '?', '#', '\\'])
        .unwrap_or(after_slashes.len());
    let (authority, rest) = after_slashes.split_at(authority_ends);
    if authority.is_empty() {
        return Err(format!("must name a host ({scheme}://host/...)"));
    }
    if authority.contains('@') || !url.username().is_empty() || url.password().is_some() {
        return Err("must not contain a user name or password (user@host)".into());
    }
    if url.fragment().is_some() {
        return Err("must not have a fragment (#...): it is never sent".into());
    }
    let default_port = if scheme == "http" { ":80" } else { ":443" };
    let authority = authority.to_ascii_lowercase();
    let authority = authority.strip_suffix(default_port).unwrap_or(&authority);
    let path = if rest.starts_with('/') { "" } else { "/" };
    let as_sent = format!("{scheme}://{authority}{path}{rest}");
    if as_sent != url.as_str() {
        return Err(format!(
            "must be written the way it is read: it reads as {url} (only the scheme's and \
             host's letter case, a default port and an empty path are normalised)"
        ));
    }
    // Normalising may add a `/`, and so lengthen it.
    if url.as_str().chars().count() > MAX_URL_CHARS {
        return Err(format!(
            "must be at most {MAX_URL_CHARS} characters once normalised"
        ));
    }
    Ok(url)
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
    /// When the circuit breaker disabled it, after its attempts kept
    /// failing; no delivery goes to it any more.
    pub disabled_at: Option<DateTime<Utc>>,
}

impl WebhookEndpoint {
    /// The normalised request this endpoint was created from, as its
    /// fingerprint was taken (`None` for a key stored under an older
    /// fingerprint scheme): what a reuse of its key is compared with.
    pub fn first_request(&self) -> Option<serde_json::Value> {
        let request = serde_json::json!({
            "url": self.url,
            "event_types": self.event_types.as_ref().map(|types| type_names(types)),
        });
        super::differences::first_request(&self.fingerprint, vec![request])
    }
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
        // Without a path, normalising adds `/`: within the limit as sent,
        // at it or one over once normalised.
        let query = |chars: usize| {
            let prefix = "https://example.com?";
            format!("{prefix}{}", "a".repeat(chars - prefix.len()))
        };
        let endpoint = NewWebhookEndpoint::parse(&json!({ "url": query(MAX_URL_CHARS - 1) }))
            .expect("at the limit once normalised");
        assert_eq!(endpoint.url.as_str().chars().count(), MAX_URL_CHARS);
        assert_eq!(
            NewWebhookEndpoint::parse(&json!({ "url": query(MAX_URL_CHARS) }))
                .expect_err("over the limit once normalised"),
            [FieldError::new(
                "url",
                format!("must be at most {MAX_URL_CHARS} characters once normalised")
            )]
        );
    }

    /// The message for `url`, which must be refused.
    fn refused(url: &str) -> String {
        let errors = NewWebhookEndpoint::parse(&json!({ "url": url }))
            .expect_err(&format!("{url:?} is refused"));
        assert_eq!(errors.len(), 1, "{url:?}: {errors:?}");
        assert_eq!(errors[0].field, "url", "{url:?}");
        errors[0].message.clone()
    }

    #[test]
    fn a_url_the_parser_would_repair_is_refused() {
        for (url, says) in [
            ("http://127.0.0.1:18100/x\r\nX-Injected: 1", "U+000D"),
            ("http://127.0.0.1:18100/x\nX-Injected: 1", "U+000A"),
            ("http://127.0.0.1:18100/x\u{0}", "U+0000"),
            ("http://example.com/\u{1b}[31m", "U+001B"),
            ("http://exa\tmple.com/", "U+0009"),
            ("http://example.com/\u{7f}", "U+007F"),
            ("http://example.com/\u{85}", "U+0085"),
            (" http://example.com/", "white space"),
            ("http://example.com/a b", "white space"),
            ("http://example.com/\u{a0}", "white space"),
            ("http:///x", "must name a host"),
            ("https:///", "must name a host"),
            ("http://?x", "must name a host"),
            ("http:/example.com/", "must start with http://"),
            ("http:example.com", "must start with http://"),
            ("http://user@example.com/", "user name or password"),
            ("http://user:pass@example.com/", "user name or password"),
            ("http://@example.com/", "user name or password"),
            ("http://example.com/#frag", "fragment"),
            ("http://example.com/#", "fragment"),
            ("http://example.com/a/../b", "reads as http://example.com/b"),
            ("http://example.com/./a", "reads as http://example.com/a"),
            ("http://example.com\\a", "reads as http://example.com/a"),
            ("http://0x7f000001/", "reads as http://127.0.0.1/"),
            ("http://2130706433/", "reads as http://127.0.0.1/"),
            (
                "http://[::ffff:127.0.0.1]/",
                "reads as http://[::ffff:7f00:1]/",
            ),
            (
                "http://b\u{fc}cher.de/",
                "reads as http://xn--bcher-kva.de/",
            ),
            (
                "http://example.com/\u{e9}",
                "reads as http://example.com/%C3%A9",
            ),
            ("http://ex%41mple.com/", "reads as http://example.com/"),
            ("http://example.com:/", "reads as http://example.com/"),
            ("http://example.com:0080/", "reads as http://example.com/"),
        ] {
            let message = refused(url);
            assert!(message.contains(says), "{url:?}: {message}");
        }
    }

    #[test]
    fn only_the_documented_normalisation_is_applied() {
        for (sent, stored) in [
            ("HTTPS://Example.COM", "https://example.com/"),
            (
                "http://EXAMPLE.com:80/Path?Q=A",
                "http://example.com/Path?Q=A",
            ),
            ("https://example.com:443", "https://example.com/"),
            ("https://example.com:8443/x", "https://example.com:8443/x"),
            ("http://example.com?a=1", "http://example.com/?a=1"),
            ("http://[2001:DB8::1]:8080/h", "http://[2001:db8::1]:8080/h"),
            (
                "http://127.0.0.1:18100/x%0D%0A",
                "http://127.0.0.1:18100/x%0D%0A",
            ),
            ("https://example.com/a%20b", "https://example.com/a%20b"),
            ("http://xn--bcher-kva.de/", "http://xn--bcher-kva.de/"),
        ] {
            let endpoint = NewWebhookEndpoint::parse(&json!({ "url": sent }))
                .unwrap_or_else(|e| panic!("{sent:?}: {e:?}"));
            assert_eq!(endpoint.url.as_str(), stored, "{sent:?}");
        }
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
