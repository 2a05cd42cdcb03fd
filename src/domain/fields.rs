//! Request fields shared by charges and refunds: how each is validated, and
//! the error that names the offending field.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// Documented limits of request fields.
pub mod limits {
    pub const CUSTOMER_CHARS: usize = 255;
    pub const DESCRIPTION_CHARS: usize = 1000;
    pub const METADATA_ENTRIES: usize = 50;
    pub const METADATA_KEY_CHARS: usize = 40;
    pub const METADATA_VALUE_CHARS: usize = 500;
}

/// About what a stored record's optional texts and metadata hold on the
/// heap; an estimate for memory bounds, not an exact count.
pub(crate) fn heap_bytes<'a>(
    texts: impl IntoIterator<Item = Option<&'a str>>,
    metadata: &BTreeMap<String, String>,
) -> usize {
    /// A B-tree entry's share of its node beyond the two strings' bytes.
    const METADATA_ENTRY: usize = 64;
    let texts: usize = texts.into_iter().flatten().map(str::len).sum();
    let metadata: usize = metadata
        .iter()
        .map(|(key, value)| METADATA_ENTRY + key.len() + value.len())
        .sum();
    texts + metadata
}

/// The error that names an offending field: a member of the problem
/// document an invalid request gets, so it is the wire type itself.
pub use chargeonce_api::FieldError;

/// The body as an object whose members are all among `known`; otherwise
/// the errors (unknown members each named).
pub(crate) fn object<'a>(
    body: &'a Value,
    known: &[&str],
    errors: &mut Vec<FieldError>,
) -> Option<&'a Map<String, Value>> {
    let Some(object) = body.as_object() else {
        errors.push(FieldError::new("", "the body must be a JSON object"));
        return None;
    };
    for field in object.keys() {
        if !known.contains(&field.as_str()) {
            errors.push(FieldError::new(field.clone(), "unknown field"));
        }
    }
    Some(object)
}

/// PostgreSQL text cannot hold NUL, and no charge needs one.
const NUL_MESSAGE: &str = "must not contain NUL characters (\\u0000)";

pub(crate) fn optional_text(
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

pub(crate) fn parse_metadata(
    value: Option<&Value>,
    errors: &mut Vec<FieldError>,
) -> BTreeMap<String, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_bytes_adds_the_texts_and_a_node_share_per_metadata_entry() {
        let metadata = BTreeMap::from([
            ("k".to_owned(), "vv".to_owned()),
            ("key".to_owned(), "v".to_owned()),
        ]);
        assert_eq!(
            heap_bytes([Some("abc"), None, Some("de")], &metadata),
            5 + 67 + 68
        );
        assert_eq!(heap_bytes([None], &BTreeMap::new()), 0);
    }

    /// The errors `parse_metadata` reports, as (field, message).
    fn metadata_errors(value: Value) -> Vec<(String, String)> {
        let mut errors = Vec::new();
        parse_metadata(Some(&value), &mut errors);
        errors.into_iter().map(|e| (e.field, e.message)).collect()
    }

    #[test]
    fn a_nul_anywhere_is_refused_with_its_own_message() {
        let mut errors = Vec::new();
        let body = serde_json::json!({"customer": "a\u{0}b"});
        let object = body.as_object().expect("object");
        assert_eq!(optional_text(object, "customer", 255, &mut errors), None);
        assert_eq!(errors, [FieldError::new("customer", NUL_MESSAGE)]);
        for (metadata, field) in [
            (serde_json::json!({"k\u{0}": "v"}), "metadata.k\u{0}"),
            (serde_json::json!({"k": "v\u{0}"}), "metadata.k"),
        ] {
            assert_eq!(
                metadata_errors(metadata),
                [(field.to_owned(), NUL_MESSAGE.to_owned())]
            );
        }
    }

    #[test]
    fn a_long_metadata_value_is_told_its_limit() {
        let value = "x".repeat(limits::METADATA_VALUE_CHARS + 1);
        assert_eq!(
            metadata_errors(serde_json::json!({ "k": value })),
            [(
                "metadata.k".to_owned(),
                format!(
                    "must be at most {} characters",
                    limits::METADATA_VALUE_CHARS
                )
            )]
        );
    }
}
