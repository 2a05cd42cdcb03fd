//! What the resource handlers share: JSON answers, the answer to an
//! idempotent creation (201 / 202 / 402 from the stored record, so a replay
//! is byte for byte the first answer), and pages with a cursor.

use actix_web::http::{header, StatusCode};
use actix_web::HttpResponse;
use serde::Serialize;

use crate::domain::{FieldError, Status};
use crate::error::{ApiError, Problem, PROBLEM_JSON};

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

/// A final failure, as the 402 problem of a creation: its code, its message,
/// and the record under `<object>` with its id under `<object>_id`. Only
/// rendered for a failed record, so nothing here is formatted in advance.
pub struct Declined<'a, T: Serialize> {
    pub object: &'static str,
    pub id: &'a dyn std::fmt::Display,
    pub record: &'a T,
    pub code: Option<&'a str>,
    pub message: Option<&'a str>,
    pub title: &'static str,
}

/// The answer to an idempotent creation, rendered from the stored record
/// alone: `201` succeeded, `202` pending, `402` failed (a problem document).
/// `rendered` is the record's JSON if it is at hand already (the replay
/// cache keeps it): the body of a 201 or 202 as it is.
pub fn created<T: Serialize>(
    status: Status,
    record: &T,
    rendered: Option<&str>,
    declined: Declined<'_, T>,
    location: String,
    replayed: bool,
) -> Result<HttpResponse, ApiError> {
    let json = || rendered.map_or_else(|| to_json(record), |json| Ok(json.to_owned()));
    let (code, content_type, body) = match status {
        Status::Succeeded => (StatusCode::CREATED, "application/json", json()?),
        Status::Pending => (StatusCode::ACCEPTED, "application/json", json()?),
        Status::Failed => {
            let mut extra = serde_json::Map::new();
            extra.insert(
                format!("{}_id", declined.object),
                declined.id.to_string().into(),
            );
            extra.insert(
                declined.object.to_owned(),
                serde_json::to_value(declined.record).map_err(|e| ApiError::Internal(e.into()))?,
            );
            let problem = Problem::new(
                StatusCode::PAYMENT_REQUIRED,
                declined.code.unwrap_or("declined"),
                declined.title,
                declined.message.unwrap_or("It was declined.").to_owned(),
                extra,
            );
            let body = problem
                .to_body()
                .map_err(|e| ApiError::Internal(e.into()))?;
            (StatusCode::PAYMENT_REQUIRED, PROBLEM_JSON, body)
        }
    };
    let mut response = HttpResponse::build(code);
    response
        .content_type(content_type)
        .insert_header((header::LOCATION, location));
    if replayed {
        response.insert_header((REPLAYED, "true"));
    }
    Ok(response.body(body))
}

pub const DEFAULT_PAGE: i64 = 10;
pub const MAX_PAGE: i64 = 100;

/// A page of a list, newest first.
#[derive(Serialize)]
pub struct Page<'a, T> {
    object: &'static str,
    url: String,
    has_more: bool,
    data: &'a [T],
}

/// `items` (fetched with `limit + 1`) as a page of at most `limit`.
pub fn page<T: Serialize>(
    url: String,
    mut items: Vec<T>,
    limit: i64,
) -> Result<HttpResponse, ApiError> {
    let has_more = items.len() as i64 > limit;
    items.truncate(usize::try_from(limit).unwrap_or(0));
    json(&Page {
        object: "list",
        url,
        has_more,
        data: &items,
    })
}

/// `limit` (1..=100, default 10) and `starting_after` (an id `parse_id`
/// accepts, described by `id_hint`); any other parameter is an error rather
/// than silently ignored, unless `extra` takes it (a filter of its own).
pub fn page_query<Id>(
    query: &str,
    parse_id: fn(&str) -> Option<Id>,
    id_hint: &str,
    mut extra: impl FnMut(&str, &str) -> Option<Result<(), FieldError>>,
) -> Result<(i64, Option<Id>), ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|e| ApiError::invalid(format!("the query string is malformed: {e}"), vec![]))?;
    let mut limit = DEFAULT_PAGE;
    let mut starting_after = None;
    let mut errors = Vec::new();
    for (name, value) in pairs {
        match name.as_str() {
            "limit" => match value.parse::<i64>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                _ => errors.push(FieldError::new(
                    "limit",
                    format!("must be an integer from 1 to {MAX_PAGE}"),
                )),
            },
            "starting_after" => match parse_id(&value) {
                Some(id) => starting_after = Some(id),
                None => errors.push(FieldError::new(
                    "starting_after",
                    format!("must be an id ({id_hint}...)"),
                )),
            },
            other => match extra(other, &value) {
                Some(Ok(())) => {}
                Some(Err(error)) => errors.push(error),
                None => errors.push(FieldError::new(other, "unknown query parameter")),
            },
        }
    }
    if errors.is_empty() {
        Ok((limit, starting_after))
    } else {
        Err(ApiError::invalid("the query is invalid", errors))
    }
}
