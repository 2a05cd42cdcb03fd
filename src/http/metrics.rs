//! `GET /metrics`: the Prometheus text format, on the API's port or on
//! `metrics.port` of its own.

use actix_web::{web, HttpResponse};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::metrics::Pools;

/// What a scrape reads: the recorder and the application's pools.
pub struct Exporter {
    pub handle: PrometheusHandle,
    pub pools: Pools,
}

/// Metrics in the Prometheus text format.
///
/// Served with `metrics.enabled`, on the API's port unless `metrics.port`
/// gives it one of its own.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operations",
    operation_id = "metrics",
    responses((status = 200, description = "Prometheus text exposition format 0.0.4", body = String, content_type = "text/plain")),
)]
pub async fn scrape(exporter: web::Data<Exporter>) -> HttpResponse {
    exporter.pools.observe();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(exporter.handle.render())
}
