//! `/v1/webhook_endpoints`: create (idempotent, like a charge: the same key
//! and body replay the first answer byte for byte, its secret included, with
//! `Idempotent-Replayed: true`; another body is 422), list (no secrets) and
//! delete.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use super::openapi::{
    DeletedWebhookEndpoint, WebhookEndpointCreated, WebhookEndpointList, WebhookEndpointPage,
    WebhookEndpointRequest,
};
use super::query::Params;
use super::render::REPLAYED;
use super::{body, AuthenticatedMerchant, HttpLimits};
use crate::domain::{NewWebhookEndpoint, RequestFingerprint, WebhookEndpoint, WebhookEndpointId};
use crate::error::ApiError;
use crate::service::webhook_endpoints::WebhookEndpoints;

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
    request_body(content = WebhookEndpointRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Created", body = WebhookEndpointCreated, headers(
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
    // From the stored row alone, so a replay is the same bytes.
    let body = to_json(&reply.endpoint.as_created())?;
    let mut response = HttpResponse::build(StatusCode::CREATED);
    response.content_type("application/json");
    if reply.replayed {
        response.insert_header((REPLAYED, "true"));
    }
    Ok(response.body(body))
}

#[derive(Serialize)]
struct Page<'a> {
    object: &'static str,
    url: &'static str,
    has_more: bool,
    data: &'a [WebhookEndpoint],
}

/// The merchant's endpoints that are not deleted, newest first.
#[utoipa::path(
    get,
    path = "/v1/webhook_endpoints",
    tag = "webhook_endpoints",
    operation_id = "listWebhookEndpoints",
    params(WebhookEndpointPage),
    responses((status = 200, description = "A page of endpoints", body = WebhookEndpointList)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn list(
    endpoints: web::Data<WebhookEndpoints>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut params = Params::parse(request.query_string())?;
    let limit = params.limit();
    let starting_after = params.parsed(
        "starting_after",
        WebhookEndpointId::parse,
        "a webhook endpoint id (we_...)",
    );
    params.finish()?;
    let mut found = endpoints.list(merchant, limit + 1, starting_after).await?;
    let has_more = found.len() as i64 > limit;
    found.truncate(limit as usize);
    let page = Page {
        object: "list",
        url: "/v1/webhook_endpoints",
        has_more,
        data: &found,
    };
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(to_json(&page)?))
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
    responses((status = 200, description = "The deleted endpoint", body = DeletedWebhookEndpoint)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn delete(
    endpoints: web::Data<WebhookEndpoints>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = WebhookEndpointId::parse(&id).ok_or(ApiError::NotFound)?;
    let deleted = endpoints.delete(merchant, id).await?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(to_json(&deleted)?))
}

fn to_json<T: Serialize>(value: &T) -> Result<String, ApiError> {
    serde_json::to_string(value).map_err(|e| ApiError::Internal(e.into()))
}
