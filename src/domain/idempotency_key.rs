//! The client's idempotency key: 1 to 255 visible ASCII characters. The
//! quoted form of the IETF Idempotency-Key header draft (`"abc"`) names the
//! same key as `abc`.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the Idempotency-Key is empty")]
    Empty,
    #[error(
        "the Idempotency-Key is longer than {} characters",
        IdempotencyKey::MAX_LEN
    )]
    TooLong,
    #[error("the Idempotency-Key may contain only visible ASCII characters (no spaces)")]
    BadCharacter,
    #[error("the Idempotency-Key header was sent more than once; send exactly one")]
    Repeated,
}

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let key = raw
            .strip_prefix('"')
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or(raw);
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError::BadCharacter);
        }
        if key.len() > Self::MAX_LEN {
            return Err(KeyError::TooLong);
        }
        Ok(Self(key.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_as_given() {
        let key = IdempotencyKey::parse("order-1042").expect("valid");
        assert_eq!(key.to_string(), "order-1042");
    }

    #[test]
    fn accepts_visible_ascii_up_to_255() {
        assert_eq!(IdempotencyKey::parse("a").map(|k| k.0), Ok("a".into()));
        let long = "k".repeat(255);
        assert_eq!(IdempotencyKey::parse(&long).map(|k| k.0), Ok(long));
        let symbols = "!#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
        assert!(IdempotencyKey::parse(symbols).is_ok());
    }

    #[test]
    fn quoted_form_is_the_same_key() {
        assert_eq!(
            IdempotencyKey::parse("\"order-42\""),
            IdempotencyKey::parse("order-42")
        );
        // A lone quote is not a quoted form, just a one-character key.
        assert_eq!(IdempotencyKey::parse("\"").map(|k| k.0), Ok("\"".into()));
    }

    #[test]
    fn rejects_empty_long_and_invisible() {
        assert_eq!(IdempotencyKey::parse(""), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse("\"\""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::parse(&"k".repeat(256)),
            Err(KeyError::TooLong)
        );
        assert_eq!(
            IdempotencyKey::parse(&format!("\"{}\"", "k".repeat(256))),
            Err(KeyError::TooLong)
        );
        for bad in ["has space", "tab\there", "caf\u{e9}", "nul\0", "del\x7f"] {
            assert_eq!(
                IdempotencyKey::parse(bad),
                Err(KeyError::BadCharacter),
                "{bad:?}"
            );
        }
    }
}
