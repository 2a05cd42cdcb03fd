//! `GET /openapi.json`: the OpenAPI 3.1 document of the API, generated from
//! the code. Each handler carries its `#[utoipa::path]` (method, path,
//! parameters, request body, success answers); `super::routes` serves the
//! handlers at exactly those methods and paths and collects the operations.
//! Here the operations are completed with what every one of them shares,
//! derived from what they declare: the problem answers (from `ApiError`
//! itself, each code with an example rendered by the same code that renders
//! the real answer), `X-Request-Id`, `Retry-After`, `WWW-Authenticate`.
//!
//! The schemas below describe the JSON that `crate::domain`'s hand-written
//! `Serialize` impls and `super::render` produce; they exist for the
//! document only. tests/api/openapi.rs and `scripts/contract-fuzz` check that
//! real answers conform to them.

use std::collections::BTreeMap;

use actix_web::{web, HttpResponse};
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::header::Header;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, Object, ObjectBuilder, OpenApi as Document, RefOr, Required, Response,
    ResponseBuilder, Type,
};
use utoipa::{Modify, OpenApi};

use super::routes::{self, Served};
use crate::domain::{FieldError as Field, KeyError};
use crate::error::{ApiError, PROBLEM_JSON};

pub use schemas::*;

/// The name of the security scheme of the merchant API key.
pub const BEARER: &str = "bearerAuth";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "chargeonce",
        description = "Idempotent payment charges: one charge per logical request, however often \
                       it is sent. The human-readable contract is docs/api.md in the repository.",
        license(name = "MIT", identifier = "MIT"),
    ),
    components(schemas(
        ChargeRequest,
        Charge,
        ChargeList,
        ChargeDeclined,
        RefundRequest,
        Refund,
        RefundList,
        RefundDeclined,
        Event,
        EventList,
        Delivery,
        DeliveryList,
        WebhookEndpointRequest,
        WebhookEndpointCreated,
        WebhookEndpoint,
        WebhookEndpointList,
        DeletedWebhookEndpoint,
        Problem,
        Health,
        Readiness,
        OpenApiDocument,
    )),
    modifiers(&BearerAuth),
    tags(
        (name = "charges", description = "Charges, created idempotently"),
        (name = "refunds", description = "Refunds of charges, created idempotently"),
        (name = "events", description = "Every state change of a charge or a refund, and its webhook deliveries"),
        (name = "webhook_endpoints", description = "Where events are sent, signed"),
        (name = "operations", description = "Health, readiness, metrics and this document; no API key"),
        (name = "demo", description = "The demo checkout, served only with demo.enabled (development)"),
    ),
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The merchant's secret API key (`chargeonce merchant create NAME` \
                         prints one): `Authorization: Bearer <key>`.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The document of the API as served with these optional parts.
pub fn document(served: Served) -> Document {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.paths = routes::api(served).into_paths();
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.patch,
            &mut item.delete,
        ];
        for operation in operations.into_iter().flatten() {
            complete(operation);
        }
    }
    doc
}

/// `document(served)` as JSON, what `GET /openapi.json` answers.
pub struct Rendered(pub String);

impl Rendered {
    pub fn new(served: Served) -> Result<Self, serde_json::Error> {
        serde_json::to_string(&rendered(served)?).map(Self)
    }
}

/// `document(served)` as JSON. utoipa 5.5 writes a link's target as
/// `operation_id` (its `Link` lacks the camel-case renaming its other types
/// have); OpenAPI's name for it, which tools look for, is `operationId`.
pub fn rendered(served: Served) -> Result<serde_json::Value, serde_json::Error> {
    let mut value = serde_json::to_value(document(served))?;
    let links = value
        .get_mut("paths")
        .and_then(serde_json::Value::as_object_mut)
        .into_iter()
        .flat_map(|paths| paths.values_mut())
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(|operation| operation.get_mut("responses"))
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|responses| responses.values_mut())
        .filter_map(|response| response.get_mut("links"))
        .filter_map(serde_json::Value::as_object_mut)
        .flat_map(|links| links.values_mut())
        .filter_map(serde_json::Value::as_object_mut);
    for link in links {
        if let Some(target) = link.remove("operation_id") {
            link.insert("operationId".to_owned(), target);
        }
    }
    Ok(value)
}

/// The OpenAPI 3.1 document of this API (this document).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    operation_id = "getOpenApiDocument",
    responses(
        (status = 200, description = "This document", body = OpenApiDocument, content_type = "application/json"),
    ),
)]
pub async fn serve_document(rendered: web::Data<Rendered>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(rendered.0.clone())
}

/// Adds to `operation` what it shares with the others: the optional
/// `X-Request-Id` request header, every problem answer it can give, and the
/// `X-Request-Id` header of every answer.
fn complete(operation: &mut Operation) {
    let parameters = operation.parameters.get_or_insert_with(Vec::new);
    parameters.push(
        ParameterBuilder::new()
            .name("X-Request-Id")
            .parameter_in(ParameterIn::Header)
            .required(Required::False)
            .description(Some(
                "Your id for this request, echoed in the answer's X-Request-Id and written \
                 in every log line about it if it is 1 to 128 letters, digits, `.`, `_`, \
                 `-`, `:`. Any other value is ignored (not refused) and a new id is made.",
            ))
            .schema(Some(string()))
            .build(),
    );
    for (status, problems) in problems_of(operation) {
        let key = status.to_string();
        if operation.responses.responses.contains_key(&key) {
            continue;
        }
        operation
            .responses
            .responses
            .insert(key, RefOr::T(problem_response(&problems)));
    }
    let links = links_of(operation.operation_id.as_deref().unwrap_or_default());
    for (status, response) in operation.responses.responses.iter_mut() {
        if let RefOr::T(response) = response {
            for (on, name, target, id) in &links {
                if on == status {
                    response.links.insert(
                        (*name).to_owned(),
                        RefOr::T(
                            LinkBuilder::new()
                                .operation_id(*target)
                                .parameter("id", *id)
                                .build(),
                        ),
                    );
                }
            }
            response.headers.insert(
                "X-Request-Id".to_owned(),
                described(
                    Header::new(string()),
                    "The request's id: the client's X-Request-Id if acceptable, else a new one.",
                ),
            );
        }
    }
}

/// What an answer of `operation_id` leads to: (status, link name, operation,
/// where its `id` parameter comes from). Clients and stateful testing
/// (schemathesis) follow these.
fn links_of(operation_id: &str) -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    const ID: &str = "$response.body#/id";
    match operation_id {
        "createCharge" => ["201", "202"]
            .into_iter()
            .flat_map(|status| {
                [
                    (status, "GetCharge", "getCharge", ID),
                    (status, "CreateRefund", "createRefund", ID),
                    (status, "ListRefundsOfCharge", "listRefundsOfCharge", ID),
                ]
            })
            .chain([("402", "GetCharge", "getCharge", "$response.body#/charge_id")])
            .collect(),
        "createRefund" => vec![
            ("201", "GetRefund", "getRefund", ID),
            ("202", "GetRefund", "getRefund", ID),
            ("402", "GetRefund", "getRefund", "$response.body#/refund_id"),
        ],
        "createWebhookEndpoint" => {
            vec![("201", "DeleteWebhookEndpoint", "deleteWebhookEndpoint", ID)]
        }
        _ => Vec::new(),
    }
}

fn string() -> Object {
    ObjectBuilder::new().schema_type(Type::String).build()
}

fn described(mut header: Header, description: &str) -> Header {
    header.description = Some(description.to_owned());
    header
}

/// Every problem `operation` can answer, by status, derived from what it
/// declares: any request can be malformed, too slow or too large in its
/// head, meet a full server or a failure; an API key, a path id, a query, a
/// body and an `Idempotency-Key` each bring their own.
fn problems_of(operation: &Operation) -> BTreeMap<u16, Vec<(&'static str, ApiError)>> {
    let has_parameter = |name: &str, place: ParameterIn| {
        operation.parameters.iter().flatten().any(|parameter| {
            parameter.name.eq_ignore_ascii_case(name) && parameter.parameter_in == place
        })
    };
    let authenticated = operation
        .security
        .as_ref()
        .is_some_and(|requirements| !requirements.is_empty());
    let mut problems: Vec<(&'static str, ApiError)> = vec![
        (
            "malformed_request",
            ApiError::MalformedRequest {
                detail: "the header \"X-Note\" contains a control character".to_owned(),
            },
        ),
        (
            "request_timeout",
            ApiError::RequestTimeout {
                detail: "the request head did not arrive within 5000 ms".to_owned(),
            },
        ),
        (
            "request_header_fields_too_large",
            ApiError::HeaderFieldsTooLarge,
        ),
        ("internal_error", ApiError::Internal("example".into())),
        (
            "service_unavailable",
            ApiError::ServiceUnavailable("example".into()),
        ),
    ];
    if authenticated {
        problems.push(("unauthenticated", ApiError::Unauthenticated));
    }
    if has_parameter("id", ParameterIn::Path) {
        problems.push(("not_found", ApiError::NotFound));
    }
    if has_parameter("limit", ParameterIn::Query) {
        problems.push((
            "invalid_request_query",
            ApiError::invalid(
                "the query is invalid",
                vec![Field::new("limit", "must be an integer from 1 to 100")],
            ),
        ));
    }
    if operation.request_body.is_some() {
        problems.extend([
            (
                "invalid_request",
                ApiError::invalid(
                    "the charge request is invalid",
                    vec![
                        Field::new("amount", "must be greater than 0"),
                        Field::new(
                            "currency",
                            "must be an active ISO 4217 currency code, such as \"USD\"",
                        ),
                    ],
                ),
            ),
            (
                "invalid_request_json",
                ApiError::invalid(
                    "the body is not valid JSON: duplicate member \"amount\"",
                    vec![],
                ),
            ),
            (
                "payload_too_large",
                ApiError::PayloadTooLarge { limit: 65536 },
            ),
            ("unsupported_media_type", ApiError::UnsupportedMediaType),
            (
                "request_timeout_body",
                ApiError::RequestTimeout {
                    detail: "the request body did not arrive within 10000 ms".to_owned(),
                },
            ),
        ]);
    }
    if has_parameter("Idempotency-Key", ParameterIn::Header) {
        problems.extend([
            ("idempotency_key_missing", ApiError::IdempotencyKeyMissing),
            (
                "idempotency_key_invalid",
                ApiError::IdempotencyKeyInvalid(KeyError::BadCharacter),
            ),
            ("idempotency_key_reused", ApiError::IdempotencyKeyReused),
            (
                "idempotency_key_in_use",
                ApiError::IdempotencyKeyInUse {
                    retry_after_secs: 1,
                },
            ),
        ]);
    }
    if operation.operation_id.as_deref() == Some("createRefund") {
        problems.extend([
            (
                "charge_not_refundable",
                ApiError::ChargeNotRefundable { status: "failed" },
            ),
            (
                "refund_exceeds_charge",
                ApiError::RefundExceedsCharge {
                    refundable_amount: 500,
                },
            ),
        ]);
    }
    let mut by_status: BTreeMap<u16, Vec<(&'static str, ApiError)>> = BTreeMap::new();
    for (name, problem) in problems {
        by_status
            .entry(problem.status().as_u16())
            .or_default()
            .push((name, problem));
    }
    by_status
}

/// What a client should do about a problem `code`.
pub fn advice(code: &str) -> &'static str {
    match code {
        "unauthenticated" => "send a valid API key; do not retry as is",
        "idempotency_key_missing" | "idempotency_key_invalid" => {
            "fix the Idempotency-Key header; nothing was processed"
        }
        "idempotency_key_reused" => {
            "a key names one request: send a new request under a new key; do not retry as is"
        }
        "idempotency_key_in_use" => {
            "the first request with this key is still being processed: retry the same \
             request, same key, after Retry-After seconds"
        }
        "invalid_request" => "fix the fields named in `errors`; nothing was processed",
        "not_found" => "no such resource for this merchant; do not retry",
        "charge_not_refundable" | "refund_exceeds_charge" => {
            "nothing was refunded; do not retry as is"
        }
        "method_not_allowed" => "use a method the path has",
        "payload_too_large" | "unsupported_media_type" | "malformed_request" => {
            "fix the request; nothing was processed"
        }
        "request_header_fields_too_large" => "send fewer or shorter headers",
        "request_timeout" => "send the whole request faster; retry with the same key is safe",
        "service_unavailable" => {
            "nothing was processed: retry after Retry-After seconds, with the same \
             Idempotency-Key"
        }
        "internal_error" => "retry with the same Idempotency-Key: the key makes the retry safe",
        _ => "",
    }
}

/// One answer for every problem of one status: a description naming each
/// code, an example of each, and the headers they carry.
fn problem_response(problems: &[(&'static str, ApiError)]) -> Response {
    let mut description = String::from("A problem (RFC 9457):");
    let mut content = ContentBuilder::new().schema(Some(RefOr::Ref(
        utoipa::openapi::Ref::from_schema_name("Problem"),
    )));
    let mut codes = Vec::new();
    for (name, problem) in problems {
        let code = problem.code();
        if !codes.contains(&code) {
            codes.push(code);
            description.push_str(&format!("\n- `{code}`: {}", advice(code)));
        }
        let example: Option<serde_json::Value> = serde_json::from_str(&problem.problem_body()).ok();
        content = content.examples_from_iter([(
            *name,
            ExampleBuilder::new().summary(code).value(example).build(),
        )]);
    }
    let mut response = ResponseBuilder::new()
        .description(description)
        .content(PROBLEM_JSON, content.build());
    if let Some(seconds) = problems.iter().find_map(|(_, p)| p.retry_after()) {
        response = response.header(
            "Retry-After",
            described(
                Header::new(
                    ObjectBuilder::new()
                        .schema_type(Type::Integer)
                        .minimum(Some(1))
                        .build(),
                ),
                &format!("Seconds to wait before retrying (e.g. {seconds})."),
            ),
        );
    }
    if problems
        .iter()
        .any(|(_, p)| matches!(p, ApiError::Unauthenticated))
    {
        response = response.header(
            "WWW-Authenticate",
            described(Header::new(string()), "`Bearer`"),
        );
    }
    response.build()
}

/// The document's schemas: what the service sends and takes, for the
/// document only.
#[allow(dead_code)]
mod schemas {
    use utoipa::openapi::schema::Schema;
    use utoipa::openapi::{Object, ObjectBuilder, RefOr, Type};
    use utoipa::{IntoParams, ToSchema};

    /// The metadata of a charge or refund: up to 50 string values, keys of
    /// 1 to 40 characters, values of up to 500; no NUL characters.
    pub struct Metadata;

    impl utoipa::PartialSchema for Metadata {
        fn schema() -> RefOr<Schema> {
            let text = |min, max| {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(min)
                    .max_length(Some(max))
                    .build()
            };
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(
                    "Up to 50 string values; keys of 1 to 40 characters, values of up to \
                     500; no NUL characters.",
                ))
                .property_names(Some(text(Some(1), 40)))
                .additional_properties(Some(RefOr::T(Schema::Object(text(None, 500)))))
                .max_properties(Some(50))
                .examples([serde_json::json!({"order": "1042"})])
                .into()
        }
    }

    impl ToSchema for Metadata {}

    /// The currency codes a request may name (`crate::domain::Currency`).
    fn currency() -> Object {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(crate::domain::Currency::codes().iter().copied()))
            .examples(["USD"])
            .build()
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Status {
        Pending,
        Succeeded,
        Failed,
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum ChargeObject {
        Charge,
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum RefundObject {
        Refund,
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum ListObject {
        List,
    }

    /// `POST /v1/charges`. Unknown members are refused; `null` is the same as
    /// leaving an optional member out.
    #[derive(ToSchema)]
    #[serde(deny_unknown_fields)]
    #[schema(example = json!({"amount": 1999, "currency": "USD", "customer": "cus_42", "description": "Order 1042", "metadata": {"order": "1042"}}))]
    pub struct ChargeRequest {
        /// In minor units (cents for USD), 1 to 99999999999, written as a
        /// JSON integer: `1999`, not `1999.0` or `1.999e3` (400).
        #[schema(minimum = 1, maximum = 99_999_999_999_i64)]
        pub amount: i64,
        /// An active ISO 4217 code. Lower case is accepted too (`usd` is
        /// `USD`), and answers show it in upper case.
        #[schema(schema_with = currency)]
        pub currency: String,
        /// Up to 255 characters, no NUL.
        #[schema(max_length = 255)]
        pub customer: Option<String>,
        /// Up to 1000 characters, no NUL.
        #[schema(max_length = 1000)]
        pub description: Option<String>,
        #[schema(nullable)]
        pub metadata: Option<Metadata>,
    }

    /// A charge. The answer to its creation (and every replay) shows it as
    /// created, before any refund; reads and events show it as it is.
    #[derive(ToSchema)]
    #[schema(example = json!({"id": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8", "object": "charge", "amount": 1999, "currency": "USD", "status": "succeeded", "customer": "cus_42", "description": "Order 1042", "metadata": {"order": "1042"}, "failure_code": null, "failure_message": null, "amount_refunded": 0, "refunded": false, "created_at": "2026-12-01T06:00:00.123456Z"}))]
    pub struct Charge {
        #[schema(pattern = "^ch_[0-9a-f]{32}$")]
        pub id: String,
        pub object: ChargeObject,
        pub amount: i64,
        #[schema(pattern = "^[A-Z]{3}$")]
        pub currency: String,
        pub status: Status,
        #[schema(required)]
        pub customer: Option<String>,
        #[schema(required)]
        pub description: Option<String>,
        pub metadata: Metadata,
        /// Set when `status` is `failed`: why, in the processor's words.
        #[schema(required)]
        pub failure_code: Option<String>,
        #[schema(required)]
        pub failure_message: Option<String>,
        /// Succeeded refunds, in minor units.
        pub amount_refunded: i64,
        /// Whether `amount_refunded` is all of `amount`.
        pub refunded: bool,
        #[schema(format = DateTime)]
        pub created_at: String,
    }

    /// A page of charges, newest first.
    #[derive(ToSchema)]
    pub struct ChargeList {
        pub object: ListObject,
        pub url: String,
        /// Whether older items follow: ask with `starting_after` = the last id.
        pub has_more: bool,
        pub data: Vec<Charge>,
    }

    /// Why a refund is made.
    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum RefundReason {
        Duplicate,
        Fraudulent,
        RequestedByCustomer,
    }

    /// `POST /v1/charges/{id}/refunds`: every member optional. Without
    /// `amount`, the refund is for what remains refundable of the charge.
    #[derive(ToSchema)]
    #[serde(deny_unknown_fields)]
    #[schema(example = json!({"amount": 500, "reason": "requested_by_customer"}))]
    pub struct RefundRequest {
        /// In minor units, 1 to 99999999999, written as a JSON integer (not
        /// `500.0`); left out or null: all that remains refundable.
        #[schema(minimum = 1, maximum = 99_999_999_999_i64, nullable)]
        pub amount: Option<i64>,
        #[schema(nullable)]
        pub reason: Option<RefundReason>,
        #[schema(nullable)]
        pub metadata: Option<Metadata>,
    }

    #[derive(ToSchema)]
    #[schema(example = json!({"id": "re_0193a5c1e0b37f7aa1e0c2d4b5f6a7b9", "object": "refund", "charge": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8", "amount": 500, "currency": "USD", "status": "succeeded", "reason": "requested_by_customer", "metadata": {}, "failure_code": null, "failure_message": null, "created_at": "2026-12-01T06:01:00.000001Z"}))]
    pub struct Refund {
        #[schema(pattern = "^re_[0-9a-f]{32}$")]
        pub id: String,
        pub object: RefundObject,
        /// The refunded charge's id.
        #[schema(pattern = "^ch_[0-9a-f]{32}$")]
        pub charge: String,
        pub amount: i64,
        #[schema(pattern = "^[A-Z]{3}$")]
        pub currency: String,
        pub status: Status,
        #[schema(required)]
        pub reason: Option<RefundReason>,
        pub metadata: Metadata,
        #[schema(required)]
        pub failure_code: Option<String>,
        #[schema(required)]
        pub failure_message: Option<String>,
        #[schema(format = DateTime)]
        pub created_at: String,
    }

    #[derive(ToSchema)]
    pub struct RefundList {
        pub object: ListObject,
        pub url: String,
        pub has_more: bool,
        pub data: Vec<Refund>,
    }

    /// One field's problem in an `invalid_request` answer. `field` is a
    /// member name, a path such as `metadata.k` or `event_types[1]`, or ""
    /// for the body as a whole.
    #[derive(ToSchema)]
    pub struct FieldError {
        pub field: String,
        pub message: String,
    }

    /// A problem document (RFC 9457, `application/problem+json`). `code` is
    /// stable and what to act on; `detail` is for people.
    #[derive(ToSchema)]
    #[schema(example = json!({"type": "urn:chargeonce:problem:idempotency_key_missing", "title": "Idempotency-Key missing", "status": 400, "detail": "the Idempotency-Key header is required on this request", "code": "idempotency_key_missing"}))]
    pub struct Problem {
        /// `urn:chargeonce:problem:<code>`.
        #[serde(rename = "type")]
        pub kind: String,
        pub title: String,
        pub status: u16,
        pub detail: String,
        pub code: String,
        /// `invalid_request` only: every offending field.
        #[schema(nullable = false)]
        pub errors: Option<Vec<FieldError>>,
        /// `refund_exceeds_charge` only: what can still be refunded.
        #[schema(nullable = false)]
        pub refundable_amount: Option<i64>,
    }

    /// `402`: the charge was declined. A problem document carrying the
    /// charge, which exists (status `failed`) and is what every replay of the
    /// request answers.
    #[derive(ToSchema)]
    #[schema(example = json!({"type": "urn:chargeonce:problem:card_declined", "title": "Payment declined", "status": 402, "detail": "The card was declined.", "code": "card_declined", "charge_id": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8", "charge": {"id": "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8", "object": "charge", "amount": 1999, "currency": "USD", "status": "failed", "customer": null, "description": null, "metadata": {}, "failure_code": "card_declined", "failure_message": "The card was declined.", "amount_refunded": 0, "refunded": false, "created_at": "2026-12-01T06:00:00.123456Z"}}))]
    pub struct ChargeDeclined {
        #[serde(rename = "type")]
        pub kind: String,
        pub title: String,
        pub status: u16,
        pub detail: String,
        /// The processor's decline code (`declined` if it gave none).
        pub code: String,
        #[schema(pattern = "^ch_[0-9a-f]{32}$")]
        pub charge_id: String,
        pub charge: Charge,
    }

    /// `402`: the refund was declined; the refund exists (status `failed`).
    #[derive(ToSchema)]
    pub struct RefundDeclined {
        #[serde(rename = "type")]
        pub kind: String,
        pub title: String,
        pub status: u16,
        pub detail: String,
        pub code: String,
        #[schema(pattern = "^re_[0-9a-f]{32}$")]
        pub refund_id: String,
        pub refund: Refund,
    }

    #[derive(ToSchema)]
    pub enum EventType {
        #[serde(rename = "charge.pending")]
        ChargePending,
        #[serde(rename = "charge.succeeded")]
        ChargeSucceeded,
        #[serde(rename = "charge.failed")]
        ChargeFailed,
        #[serde(rename = "refund.pending")]
        RefundPending,
        #[serde(rename = "refund.succeeded")]
        RefundSucceeded,
        #[serde(rename = "refund.failed")]
        RefundFailed,
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum EventObject {
        Event,
    }

    /// The charge or refund as the change left it.
    #[derive(ToSchema)]
    #[serde(untagged)]
    pub enum EventSubject {
        Charge(Charge),
        Refund(Refund),
    }

    #[derive(ToSchema)]
    pub struct EventData {
        pub object: EventSubject,
    }

    /// A state change of a charge or refund; byte for byte the body of its
    /// webhook deliveries.
    #[derive(ToSchema)]
    pub struct Event {
        #[schema(pattern = "^evt_[0-9a-f]{32}$")]
        pub id: String,
        pub object: EventObject,
        #[serde(rename = "type")]
        pub kind: EventType,
        #[schema(format = DateTime)]
        pub created_at: String,
        pub data: EventData,
    }

    #[derive(ToSchema)]
    pub struct EventList {
        pub object: ListObject,
        pub url: String,
        pub has_more: bool,
        pub data: Vec<Event>,
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum DeliveryObject {
        WebhookDelivery,
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum DeliveryStatus {
        Pending,
        Delivered,
        Failed,
    }

    #[derive(ToSchema)]
    pub struct DeliveryAttempt {
        pub attempt: i32,
        /// The endpoint's HTTP status; null if none came.
        #[schema(required)]
        pub status_code: Option<i32>,
        #[schema(required)]
        pub error: Option<String>,
        pub duration_ms: i32,
        #[schema(format = DateTime)]
        pub created_at: String,
    }

    /// The delivery of one event to one endpoint, with its attempts.
    #[derive(ToSchema)]
    pub struct Delivery {
        pub object: DeliveryObject,
        #[schema(pattern = "^evt_[0-9a-f]{32}$")]
        pub event: String,
        #[schema(pattern = "^we_[0-9a-f]{32}$")]
        pub endpoint: String,
        pub url: String,
        pub status: DeliveryStatus,
        pub attempts: i32,
        /// While pending: when the next attempt is due.
        #[schema(required, format = DateTime)]
        pub next_attempt_at: Option<String>,
        #[schema(required)]
        pub last_status_code: Option<i32>,
        #[schema(required)]
        pub last_error: Option<String>,
        #[schema(format = DateTime)]
        pub created_at: String,
        #[schema(format = DateTime)]
        pub updated_at: String,
        pub attempt_log: Vec<DeliveryAttempt>,
    }

    /// Every delivery of an event (one per endpoint; `has_more` is false).
    #[derive(ToSchema)]
    pub struct DeliveryList {
        pub object: ListObject,
        pub url: String,
        pub has_more: bool,
        pub data: Vec<Delivery>,
    }

    #[derive(ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum WebhookEndpointObject {
        WebhookEndpoint,
    }

    /// `POST /v1/webhook_endpoints`.
    #[derive(ToSchema)]
    #[serde(deny_unknown_fields)]
    #[schema(example = json!({"url": "https://example.com/webhooks", "event_types": ["charge.succeeded", "charge.failed"]}))]
    pub struct WebhookEndpointRequest {
        /// An absolute http:// or https:// URL naming a host, at most 2048
        /// characters once normalised. Private addresses may be refused
        /// (webhooks.allow_private_targets).
        #[schema(
            max_length = 2048,
            pattern = "^[Hh][Tt][Tt][Pp][Ss]?://[A-Za-z0-9.-]+(:[1-9][0-9]{0,3})?(/[!-~]*)?$",
            example = "https://example.com/webhooks"
        )]
        pub url: String,
        /// The event types to send; left out or null: every type.
        #[schema(nullable, min_items = 1)]
        pub event_types: Option<Vec<EventType>>,
    }

    /// The answer to an endpoint's creation: the only time its signing
    /// secret is shown (replays show it again).
    #[derive(ToSchema)]
    pub struct WebhookEndpointCreated {
        #[schema(pattern = "^we_[0-9a-f]{32}$")]
        pub id: String,
        pub object: WebhookEndpointObject,
        pub url: String,
        /// null: every type.
        #[schema(required)]
        pub event_types: Option<Vec<EventType>>,
        /// `whsec_` and the base64 of 32 bytes (Standard Webhooks).
        #[schema(pattern = "^whsec_[A-Za-z0-9+/=]+$")]
        pub secret: String,
        pub enabled: bool,
        #[schema(format = DateTime)]
        pub created_at: String,
    }

    /// An endpoint as lists show it (no secret).
    #[derive(ToSchema)]
    pub struct WebhookEndpoint {
        #[schema(pattern = "^we_[0-9a-f]{32}$")]
        pub id: String,
        pub object: WebhookEndpointObject,
        pub url: String,
        #[schema(required)]
        pub event_types: Option<Vec<EventType>>,
        pub enabled: bool,
        #[schema(format = DateTime)]
        pub created_at: String,
    }

    #[derive(ToSchema)]
    pub struct WebhookEndpointList {
        pub object: ListObject,
        pub url: String,
        pub has_more: bool,
        pub data: Vec<WebhookEndpoint>,
    }

    /// The deleted endpoint: `enabled` false, `deleted` true, no secret.
    #[derive(ToSchema)]
    pub struct DeletedWebhookEndpoint {
        #[schema(pattern = "^we_[0-9a-f]{32}$")]
        pub id: String,
        pub object: WebhookEndpointObject,
        pub url: String,
        #[schema(required)]
        pub event_types: Option<Vec<EventType>>,
        pub enabled: bool,
        #[schema(format = DateTime)]
        pub created_at: String,
        pub deleted: bool,
    }

    #[derive(ToSchema)]
    #[schema(example = json!({"status": "ok"}))]
    pub struct Health {
        pub status: String,
    }

    /// Ready: the database answers and carries every migration this binary
    /// knows (`migration`, the latest).
    #[derive(ToSchema)]
    #[schema(example = json!({"status": "ready", "migration": 9}))]
    pub struct Readiness {
        pub status: String,
        pub migration: i64,
    }

    /// An OpenAPI 3.1 document.
    #[derive(ToSchema)]
    pub struct OpenApiDocument {
        #[schema(example = "3.1.0")]
        pub openapi: String,
        #[schema(value_type = Object)]
        pub info: serde_json::Value,
        #[schema(value_type = Object)]
        pub paths: serde_json::Value,
    }

    /// The query of a list of charges: a page of `limit`, newest first,
    /// after the charge `starting_after` if given. Any other parameter is
    /// refused (400).
    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct ChargePage {
        /// 1 to 100, default 10.
        #[param(minimum = 1, maximum = 100)]
        pub limit: Option<i64>,
        /// The id of the last charge of the previous page.
        #[param(pattern = "^ch_[0-9a-f]{32}$")]
        pub starting_after: Option<String>,
    }

    /// The query of a list of refunds (as for charges).
    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct RefundPage {
        /// 1 to 100, default 10.
        #[param(minimum = 1, maximum = 100)]
        pub limit: Option<i64>,
        /// The id of the last refund of the previous page.
        #[param(pattern = "^re_[0-9a-f]{32}$")]
        pub starting_after: Option<String>,
    }

    /// The query of a list of webhook endpoints (as for charges; a parameter
    /// given twice is refused too).
    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct WebhookEndpointPage {
        /// 1 to 100, default 10.
        #[param(minimum = 1, maximum = 100)]
        pub limit: Option<i64>,
        /// The id of the last endpoint of the previous page.
        #[param(pattern = "^we_[0-9a-f]{32}$")]
        pub starting_after: Option<String>,
    }

    /// `GET /v1/events`: a page, optionally of one event type.
    #[derive(IntoParams)]
    #[into_params(parameter_in = Query)]
    pub struct EventQuery {
        /// 1 to 100, default 10.
        #[param(minimum = 1, maximum = 100)]
        pub limit: Option<i64>,
        /// The id of the last event of the previous page.
        #[param(pattern = "^evt_[0-9a-f]{32}$")]
        pub starting_after: Option<String>,
        /// Only events of this type.
        #[param(rename = "type", inline)]
        pub kind: Option<EventType>,
    }
}
