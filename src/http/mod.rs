//! The HTTP layer: routes, extractors and response rendering. Handlers parse
//! and authenticate, call one service function, and render; errors become
//! problem+json in `crate::error` only.

mod auth;
mod body;
mod charges;
pub mod demo;
mod events;
mod health;
mod query;
pub mod server;
mod webhook_endpoints;

use actix_web::dev::{Service, ServiceRequest};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, HttpResponse};

pub use auth::AuthenticatedMerchant;

/// Request limits the handlers enforce.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    pub max_body_bytes: usize,
    pub body_timeout: std::time::Duration,
}

use crate::error::ApiError;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/v1/charges")
            .route(web::post().to(charges::create))
            .route(web::get().to(charges::list))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/charges/{id}")
            .route(web::get().to(charges::get))
            .default_service(web::to(method_not_allowed)),
    )
    .configure(events::routes)
    .configure(webhook_endpoints::routes)
    .route("/healthz", web::get().to(health::healthz))
    .route("/readyz", web::get().to(health::readyz))
    .default_service(web::to(not_found));
}

async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError::NotFound)
}

async fn method_not_allowed() -> Result<HttpResponse, ApiError> {
    Err(ApiError::MethodNotAllowed)
}

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Logs every request with its outcome and echoes (or assigns) a request id
/// that support can search the log for.
pub fn request_log<S, B>(
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
    let started = std::time::Instant::now();
    let request_id = request
        .headers()
        .get(&REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= 200)
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&uuid::Uuid::new_v4().simple().to_string())
                .unwrap_or(HeaderValue::from_static("unknown"))
        });
    let method = request.method().clone();
    let path = request.path().to_owned();
    let response = service.call(request);
    async move {
        let mut response = response.await?;
        tracing::info!(
            request_id = request_id.to_str().unwrap_or(""),
            %method,
            %path,
            status = response.status().as_u16(),
            elapsed_ms = started.elapsed().as_secs_f64() * 1000.0,
            "request"
        );
        response.headers_mut().insert(REQUEST_ID, request_id);
        Ok(response)
    }
}
