//! Liveness and readiness.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::db::Database;
use crate::error::ApiError;
use crate::service::health;

/// The process is up and serving HTTP.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// The database answers and carries every migration this binary knows.
pub async fn readyz(db: web::Data<Database>) -> Result<HttpResponse, ApiError> {
    let migration = health::ready(&db).await?;
    Ok(HttpResponse::Ok().json(json!({"status": "ready", "migration": migration})))
}
