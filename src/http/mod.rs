//! The HTTP layer: routes, extractors and response rendering. Handlers parse
//! and authenticate, call one service function, and render the public form
//! of what it returns (`chargeonce_api`); errors become problem+json in
//! `crate::error` only. Handlers import the helpers they use (`auth`,
//! `body`, `query`, `render`) and nothing that imports them: `routes` is the
//! only module that knows every handler.

mod auth;
mod body;
mod charges;
pub mod demo;
mod events;
mod health;
pub mod metrics;
pub mod openapi;
mod query;
mod refunds;
mod render;
pub mod routes;
pub mod server;
mod webhook_endpoints;

use actix_web::dev::{Service, ServiceRequest};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, HttpResponse};

pub use auth::AuthenticatedMerchant;
pub use body::HttpLimits;

use crate::error::ApiError;

/// The API's routes (`routes::api`, each documented in `/openapi.json`);
/// any other path is 404.
pub fn configure(cfg: &mut web::ServiceConfig, served: routes::Served) {
    routes::api(served).register(cfg);
    cfg.default_service(web::to(not_found));
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A request id a client may choose: what support can search a log for,
/// and nothing that could forge one (letters, digits, `.`, `_`, `-`, `:`).
fn acceptable_request_id(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    (1..=128).contains(&bytes.len())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(b))
}

/// Every request runs in a `request` span that carries its request id (the
/// client's `X-Request-Id` if acceptable, else a new one, echoed in the
/// answer), the route template, and once known the merchant, the id of the
/// charge or refund and what its idempotency key led to; so every log line
/// written while serving it can be tied to it. At the end: one access-log
/// line and the HTTP metrics.
pub fn observe<S, B>(
    request: ServiceRequest,
    service: &S,
) -> impl std::future::Future<Output = Result<actix_web::dev::ServiceResponse<B>, actix_web::Error>>
where
    S: Service<
        ServiceRequest,
        Response = actix_web::dev::ServiceResponse<B>,
        Error = actix_web::Error,
    >,
{
    use tracing::field::Empty;
    use tracing::Instrument;

    let started = std::time::Instant::now();
    let request_id = request
        .headers()
        .get(&REQUEST_ID)
        .filter(|value| acceptable_request_id(value))
        .cloned()
        .unwrap_or_else(|| {
            // Hex digits written straight into a buffer, not through
            // `Display` and a String.
            let mut hex = [0u8; uuid::fmt::Simple::LENGTH];
            let id = uuid::Uuid::new_v4().simple().encode_lower(&mut hex);
            HeaderValue::from_str(id).unwrap_or(HeaderValue::from_static("unknown"))
        });
    let method = request.method().clone();
    // The template, not the path: bounded label values, no ids in them.
    // Known before the handler runs (actix matches the path against the
    // app's resource map), so every line of the request carries it.
    let route = request.match_pattern();
    let span = tracing::info_span!(
        "request",
        request_id = request_id.to_str().unwrap_or(""),
        %method,
        route = route.as_deref(),
        merchant = Empty,
        id = Empty,
        idempotency = Empty,
    );
    let response = span.in_scope(|| service.call(request));
    async move {
        let mut response = response.instrument(span.clone()).await?;
        let route = match route {
            Some(route) => route,
            // No resource matched before the handler ran (the default
            // service's 404): named once the answer is known.
            None => {
                let route = response
                    .request()
                    .match_pattern()
                    .unwrap_or_else(|| "unmatched".to_owned());
                span.record("route", route.as_str());
                route
            }
        };
        let status = response.status().as_u16();
        let took = started.elapsed();
        span.in_scope(|| {
            tracing::info!(status, elapsed_ms = took.as_secs_f64() * 1000.0, "request")
        });
        let method = crate::metrics::method_label(&method);
        crate::metrics::http_request(&route, method, status, took);
        response.headers_mut().insert(REQUEST_ID, request_id);
        Ok(response)
    }
}
