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

pub async fn scrape(exporter: web::Data<Exporter>) -> HttpResponse {
    exporter.pools.observe();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(exporter.handle.render())
}

/// The route, for an `App` (the API's, or the metrics port's own).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(scrape));
}
