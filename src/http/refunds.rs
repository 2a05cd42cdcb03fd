//! Refunds: `POST /v1/charges/{id}/refunds` (idempotent, like charges),
//! `GET /v1/charges/{id}/refunds`, `GET /v1/refunds/{id}`, `GET /v1/refunds`.

use actix_web::{web, HttpRequest, HttpResponse};

use super::openapi::{RefundDeclined, RefundList, RefundPage, RefundRequest};
use super::{body, render, AuthenticatedMerchant, HttpLimits};
use crate::domain::{ChargeId, NewRefund, RefundId, RequestFingerprint};
use crate::error::ApiError;
use crate::service::refunds::{RefundReply, Refunds};

/// Refund a succeeded charge, at most once per `Idempotency-Key`.
///
/// All of what remains refundable, or `amount` of it: 201 succeeded, 202
/// pending, 402 declined; replays as for charges.
#[utoipa::path(
    post,
    path = "/v1/charges/{id}/refunds",
    tag = "refunds",
    operation_id = "createRefund",
    params(
        ("id" = String, Path, description = "The charge's id (`ch_...`)", example = "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8"),
        ("Idempotency-Key" = String, Header, description = "Names this logical request: 1 to 255 visible ASCII characters (a quoted form, `\"abc\"`, names the same key as `abc`). The same key with the same body replays the first answer; with another body it is 422.", pattern = "^[!-~]{1,255}$", example = "order-1042-attempt"),
    ),
    request_body(content = RefundRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Succeeded", body = crate::http::openapi::Refund, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 202, description = "Pending", body = crate::http::openapi::Refund, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 402, description = "Declined: the refund exists and failed", body = RefundDeclined, content_type = "application/problem+json", headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
    ),
    security(("bearerAuth" = [])),
)]
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
    let fingerprint = RequestFingerprint::new(&new_refund.normalised(), body);
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
        reply.json.as_deref(),
        render::Declined {
            object: "refund",
            id: &refund.id,
            record: refund,
            code: refund.failure_code.as_deref(),
            message: refund.failure_message.as_deref(),
            title: "Refund declined",
        },
        format!("/v1/refunds/{}", refund.id),
        reply.replayed,
    )
}

/// A refund.
#[utoipa::path(
    get,
    path = "/v1/refunds/{id}",
    tag = "refunds",
    operation_id = "getRefund",
    params(("id" = String, Path, description = "The refund's id (`re_...`)", example = "re_0193a5c1e0b37f7aa1e0c2d4b5f6a7b9")),
    responses((status = 200, description = "The refund", body = crate::http::openapi::Refund)),
    security(("bearerAuth" = [])),
)]
pub async fn get(
    refunds: web::Data<Refunds>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = RefundId::parse(&id).ok_or(ApiError::NotFound)?;
    render::json(&refunds.get(merchant, id).await?)
}

/// `GET /v1/refunds`: the merchant's refunds, newest first.
#[utoipa::path(
    get,
    path = "/v1/refunds",
    tag = "refunds",
    operation_id = "listRefunds",
    params(RefundPage),
    responses((status = 200, description = "A page of refunds", body = RefundList)),
    security(("bearerAuth" = [])),
)]
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

/// `GET /v1/charges/{id}/refunds`: the charge's refunds, newest first.
#[utoipa::path(
    get,
    path = "/v1/charges/{id}/refunds",
    tag = "refunds",
    operation_id = "listRefundsOfCharge",
    params(
        ("id" = String, Path, description = "The charge's id (`ch_...`)", example = "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8"),
        RefundPage,
    ),
    responses((status = 200, description = "A page of the charge's refunds", body = RefundList)),
    security(("bearerAuth" = [])),
)]
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
