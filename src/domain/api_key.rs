//! Secret API keys. The secret is shown once, when the merchant is created;
//! the database keeps only its SHA-256 digest. Secrets carry 192 random bits,
//! so a fast digest is safe: there is no dictionary to try.

use rand::RngCore;
use secrecy::{ExposeSecret, SecretString};
use sha2::{Digest, Sha256};

/// A secret key. `Debug` prints it redacted; reading it takes an explicit
/// `expose_secret`.
#[derive(Debug)]
pub struct ApiKey(SecretString);

impl ApiKey {
    pub const PREFIX: &'static str = "sk_";

    pub fn generate() -> Self {
        let mut bytes = [0u8; 24];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        Self(format!("{}{}", Self::PREFIX, hex::encode(bytes)).into())
    }

    pub fn from_secret(secret: &str) -> Self {
        Self(secret.into())
    }

    pub fn expose_secret(&self) -> &str {
        self.0.expose_secret()
    }

    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(self.expose_secret().as_bytes()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_are_unique_and_prefixed() {
        let (a, b) = (ApiKey::generate(), ApiKey::generate());
        assert!(a.expose_secret().starts_with("sk_"));
        assert_eq!(a.expose_secret().len(), 3 + 48);
        assert_ne!(a.expose_secret(), b.expose_secret());
        assert_ne!(a.digest(), b.digest());
    }

    #[test]
    fn the_digest_depends_only_on_the_secret_and_debug_hides_it() {
        let key = ApiKey::generate();
        assert_eq!(
            ApiKey::from_secret(key.expose_secret()).digest(),
            key.digest()
        );
        assert!(!format!("{key:?}").contains(key.expose_secret()));
    }
}
