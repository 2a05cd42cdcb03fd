//! `/v1/events`: list (newest first, `type` filter), read, and an event's
//! webhook deliveries. An event's JSON here is byte for byte the body its
//! webhooks carry.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use super::openapi::{DeliveryList, EventList, EventQuery};
use super::query::Params;
use super::AuthenticatedMerchant;
use crate::domain::{Delivery, Event, EventId, EventType};
use crate::error::ApiError;
use crate::service::events::Events;

#[derive(Serialize)]
struct Page<'a, T> {
    object: &'static str,
    url: &'a str,
    has_more: bool,
    data: &'a [T],
}

/// The merchant's events, newest first.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    operation_id = "listEvents",
    params(EventQuery),
    responses((status = 200, description = "A page of events", body = EventList)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn list(
    events: web::Data<Events>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut params = Params::parse(request.query_string())?;
    let limit = params.limit();
    let starting_after = params.parsed("starting_after", EventId::parse, "an event id (evt_...)");
    let of_type = params.parsed(
        "type",
        EventType::parse,
        &format!("one of {}", EventType::names()),
    );
    params.finish()?;
    let mut found = events
        .list(merchant, limit + 1, starting_after, of_type)
        .await?;
    let has_more = found.len() as i64 > limit;
    found.truncate(limit as usize);
    json(&Page {
        object: "list",
        url: "/v1/events",
        has_more,
        data: &found,
    })
}

/// An event: byte for byte the body its webhooks carry.
#[utoipa::path(
    get,
    path = "/v1/events/{id}",
    tag = "events",
    operation_id = "getEvent",
    params(("id" = String, Path, description = "The event's id (`evt_...`)", example = "evt_0193a5c1e0b37f7aa1e0c2d4b5f6a7c0")),
    responses((status = 200, description = "The event", body = crate::http::openapi::Event)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn get(
    events: web::Data<Events>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    // A malformed id names no event: the same 404 as another merchant's.
    let id = EventId::parse(&id).ok_or(ApiError::NotFound)?;
    let event: Event = events.get(merchant, id).await?;
    let body = event.to_json().map_err(|e| ApiError::Internal(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body))
}

/// The event's webhook deliveries, one per endpoint, with their attempts.
#[utoipa::path(
    get,
    path = "/v1/events/{id}/deliveries",
    tag = "events",
    operation_id = "listEventDeliveries",
    params(("id" = String, Path, description = "The event's id (`evt_...`)", example = "evt_0193a5c1e0b37f7aa1e0c2d4b5f6a7c0")),
    responses((status = 200, description = "Every delivery of the event", body = DeliveryList)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn deliveries(
    events: web::Data<Events>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let id = EventId::parse(&id).ok_or(ApiError::NotFound)?;
    let deliveries: Vec<Delivery> = events.deliveries(merchant, id).await?;
    json(&Page {
        object: "list",
        url: &format!("/v1/events/{id}/deliveries"),
        // One delivery per endpoint, all of them.
        has_more: false,
        data: &deliveries,
    })
}

fn json<T: Serialize>(value: &T) -> Result<HttpResponse, ApiError> {
    let body = serde_json::to_string(value).map_err(|e| ApiError::Internal(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body))
}
