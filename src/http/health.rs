//! Liveness and readiness.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use crate::db::Database;
use crate::error::ApiError;
use crate::service::health;

/// The answer of `/healthz`.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"status": "ok"}))]
pub struct Health {
    pub status: &'static str,
}

/// Ready: the database answers and carries every migration this binary
/// knows (`migration`, the latest).
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"status": "ready", "migration": 9}))]
pub struct Readiness {
    // In this order: the answer has always had its members sorted.
    pub migration: i64,
    pub status: &'static str,
}

/// The process is up and serving HTTP.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "healthz",
    responses((status = 200, description = "Alive", body = inline(Health))),
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
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
    responses((status = 200, description = "Ready to serve", body = inline(Readiness))),
)]
pub async fn readyz(db: web::Data<Database>) -> Result<HttpResponse, ApiError> {
    let migration = health::ready(&db, READINESS_BOUND).await?;
    Ok(HttpResponse::Ok().json(Readiness {
        migration,
        status: "ready",
    }))
}
