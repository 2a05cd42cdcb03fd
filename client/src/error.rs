//! The client's one error type, typed from the service's problem+json `code`
//! (RFC 9457), and the one place that turns an error answer into it.
//!
//! Invariants:
//! - Every error of an operation that sent an `Idempotency-Key` carries that
//!   key ([`Error::idempotency_key`]), so the caller can try the same
//!   operation again later without risking a second charge.
//! - Which errors are retried is decided in `crate::retry`, not here; this
//!   module only keeps what that decision needs (status, code, Retry-After).

use std::time::Duration;

use chargeonce_api::{ChargeDeclined, Problem, RefundDeclined};
use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use crate::model::{Charge, Refund};
use crate::{FieldError, IdempotencyKey};

/// Everything that can go wrong, by what the caller should do about it.
///
/// Match on the variants you handle and fall back to `Display` for the rest:
///
/// ```no_run
/// # use chargeonce_client::{Client, Error, NewCharge};
/// # async fn run(client: Client) {
/// match client.create_charge(&NewCharge::new(1999, "USD")).await {
///     Ok(charge) => println!("paid: {}", charge.id),
///     Err(Error::Declined { code, charge, .. }) => println!("declined ({code}): {}", charge.id),
///     Err(Error::Pending { charge, .. }) => println!("not known yet; check {} later", charge.id),
///     Err(e) if e.is_retryable() => {
///         // Keep e.idempotency_key() and try the same operation again later.
///     }
///     Err(e) => eprintln!("{e}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `402`: the processor declined the charge. The charge exists, with
    /// status `failed`. Final: a retry with the same key gets the same answer.
    #[error("charge declined ({code}): {message}")]
    Declined {
        /// The processor's reason, e.g. `card_declined`, `insufficient_funds`.
        code: String,
        /// A human-readable reason.
        message: String,
        /// The failed charge.
        charge: Box<Charge>,
        /// The key the charge was created with.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `402` on a refund: the processor declined it. The refund exists, with
    /// status `failed`.
    #[error("refund declined ({code}): {message}")]
    RefundDeclined {
        /// The processor's reason.
        code: String,
        /// A human-readable reason.
        message: String,
        /// The failed refund.
        refund: Box<Refund>,
        /// The key the refund was created with.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// The charge was accepted but the processor's answer was still unknown
    /// when the retry policy ran out (attempts or deadline). Money may or may
    /// not have moved. The service finishes it by itself; look at it later
    /// with `get_charge(&charge.id)`, or send the same operation again (same
    /// key), which asks the processor again at once.
    #[error("charge {} is still pending: the processor's answer is not known yet", charge.id)]
    Pending {
        /// The pending charge.
        charge: Box<Charge>,
        /// The key to retry with.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// Like [`Error::Pending`], for a refund.
    #[error("refund {} is still pending: the processor's answer is not known yet", refund.id)]
    RefundPending {
        /// The pending refund.
        refund: Box<Refund>,
        /// The key to retry with.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `422 idempotency_key_reused`: this key was used before with a
    /// different body. A bug in the caller: one key must name one request.
    #[error("idempotency key reused with a different request body: {detail}")]
    KeyReused {
        /// The service's explanation.
        detail: String,
        /// The names of the fields that differ from the request the key was
        /// first used with (`amount`, `metadata.order`, …); empty when the
        /// service could not tell.
        differing_fields: Vec<String>,
        /// The reused key.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `422 idempotency_key_expired`: the key's replay window ended, so the
    /// service neither replays nor processes the request. Final, never
    /// retried: [`Client::find_by_key`](crate::Client::find_by_key) shows
    /// what the key created; a new request needs a new key.
    #[error("idempotency key expired: {detail}")]
    KeyExpired {
        /// The service's explanation: what the key created and when its
        /// window ended.
        detail: String,
        /// When the window ended, as the service's `Idempotency-Key-Expires`
        /// header says it (an HTTP date).
        window_ended: Option<String>,
        /// The expired key.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `400 invalid_request`: the body or query is invalid; `errors` names
    /// every offending field.
    #[error("invalid request: {detail}{}", describe_fields(errors))]
    InvalidRequest {
        /// The service's summary.
        detail: String,
        /// Each offending field.
        errors: Vec<FieldError>,
        /// The key of the refused operation.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `401`: the secret key is missing, unknown or revoked.
    #[error("unauthenticated: {detail}")]
    Unauthenticated {
        /// The service's explanation.
        detail: String,
        /// The key of the refused operation.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `404`: no such charge or refund for this merchant.
    #[error("not found: {detail}")]
    NotFound {
        /// The service's explanation.
        detail: String,
        /// The key of the refused operation.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `400 charge_not_refundable`: e.g. the charge failed, is pending or is
    /// already refunded in full.
    #[error("charge not refundable: {detail}")]
    ChargeNotRefundable {
        /// The service's explanation.
        detail: String,
        /// The key of the refused refund.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// `400 refund_exceeds_charge`: the amount is more than what is left.
    #[error(
        "refund exceeds what is left of the charge ({refundable_amount} refundable): {detail}"
    )]
    RefundExceedsCharge {
        /// What can still be refunded, in minor units.
        refundable_amount: i64,
        /// The service's explanation.
        detail: String,
        /// The key of the refused refund.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// Any other error answer: `413`, `415`, `409`, `429`, `5xx`, … with the
    /// problem's `code` when the body had one.
    #[error("{status}{}: {detail}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Api {
        /// The HTTP status.
        status: StatusCode,
        /// The problem+json `code`, if the body was a problem document.
        code: Option<String>,
        /// The problem's `detail`, or the start of the body.
        detail: String,
        /// The `Retry-After` the service asked for, in seconds.
        retry_after: Option<Duration>,
        /// The key of the failed operation.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// A success status with a body that is not the expected resource.
    #[error("unexpected answer ({status}): {message}")]
    UnexpectedResponse {
        /// The HTTP status.
        status: StatusCode,
        /// What did not fit.
        message: String,
        /// The key of the operation.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// No answer: connecting failed, the connection broke, or the attempt
    /// timed out. The request may or may not have reached the service.
    #[error("no answer from the service: {source}")]
    Transport {
        /// What reqwest reported.
        source: reqwest::Error,
        /// The key of the operation.
        idempotency_key: Option<IdempotencyKey>,
    },
    /// Every attempt met a retryable error and the retry policy ran out
    /// (attempts or total deadline). `last` is the final attempt's error.
    /// Send the same operation again later, with the same key.
    #[error("gave up after {attempts} attempt(s) in {elapsed:.1?}: {last}")]
    GaveUp {
        /// The error of the last attempt.
        last: Box<Error>,
        /// How many requests were sent.
        attempts: u32,
        /// From the first attempt until giving up.
        elapsed: Duration,
    },
    /// The idempotency key is not 1 to 255 visible ASCII characters; nothing
    /// was sent.
    #[error(
        "invalid idempotency key {idempotency_key:?}: it must be 1 to 255 visible ASCII characters"
    )]
    InvalidKey {
        /// The refused key.
        idempotency_key: IdempotencyKey,
    },
    /// The client could not be built (bad base URL or secret key, TLS set-up).
    #[error("invalid client configuration: {0}")]
    Config(String),
}

fn describe_fields(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(|e| format!("; {}: {}", e.field, e.message))
        .collect()
}

impl Error {
    /// The idempotency key of the operation that failed, if it sent one
    /// (creating a charge or refund does; reads do not).
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        match self {
            Self::Declined {
                idempotency_key, ..
            }
            | Self::RefundDeclined {
                idempotency_key, ..
            }
            | Self::Pending {
                idempotency_key, ..
            }
            | Self::RefundPending {
                idempotency_key, ..
            }
            | Self::KeyReused {
                idempotency_key, ..
            }
            | Self::KeyExpired {
                idempotency_key, ..
            }
            | Self::InvalidRequest {
                idempotency_key, ..
            }
            | Self::Unauthenticated {
                idempotency_key, ..
            }
            | Self::NotFound {
                idempotency_key, ..
            }
            | Self::ChargeNotRefundable {
                idempotency_key, ..
            }
            | Self::RefundExceedsCharge {
                idempotency_key, ..
            }
            | Self::Api {
                idempotency_key, ..
            }
            | Self::UnexpectedResponse {
                idempotency_key, ..
            }
            | Self::Transport {
                idempotency_key, ..
            } => idempotency_key.as_ref(),
            Self::InvalidKey { idempotency_key } => Some(idempotency_key),
            Self::GaveUp { last, .. } => last.idempotency_key(),
            Self::Config(_) => None,
        }
    }

    /// The HTTP status of the (last) answer, if there was one.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Declined { .. } | Self::RefundDeclined { .. } => {
                Some(StatusCode::PAYMENT_REQUIRED)
            }
            Self::Pending { .. } | Self::RefundPending { .. } => Some(StatusCode::ACCEPTED),
            Self::KeyReused { .. } | Self::KeyExpired { .. } => {
                Some(StatusCode::UNPROCESSABLE_ENTITY)
            }
            Self::InvalidRequest { .. }
            | Self::ChargeNotRefundable { .. }
            | Self::RefundExceedsCharge { .. } => Some(StatusCode::BAD_REQUEST),
            Self::Unauthenticated { .. } => Some(StatusCode::UNAUTHORIZED),
            Self::NotFound { .. } => Some(StatusCode::NOT_FOUND),
            Self::Api { status, .. } | Self::UnexpectedResponse { status, .. } => Some(*status),
            Self::GaveUp { last, .. } => last.status(),
            Self::Transport { .. } | Self::InvalidKey { .. } | Self::Config(_) => None,
        }
    }

    /// Whether sending the same operation again later, with the same key,
    /// may succeed: the service was unavailable, busy or unreachable, the
    /// outcome is still pending, or the retry policy ran out on one of
    /// those. `false` for answers that will not change (declined, invalid,
    /// not found, key reused, …).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::GaveUp { .. } => true,
            other => crate::retry::is_retried(other),
        }
    }

    /// Turns an error answer (any status but 2xx) into an error.
    pub(crate) fn from_answer(
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        idempotency_key: Option<IdempotencyKey>,
    ) -> Self {
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(crate::retry::parse_retry_after);
        // Every member optional: a body that is not a problem document (or
        // only partly) still gives an error.
        let problem = serde_json::from_slice::<Problem>(body).unwrap_or_default();
        let detail = if problem.detail.is_empty() {
            // Not a problem document (a proxy's HTML page, say): keep the
            // start of it, which is usually enough to tell what answered.
            let text = String::from_utf8_lossy(body);
            let text = text.trim();
            if text.is_empty() {
                status.canonical_reason().unwrap_or("").to_owned()
            } else {
                text.chars().take(200).collect()
            }
        } else {
            problem.detail.into_owned()
        };
        let code = Some(problem.code.into_owned()).filter(|code| !code.is_empty());
        match (status.as_u16(), code.as_deref()) {
            (402, _) => {
                let code = code.clone().unwrap_or_else(|| "declined".to_owned());
                // Read again as what it carries: a problem that carries a
                // malformed charge still tells its code.
                if let Ok(declined) = serde_json::from_slice::<RefundDeclined>(body) {
                    return Self::RefundDeclined {
                        code,
                        message: detail,
                        refund: Box::new(declined.refund),
                        idempotency_key,
                    };
                }
                if let Ok(declined) = serde_json::from_slice::<ChargeDeclined>(body) {
                    return Self::Declined {
                        code,
                        message: detail,
                        charge: Box::new(declined.charge),
                        idempotency_key,
                    };
                }
            }
            (422, Some("idempotency_key_reused")) => {
                return Self::KeyReused {
                    detail,
                    differing_fields: problem.differing_fields.unwrap_or_default(),
                    idempotency_key,
                }
            }
            (422, Some("idempotency_key_expired")) => {
                return Self::KeyExpired {
                    detail,
                    window_ended: headers
                        .get("idempotency-key-expires")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned),
                    idempotency_key,
                }
            }
            (400, Some("invalid_request")) => {
                return Self::InvalidRequest {
                    detail,
                    errors: problem.errors.into_owned(),
                    idempotency_key,
                }
            }
            (400, Some("charge_not_refundable")) => {
                return Self::ChargeNotRefundable {
                    detail,
                    idempotency_key,
                }
            }
            (400, Some("refund_exceeds_charge")) => {
                if let Some(refundable_amount) = problem.refundable_amount {
                    return Self::RefundExceedsCharge {
                        refundable_amount,
                        detail,
                        idempotency_key,
                    };
                }
            }
            (401, _) => {
                return Self::Unauthenticated {
                    detail,
                    idempotency_key,
                }
            }
            (404, _) => {
                return Self::NotFound {
                    detail,
                    idempotency_key,
                }
            }
            _ => {}
        }
        Self::Api {
            status,
            code,
            detail,
            retry_after,
            idempotency_key,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(status: u16, body: serde_json::Value) -> Error {
        Error::from_answer(
            StatusCode::from_u16(status).expect("status"),
            &HeaderMap::new(),
            body.to_string().as_bytes(),
            Some(IdempotencyKey::from("k-1")),
        )
    }

    fn problem(status: u16, code: &str, extra: serde_json::Value) -> serde_json::Value {
        let mut body = json!({
            "type": format!("urn:chargeonce:problem:{code}"), "title": "t",
            "status": status, "detail": "what went wrong", "code": code
        });
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        body
    }

    fn charge_json(status: &str) -> serde_json::Value {
        json!({"id": "ch_1", "object": "charge", "amount": 1002, "currency": "USD",
               "status": status, "customer": null, "description": null, "metadata": {},
               "failure_code": "card_declined", "failure_message": "The card was declined.",
               "created_at": "2026-11-30T19:59:39.452451Z"})
    }

    #[test]
    fn a_declined_charge_keeps_the_charge_and_the_key() {
        let error = answer(
            402,
            problem(
                402,
                "card_declined",
                json!({"charge_id": "ch_1", "charge": charge_json("failed")}),
            ),
        );
        let Error::Declined { code, charge, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(code, "card_declined");
        assert_eq!(charge.id, "ch_1");
        assert_eq!(error.idempotency_key().map(|k| k.as_str()), Some("k-1"));
        assert!(!error.is_retryable());
    }

    #[test]
    fn a_declined_refund_is_told_apart_by_its_refund_member() {
        let refund = json!({"id": "re_1", "object": "refund", "charge": "ch_1", "amount": 5,
            "currency": "USD", "status": "failed", "reason": null, "metadata": {},
            "failure_code": "expired_card", "failure_message": "m",
            "created_at": "2026-11-30T19:59:39Z"});
        let error = answer(402, problem(402, "expired_card", json!({"refund": refund})));
        assert!(matches!(error, Error::RefundDeclined { ref code, .. } if code == "expired_card"));
    }

    #[test]
    fn codes_become_variants() {
        let field = json!({"errors": [{"field": "amount", "message": "must be greater than 0"}]});
        let Error::InvalidRequest { errors, .. } =
            answer(400, problem(400, "invalid_request", field))
        else {
            panic!("not InvalidRequest")
        };
        assert_eq!(errors[0].field, "amount");
        assert!(matches!(
            answer(422, problem(422, "idempotency_key_reused", json!({}))),
            Error::KeyReused { .. }
        ));
        assert!(matches!(
            answer(401, problem(401, "unauthenticated", json!({}))),
            Error::Unauthenticated { .. }
        ));
        assert!(matches!(
            answer(404, problem(404, "not_found", json!({}))),
            Error::NotFound { .. }
        ));
        assert!(matches!(
            answer(400, problem(400, "charge_not_refundable", json!({}))),
            Error::ChargeNotRefundable { .. }
        ));
        assert!(matches!(
            answer(
                400,
                problem(
                    400,
                    "refund_exceeds_charge",
                    json!({"refundable_amount": 250})
                )
            ),
            Error::RefundExceedsCharge {
                refundable_amount: 250,
                ..
            }
        ));
        let other = answer(415, problem(415, "unsupported_media_type", json!({})));
        assert!(matches!(
            other,
            Error::Api { status: StatusCode::UNSUPPORTED_MEDIA_TYPE, code: Some(ref c), .. }
                if c == "unsupported_media_type"
        ));
    }

    #[test]
    fn a_body_that_is_not_a_problem_still_gives_an_error() {
        let error = Error::from_answer(
            StatusCode::BAD_GATEWAY,
            &HeaderMap::new(),
            b"<html>Bad Gateway</html>",
            None,
        );
        let Error::Api { code, detail, .. } = &error else {
            panic!("{error:?}")
        };
        assert_eq!(code, &None);
        assert_eq!(detail, "<html>Bad Gateway</html>");
        assert!(error.is_retryable());
    }

    #[test]
    fn retry_after_is_kept() {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, "1".parse().expect("header"));
        let error = Error::from_answer(
            StatusCode::SERVICE_UNAVAILABLE,
            &headers,
            problem(503, "service_unavailable", json!({}))
                .to_string()
                .as_bytes(),
            None,
        );
        assert!(matches!(
            error,
            Error::Api { retry_after: Some(d), .. } if d == Duration::from_secs(1)
        ));
    }
}
