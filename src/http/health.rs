//! Liveness and readiness.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::db::Database;
use crate::error::ApiError;
use crate::service::health;

/// The process is up and serving HTTP.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "healthz",
    responses((status = 200, description = "Alive", body = super::openapi::Health)),
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// Longest `/readyz` takes to say the database does not answer: short, so
/// a load balancer's probe is not held up by a partition.
pub const READINESS_BOUND: Duration = Duration::from_secs(1);

/// The database answers and carries every migration this binary knows.
///
/// 503 `service_unavailable` otherwise, within a second.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    operation_id = "readyz",
    responses((status = 200, description = "Ready to serve", body = super::openapi::Readiness)),
)]
pub async fn readyz(db: web::Data<Database>) -> Result<HttpResponse, ApiError> {
    let migration = health::ready(&db, READINESS_BOUND).await?;
    Ok(HttpResponse::Ok().json(json!({"status": "ready", "migration": migration})))
}
