//! What the resource handlers share: JSON answers, the answer to an
//! idempotent creation (201 / 202 / 402 from the stored record, so a replay
//! is byte for byte the first answer), and pages of a list.

use std::borrow::Cow;

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use chargeonce_api::{List, ListObject, Problem};
use serde::Serialize;

use crate::domain::Status;
use crate::error::{http_date, problem, ApiError, KEY_EXPIRES, PROBLEM_JSON};

/// Set on an answer that belongs to an earlier request with the same key.
pub const REPLAYED: &str = "idempotent-replayed";

pub fn to_json<T: Serialize>(value: &T) -> Result<String, ApiError> {
    serde_json::to_string(value).map_err(|e| ApiError::Internal(e.into()))
}

/// `200` with `value` as JSON.
pub fn json<T: Serialize>(value: &T) -> Result<HttpResponse, ApiError> {
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(to_json(value)?))
}

/// The answer to an idempotent creation, rendered from the stored record
/// alone: `201` succeeded, `202` pending (the record's public form, `wire`),
/// `402` failed (the problem document `declined` makes of it). `rendered`
/// is the public form's JSON if it is at hand already (the replay cache
/// keeps it): then nothing is rendered again. `Idempotency-Key-Expires`
/// says when the key's replay window ends (`window_end`, from the record's
/// id, so a replay says the same).
pub fn created<W: Serialize, D: Serialize>(
    status: Status,
    rendered: Option<&str>,
    wire: impl FnOnce() -> W,
    declined: impl FnOnce(W) -> D,
    location: String,
    replayed: bool,
    window_end: chrono::DateTime<chrono::Utc>,
) -> Result<HttpResponse, ApiError> {
    let (code, content_type) = match status {
        Status::Succeeded => (StatusCode::CREATED, "application/json"),
        Status::Pending => (StatusCode::ACCEPTED, "application/json"),
        Status::Failed => (StatusCode::PAYMENT_REQUIRED, PROBLEM_JSON),
    };
    let body = match (status, rendered) {
        (Status::Failed, _) => to_json(&declined(wire()))?,
        (_, Some(json)) => json.to_owned(),
        (_, None) => to_json(&wire())?,
    };
    let mut response = HttpResponse::build(code);
    response
        .content_type(content_type)
        .insert_header((header::LOCATION, location))
        .insert_header((KEY_EXPIRES, http_date(window_end)));
    if replayed {
        response.insert_header((REPLAYED, "true"));
    }
    Ok(response.body(body))
}

/// The problem of a failed record's 402: its failure code (`declined` if
/// it has none) and message.
pub fn declined<'a>(
    title: &'a str,
    code: Option<Cow<'a, str>>,
    message: Option<Cow<'a, str>>,
) -> Problem<'a> {
    problem(
        StatusCode::PAYMENT_REQUIRED,
        code.unwrap_or(Cow::Borrowed("declined")),
        title,
        message.unwrap_or(Cow::Borrowed("It was declined.")),
    )
}

/// `items` (fetched with `limit + 1`) as a page of at most `limit`, each
/// item in its public form (`wire`).
pub fn page<'a, T, W: Serialize>(
    url: String,
    items: &'a [T],
    limit: i64,
    wire: impl FnMut(&'a T) -> W,
) -> Result<HttpResponse, ApiError> {
    let limit = usize::try_from(limit).unwrap_or(0);
    json(&List {
        object: ListObject::List,
        url,
        has_more: items.len() > limit,
        data: items.iter().take(limit).map(wire).collect(),
    })
}
