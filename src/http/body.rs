//! Request headers and bodies, checked before any work: the idempotency key,
//! the content type (415), the size (413) and strict JSON syntax (400).

use actix_web::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use actix_web::{web, HttpRequest};
use futures_util::StreamExt;
use serde_json::Value;

use crate::domain::{strict_json, IdempotencyKey, KeyError};
use crate::error::ApiError;

/// Request limits the handlers enforce.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub max_body_bytes: usize,
    pub body_timeout: std::time::Duration,
}

/// The `Idempotency-Key` of a request creating a `kind` ("charge",
/// "refund", …); a missing or malformed one is counted as such.
pub fn idempotency_key(
    request: &HttpRequest,
    kind: &'static str,
) -> Result<IdempotencyKey, ApiError> {
    let parsed = key_of(request);
    if let Err(error) = &parsed {
        let outcome = match error {
            ApiError::IdempotencyKeyMissing => "key_missing",
            _ => "key_invalid",
        };
        crate::telemetry::record("idempotency", &outcome);
        crate::metrics::idempotency(kind, outcome);
    }
    parsed
}

fn key_of(request: &HttpRequest) -> Result<IdempotencyKey, ApiError> {
    let mut values = request.headers().get_all("idempotency-key");
    let value = values.next().ok_or(ApiError::IdempotencyKeyMissing)?;
    if values.next().is_some() {
        return Err(KeyError::Repeated.into());
    }
    let text = value.to_str().map_err(|_| KeyError::BadCharacter)?;
    Ok(IdempotencyKey::parse(text)?)
}

/// Reads a JSON body of at most `limits.max_body_bytes` bytes, all of it
/// within `limits.body_timeout`.
pub async fn json(
    request: &HttpRequest,
    payload: web::Payload,
    limits: &HttpLimits,
) -> Result<Value, ApiError> {
    let content_type = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut parts = content_type.split(';');
    let media_type = parts.next().unwrap_or("").trim();
    let is_json = media_type.eq_ignore_ascii_case("application/json")
        || (media_type.len() > 5
            && media_type.to_ascii_lowercase().starts_with("application/")
            && media_type.to_ascii_lowercase().ends_with("+json"));
    // JSON is UTF-8 (RFC 8259): `charset=utf-8` is welcome, another charset
    // would be read as something it is not.
    let other_charset = parts
        .filter_map(|p| p.split_once('='))
        .any(|(name, value)| {
            name.trim().eq_ignore_ascii_case("charset")
                && !value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        });
    if !is_json || other_charset {
        return Err(ApiError::UnsupportedMediaType);
    }
    let limit = limits.max_body_bytes;
    let declared = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let body = tokio::time::timeout(limits.body_timeout, read(payload, declared, limit))
        .await
        .map_err(|_| ApiError::RequestTimeout {
            detail: format!(
                "the request body did not arrive within {} ms",
                limits.body_timeout.as_millis()
            ),
        })??;
    // Strict: a member sent twice is refused, not "last one wins".
    strict_json::parse(&body)
        .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}"), vec![]))
}

async fn read(
    mut payload: web::Payload,
    declared: Option<usize>,
    limit: usize,
) -> Result<web::BytesMut, ApiError> {
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(1024).min(limit));
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|error| {
            use actix_web::error::PayloadError;
            let why = match error {
                PayloadError::Incomplete(_) => "it ended before all of it arrived".to_owned(),
                PayloadError::EncodingCorrupted => "its chunked encoding is malformed".to_owned(),
                other => other.to_string(),
            };
            ApiError::invalid(format!("the request body could not be read: {why}"), vec![])
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
