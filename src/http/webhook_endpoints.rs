//! `/v1/webhook_endpoints`: create (idempotent, like a charge: the same key
//! and body replay the first answer byte for byte, its secret included, with
//! `Idempotent-Replayed: true`, as long as the endpoint is not deleted; once
//! it is, 409 `webhook_endpoint_deleted` without the secret; another body is
//! 422), list (no secrets) and delete.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use chargeonce_api as api;

use super::auth::AuthenticatedMerchant;
use super::body::{self, HttpLimits};
use super::query;
use super::render::{self, REPLAYED};
use crate::domain::{NewWebhookEndpoint, RequestFingerprint, WebhookEndpointId};
use crate::error::ApiError;
use crate::service::webhook_endpoints::WebhookEndpoints;

/// A page of endpoints, by the name the document gives it
/// (`WebhookEndpointList`).
type WebhookEndpointList = api::List<api::WebhookEndpoint>;

/// Create a webhook endpoint, at most once per `Idempotency-Key`.
///
/// The answer (and its replays) is the only one that shows the signing
/// secret.
#[utoipa::path(
    post,
    path = "/v1/webhook_endpoints",
    tag = "webhook_endpoints",
    operation_id = "createWebhookEndpoint",
    params(("Idempotency-Key" = String, Header, description = "Names this logical request: 1 to 255 visible ASCII characters (a quoted form, `\"abc\"`, names the same key as `abc`). The same key with the same body replays the first answer; with another body it is 422.", pattern = "^[!-~]{1,255}$", example = "order-1042-attempt")),
    request_body(content = api::NewWebhookEndpoint, content_type = "application/json"),
    responses(
        (status = 201, description = "Created: the endpoint and its `secret`", body = api::WebhookEndpoint, headers(
            ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
        )),
    ),
    security(("bearerAuth" = [])),
)]
pub(super) async fn create(
    endpoints: web::Data<WebhookEndpoints>,
    limits: web::Data<HttpLimits>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    let key = body::idempotency_key(&request, "webhook_endpoint")?;
    let body = body::json(&request, payload, &limits).await?;
    let new_endpoint = NewWebhookEndpoint::parse(&body)
        .map_err(|errors| ApiError::invalid("the webhook endpoint is invalid", errors))?;
    let fingerprint = RequestFingerprint::new(&new_endpoint.normalised(), body);
    let reply = endpoints
        .create(merchant, &key, fingerprint, &new_endpoint)
        .await?;
    // A deleted endpoint's secret is not handed out again, to anyone who
    // replays its creation: the client learns it is gone, and that a new
    // endpoint needs a new key.
    if reply.endpoint.deleted_at.is_some() {
        return Err(ApiError::WebhookEndpointDeleted {
            id: reply.endpoint.id.to_string(),
        });
    }
    // From the stored row alone, so a replay is the same bytes.
    let body = render::to_json(&reply.endpoint.as_created())?;
    let mut response = HttpResponse::build(StatusCode::CREATED);
    response.content_type("application/json");
    if reply.replayed {
        response.insert_header((REPLAYED, "true"));
    }
    Ok(response.body(body))
}

/// The merchant's endpoints that are not deleted, newest first.
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints",
    tag = "webhook_endpoints",
    operation_id = "listWebhookEndpoints",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "1 to 100, default 10."),
        ("starting_after" = Option<String>, Query, pattern = "^we_[0-9a-f]{32}$", description = "The id of the last endpoint of the previous page."),
    ),
    responses((status = 200, description = "A page of endpoints", body = WebhookEndpointList)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn list(
    endpoints: web::Data<WebhookEndpoints>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let page = query::page(
        request.query_string(),
        WebhookEndpointId::parse,
        "a webhook endpoint id (we_...)",
    )?;
    let found = endpoints
        .list(merchant, page.limit + 1, page.starting_after)
        .await?;
    render::page(
        "/v1/webhook_endpoints".to_owned(),
        &found,
        page.limit,
        api::WebhookEndpoint::from,
    )
}

/// Deletes the endpoint and answers with it (no secret, `"deleted": true`).
/// An endpoint already deleted is 404, like an unknown one.
/// Delete a webhook endpoint.
///
/// No new deliveries go to it; deleting it again is 404.
#[utoipa::path(
    delete,
    path = "/v1/webhook_endpoints/{id}",
    tag = "webhook_endpoints",
    operation_id = "deleteWebhookEndpoint",
    params(("id" = String, Path, description = "The endpoint's id (`we_...`)", example = "we_0193a5c1e0b37f7aa1e0c2d4b5f6a7c1")),
    responses((status = 200, description = "The deleted endpoint", body = api::WebhookEndpoint)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn delete(
    endpoints: web::Data<WebhookEndpoints>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = WebhookEndpointId::parse(&id).ok_or(ApiError::NotFound)?;
    let deleted = endpoints.delete(merchant, id).await?;
    render::json(&api::WebhookEndpoint::from(&deleted))
}
