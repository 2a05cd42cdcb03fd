//! The demo checkout, for development only (`demo.enabled`, off in
//! config/production.toml; when off these routes do not exist and answer 404
//! like any unknown path):
//!
//! - `GET /demo`: a checkout page (`web/demo.html`);
//! - `GET /demo/chargeonce.js`: the browser module it uses (`web/chargeonce.js`);
//! - `POST /demo/charges`: plays the merchant's backend. A real page posts to
//!   its merchant's server, which adds the secret API key and forwards the
//!   `Idempotency-Key` header and the body to `POST /v1/charges`; here the
//!   service holds a demo merchant itself, so no secret key is ever in the
//!   page, and runs the very same charge flow for it.
//!
//! Both files are embedded, so the binary serves the demo without a web/
//! folder next to it.

use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use chargeonce_api as api;
use uuid::Uuid;

use super::body::HttpLimits;
use super::charges;
use super::query::{self, PageOrKey};
use crate::db::{self, Database, DbError};
use crate::domain::{ChargeId, FieldError, MerchantId};
use crate::error::ApiError;
use crate::service::charges::Charges;
use crate::telemetry::error_chain;

const PAGE: &str = include_str!("../../web/demo.html");
const MODULE: &str = include_str!("../../web/chargeonce.js");

/// The demo merchant's id: fixed, so every start (and every instance) finds
/// the same merchant, and recognisable in the database
/// (`mer_00000000000070008000000000000de0`).
const DEMO_MERCHANT: Uuid = Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0de0);
const DEMO_MERCHANT_NAME: &str = "Demo merchant";

pub fn demo_merchant() -> MerchantId {
    MerchantId::from_uuid(DEMO_MERCHANT)
}

/// Creates the demo merchant unless it exists. Called on start-up, after the
/// migrations, when the demo is enabled; failing stops the start, as a
/// failed migration does, rather than serve a demo that cannot charge.
pub async fn ensure_demo_merchant(database: &Database) -> Result<(), DbError> {
    let created = async {
        let conn = database.conn().await?;
        db::merchants::ensure(&conn, demo_merchant(), DEMO_MERCHANT_NAME).await
    };
    created.await.inspect_err(|error| {
        tracing::error!(
            cause = %error_chain(error),
            "cannot create the demo merchant (demo.enabled = true)"
        )
    })
}

/// The demo checkout page.
#[utoipa::path(
    get,
    path = "/demo",
    tag = "demo",
    operation_id = "demoPage",
    responses((status = 200, description = "The page", body = String, content_type = "text/html")),
)]
pub(super) async fn page(page: web::Data<DemoPage>) -> HttpResponse {
    embedded_file("text/html; charset=utf-8", page.0.clone())
}

/// The page with the server's `idempotency.retention_hours` filled in: the
/// module must not resume a stored payment whose key the server may have
/// released (the same key would then make a second charge).
pub struct DemoPage(web::Bytes);

impl DemoPage {
    pub fn new(retention: Duration) -> Self {
        let page = PAGE.replace("{{RETENTION_MS}}", &retention.as_millis().to_string());
        Self(web::Bytes::from(page))
    }
}

/// The browser module the page uses.
#[utoipa::path(
    get,
    path = "/demo/chargeonce.js",
    tag = "demo",
    operation_id = "demoModule",
    responses((status = 200, description = "The module", body = String, content_type = "text/javascript")),
)]
pub(super) async fn module() -> HttpResponse {
    embedded_file(
        "text/javascript; charset=utf-8",
        web::Bytes::from_static(MODULE.as_bytes()),
    )
}

fn embedded_file(content_type: &'static str, body: web::Bytes) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        // Revalidate every time: a rebuilt binary may carry a new version,
        // and a stale cached module would hide it during development.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

/// A page of charges, by the name the document gives it.
type ChargeList = api::List<api::Charge<'static>>;

/// What an idempotency key created for the demo merchant: the demo
/// backend's forwarding of `GET /v1/charges?idempotency_key=`, which the
/// page's module asks after a reload before it pays again.
#[utoipa::path(
    get,
    path = "/demo/charges",
    tag = "demo",
    operation_id = "lookupDemoCharge",
    params(("idempotency_key" = String, Query, pattern = "^[!-~]{1,255}$", description = "The key of the payment to look up.")),
    responses((status = 200, description = "The charge the key created, or none", body = ChargeList)),
)]
pub(super) async fn lookup_charge(
    charges: web::Data<Charges>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = query::page_or_key(request.query_string(), ChargeId::parse, "a charge id")?;
    let PageOrKey::Key(key) = query else {
        return Err(ApiError::invalid(
            "the demo backend only looks charges up by key",
            vec![FieldError::new("idempotency_key", "required")],
        ));
    };
    charges::found_by_key(demo_merchant(), &charges, &key, "/demo/charges").await
}

/// The merchant backend's forwarding route, with the demo merchant standing
/// in for "the merchant whose secret key the backend holds".
/// Create a charge for the demo merchant (no API key).
///
/// The charge flow of `POST /v1/charges`, for the server-held demo merchant.
#[utoipa::path(
    post,
    path = "/demo/charges",
    tag = "demo",
    operation_id = "createDemoCharge",
    params(("Idempotency-Key" = String, Header, description = "Names this logical request: 1 to 255 visible ASCII characters (a quoted form, `\"abc\"`, names the same key as `abc`). The same key with the same body replays the first answer; with another body it is 422.", pattern = "^[!-~]{1,255}$", example = "order-1042-attempt")),
    request_body(content = api::NewCharge, content_type = "application/json"),
    responses(
        (status = 201, description = "Succeeded", body = api::Charge, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 202, description = "Pending", body = api::Charge, headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
        (status = 402, description = "Declined", body = api::ChargeDeclined, content_type = "application/problem+json", headers(
                ("Location" = String, description = "The created resource"),
                ("Idempotent-Replayed" = String, description = "`true` when this answer is the replay of an earlier request with the same key and body; absent on the first answer"),
            )),
    ),
)]
pub(super) async fn create_charge(
    charges: web::Data<Charges>,
    limits: web::Data<HttpLimits>,
    request: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, ApiError> {
    charges::create_for(demo_merchant(), &charges, &limits, &request, payload).await
}
