//! `/v1/charges`: create (idempotent), read, list.

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use super::{body, AuthenticatedMerchant, HttpLimits};
use crate::domain::{
    Charge, ChargeId, FieldError, MerchantId, NewCharge, RequestFingerprint, Status,
};
use crate::error::{ApiError, Problem, PROBLEM_JSON};
use crate::service::charges::{ChargeReply, Charges};

pub const REPLAYED: &str = "idempotent-replayed";

pub async fn create(
    charges: web::Data<Charges>,
    limits: web::Data<HttpLimits>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    create_for(merchant, &charges, &limits, &request, payload).await
}

/// The charge flow for a merchant someone already vouched for: the API key
/// above, or the demo's merchant backend (`super::demo`), which holds its
/// merchant on the server side. Parsing, fingerprint and answers are the same.
pub(crate) async fn create_for(
    merchant: MerchantId,
    charges: &Charges,
    limits: &HttpLimits,
    request: &HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = body::idempotency_key(request)?;
    let body = body::json(request, payload, limits).await?;
    let new_charge = NewCharge::parse(&body)
        .map_err(|errors| ApiError::invalid("the charge request is invalid", errors))?;
    let fingerprint = RequestFingerprint::new(&new_charge.normalised(), &body);
    let reply = charges
        .create(merchant, &key, fingerprint, &new_charge)
        .await?;
    charge_response(&reply)
}

/// The answer for a charge, from its stored row alone, so a replay renders
/// the same status and the same bytes as the first answer.
fn charge_response(reply: &ChargeReply) -> Result<HttpResponse, ApiError> {
    // The answer to the creation: the same bytes on every replay, whatever
    // refunds did to the charge since (`Charge::as_created`).
    let charge = &reply.record.as_created();
    let (status, content_type, body) = match charge.status {
        Status::Succeeded => (StatusCode::CREATED, "application/json", to_json(charge)?),
        Status::Pending => (StatusCode::ACCEPTED, "application/json", to_json(charge)?),
        Status::Failed => (
            StatusCode::PAYMENT_REQUIRED,
            PROBLEM_JSON,
            declined_problem(charge)?,
        ),
    };
    let mut response = HttpResponse::build(status);
    response
        .content_type(content_type)
        .insert_header((header::LOCATION, format!("/v1/charges/{}", charge.id)));
    if reply.replayed {
        response.insert_header((REPLAYED, "true"));
    }
    Ok(response.body(body))
}

#[derive(Serialize)]
struct Declined<'a> {
    charge_id: String,
    charge: &'a Charge,
}

fn declined_problem(charge: &Charge) -> Result<String, ApiError> {
    let code = charge.failure_code.as_deref().unwrap_or("card_declined");
    Problem::new(
        StatusCode::PAYMENT_REQUIRED,
        code,
        "Payment declined",
        charge
            .failure_message
            .clone()
            .unwrap_or_else(|| "The payment was declined.".to_owned()),
        Declined {
            charge_id: charge.id.to_string(),
            charge,
        },
    )
    .to_body()
    .map_err(|e| ApiError::Internal(e.into()))
}

fn to_json<T: Serialize>(value: &T) -> Result<String, ApiError> {
    serde_json::to_string(value).map_err(|e| ApiError::Internal(e.into()))
}

pub async fn get(
    charges: web::Data<Charges>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    // A malformed id names no charge: the same 404 as someone else's charge.
    let id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    let charge = charges.get(merchant, id).await?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(to_json(&charge)?))
}

pub const DEFAULT_PAGE: i64 = 10;
pub const MAX_PAGE: i64 = 100;

#[derive(Serialize)]
struct Page<'a> {
    object: &'static str,
    url: &'static str,
    has_more: bool,
    data: &'a [Charge],
}

pub async fn list(
    charges: web::Data<Charges>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (limit, starting_after) = page_query(request.query_string())?;
    let mut charges = charges.list(merchant, limit + 1, starting_after).await?;
    let has_more = charges.len() as i64 > limit;
    charges.truncate(limit as usize);
    let page = Page {
        object: "list",
        url: "/v1/charges",
        has_more,
        data: &charges,
    };
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(to_json(&page)?))
}

/// `limit` (1..=100, default 10) and `starting_after` (a charge id); any
/// other parameter is an error rather than silently ignored.
fn page_query(query: &str) -> Result<(i64, Option<ChargeId>), ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query)
        .map_err(|e| ApiError::invalid(format!("the query string is malformed: {e}"), vec![]))?;
    let mut limit = DEFAULT_PAGE;
    let mut starting_after = None;
    let mut errors = Vec::new();
    for (name, value) in pairs {
        match name.as_str() {
            "limit" => match value.parse::<i64>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => limit = n,
                _ => errors.push(FieldError {
                    field: "limit".into(),
                    message: format!("must be an integer from 1 to {MAX_PAGE}"),
                }),
            },
            "starting_after" => match ChargeId::parse(&value) {
                Some(id) => starting_after = Some(id),
                None => errors.push(FieldError {
                    field: "starting_after".into(),
                    message: "must be a charge id (ch_...)".into(),
                }),
            },
            _ => errors.push(FieldError {
                field: name,
                message: "unknown query parameter".into(),
            }),
        }
    }
    if errors.is_empty() {
        Ok((limit, starting_after))
    } else {
        Err(ApiError::invalid("the query is invalid", errors))
    }
}
