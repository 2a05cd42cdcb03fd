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
//! The payment id is derived from the key, so a repeated call returns the
//! same payment, as a real processor does.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use super::{simulated_decline, PaymentProcessor, PaymentRequest, ProcessorReply};
use crate::domain::Outcome;

pub struct SimulatedProcessor {
    latency: Duration,
    calls: AtomicU64,
    /// Keys of `…09` amounts that have had their first (timed-out) call. Only
    /// those need memory; every other answer is a pure function of the call.
    timed_out_once: Mutex<HashSet<String>>,
}

impl SimulatedProcessor {
    pub fn new(latency: Duration) -> Self {
        Self {
            latency,
            calls: AtomicU64::new(0),
            timed_out_once: Mutex::new(HashSet::new()),
        }
    }

    /// How many calls this processor has answered.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    fn payment_id(key: &str) -> String {
        let digest = Sha256::digest(key.as_bytes());
        format!("sim_{}", &hex::encode(digest)[..24])
    }

    fn first_call_for(&self, key: &str) -> bool {
        match self.timed_out_once.lock() {
            Ok(mut seen) => seen.insert(key.to_owned()),
            Err(poisoned) => poisoned.into_inner().insert(key.to_owned()),
        }
    }
}

#[async_trait]
impl PaymentProcessor for SimulatedProcessor {
    async fn charge(&self, request: &PaymentRequest<'_>) -> ProcessorReply {
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
        self.calls.fetch_add(1, Ordering::SeqCst);
        let payment_id = Self::payment_id(request.idempotency_key);
        if let Some((code, message)) = simulated_decline(request.amount) {
            return ProcessorReply::Final(Outcome::Declined {
                payment_id: Some(payment_id),
                code: code.to_owned(),
                message: message.to_owned(),
            });
        }
        if request.amount % 100 == 9 && self.first_call_for(request.idempotency_key) {
            return ProcessorReply::unknown("simulated processor timeout");
        }
        ProcessorReply::Final(Outcome::Succeeded { payment_id })
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
    async fn the_same_key_gets_the_same_payment() {
        let processor = SimulatedProcessor::new(Duration::ZERO);
        let first = processor.charge(&request("k", 500)).await;
        assert_eq!(processor.charge(&request("k", 500)).await, first);
        assert_ne!(processor.charge(&request("other", 500)).await, first);
    }
}
