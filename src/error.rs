//! One error type for the API and the one place that turns it into HTTP: an
//! `application/problem+json` body (RFC 9457) with a stable `code`. 5xx
//! bodies say nothing about internals; the cause goes to the log.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;

use crate::domain::{FieldError, KeyError};

pub const PROBLEM_JSON: &str = "application/problem+json";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("a valid API key is required: send `Authorization: Bearer <secret key>`")]
    Unauthenticated,
    #[error("the Idempotency-Key header is required on this request")]
    IdempotencyKeyMissing,
    #[error("{0}")]
    IdempotencyKeyInvalid(#[from] KeyError),
    #[error("this Idempotency-Key was already used with a different request body")]
    IdempotencyKeyReused,
    #[error("a request with this Idempotency-Key is still being processed; retry later")]
    IdempotencyKeyInUse { retry_after_secs: u64 },
    #[error("{detail}")]
    InvalidRequest {
        detail: String,
        errors: Vec<FieldError>,
    },
    #[error("no such resource")]
    NotFound,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("the request body is larger than {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("the request body must be sent as application/json")]
    UnsupportedMediaType,
    #[error("the database is unavailable; nothing was processed, retry later")]
    ServiceUnavailable(String),
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(detail: impl Into<String>, errors: Vec<FieldError>) -> Self {
        Self::InvalidRequest {
            detail: detail.into(),
            errors,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "unauthenticated",
            Self::IdempotencyKeyMissing => "idempotency_key_missing",
            Self::IdempotencyKeyInvalid(_) => "idempotency_key_invalid",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::IdempotencyKeyInUse { .. } => "idempotency_key_in_use",
            Self::InvalidRequest { .. } => "invalid_request",
            Self::NotFound => "not_found",
            Self::MethodNotAllowed => "method_not_allowed",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::ServiceUnavailable(_) => "service_unavailable",
            Self::Internal(_) => "internal_error",
        }
    }

    fn title(&self) -> &'static str {
        match self {
            Self::Unauthenticated => "Unauthenticated",
            Self::IdempotencyKeyMissing => "Idempotency-Key missing",
            Self::IdempotencyKeyInvalid(_) => "Idempotency-Key invalid",
            Self::IdempotencyKeyReused => "Idempotency-Key reused",
            Self::IdempotencyKeyInUse { .. } => "Idempotency-Key in use",
            Self::InvalidRequest { .. } => "Invalid request",
            Self::NotFound => "Not found",
            Self::MethodNotAllowed => "Method not allowed",
            Self::PayloadTooLarge { .. } => "Payload too large",
            Self::UnsupportedMediaType => "Unsupported media type",
            Self::ServiceUnavailable(_) => "Service unavailable",
            Self::Internal(_) => "Internal error",
        }
    }
}

/// A problem document. `extra` carries members beyond the standard five.
#[derive(Serialize)]
pub struct Problem<'a, T: Serialize> {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'a str,
    pub status: u16,
    pub detail: String,
    pub code: &'a str,
    #[serde(flatten)]
    pub extra: T,
}

impl<'a, T: Serialize> Problem<'a, T> {
    pub fn new(
        status: StatusCode,
        code: &'a str,
        title: &'a str,
        detail: String,
        extra: T,
    ) -> Self {
        Self {
            kind: format!("urn:chargeonce:problem:{code}"),
            title,
            status: status.as_u16(),
            detail,
            code,
            extra,
        }
    }

    pub fn to_body(&self) -> String {
        // Serialising plain strings, numbers and maps cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[derive(Serialize)]
struct FieldErrors<'a> {
    #[serde(skip_serializing_if = "<[FieldError]>::is_empty")]
    errors: &'a [FieldError],
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::IdempotencyKeyMissing
            | Self::IdempotencyKeyInvalid(_)
            | Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::IdempotencyKeyInUse { .. } => StatusCode::CONFLICT,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::ServiceUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        match self {
            Self::ServiceUnavailable(cause) => tracing::warn!(%cause, "failing closed"),
            Self::Internal(cause) => tracing::error!(%cause, "internal error"),
            _ => {}
        }
        let errors: &[FieldError] = match self {
            Self::InvalidRequest { errors, .. } => errors,
            _ => &[],
        };
        let body = Problem::new(
            status,
            self.code(),
            self.title(),
            self.to_string(),
            FieldErrors { errors },
        )
        .to_body();
        let mut response = HttpResponse::build(status);
        response.content_type(PROBLEM_JSON);
        match self {
            Self::IdempotencyKeyInUse { retry_after_secs } => {
                response.insert_header((header::RETRY_AFTER, retry_after_secs.to_string()));
            }
            Self::ServiceUnavailable(_) => {
                response.insert_header((header::RETRY_AFTER, "1"));
            }
            Self::Unauthenticated => {
                response.insert_header((header::WWW_AUTHENTICATE, "Bearer"));
            }
            _ => {}
        }
        response.body(body)
    }
}

impl From<deadpool_postgres::PoolError> for ApiError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        match error {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => Self::ServiceUnavailable(other.to_string()),
        }
    }
}

impl From<tokio_postgres::Error> for ApiError {
    /// Lost connections, timeouts and an overloaded or restarting server fail
    /// closed with 503; anything else is a bug and a 500.
    fn from(error: tokio_postgres::Error) -> Self {
        use tokio_postgres::error::SqlState;
        let transient = match error.code() {
            // No SQLSTATE: the connection failed or closed (an IO error), or
            // the statement itself is wrong (a type mismatch: a bug).
            None => {
                error.is_closed()
                    || std::error::Error::source(&error).is_some_and(|s| s.is::<std::io::Error>())
            }
            Some(code) => {
                *code == SqlState::QUERY_CANCELED
                    || *code == SqlState::ADMIN_SHUTDOWN
                    || *code == SqlState::CRASH_SHUTDOWN
                    || *code == SqlState::CANNOT_CONNECT_NOW
                    || *code == SqlState::TOO_MANY_CONNECTIONS
                    || *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::T_R_DEADLOCK_DETECTED
                    || code.code().starts_with("08")
            }
        };
        let cause = format!("{error:?}");
        if transient {
            Self::ServiceUnavailable(cause)
        } else {
            Self::Internal(cause)
        }
    }
}
