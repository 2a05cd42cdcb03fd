//! `/v1/events`: list (newest first, `type` filter), read, and an event's
//! webhook deliveries. An event's JSON here is byte for byte the body its
//! webhooks carry.

use actix_web::{web, HttpRequest, HttpResponse};
use chargeonce_api as api;

use super::auth::AuthenticatedMerchant;
use super::query::Params;
use super::render;
use crate::domain::{EventId, EventType};
use crate::error::ApiError;
use crate::service::events::Events;

/// A page of events, by the name the document gives it (`EventList`).
type EventList = api::List<api::Event<'static>>;
/// An event's deliveries, by the name the document gives them (`DeliveryList`).
type DeliveryList = api::List<api::Delivery>;

/// The merchant's events, newest first.
#[utoipa::path(
    get,
    path = "/v1/events",
    tag = "events",
    operation_id = "listEvents",
    params(
        ("limit" = Option<i64>, Query, minimum = 1, maximum = 100, description = "1 to 100, default 10."),
        ("starting_after" = Option<String>, Query, pattern = "^evt_[0-9a-f]{32}$", description = "The id of the last event of the previous page."),
        ("type" = inline(Option<api::EventType>), Query, description = "Only events of this type."),
    ),
    responses((status = 200, description = "A page of events", body = EventList)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn list(
    events: web::Data<Events>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let mut params = Params::parse(request.query_string())?;
    let page = params.page(EventId::parse, "an event id (evt_...)");
    let of_type = params.parsed(
        "type",
        EventType::parse,
        &format!("one of {}", EventType::names()),
    );
    params.finish()?;
    let found = events
        .list(merchant, page.limit + 1, page.starting_after, of_type)
        .await?;
    render::page(
        "/v1/events".to_owned(),
        &found,
        page.limit,
        api::Event::from,
    )
}

/// An event: byte for byte the body its webhooks carry.
#[utoipa::path(
    get,
    path = "/v1/events/{id}",
    tag = "events",
    operation_id = "getEvent",
    params(("id" = String, Path, description = "The event's id (`evt_...`)", example = "evt_0193a5c1e0b37f7aa1e0c2d4b5f6a7c0")),
    responses((status = 200, description = "The event", body = api::Event)),
    security(("bearerAuth" = [])),
)]
pub(super) async fn get(
    events: web::Data<Events>,
    AuthenticatedMerchant(merchant): AuthenticatedMerchant,
    id: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    // A malformed id names no event: the same 404 as another merchant's.
    let id = EventId::parse(&id).ok_or(ApiError::NotFound)?;
    let event = events.get(merchant, id).await?;
    let body = event.to_json().map_err(|e| ApiError::Internal(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body))
}

/// The event's webhook deliveries, one per endpoint, with their attempts.
///
/// All of them on one page: it takes no query parameter.
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
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let id = EventId::parse(&id).ok_or(ApiError::NotFound)?;
    Params::parse(request.query_string())?.finish()?;
    let deliveries = events.deliveries(merchant, id).await?;
    render::json(&api::List {
        object: api::ListObject::List,
        url: format!("/v1/events/{id}/deliveries"),
        // One delivery per endpoint, all of them.
        has_more: false,
        data: deliveries.iter().map(api::Delivery::from).collect(),
    })
}
