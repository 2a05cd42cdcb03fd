//! Typed ids. Outside the service they carry a prefix (`ch_`, `mer_`) so a
//! charge id can never be mistaken for another kind of id; inside they are
//! UUIDv7, time-ordered, which keeps index inserts local and lets "newest
//! first" be an index scan on the id.

use std::fmt;

use uuid::Uuid;

macro_rules! prefixed_id {
    ($name:ident, $prefix:literal) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            pub fn new() -> Self {
                Self(crate::clock::new_v7())
            }

            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            pub fn as_uuid(&self) -> &Uuid {
                &self.0
            }

            /// Parses the external form; `None` for anything else.
            pub fn parse(text: &str) -> Option<Self> {
                let hex = text.strip_prefix(Self::PREFIX)?;
                if hex.len() != 32 {
                    return None;
                }
                Uuid::try_parse(hex).ok().map(Self)
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", Self::PREFIX, self.0.simple())
            }
        }
    };
}

prefixed_id!(ChargeId, "ch_");
prefixed_id!(MerchantId, "mer_");
prefixed_id!(RefundId, "re_");
prefixed_id!(EventId, "evt_");
prefixed_id!(WebhookEndpointId, "we_");

impl ChargeId {
    /// The idempotency key this charge presents to the payment processor. It
    /// is derived from the charge, so every attempt, from any instance and
    /// after any restart, sends the same one and the processor deduplicates.
    pub fn processor_idempotency_key(&self) -> String {
        format!("chargeonce-{}", self.0.simple())
    }
}

impl RefundId {
    /// The refund's stable key at the processor, like a charge's; its own
    /// prefix keeps it apart from every charge key.
    pub fn processor_idempotency_key(&self) -> String {
        format!("chargeonce-refund-{}", self.0.simple())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_form_round_trips() {
        let id = ChargeId::new();
        let text = id.to_string();
        assert!(text.starts_with("ch_") && text.len() == 35, "{text}");
        assert_eq!(ChargeId::parse(&text), Some(id));
    }

    #[test]
    fn foreign_or_malformed_ids_do_not_parse() {
        let merchant = MerchantId::new().to_string();
        assert_eq!(ChargeId::parse(&merchant), None);
        assert_eq!(ChargeId::parse("ch_123"), None);
        assert_eq!(ChargeId::parse("ch_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"), None);
        assert_eq!(ChargeId::parse(""), None);
    }

    #[test]
    fn the_processor_key_is_stable_per_charge() {
        let id = ChargeId::new();
        let again = ChargeId::parse(&id.to_string()).expect("parses");
        assert_eq!(
            id.processor_idempotency_key(),
            again.processor_idempotency_key()
        );
        assert_ne!(
            id.processor_idempotency_key(),
            ChargeId::new().processor_idempotency_key()
        );
    }

    #[test]
    fn a_refund_key_is_stable_and_apart_from_every_charge_key() {
        let uuid = Uuid::now_v7();
        let refund = RefundId::from_uuid(uuid).processor_idempotency_key();
        let charge = ChargeId::from_uuid(uuid).processor_idempotency_key();
        assert_eq!(refund, format!("chargeonce-refund-{}", uuid.simple()));
        assert_eq!(
            refund,
            RefundId::from_uuid(uuid).processor_idempotency_key()
        );
        assert_ne!(refund, charge);
    }

    #[test]
    fn ids_are_time_ordered() {
        let first = ChargeId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(ChargeId::new() > first);
    }
}
