//! `GET /openapi.json`: the OpenAPI 3.1 document of the API, generated from
//! the code. Each handler carries its `#[utoipa::path]` (method, path,
//! parameters, request body, success answers); `super::routes` serves the
//! handlers at exactly those methods and paths and hands their operations
//! to `document`. The schemas are those of the types the service writes
//! (`chargeonce_api`). Here the operations are completed with what every one
//! of them shares, derived from what they declare: the problem answers (from
//! `ApiError` itself, each code with an example rendered by the same code
//! that renders the real answer), `X-Request-Id`, `Retry-After`,
//! `WWW-Authenticate`. tests/api/openapi.rs and `scripts/contract-fuzz`
//! check that real answers conform to the document.

use std::collections::BTreeMap;

use actix_web::{web, HttpResponse};
use chargeonce_api as api;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::header::Header;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterBuilder, ParameterIn, Paths};
use utoipa::openapi::schema::Schema;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{
    ContentBuilder, Object, ObjectBuilder, OpenApi as Document, RefOr, Required, Response,
    ResponseBuilder, Type,
};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::domain::{Currency, FieldError as Field, KeyError};
use crate::error::{ApiError, PROBLEM_JSON};

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
        api::NewCharge,
        api::Charge,
        api::ChargeDeclined,
        api::NewRefund,
        api::Refund,
        api::RefundDeclined,
        api::Event,
        api::NewWebhookEndpoint,
        api::WebhookEndpoint,
        api::Problem,
        OpenApiDocument,
    )),
    modifiers(&BearerAuth, &Lists, &Currencies),
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

/// The lists: generic types, which `components(schemas(...))` does not take.
struct Lists;

impl Modify for Lists {
    fn modify(&self, openapi: &mut Document) {
        fn add<T: ToSchema>(openapi: &mut Document) {
            let mut schemas = vec![(T::name().into_owned(), T::schema())];
            T::schemas(&mut schemas);
            let components = openapi.components.get_or_insert_with(Default::default);
            components.schemas.extend(schemas);
        }
        add::<api::List<api::Charge>>(openapi);
        add::<api::List<api::Refund>>(openapi);
        add::<api::List<api::Event>>(openapi);
        add::<api::List<api::Delivery>>(openapi);
        add::<api::List<api::WebhookEndpoint>>(openapi);
    }
}

/// A charge request's `currency` is one of the codes the service knows
/// (`crate::domain::Currency`), which the wire type cannot name.
struct Currencies;

impl Modify for Currencies {
    fn modify(&self, openapi: &mut Document) {
        let request = openapi
            .components
            .as_mut()
            .and_then(|components| components.schemas.get_mut(api::NewCharge::name().as_ref()));
        if let Some(RefOr::T(Schema::Object(request))) = request {
            let codes = ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(Currency::codes().iter().copied()))
                .examples(["USD"]);
            request
                .properties
                .insert("currency".to_owned(), codes.into());
        }
    }
}

/// The answer of `GET /openapi.json`.
#[derive(ToSchema)]
#[allow(dead_code)]
struct OpenApiDocument {
    #[schema(example = "3.1.0")]
    openapi: String,
    #[schema(value_type = Object)]
    info: serde_json::Value,
    #[schema(value_type = Object)]
    paths: serde_json::Value,
}

/// The document of the API whose operations are `paths`
/// (`super::routes::api`).
pub fn document(paths: Paths) -> Document {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.paths = paths;
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

/// `document(paths)` as JSON, what `GET /openapi.json` answers (built by
/// `Rendered::new` in `super::routes`, which knows the paths).
pub struct Rendered(pub String);

/// `document(paths)` as JSON. utoipa 5.5 writes a link's target as
/// `operation_id` (its `Link` lacks the camel-case renaming its other types
/// have); OpenAPI's name for it, which tools look for, is `operationId`.
pub fn rendered(paths: Paths) -> Result<serde_json::Value, serde_json::Error> {
    let mut value = serde_json::to_value(document(paths))?;
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
    let operation_id = operation.operation_id.clone().unwrap_or_default();
    let links = links_of(&operation_id);
    let key_window = KEYS_WITH_A_WINDOW.contains(&operation_id.as_str());
    for (status, response) in operation.responses.responses.iter_mut() {
        if let RefOr::T(response) = response {
            if key_window && ["201", "202", "402", "422"].contains(&status.as_str()) {
                response.headers.insert(
                    "Idempotency-Key-Expires".to_owned(),
                    described(
                        Header::new(string()),
                        "When the replay window of this request's Idempotency-Key ends, as an \
                         HTTP date (`Sat, 05 Dec 2026 06:00:00 GMT`): the first answer and every \
                         replay carry the same. After it, the key answers 422 \
                         `idempotency_key_expired` (which carries this header too) until it is \
                         released. Not on a 422 `idempotency_key_reused`.",
                    ),
                );
            }
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

/// The creations whose keys have a replay window (`idempotency.retention_hours`):
/// their answers say when it ends. (A webhook endpoint's key lasts as long as
/// the endpoint.)
const KEYS_WITH_A_WINDOW: [&str; 3] = ["createCharge", "createRefund", "createDemoCharge"];

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
/// declares: any request can meet a full server or a failure; an API key,
/// a path id, a query, a body (which can also be too slow) and an
/// `Idempotency-Key` each bring their own. A head the HTTP layer cannot
/// parse gets actix-http's own bare answer, which is no problem document.
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
                "request_timeout",
                ApiError::RequestTimeout {
                    detail: "the request body did not arrive within 10000 ms".to_owned(),
                },
            ),
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
            (
                "idempotency_key_reused",
                ApiError::IdempotencyKeyReused {
                    differing_fields: Some(vec!["amount".to_owned(), "metadata.order".to_owned()]),
                },
            ),
            (
                "idempotency_key_in_use",
                ApiError::IdempotencyKeyInUse {
                    retry_after_secs: 1,
                },
            ),
        ]);
    }
    let operation_id = operation.operation_id.as_deref().unwrap_or_default();
    if KEYS_WITH_A_WINDOW.contains(&operation_id) {
        problems.push((
            "idempotency_key_expired",
            ApiError::IdempotencyKeyExpired {
                object: "ch_0193a5c1e0b37f7aa1e0c2d4b5f6a7b8".to_owned(),
                window_ended: chrono::DateTime::from_timestamp(1_764_655_200, 0)
                    .unwrap_or_default(),
            },
        ));
    }
    if has_parameter("idempotency_key", ParameterIn::Query) {
        problems.push((
            "idempotency_key_invalid",
            ApiError::IdempotencyKeyInvalid(KeyError::BadCharacter),
        ));
    }
    if operation.operation_id.as_deref() == Some("createWebhookEndpoint") {
        problems.extend([
            (
                "invalid_request_endpoints_cap",
                ApiError::invalid(
                    "this merchant already has 16 webhook endpoints, the most it may have \
                     (webhooks.max_endpoints_per_merchant): delete one to create another",
                    vec![],
                ),
            ),
            (
                "webhook_endpoint_deleted",
                ApiError::WebhookEndpointDeleted {
                    id: "we_0193a5c1e0b37f7aa1e0c2d4b5f6a7c1".to_owned(),
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
            "a key names one request: send a new request under a new key; do not retry as is \
             (`differing_fields` names what differs)"
        }
        "idempotency_key_expired" => {
            "the key's replay window has ended: nothing was processed; GET the object the \
             detail names, and send a new request under a new key; do not retry"
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
        "webhook_endpoint_deleted" => {
            "the endpoint this key created was deleted: create a new one with a new key"
        }
        "method_not_allowed" => "use a method the path has",
        "payload_too_large" | "unsupported_media_type" => "fix the request; nothing was processed",
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
