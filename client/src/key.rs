//! The idempotency key of one logical operation.
//!
//! Invariant: a key names exactly one logical charge or refund. It is made
//! once, before the first attempt, and sent unchanged with every attempt of
//! that operation, including attempts made after a process restart (persist
//! it with the order, then rebuild it with [`IdempotencyKey::from`]). A new
//! key means a new charge.

use std::fmt;

/// The `Idempotency-Key` header value for one logical operation.
///
/// [`IdempotencyKey::new`] makes a random UUIDv4, which is what most callers
/// want. To survive a restart, store [`IdempotencyKey::as_str`] before the
/// first attempt and turn it back into a key with `IdempotencyKey::from`.
///
/// The service accepts 1 to 255 visible ASCII characters (no spaces); a key
/// outside that is refused by the client before anything is sent
/// ([`Error::InvalidKey`](crate::Error::InvalidKey)).
///
/// ```
/// use chargeonce_client::IdempotencyKey;
///
/// let key = IdempotencyKey::new();
/// let stored: String = key.as_str().to_owned(); // e.g. in the orders table
/// assert_eq!(IdempotencyKey::from(stored), key);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The longest key the service accepts, in bytes.
    pub const MAX_LEN: usize = 255;

    /// A fresh random key (UUIDv4, hyphenated).
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// The key as sent in the header.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the service will accept this key: 1 to 255 visible ASCII
    /// characters.
    pub fn is_valid(&self) -> bool {
        !self.0.is_empty()
            && self.0.len() <= Self::MAX_LEN
            && self.0.bytes().all(|b| b.is_ascii_graphic())
    }
}

impl Default for IdempotencyKey {
    /// Same as [`IdempotencyKey::new`]: a fresh random key.
    fn default() -> Self {
        Self::new()
    }
}

impl From<String> for IdempotencyKey {
    fn from(key: String) -> Self {
        Self(key)
    }
}

impl From<&str> for IdempotencyKey {
    fn from(key: &str) -> Self {
        Self(key.to_owned())
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
    fn new_keys_are_distinct_valid_uuids() {
        let (a, b) = (IdempotencyKey::new(), IdempotencyKey::new());
        assert_ne!(a, b);
        assert!(a.is_valid());
        assert!(uuid::Uuid::parse_str(a.as_str()).is_ok());
    }

    #[test]
    fn validity_follows_the_service_rule() {
        assert!(IdempotencyKey::from("order-1001").is_valid());
        assert!(IdempotencyKey::from("k".repeat(255)).is_valid());
        for bad in [
            String::new(),
            "k".repeat(256),
            "has space".into(),
            "café".into(),
        ] {
            assert!(!IdempotencyKey::from(bad.clone()).is_valid(), "{bad:?}");
        }
    }
}
