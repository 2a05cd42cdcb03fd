//! The simulated processor: in-process, deterministic, for local use and for
//! other teams' test suites. The answer depends only on the amount's last two
//! digits and the idempotency key:
//!
//! | amount ends in | answer |
//! |---|---|
//! | `02` | declined, `card_declined` |
//! | `05` | declined, `insufficient_funds` |
//! | `09` | the first call for a key times out (outcome unknown, but the payment was made); later calls with that key answer `succeeded` |
//! | anything else | succeeded |
//!
//! Refunds follow the same rules with their own key: an amount ending in
//! `02` is declined `refund_declined`, `09` times out on the first call.
//!
//! The payment id is derived from the key, so a repeated call returns the
//! same payment, as a real processor does.
//!
//! The only state is which `…09` keys already had their timed-out call: at
//! most `REMEMBERED_TIMEOUTS` of them, the least recently used forgotten
//! first (such a key then times out once more, which a caller must handle
//! anyway), so a long-running service's memory stays bounded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use moka::sync::Cache;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{
    simulated_decline, simulated_refund_decline, PaymentProcessor, PaymentRequest, ProcessorReply,
    RefundRequest,
};
use crate::domain::Outcome;

/// Most `…09` keys remembered as having had their timed-out call.
pub const REMEMBERED_TIMEOUTS: u64 = 100_000;

pub struct SimulatedProcessor {
    latency: Duration,
    /// Calls begun (counted before the latency) and answered.
    begun: AtomicU64,
    calls: AtomicU64,
    /// Keys of `…09` amounts that have had their first (timed-out) call. Only
    /// those need memory; every other answer is a pure function of the call.
    timed_out_once: Cache<String, ()>,
}

impl SimulatedProcessor {
    pub fn new(latency: Duration) -> Self {
        Self::with_memory(latency, REMEMBERED_TIMEOUTS)
    }

    fn with_memory(latency: Duration, remembered: u64) -> Self {
        Self {
            latency,
            begun: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            timed_out_once: Cache::new(remembered),
        }
    }

    /// How many calls this processor has answered.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// How many calls have reached this processor, answered or not: a test
    /// that cuts the database "while the card is charged" waits for this.
    pub fn calls_begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// `sim_` and the first 24 hex digits of the key's SHA-256: the same
    /// key always gets the same id.
    fn processor_id(key: &str) -> String {
        let digest = Sha256::digest(key.as_bytes());
        format!("sim_{}", hex::encode(&digest[..12]))
    }

    /// The answer for a call with `key` and `amount`, given its declines.
    async fn answer(
        &self,
        key: &str,
        amount: i64,
        decline: Option<(&str, &str)>,
    ) -> ProcessorReply {
        self.begun.fetch_add(1, Ordering::SeqCst);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        let processor_id = Self::processor_id(key);
        if let Some((code, message)) = decline {
            return ProcessorReply::Final(Outcome::Declined {
                processor_id: Some(processor_id),
                code: code.to_owned(),
                message: message.to_owned(),
            });
        }
        if amount % 100 == 9 && self.first_call_for(key) {
            return ProcessorReply::unknown("simulated processor timeout");
        }
        ProcessorReply::Final(Outcome::Succeeded { processor_id })
    }

    fn first_call_for(&self, key: &str) -> bool {
        let entry = self.timed_out_once.entry(key.to_owned()).or_insert(());
        entry.is_fresh()
    }
}

#[async_trait]
impl PaymentProcessor for SimulatedProcessor {
    async fn charge(&self, request: &PaymentRequest<'_>) -> ProcessorReply {
        self.answer(
            request.idempotency_key,
            request.amount,
            simulated_decline(request.amount),
        )
        .await
    }

    async fn refund(&self, request: &RefundRequest<'_>) -> ProcessorReply {
        self.answer(
            request.idempotency_key,
            request.amount,
            simulated_refund_decline(request.amount),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(key: &str, amount: i64) -> PaymentRequest<'_> {
        PaymentRequest {
            idempotency_key: key,
            amount,
            currency: "USD",
            customer: None,
            description: None,
        }
    }

    /// Ids already stored by earlier versions must stay the ids of their
    /// keys: pinned to the digest's first 24 hex digits.
    #[test]
    fn a_payment_id_is_the_start_of_the_keys_digest() {
        // printf chg_key | sha256sum: 689a4467ddbae231a1cce0fb c96d42a5…
        assert_eq!(
            SimulatedProcessor::processor_id("chg_key"),
            "sim_689a4467ddbae231a1cce0fb"
        );
    }

    #[tokio::test]
    async fn follows_the_documented_rules() {
        let processor = SimulatedProcessor::new(Duration::ZERO);
        let code = |reply: ProcessorReply| match reply {
            ProcessorReply::Final(Outcome::Succeeded { .. }) => "succeeded".to_owned(),
            ProcessorReply::Final(Outcome::Declined { code, .. }) => code,
            ProcessorReply::Unknown { .. } => "unknown".to_owned(),
        };
        assert_eq!(
            code(processor.charge(&request("a", 1000)).await),
            "succeeded"
        );
        assert_eq!(
            code(processor.charge(&request("b", 1002)).await),
            "card_declined"
        );
        assert_eq!(
            code(processor.charge(&request("c", 1005)).await),
            "insufficient_funds"
        );
        assert_eq!(code(processor.charge(&request("d", 1009)).await), "unknown");
        assert_eq!(
            code(processor.charge(&request("d", 1009)).await),
            "succeeded"
        );
        assert_eq!(code(processor.charge(&request("e", 1009)).await), "unknown");
        assert_eq!(processor.calls(), 6);
    }

    #[tokio::test]
    async fn the_timeout_memory_stays_bounded() {
        let processor = SimulatedProcessor::with_memory(Duration::ZERO, 100);
        for i in 0..10_000 {
            processor.charge(&request(&format!("k{i}"), 1009)).await;
        }
        processor.timed_out_once.run_pending_tasks();
        assert!(processor.timed_out_once.entry_count() <= 100);
    }

    #[tokio::test]
    async fn the_same_key_gets_the_same_payment() {
        let processor = SimulatedProcessor::new(Duration::ZERO);
        let first = processor.charge(&request("k", 500)).await;
        assert_eq!(processor.charge(&request("k", 500)).await, first);
        assert_ne!(processor.charge(&request("other", 500)).await, first);
    }
}
