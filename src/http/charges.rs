//! `/v1/charges`: create (idempotent), read, list.

use actix_web::{web, HttpRequest, HttpResponse};
use chargeonce_api as api;

use super::auth::AuthenticatedMerchant;
use super::body::{self, HttpLimits};
use super::query::PageOrKey;
use super::{query, render};
use crate::domain::{wire, ChargeId, IdempotencyKey, MerchantId, NewCharge, RequestFingerprint};
use crate::error::ApiError;
use crate::service::charges::{ChargeReply, Charges};

/// A page of charges, by the name the document gives it (`ChargeList`).
type ChargeList = api::List<api::Charge<'static>>;

/// Create a charge, at most once per `Idempotency-Key`.
///
/// The answer's status is the charge's: 201 succeeded, 202 pending (the processor's answer is
/// not final yet; the charge is settled in the background, read it or wait
/// for its event), 402 declined. Every replay is the first answer, byte for
/// byte, with `Idempotent-Replayed: true`.
#[utoipa::path(
    post,
    path = "/v1/charges",
    tag = "charges",
    operation_id = "createCharge",
    params(("Idempotency-Key" = String, Header, description = "Names this logical request: 1 to 255 visible ASCII characters (a quoted form, `\"abc\"`, names the same key as `abc`). The same key with the same body replays the first answer; with another body it is 422.", pattern = "^[!-~]{1,255}$", example = "order-1042-attempt")),
    request_body(content = api::NewCharge, content_type = "application/json"),
    responses(
        (status = 201, description = "Succeeded", body = api::Charge, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 202, description = "Pending: the processor has not answered finally yet", body = api::Charge, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 402, description = "Declined: the charge exists and failed", body = api::ChargeDeclined, content_type = "application/problem+json", headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
    ),
    security(("bearerAuth" = [])),
)]
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
    let fingerprint = RequestFingerprint::new(&new_charge.normalised(), body);
    let reply = charges
        .create(merchant, &key, fingerprint, &new_charge)
        .await?;
    let window_end = charges.window_end(&reply.record);
    charge_response(reply, window_end)
}

/// The answer for a charge, from its stored row alone, so a replay renders
/// the same status and the same bytes as the first answer: the charge as
/// created, whatever refunds did to it since (`Charge::into_created`).
fn charge_response(
    reply: ChargeReply,
    window_end: chrono::DateTime<chrono::Utc>,
) -> Result<HttpResponse, ApiError> {
    let charge = &reply.record.into_created();
    render::created(
        charge.status,
        reply.json.as_deref(),
        || api::Charge::from(charge),
        |charge| api::ChargeDeclined {
            problem: render::declined(
                "Payment declined",
                charge.failure_code.clone(),
                charge.failure_message.clone(),
            ),
            charge_id: charge.id.clone(),
            charge,
        },
        format!("/v1/charges/{}", charge.id),
        reply.replayed,
        window_end,
    )
}

/// The list of the charge `key` created for `merchant` (zero or one), as
/// the lookup by key answers it at `url`.
pub(crate) async fn found_by_key(
    merchant: MerchantId,
    charges: &Charges,
    key: &IdempotencyKey,
    url: &str,
) -> Result<HttpResponse, ApiError> {
    let found = charges.find_by_key(merchant, key).await?;
    render::page(url.to_owned(), found.as_slice(), 1, |charge| {
        wire::charge_found_by_key(charge, key.as_str(), charges.window_end(charge))
    })
}

/// A charge as it is now (refunds included).
#[utoipa::path(
    get,
    path = "/v1/charges/{id}",
    tag = "charges",
    operation_id = "getCharge",
    params(("id" = String, Path, description = "The charge's id (`ch_...`); a malformed id is 404 like an unknown one", example = "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8")),
    responses((status = 200, description = "The charge", body = api::Charge)),
    security(("bearerAuth" = [])),
)]
pub async fn get(
    charges: web::Data<Charges>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    // A malformed id names no charge: the same 404 as someone else's charge.
    let id = ChargeId::parse(&id).ok_or(ApiError::NotFound)?;
    render::json(&api::Charge::from(&charges.get(merchant, id).await?))
}

/// The merchant's charges, newest first; or the one an idempotency key
/// created.
///
/// With `idempotency_key`, the list holds the charge that key created, in
/// its current state (pending included), with the key and the end of its
/// replay window; or nothing, if the key names no charge of this merchant
/// (never used, or released). It reads one row: no processor call, no
/// lease, nothing created. Use it to learn what happened to a request whose
/// answer was lost, without sending it again.
#[utoipa::path(
    get,
    path = "/v1/charges",
    tag = "charges",
    operation_id = "listCharges",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "1 to 100, default 10."),
        ("starting_after" = Option<String>, Query, pattern = "^ch_[0-9a-f]{32}$", description = "The id of the last charge of the previous page."),
        ("idempotency_key" = Option<String>, Query, pattern = "^[!-~]{1,255}$", description = "Look up the charge this key created (given alone, without `limit` or `starting_after`): zero or one charge. A malformed key is 400 `idempotency_key_invalid`."),
    ),
    responses((status = 200, description = "A page of charges", body = ChargeList)),
    security(("bearerAuth" = [])),
)]
pub async fn list(
    charges: web::Data<Charges>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let page = match query::page_or_key(
        request.query_string(),
        ChargeId::parse,
        "a charge id (ch_...)",
    )? {
        PageOrKey::Page(page) => page,
        PageOrKey::Key(key) => return found_by_key(merchant, &charges, &key, "/v1/charges").await,
    };
    let found = charges
        .list(merchant, page.limit + 1, page.starting_after)
        .await?;
    render::page(
        "/v1/charges".to_owned(),
        &found,
        page.limit,
        api::Charge::from,
    )
}
