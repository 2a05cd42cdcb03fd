//! The client for a processor that speaks docs/processor-protocol.md:
//! `POST /v1/payments` and `POST /v1/refunds`. Each attempt is bounded by
//! `processor.timeout_ms`. Answers are classified (see `ProcessorReply`), the
//! same for both: 2xx and 402 are final; 400 is final too, as a
//! `processor_rejected` decline, since a malformed request proves nothing was
//! made; a timeout, a dropped connection, an unreadable answer, 5xx and 429
//! are retried `processor.retries` times with the same idempotency key, after
//! which the outcome is unknown and the operation stays pending; a conflict
//! on the key (409, 422) or another 4xx is unknown at once and needs an
//! operator's attention.

use async_trait::async_trait;
use backon::Retryable;
use serde::{Deserialize, Serialize};

use super::{PaymentProcessor, PaymentRequest, ProcessorReply, RefundRequest};
use crate::config::ProcessorSettings;
use crate::domain::Outcome;

pub struct HttpProcessor {
    client: reqwest::Client,
    payments: String,
    refunds: String,
    retries: u32,
}

/// The request body of `POST /v1/payments`.
#[derive(Debug, Serialize, Deserialize)]
pub struct PaymentBody {
    pub amount: i64,
    pub currency: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub customer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// The request body of `POST /v1/refunds`.
#[derive(Debug, Serialize, Deserialize)]
pub struct RefundBody {
    pub payment_id: String,
    pub amount: i64,
    pub currency: String,
}

/// The processor's answer for a payment or a refund (201 or 402).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PaymentAnswer {
    pub id: String,
    pub status: String,
    pub amount: i64,
    pub currency: String,
    /// For a refund: the payment it refunds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decline_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Why one attempt gave no final answer; `retry` says whether repeating it
/// at once may help.
struct Failed {
    reason: String,
    retry: bool,
}

/// Most bytes of an error answer quoted in a log line or failure message.
const QUOTED_BYTES: usize = 200;

fn quote(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(QUOTED_BYTES)]);
    text.chars().filter(|c| !c.is_control()).collect()
}

/// What an operation is called in messages, and its decline when the
/// processor gives no code.
struct Operation {
    what: &'static str,
    default_code: &'static str,
    default_message: &'static str,
}

const PAYMENT: Operation = Operation {
    what: "payment",
    default_code: "card_declined",
    default_message: "The payment was declined.",
};

const REFUND: Operation = Operation {
    what: "refund",
    default_code: "refund_declined",
    default_message: "The refund was declined.",
};

impl HttpProcessor {
    pub fn new(settings: &ProcessorSettings) -> Result<Self, reqwest::Error> {
        let timeout = settings.timeout;
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(std::time::Duration::from_secs(2)))
            .pool_idle_timeout(std::time::Duration::from_secs(30))
            .build()?;
        let base = settings.url.trim_end_matches('/');
        Ok(Self {
            client,
            payments: format!("{base}/v1/payments"),
            refunds: format!("{base}/v1/refunds"),
            retries: settings.retries,
        })
    }

    /// Posts `body` with `key` until an attempt gives a classified answer or
    /// the retries run out.
    async fn call(
        &self,
        endpoint: &str,
        key: &str,
        body: &impl Serialize,
        operation: &Operation,
    ) -> ProcessorReply {
        let retries = ProcessorSettings::RETRY_BACKOFF.builder();
        let mut attempt = 0;
        let answer = (|| self.attempt(endpoint, key, body, operation))
            .retry(retries.with_max_times(self.retries as usize))
            .when(|failed| failed.retry)
            .notify(|failed, _| {
                attempt += 1;
                tracing::info!(key, attempt, reason = %failed.reason, "retrying processor call");
            })
            .await;
        answer.unwrap_or_else(|failed| ProcessorReply::unknown(failed.reason))
    }

    async fn attempt(
        &self,
        endpoint: &str,
        key: &str,
        body: &impl Serialize,
        operation: &Operation,
    ) -> Result<ProcessorReply, Failed> {
        let lost = |e: reqwest::Error| Failed {
            reason: format!("no answer from the processor: {e}"),
            retry: true,
        };
        let response = self
            .client
            .post(endpoint)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .await
            .map_err(lost)?;
        let status = response.status();
        // Read the whole answer: a connection dropped mid-body is no answer.
        let bytes = response.bytes().await.map_err(lost)?;
        if status.is_server_error() || status.as_u16() == 429 {
            return Err(Failed {
                reason: format!("processor answered {status}"),
                retry: true,
            });
        }
        let answer = match status.as_u16() {
            200 | 201 | 402 => {
                serde_json::from_slice::<PaymentAnswer>(&bytes).map_err(|e| Failed {
                    reason: format!("unreadable processor answer ({status}): {e}"),
                    retry: true,
                })?
            }
            // Malformed: the processor refused to look at the request, so
            // nothing was made. Final, and repeating it would not help.
            400 => {
                return Ok(ProcessorReply::Final(Outcome::Declined {
                    processor_id: None,
                    code: super::PROCESSOR_REJECTED.to_owned(),
                    message: format!(
                        "The payment processor rejected the {}: {}",
                        operation.what,
                        quote(&bytes)
                    ),
                }))
            }
            // A conflict on our key (409, 422) or an unexpected 4xx (our
            // credentials, a wrong URL): whether anything was made is not
            // known, and retrying at once will not change the answer. The
            // operation stays pending and recovery keeps trying with backoff.
            _ => {
                return Ok(ProcessorReply::Unknown {
                    reason: format!("processor answered {status}: {}", quote(&bytes)),
                    attention: true,
                })
            }
        };
        Ok(match answer.status.as_str() {
            "succeeded" => ProcessorReply::Final(Outcome::Succeeded {
                processor_id: answer.id,
            }),
            _ => ProcessorReply::Final(Outcome::Declined {
                processor_id: Some(answer.id),
                code: answer
                    .decline_code
                    .unwrap_or_else(|| operation.default_code.to_owned()),
                message: answer
                    .message
                    .unwrap_or_else(|| operation.default_message.to_owned()),
            }),
        })
    }
}

#[async_trait]
impl PaymentProcessor for HttpProcessor {
    async fn charge(&self, request: &PaymentRequest<'_>) -> ProcessorReply {
        let body = PaymentBody {
            amount: request.amount,
            currency: request.currency.to_owned(),
            customer: request.customer.map(str::to_owned),
            description: request.description.map(str::to_owned),
        };
        self.call(&self.payments, request.idempotency_key, &body, &PAYMENT)
            .await
    }

    async fn refund(&self, request: &RefundRequest<'_>) -> ProcessorReply {
        let body = RefundBody {
            payment_id: request.payment_id.to_owned(),
            amount: request.amount,
            currency: request.currency.to_owned(),
        };
        self.call(&self.refunds, request.idempotency_key, &body, &REFUND)
            .await
    }
}
