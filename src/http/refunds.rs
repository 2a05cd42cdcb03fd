//! Refunds: `POST /v1/charges/{id}/refunds` (idempotent, like charges),
//! `GET /v1/charges/{id}/refunds`, `GET /v1/refunds/{id}`, `GET /v1/refunds`.

use actix_web::{web, HttpRequest, HttpResponse};

use super::{body, render, AuthenticatedMerchant, HttpLimits};
use crate::domain::{ChargeId, NewRefund, RefundId, RequestFingerprint};
use crate::error::ApiError;
use crate::service::refunds::{RefundReply, Refunds};

pub async fn create(
    refunds: web::Data<Refunds>,
    limits: web::Data<HttpLimits>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    charge: web::Path<String>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    // A malformed id names no charge: the same 404 as someone else's.
    let charge = ChargeId::parse(&charge).ok_or(ApiError::NotFound)?;
    let key = body::idempotency_key(&request, "refund")?;
    let body = body::json(&request, payload, &limits).await?;
    let new_refund = NewRefund::parse(&body)
        .map_err(|errors| ApiError::invalid("the refund request is invalid", errors))?;
    let fingerprint = RequestFingerprint::new(&new_refund.normalised(), &body);
    let reply = refunds
        .create(merchant, charge, &key, fingerprint, &new_refund)
        .await?;
    refund_response(&reply)
}

/// The answer for a refund, from its stored row alone, so a replay renders
/// the same status and bytes as the first answer.
fn refund_response(reply: &RefundReply) -> Result<HttpResponse, ApiError> {
    let refund = &reply.record;
    render::created(
        refund.status,
        refund,
        render::Declined {
            object: "refund",
            id: refund.id.to_string(),
            record: refund,
            code: refund.failure_code.as_deref(),
            message: refund.failure_message.as_deref(),
            title: "Refund declined",
        },
        format!("/v1/refunds/{}", refund.id),
        reply.replayed,
    )
}

pub async fn get(
    refunds: web::Data<Refunds>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = RefundId::parse(&id).ok_or(ApiError::NotFound)?;
    render::json(&refunds.get(merchant, id).await?)
}

/// `GET /v1/refunds`.
pub async fn list(
    refunds: web::Data<Refunds>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let (limit, starting_after) =
        render::page_query(request.query_string(), RefundId::parse, "re_", |_, _| None)?;
    let found = refunds
        .list(merchant, None, limit + 1, starting_after)
        .await?;
    render::page("/v1/refunds".to_owned(), found, limit)
}

/// `GET /v1/charges/{id}/refunds`.
pub async fn list_of_charge(
    refunds: web::Data<Refunds>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    charge: web::Path<String>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let charge = ChargeId::parse(&charge).ok_or(ApiError::NotFound)?;
    let (limit, starting_after) =
        render::page_query(request.query_string(), RefundId::parse, "re_", |_, _| None)?;
    let found = refunds
        .list(merchant, Some(charge), limit + 1, starting_after)
        .await?;
    render::page(format!("/v1/charges/{charge}/refunds"), found, limit)
}
