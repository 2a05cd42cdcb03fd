//! One error type for the API and the one place that turns it into HTTP: an
//! `application/problem+json` body (RFC 9457) with a stable `code`. 5xx
//! bodies say nothing about internals; the cause goes to the log.

use std::borrow::Cow;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use chargeonce_api::Problem;

use crate::domain::{FieldError, KeyError};
use crate::service::ServiceError;
use crate::telemetry::error_chain;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// When the replay window of the answer's key ends, as an IMF-fixdate (RFC
/// 9110): on every answer that stored or replayed a key, and on the 422 of
/// a key whose window has ended.
pub const KEY_EXPIRES: &str = "idempotency-key-expires";

/// `at` as an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), to the
/// second. Every cached replay formats one, so this is `httpdate`'s
/// fixed-width writer (the one actix-http dates its answers with), not a
/// format string interpreted at each call: 53 ns instead of chrono's 308
/// (`cargo bench --bench hot_paths`, "IMF-fixdate").
pub fn http_date(at: chrono::DateTime<chrono::Utc>) -> String {
    httpdate::fmt_http_date(std::time::SystemTime::from(at))
}

/// `: amount, metadata.order differ` for the detail of a reused key.
fn differing(fields: &Option<Vec<String>>) -> String {
    match fields {
        Some(fields) if !fields.is_empty() => format!(" ({} differ)", fields.join(", ")),
        _ => String::new(),
    }
}

/// What caused a 5xx, for the log only.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid API key is required: send `Authorization: Bearer <secret key>`")]
    Unauthenticated,
    #[error("the Idempotency-Key header is required on this request")]
    IdempotencyKeyMissing,
    #[error("{0}")]
    IdempotencyKeyInvalid(#[from] KeyError),
    #[error(
        "this Idempotency-Key was already used with a different request{}",
        differing(differing_fields)
    )]
    IdempotencyKeyReused {
        differing_fields: Option<Vec<String>>,
    },
    /// The key's replay window ended at `window_ended`; it names `object`.
    #[error(
        "the replay window of this Idempotency-Key ended at {}: it created {object}, which a \
         GET shows; nothing was processed. A new request needs a new key",
        window_ended.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    )]
    IdempotencyKeyExpired {
        object: String,
        window_ended: chrono::DateTime<chrono::Utc>,
    },
    #[error("a request with this Idempotency-Key is still being processed; retry later")]
    IdempotencyKeyInUse { retry_after_secs: u64 },
    /// The replay of a webhook endpoint's creation after it was deleted:
    /// its secret is not shown again.
    #[error(
        "the webhook endpoint this Idempotency-Key created ({id}) was deleted; its secret is not \
         shown any more. Create a new endpoint with a new key"
    )]
    WebhookEndpointDeleted { id: String },
    #[error("{detail}")]
    InvalidRequest {
        detail: String,
        errors: Vec<FieldError>,
    },
    #[error("no such resource")]
    NotFound,
    #[error("only a succeeded charge can be refunded; this one is {status}")]
    ChargeNotRefundable { status: &'static str },
    #[error(
        "the refund is larger than what remains refundable of the charge ({refundable_amount})"
    )]
    RefundExceedsCharge { refundable_amount: i64 },
    /// `allow`: the path's methods, for the `Allow` header (RFC 9110 says a
    /// 405 must carry it).
    #[error("this path does not take this method; it takes {allow}")]
    MethodNotAllowed { allow: String },
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the request body must be sent as application/json")]
    UnsupportedMediaType,
    #[error("{detail}")]
    RequestTimeout { detail: String },
    #[error("the service cannot take this request now (the database is unreachable or behind, or this instance is full); nothing was processed, retry later")]
    ServiceUnavailable(#[source] Cause),
    #[error("internal error")]
    Internal(#[source] Cause),
}

/// Everything HTTP needs to know about one kind of error, in one place.
struct Description {
    status: StatusCode,
    code: &'static str,
    title: &'static str,
    /// Seconds for `Retry-After`, on answers worth retrying.
    retry_after: Option<u64>,
}

impl ApiError {
    pub fn invalid(detail: impl Into<String>, errors: Vec<FieldError>) -> Self {
        Self::InvalidRequest {
            detail: detail.into(),
            errors,
        }
    }

    fn describe(&self) -> Description {
        use StatusCode as S;
        let (status, code, title, retry_after) = match self {
            Self::Unauthenticated => (S::UNAUTHORIZED, "unauthenticated", "Unauthenticated", None),
            Self::IdempotencyKeyMissing => (
                S::BAD_REQUEST,
                "idempotency_key_missing",
                "Idempotency-Key missing",
                None,
            ),
            Self::IdempotencyKeyInvalid(_) => (
                S::BAD_REQUEST,
                "idempotency_key_invalid",
                "Idempotency-Key invalid",
                None,
            ),
            Self::IdempotencyKeyReused { .. } => (
                S::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "Idempotency-Key reused",
                None,
            ),
            Self::IdempotencyKeyExpired { .. } => (
                S::UNPROCESSABLE_ENTITY,
                "idempotency_key_expired",
                "Idempotency-Key expired",
                None,
            ),
            Self::IdempotencyKeyInUse { retry_after_secs } => (
                S::CONFLICT,
                "idempotency_key_in_use",
                "Idempotency-Key in use",
                Some(*retry_after_secs),
            ),
            Self::WebhookEndpointDeleted { .. } => (
                S::CONFLICT,
                "webhook_endpoint_deleted",
                "Webhook endpoint deleted",
                None,
            ),
            Self::InvalidRequest { .. } => {
                (S::BAD_REQUEST, "invalid_request", "Invalid request", None)
            }
            Self::NotFound => (S::NOT_FOUND, "not_found", "Not found", None),
            Self::ChargeNotRefundable { .. } => (
                S::BAD_REQUEST,
                "charge_not_refundable",
                "Charge not refundable",
                None,
            ),
            Self::RefundExceedsCharge { .. } => (
                S::BAD_REQUEST,
                "refund_exceeds_charge",
                "Refund exceeds charge",
                None,
            ),
            Self::MethodNotAllowed { .. } => (
                S::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "Method not allowed",
                None,
            ),
            Self::PayloadTooLarge { .. } => (
                S::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "Payload too large",
                None,
            ),
            Self::UnsupportedMediaType => (
                S::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Unsupported media type",
                None,
            ),
            Self::RequestTimeout { .. } => (
                S::REQUEST_TIMEOUT,
                "request_timeout",
                "Request timeout",
                None,
            ),
            Self::ServiceUnavailable(_) => (
                S::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "Service unavailable",
                Some(1),
            ),
            Self::Internal(_) => (
                S::INTERNAL_SERVER_ERROR,
                "internal_error",
                "Internal error",
                None,
            ),
        };
        Description {
            status,
            code,
            title,
            retry_after,
        }
    }

    pub fn code(&self) -> &'static str {
        self.describe().code
    }

    pub fn status(&self) -> StatusCode {
        self.describe().status
    }

    /// The seconds of its `Retry-After` header, on answers worth retrying.
    pub fn retry_after(&self) -> Option<u64> {
        self.describe().retry_after
    }

    /// The answer: status, headers beyond `Content-Type`, and the problem
    /// document. 5xx causes go to the log here, never into the body.
    pub fn parts(&self) -> (StatusCode, Vec<(&'static str, String)>, String) {
        let description = self.describe();
        match self {
            Self::ServiceUnavailable(cause) => {
                tracing::warn!(cause = %error_chain(cause.as_ref()), "failing closed")
            }
            Self::Internal(cause) => {
                tracing::error!(cause = %error_chain(cause.as_ref()), "internal error")
            }
            _ => {}
        }
        let mut headers = Vec::new();
        if let Some(seconds) = description.retry_after {
            headers.push(("retry-after", seconds.to_string()));
        }
        if matches!(self, Self::Unauthenticated) {
            headers.push(("www-authenticate", "Bearer".to_owned()));
        }
        if let Self::MethodNotAllowed { allow } = self {
            headers.push(("allow", allow.clone()));
        }
        if let Self::IdempotencyKeyExpired { window_ended, .. } = self {
            headers.push((KEY_EXPIRES, http_date(*window_ended)));
        }
        (description.status, headers, self.problem_body())
    }

    /// The problem document of the answer, with nothing logged (the
    /// OpenAPI document's examples are these).
    pub fn problem_body(&self) -> String {
        // Field names and messages are plain strings: rendering cannot fail.
        // If it ever did, a problem without the field list is still honest.
        let problem = self.problem();
        serde_json::to_string(&problem).unwrap_or_else(|error| {
            tracing::error!(%error, "cannot render a problem document");
            serde_json::to_string(&Problem {
                errors: Cow::Borrowed(&[]),
                ..problem
            })
            .unwrap_or_default()
        })
    }

    fn problem(&self) -> Problem<'_> {
        let description = self.describe();
        Problem {
            errors: match self {
                Self::InvalidRequest { errors, .. } => Cow::Borrowed(errors),
                _ => Cow::Borrowed(&[]),
            },
            refundable_amount: match self {
                Self::RefundExceedsCharge { refundable_amount } => Some(*refundable_amount),
                _ => None,
            },
            differing_fields: match self {
                Self::IdempotencyKeyReused { differing_fields } => differing_fields.clone(),
                _ => None,
            },
            ..problem(
                description.status,
                description.code.into(),
                description.title,
                self.to_string().into(),
            )
        }
    }
}

/// A problem document with the five members every one has.
pub fn problem<'a>(
    status: StatusCode,
    code: Cow<'a, str>,
    title: &'a str,
    detail: Cow<'a, str>,
) -> Problem<'a> {
    Problem {
        kind: format!("urn:chargeonce:problem:{code}"),
        title: title.into(),
        status: status.as_u16(),
        detail,
        code,
        errors: Cow::Borrowed(&[]),
        refundable_amount: None,
        differing_fields: None,
    }
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> Self {
        match error {
            ServiceError::KeyReused { differing_fields } => {
                Self::IdempotencyKeyReused { differing_fields }
            }
            ServiceError::KeyExpired {
                object,
                window_ended,
            } => Self::IdempotencyKeyExpired {
                object,
                window_ended,
            },
            ServiceError::KeyInUse { retry_after } => Self::IdempotencyKeyInUse {
                retry_after_secs: retry_after.as_secs().max(1),
            },
            ServiceError::NotFound => Self::NotFound,
            ServiceError::ChargeNotRefundable { status } => Self::ChargeNotRefundable {
                status: status.as_str(),
            },
            ServiceError::RefundExceedsCharge { refundable } => Self::RefundExceedsCharge {
                refundable_amount: refundable,
            },
            ServiceError::Invalid { detail, errors } => Self::InvalidRequest { detail, errors },
            ServiceError::Unavailable(_)
            | ServiceError::SchemaBehind { .. }
            | ServiceError::KeyContended => Self::ServiceUnavailable(error.into()),
            ServiceError::Database(_) | ServiceError::TaskFailed(_) => Self::Internal(error.into()),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.describe().status
    }

    fn error_response(&self) -> HttpResponse {
        let (status, headers, body) = self.parts();
        let mut response = HttpResponse::build(status);
        response.content_type(PROBLEM_JSON);
        for header in headers {
            response.insert_header(header);
        }
        response.body(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_imf_fixdate_is_rfc_9110s_example_to_the_second() {
        let at = chrono::DateTime::from_timestamp(784_111_777, 999_000_000).expect("in range");
        assert_eq!(http_date(at), "Sun, 06 Nov 1994 08:49:37 GMT");
    }
}
