//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): the
//! receiver gets `webhook-id`, `webhook-timestamp` (unix seconds) and
//! `webhook-signature: v1,<base64 of HMAC-SHA256>` over
//! `"{webhook-id}.{webhook-timestamp}.{body}"`, keyed with the bytes the
//! endpoint's secret encodes (base64 after `whsec_`). The timestamp is
//! signed, so a receiver that refuses old timestamps refuses replays.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The `webhook-signature` header value for one attempt.
pub fn sign(key: &[u8], webhook_id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length; this cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(webhook_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks reference libraries (secret,
    /// id, timestamp, body and the signature they compute).
    #[test]
    fn matches_the_reference_example() {
        let key = base64::engine::general_purpose::STANDARD
            .decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .expect("base64");
        let signature = sign(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }
}
