//! `/v1/charges`: create (idempotent), read, list.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{body, render, AuthenticatedMerchant, HttpLimits};
use crate::domain::{ChargeId, MerchantId, NewCharge, RequestFingerprint};
use crate::error::ApiError;
use crate::service::charges::{ChargeReply, Charges};

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
    let key = body::idempotency_key(request, "charge")?;
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
/// the same status and the same bytes as the first answer: the charge as
/// created, whatever refunds did to it since (`Charge::as_created`).
fn charge_response(reply: &ChargeReply) -> Result<HttpResponse, ApiError> {
    let charge = &reply.record.as_created();
    render::created(
        charge.status,
        charge,
        render::Declined {
            object: "charge",
            id: charge.id.to_string(),
            record: charge,
            code: charge.failure_code.as_deref(),
            message: charge.failure_message.as_deref(),
            title: "Payment declined",
        },
        format!("/v1/charges/{}", charge.id),
        reply.replayed,
    )
}

pub async fn get(
    charges: web::Data<Charges>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    // A malformed id names no charge: the same 404 as someone else's charge.
    let id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    render::json(&charges.get(merchant, id).await?)
}

pub async fn list(
    charges: web::Data<Charges>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (limit, starting_after) =
        render::page_query(request.query_string(), ChargeId::parse, "ch_", |_, _| None)?;
    let charges = charges.list(merchant, limit + 1, starting_after).await?;
    render::page("/v1/charges".to_owned(), charges, limit)
}
