//! Refunds: `POST /v1/charges/{id}/refunds` (idempotent, like charges),
//! `GET /v1/charges/{id}/refunds`, `GET /v1/refunds/{id}`, `GET /v1/refunds`.

use actix_web::{web, HttpRequest, HttpResponse};
use chargeonce_api as api;

use super::auth::AuthenticatedMerchant;
use super::body::{self, HttpLimits};
use super::query::PageOrKey;
use super::{query, render};
use crate::domain::{wire, ChargeId, NewRefund, RefundId, RequestFingerprint};
use crate::error::ApiError;
use crate::service::refunds::{RefundReply, Refunds};

/// A page of refunds, by the name the document gives it (`RefundList`).
type RefundList = api::List<api::Refund<'static>>;

/// What `starting_after` must be.
const REFUND_ID: &str = "a refund id (re_...)";

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
    request_body(content = api::NewRefund, content_type = "application/json"),
    responses(
        (status = 201, description = "Succeeded", body = api::Refund, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 202, description = "Pending", body = api::Refund, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 402, description = "Declined: the refund exists and failed", body = api::RefundDeclined, content_type = "application/problem+json", headers(
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
    refund_response(&reply, refunds.window_end(&reply.record))
}

/// The answer for a refund, from its stored row alone, so a replay renders
/// the same status and bytes as the first answer.
fn refund_response(
    reply: &RefundReply,
    window_end: chrono::DateTime<chrono::Utc>,
) -> Result<HttpResponse, ApiError> {
    let refund = &reply.record;
    render::created(
        refund.status,
        reply.json.as_deref(),
        || api::Refund::from(refund),
        |refund| api::RefundDeclined {
            problem: render::declined(
                "Refund declined",
                refund.failure_code.clone(),
                refund.failure_message.clone(),
            ),
            refund_id: refund.id.clone(),
            refund,
        },
        format!("/v1/refunds/{}", refund.id),
        reply.replayed,
        window_end,
    )
}

/// A refund.
#[utoipa::path(
    get,
    path = "/v1/refunds/{id}",
    tag = "refunds",
    operation_id = "getRefund",
    params(("id" = String, Path, description = "The refund's id (`re_...`)", example = "re_0193a5c1e0b37f7aa1e0c2d4b5f6a7b9")),
    responses((status = 200, description = "The refund", body = api::Refund)),
    security(("bearerAuth" = [])),
)]
pub async fn get(
    refunds: web::Data<Refunds>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = RefundId::parse(&id).ok_or(ApiError::NotFound)?;
    render::json(&api::Refund::from(&refunds.get(merchant, id).await?))
}

/// `GET /v1/refunds`: the merchant's refunds, newest first; or the one an
/// idempotency key created (see `GET /v1/charges?idempotency_key=`).
#[utoipa::path(
    get,
    path = "/v1/refunds",
    tag = "refunds",
    operation_id = "listRefunds",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "1 to 100, default 10."),
        ("starting_after" = Option<String>, Query, pattern = "^re_[0-9a-f]{32}$", description = "The id of the last refund of the previous page."),
        ("idempotency_key" = Option<String>, Query, pattern = "^[!-~]{1,255}$", description = "Look up the refund this key created (given alone, without `limit` or `starting_after`): zero or one refund, in its current state, with the key and the end of its replay window. A malformed key is 400 `idempotency_key_invalid`."),
    ),
    responses((status = 200, description = "A page of refunds", body = RefundList)),
    security(("bearerAuth" = [])),
)]
pub async fn list(
    refunds: web::Data<Refunds>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let page = match query::page_or_key(request.query_string(), RefundId::parse, REFUND_ID)? {
        PageOrKey::Page(page) => page,
        PageOrKey::Key(key) => {
            let found = refunds.find_by_key(merchant, &key).await?;
            return render::page("/v1/refunds".to_owned(), found.as_slice(), 1, |refund| {
                wire::refund_found_by_key(refund, key.as_str(), refunds.window_end(refund))
            });
        }
    };
    let found = refunds
        .list(merchant, None, page.limit + 1, page.starting_after)
        .await?;
    render::page(
        "/v1/refunds".to_owned(),
        &found,
        page.limit,
        api::Refund::from,
    )
}

/// `GET /v1/charges/{id}/refunds`: the charge's refunds, newest first.
#[utoipa::path(
    get,
    path = "/v1/charges/{id}/refunds",
    tag = "refunds",
    operation_id = "listRefundsOfCharge",
    params(
        ("id" = String, Path, description = "The charge's id (`ch_...`)", example = "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8"),
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "1 to 100, default 10."),
        ("starting_after" = Option<String>, Query, pattern = "^re_[0-9a-f]{32}$", description = "The id of the last refund of the previous page."),
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
    let page = query::page(request.query_string(), RefundId::parse, REFUND_ID)?;
    let found = refunds
        .list(merchant, Some(charge), page.limit + 1, page.starting_after)
        .await?;
    render::page(
        format!("/v1/charges/{charge}/refunds"),
        &found,
        page.limit,
        api::Refund::from,
    )
}
