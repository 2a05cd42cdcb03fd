//! The request fingerprint: SHA-256 of canonical JSON (object keys sorted, no
//! insignificant whitespace) of the *validated, normalised* request (see
//! `NewCharge::fingerprint`): two bodies that mean the same request (key
//! order, spacing, `null` for an absent field, `{}` for no metadata, `usd`
//! for `USD`) have the same fingerprint; any changed value does not.

use serde_json::Value;
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub const ZERO: Self = Self([0; 32]);

    pub fn of(value: &Value) -> Self {
        let mut canonical = Vec::with_capacity(256);
        write_canonical(value, &mut canonical);
        Self(Sha256::digest(&canonical).into())
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

/// What a request's stored fingerprint is checked against.
///
/// Keys stored before fingerprints were taken of the normalised request
/// carry the fingerprint of the raw body instead (the legacy one), so a
/// retry of such a request still replays. That one is computed only when
/// the current one does not match, which new keys never need: one SHA-256
/// per request instead of two. Remove `body` once every key stored by a
/// version before that change is past `idempotency.retention_hours`.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestFingerprint {
    /// The fingerprint stored with a new request.
    pub current: Fingerprint,
    /// The request body as sent, for the legacy fingerprint.
    body: Value,
}

impl RequestFingerprint {
    /// `normalised` is the validated request's canonical form, `body` the
    /// request body as sent.
    pub fn new(normalised: &Value, body: Value) -> Self {
        Self {
            current: Fingerprint::of(normalised),
            body,
        }
    }

    /// Whether a key stored with `stored` belongs to this same request.
    pub fn matches(&self, stored: &Fingerprint) -> bool {
        *stored == self.current || *stored == Fingerprint::of(&self.body)
    }
}

/// Writes `value` as canonical JSON. Keys are sorted explicitly, so the result
/// does not depend on how serde_json happens to store maps.
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_compact(key, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        // Strings (serde_json escapes them deterministically), numbers,
        // booleans and null have a single compact rendering.
        other => write_compact(other, out),
    }
}

/// serde_json's compact rendering, straight into `out`.
fn write_compact<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail, nor can serialising a JSON value or
    // a string.
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canonical(text: &str) -> String {
        let value: Value = serde_json::from_str(text).expect("json");
        let mut out = Vec::new();
        write_canonical(&value, &mut out);
        String::from_utf8(out).expect("JSON is UTF-8")
    }

    #[test]
    fn bytes_round_trip_and_only_32_of_them_make_a_fingerprint() {
        let fingerprint = Fingerprint::of(&json!({"amount": 1}));
        assert_eq!(
            Fingerprint::from_bytes(fingerprint.as_bytes()),
            Some(fingerprint)
        );
        assert_eq!(
            Fingerprint::from_bytes(&[7; 32]).map(|f| *f.as_bytes()),
            Some([7; 32])
        );
        assert_eq!(Fingerprint::from_bytes(&[7; 31]), None);
    }

    #[test]
    fn a_request_matches_its_current_or_legacy_fingerprint_only() {
        let body = json!({"amount": 1, "currency": "usd"});
        let normalised = json!({"amount": 1, "currency": "USD"});
        let request = RequestFingerprint::new(&normalised, body.clone());
        assert!(request.matches(&Fingerprint::of(&normalised)));
        assert!(request.matches(&Fingerprint::of(&body)));
        assert!(!request.matches(&Fingerprint::of(&json!({"amount": 2}))));
    }

    #[test]
    fn sorts_keys_at_every_depth_and_drops_whitespace() {
        assert_eq!(
            canonical(r#"{ "b": 1, "a": { "z": [ 1, {"y":true, "x":null} ], "c": "s" } }"#),
            r#"{"a":{"c":"s","z":[1,{"x":null,"y":true}]},"b":1}"#
        );
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_fingerprint() {
        let a: Value =
            serde_json::from_str(r#"{"amount":100,"currency":"USD","metadata":{"a":"1","b":"2"}}"#)
                .expect("json");
        let b: Value = serde_json::from_str("{\n \"metadata\": {\"b\":\"2\", \"a\":\"1\"},\n \"currency\":\"USD\", \"amount\": 100 }").expect("json");
        assert_eq!(Fingerprint::of(&a), Fingerprint::of(&b));
    }

    #[test]
    fn any_changed_value_changes_the_fingerprint() {
        let base = json!({"amount": 100, "currency": "USD"});
        for other in [
            json!({"amount": 101, "currency": "USD"}),
            json!({"amount": 100, "currency": "EUR"}),
            json!({"amount": 100, "currency": "USD", "description": "x"}),
            json!({"amount": "100", "currency": "USD"}),
        ] {
            assert_ne!(Fingerprint::of(&base), Fingerprint::of(&other), "{other}");
        }
    }

    /// Fingerprints are stored with their keys, so a request must give the
    /// same bytes in every version: otherwise its retry across an upgrade
    /// is refused with 422. The digest was taken from the code of 2026-12.
    #[test]
    fn a_fingerprint_stays_the_same_across_versions() {
        let request = json!({
            "amount": 1999, "currency": "EUR", "customer": "c\u{fc}s \"1\"\n\t\u{1}",
            "description": null, "metadata": {"b": "2", "a": "\u{e9}\u{1f600}/"},
            "n": -1.5e3, "i": 12345678901234_i64, "t": true, "l": [1, "x", false]
        });
        let hex: String = Fingerprint::of(&request)
            .as_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(
            hex,
            "11c662e5af8c25947adc7dae9f0e183e5cc1ce7a5ba8b38a4fdfa66ddba9815e"
        );
    }

    #[test]
    fn strings_are_escaped_unambiguously() {
        assert_eq!(canonical(r#"{"k":"a\"b\\c\n"}"#), r#"{"k":"a\"b\\c\n"}"#);
        assert_ne!(
            Fingerprint::of(&json!({"a": "b", "c": "d"})),
            Fingerprint::of(&json!({"a": "b\",\"c\":\"d"}))
        );
    }
}
