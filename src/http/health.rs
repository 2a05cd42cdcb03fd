//! Liveness and readiness.

use actix_web::{web, HttpResponse};
use serde_json::json;

use crate::db;
use crate::error::ApiError;
use crate::state::AppState;

/// The process is up and serving HTTP.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// The database answers and carries every migration this binary knows.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let client = state.pool.get().await?;
    let applied = db::applied_migration(&client).await.ok().flatten();
    let expected = db::latest_migration();
    if applied.is_some_and(|v| v >= expected) {
        Ok(HttpResponse::Ok().json(json!({"status": "ready", "migration": expected})))
    } else {
        Err(ApiError::ServiceUnavailable(format!(
            "database schema at {applied:?}, this binary needs {expected}"
        )))
    }
}
