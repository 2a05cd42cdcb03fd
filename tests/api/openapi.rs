//! `GET /openapi.json` against what the service really serves.
//!
//! Routes are registered from the handlers' `#[utoipa::path]` annotations
//! (src/http/routes.rs), and the document is built from the same list. These
//! tests fail when that stops being true:
//!
//! - a route registered anywhere else in `src/` (a `.route(...)` or
//!   `web::resource(...)` outside routes.rs) fails
//!   `nothing_registers_routes_but_the_documented_table`;
//! - every route of the registration table must be in the served document,
//!   and every documented (method, path) must reach a handler of the running
//!   service (not the default 404, not a 405), while every other method on a
//!   documented path must be refused with 405 (`..._are_served`);
//! - every problem code of `ApiError` must be documented with an example.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use chargeonce::http::routes::{self, Served};
use reqwest::Method;
use serde_json::Value;

use crate::helpers::{spawn_app_with, Reply, TestApp};

/// Everything on: the demo and `/metrics` on the API's port.
const ALL: Served = Served {
    demo: true,
    metrics: true,
};

async fn spawn_full_app() -> TestApp {
    spawn_app_with(|settings| {
        settings.demo.enabled = true;
        settings.metrics.enabled = true;
        settings.metrics.port = 0;
    })
    .await
}

async fn send(app: &TestApp, method: Method, path: &str, authenticated: bool) -> Reply {
    let mut request = app
        .http
        .request(method, format!("{}{path}", app.address))
        .header("Content-Type", "application/json")
        .header(
            "Idempotency-Key",
            format!("openapi-{}", uuid::Uuid::new_v4()),
        )
        .body("{}");
    if authenticated {
        request = request.bearer_auth(&app.api_key);
    }
    let response = request.send().await.expect("request sent");
    Reply {
        status: response.status(),
        headers: response.headers().clone(),
        body: response.text().await.expect("body"),
    }
}

async fn served_document(app: &TestApp) -> Value {
    // No API key: the document is public.
    let reply = app
        .http
        .get(format!("{}/openapi.json", app.address))
        .send()
        .await
        .expect("request sent");
    assert_eq!(reply.status(), 200);
    assert_eq!(
        reply
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    reply.json().await.expect("JSON")
}

/// (method, path template) of every operation of `document`.
fn operations(document: &Value) -> BTreeSet<(String, String)> {
    let mut found = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if [
                "get", "put", "post", "delete", "patch", "head", "options", "trace",
            ]
            .contains(&method.as_str())
            {
                found.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    found
}

fn table(served: Served) -> BTreeSet<(String, String)> {
    routes::api(served)
        .table()
        .into_iter()
        .map(|(method, path)| (method.as_str().to_owned(), path))
        .collect()
}

/// A concrete path for a template: an id of the right shape that names
/// nothing, so the handler itself answers (404 `not_found` from a handler
/// is fine; what is checked is that the route exists).
fn concrete(template: &str) -> String {
    template.replace("{id}", "ch_00000000000000000000000000000000")
}

#[tokio::test]
async fn every_route_is_documented_and_every_documented_route_is_served() {
    let app = spawn_full_app().await;
    let document = served_document(&app).await;
    assert_eq!(document["openapi"], "3.1.0");

    // The registration table of the running app and the document agree.
    let documented = operations(&document);
    assert_eq!(documented, table(ALL), "registered routes vs /openapi.json");
    assert_eq!(
        routes::document(ALL).ok(),
        Some(document.clone()),
        "the served document is rendered(served)"
    );

    // Every documented operation reaches a handler: never the default
    // service's 404 for unknown paths (its detail names no resource), never
    // the 405 of a resource that lacks the method.
    let unknown = send(&app, Method::GET, "/no/such/path", true).await;
    unknown.assert_problem(404, "not_found");
    for (method, template) in &documented {
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let path = concrete(template);
        let reply = send(&app, method.clone(), &path, true).await;
        assert_ne!(
            reply.status, 405,
            "{method} {template} is documented but not served: {}",
            reply.body
        );
        if !template.contains('{') {
            assert_ne!(
                reply.status, 404,
                "{method} {template} is documented but not served: {}",
                reply.body
            );
        }
        assert!(
            reply.header("x-request-id").is_some(),
            "{method} {template}: no X-Request-Id"
        );
        let content_type = reply.header("content-type").unwrap_or_default().to_owned();
        let declared = &document["paths"][template][method.as_str().to_lowercase()]["responses"]
            [reply.status.as_str()];
        assert!(
            declared.is_object(),
            "{method} {template} answered {}, which the document does not list: {}",
            reply.status,
            reply.body
        );
        let media = content_type.split(';').next().unwrap_or_default().trim();
        assert!(
            declared["content"]
                .as_object()
                .is_some_and(|content| content.keys().any(|k| k.starts_with(media))),
            "{method} {template} answered {} as {content_type}, not as documented",
            reply.status
        );
    }

    // Every other method on a documented path is refused by the resource
    // (405), so the path is registered with exactly the documented methods.
    let paths: BTreeSet<&String> = documented.iter().map(|(_, path)| path).collect();
    for template in paths {
        for method in [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ] {
            if documented.contains(&(method.as_str().to_owned(), template.clone())) {
                continue;
            }
            let reply = send(&app, method.clone(), &concrete(template), true).await;
            assert_eq!(
                reply.status, 405,
                "{method} {template} is served but not documented: {}",
                reply.body
            );
            reply.assert_problem(405, "method_not_allowed");
            // RFC 9110: a 405 names the methods the path takes.
            let allowed: BTreeSet<String> = documented
                .iter()
                .filter(|(_, path)| path == template)
                .map(|(method, _)| method.clone())
                .collect();
            assert_eq!(allow_header(&reply), allowed, "{method} {template}: Allow");
        }
    }
}

fn allow_header(reply: &Reply) -> BTreeSet<String> {
    reply
        .header("allow")
        .unwrap_or_default()
        .split(',')
        .map(|method| method.trim().to_owned())
        .filter(|method| !method.is_empty())
        .collect()
}

/// Found by contract fuzzing (schemathesis' unsupported_method check): a
/// 405 came without the `Allow` header RFC 9110 requires of it.
#[tokio::test]
async fn a_405_names_the_methods_of_the_path_in_allow() {
    let app = crate::helpers::spawn_app().await;
    for (method, path, allowed) in [
        (Method::PUT, "/v1/charges", vec!["GET", "POST"]),
        (Method::TRACE, "/healthz", vec!["GET"]),
        (
            Method::PATCH,
            "/v1/webhook_endpoints/we_00000000000000000000000000000000",
            vec!["DELETE"],
        ),
    ] {
        let reply = send(&app, method.clone(), path, true).await;
        reply.assert_problem(405, "method_not_allowed");
        let expected: BTreeSet<String> = allowed.iter().map(|m| (*m).to_owned()).collect();
        assert_eq!(allow_header(&reply), expected, "{method} {path}");
    }
}

#[tokio::test]
async fn optional_routes_are_documented_only_when_served() {
    // Test settings leave the demo off; metrics are on by default.
    let app = spawn_app_with(|settings| settings.metrics.enabled = false).await;
    let document = served_document(&app).await;
    let documented = operations(&document);
    let served = Served {
        demo: false,
        metrics: false,
    };
    assert_eq!(documented, table(served));
    for path in ["/demo", "/demo/charges", "/metrics"] {
        assert!(documented.iter().all(|(_, p)| p != path), "{path}");
        send(&app, Method::GET, path, true)
            .await
            .assert_problem(404, "not_found");
    }
}

/// Every source file of the service, except the payment processor
/// simulator (`chargeonce psp-sim`, a server of its own documented in
/// docs/processor-protocol.md).
fn service_sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&root, &mut files);
    files
        .into_iter()
        .filter(|path| !path.ends_with("processor/simulator.rs"))
        .collect()
}

#[test]
fn nothing_registers_routes_but_the_documented_table() {
    // What registers a route or a resource with actix-web.
    let registering = [
        ".route(",
        "web::resource(",
        "web::scope(",
        ".service(",
        "web::method(",
        "web::get()",
        "web::post()",
        "web::put()",
        "web::patch()",
        "web::delete()",
        "#[get(",
        "#[post(",
        "#[put(",
        "#[patch(",
        "#[delete(",
        "#[route(",
    ];
    let mut offending = Vec::new();
    for file in service_sources() {
        if file.ends_with("http/routes.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read");
        for (number, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            if let Some(call) = registering.iter().find(|call| line.contains(*call)) {
                offending.push(format!("{}:{}: {call}", file.display(), number + 1));
            }
        }
    }
    assert!(
        offending.is_empty(),
        "routes must be registered in src/http/routes.rs, from a #[utoipa::path], so \
         /openapi.json documents them:\n{}",
        offending.join("\n")
    );
}

#[test]
fn every_problem_code_is_documented_with_an_example() {
    let document = routes::document(ALL).expect("renders");
    let mut documented = BTreeSet::new();
    for item in document["paths"].as_object().expect("paths").values() {
        for operation in item.as_object().expect("item").values() {
            for (status, response) in operation["responses"].as_object().expect("responses") {
                let Some(examples) =
                    response["content"]["application/problem+json"]["examples"].as_object()
                else {
                    continue;
                };
                for example in examples.values() {
                    let value = &example["value"];
                    assert_eq!(value["status"].to_string(), *status, "{value}");
                    documented.insert(value["code"].as_str().expect("code").to_owned());
                }
            }
        }
    }
    // Every code of src/error.rs's table but method_not_allowed, which no
    // operation answers (it is what a path says to a method it lacks).
    let codes = [
        "unauthenticated",
        "idempotency_key_missing",
        "idempotency_key_invalid",
        "idempotency_key_reused",
        "idempotency_key_expired",
        "idempotency_key_in_use",
        "invalid_request",
        "not_found",
        "charge_not_refundable",
        "refund_exceeds_charge",
        "webhook_endpoint_deleted",
        "payload_too_large",
        "unsupported_media_type",
        "request_timeout",
        "service_unavailable",
        "internal_error",
    ];
    let expected: BTreeSet<String> = codes.iter().map(|c| (*c).to_owned()).collect();
    assert_eq!(documented, expected);
}

#[test]
fn operations_declare_their_auth_and_headers() {
    let document = routes::document(ALL).expect("renders");
    let public = [
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/demo",
        "/demo/chargeonce.js",
        "/demo/charges",
    ];
    let operation_ids: BTreeSet<&str> = document["paths"]
        .as_object()
        .expect("paths")
        .values()
        .flat_map(|item| item.as_object().expect("item").values())
        .filter_map(|operation| operation["operationId"].as_str())
        .collect();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("item") {
            let secured = operation["security"]
                .as_array()
                .is_some_and(|s| s.iter().any(|r| r.get("bearerAuth").is_some()));
            assert_eq!(secured, !public.contains(&path.as_str()), "{method} {path}");
            for (status, response) in operation["responses"].as_object().expect("responses") {
                assert!(
                    response["headers"]["X-Request-Id"].is_object(),
                    "{method} {path} {status}: X-Request-Id"
                );
                if status == "409" || status == "503" {
                    assert!(
                        response["headers"]["Retry-After"].is_object(),
                        "{method} {path} {status}: Retry-After"
                    );
                }
                // A recorded answer to a keyed request can be a replay.
                if method == "post" && (status.starts_with('2') || status == "402") {
                    assert!(
                        response["headers"]["Idempotent-Replayed"].is_object(),
                        "{method} {path} {status}: Idempotent-Replayed"
                    );
                }
            }
            // Links name operations that exist (stateful testing and
            // clients follow them).
            for response in operation["responses"]
                .as_object()
                .expect("responses")
                .values()
            {
                for link in response["links"].as_object().into_iter().flatten() {
                    let target = link.1["operationId"].as_str().expect("operationId");
                    assert!(operation_ids.contains(target), "{method} {path}: {target}");
                }
            }
            let idempotent = method == "post";
            let has_key = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["name"] == "Idempotency-Key" && p["in"] == "header");
            assert_eq!(has_key, idempotent, "{method} {path}: Idempotency-Key");
        }
    }
}
