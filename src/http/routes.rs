//! Every route the service serves, registered from the handlers' own
//! `#[utoipa::path]` annotations: a route's method and path template are
//! those of its documentation, and the OpenAPI document (`super::openapi`)
//! is built from this same list. So a handler cannot be served without being
//! documented, nor documented without being served. Nothing else in `src/`
//! registers a route; tests/api/openapi.rs checks that, and probes every
//! documented operation on a running service. This is the only module that
//! knows every handler; the handlers and `openapi` know none of it.

use actix_web::http::Method;
use actix_web::{web, FromRequest, Handler, HttpResponse, Responder, Route};
use utoipa::openapi::path::{HttpMethod, Paths};

use crate::error::ApiError;

use super::{charges, demo, events, health, metrics, openapi, refunds, webhook_endpoints};

/// The optional parts of the API, as the settings turn them on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// `/demo`, `/demo/chargeonce.js`, `POST /demo/charges` (`demo.enabled`).
    pub demo: bool,
    /// `GET /metrics` on the API's port (`metrics.enabled`, no `metrics.port`).
    pub metrics: bool,
}

/// Resources (a path template and its methods) and their documentation.
pub struct Routes {
    resources: Vec<(String, Vec<(Method, Route)>)>,
    paths: Paths,
}

impl Routes {
    fn new() -> Self {
        Self {
            resources: Vec::new(),
            paths: Paths::new(),
        }
    }

    /// Serves `handler` at the method(s) and path of `P`, its
    /// `#[utoipa::path]`, and documents it with `P`'s operation.
    fn add<P, F, Args>(&mut self, handler: F) -> &mut Self
    where
        P: utoipa::Path,
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        let path = P::path();
        let methods = P::methods();
        let index = match self.resources.iter().position(|(known, _)| *known == path) {
            Some(index) => index,
            None => {
                self.resources.push((path.clone(), Vec::new()));
                self.resources.len() - 1
            }
        };
        for method in &methods {
            let method = actix_method(method);
            self.resources[index]
                .1
                .push((method.clone(), web::method(method).to(handler.clone())));
        }
        self.paths
            .add_path_operation(&path, methods, P::operation());
        self
    }

    /// Every (method, path template) served, in registration order.
    pub fn table(&self) -> Vec<(Method, String)> {
        self.resources
            .iter()
            .flat_map(|(path, routes)| {
                routes
                    .iter()
                    .map(move |(method, _)| (method.clone(), path.clone()))
            })
            .collect()
    }

    /// The documentation of every route.
    pub fn into_paths(self) -> Paths {
        self.paths
    }

    /// Registers every resource; any other method on its path is 405, with
    /// `Allow` naming the path's methods.
    pub fn register(self, cfg: &mut web::ServiceConfig) {
        for (path, routes) in self.resources {
            let allow = routes
                .iter()
                .map(|(method, _)| method.as_str())
                .collect::<Vec<_>>()
                .join(", ");
            let method_not_allowed = move || {
                let allow = allow.clone();
                async move { Err::<HttpResponse, _>(ApiError::MethodNotAllowed { allow }) }
            };
            let resource = routes
                .into_iter()
                .fold(web::resource(path), |resource, (_, route)| {
                    resource.route(route)
                });
            cfg.service(resource.default_service(web::to(method_not_allowed)));
        }
    }
}

fn actix_method(method: &HttpMethod) -> Method {
    match method {
        HttpMethod::Get => Method::GET,
        HttpMethod::Post => Method::POST,
        HttpMethod::Put => Method::PUT,
        HttpMethod::Delete => Method::DELETE,
        HttpMethod::Options => Method::OPTIONS,
        HttpMethod::Head => Method::HEAD,
        HttpMethod::Patch => Method::PATCH,
        HttpMethod::Trace => Method::TRACE,
    }
}

/// The routes of the API's port.
pub fn api(served: Served) -> Routes {
    let mut routes = Routes::new();
    routes
        .add::<charges::__path_create, _, _>(charges::create)
        .add::<charges::__path_list, _, _>(charges::list)
        .add::<charges::__path_get, _, _>(charges::get)
        .add::<refunds::__path_create, _, _>(refunds::create)
        .add::<refunds::__path_list_of_charge, _, _>(refunds::list_of_charge)
        .add::<refunds::__path_list, _, _>(refunds::list)
        .add::<refunds::__path_get, _, _>(refunds::get)
        .add::<events::__path_list, _, _>(events::list)
        .add::<events::__path_get, _, _>(events::get)
        .add::<events::__path_deliveries, _, _>(events::deliveries)
        .add::<webhook_endpoints::__path_create, _, _>(webhook_endpoints::create)
        .add::<webhook_endpoints::__path_list, _, _>(webhook_endpoints::list)
        .add::<webhook_endpoints::__path_delete, _, _>(webhook_endpoints::delete)
        .add::<health::__path_healthz, _, _>(health::healthz)
        .add::<health::__path_readyz, _, _>(health::readyz)
        .add::<openapi::__path_serve_document, _, _>(openapi::serve_document);
    if served.metrics {
        routes.add::<metrics::__path_scrape, _, _>(metrics::scrape);
    }
    if served.demo {
        routes
            .add::<demo::__path_page, _, _>(demo::page)
            .add::<demo::__path_module, _, _>(demo::module)
            .add::<demo::__path_create_charge, _, _>(demo::create_charge)
            .add::<demo::__path_lookup_charge, _, _>(demo::lookup_charge);
    }
    routes
}

/// The OpenAPI document of the routes `served` as JSON.
pub fn document(served: Served) -> Result<serde_json::Value, serde_json::Error> {
    openapi::rendered(api(served).into_paths())
}

/// Built here rather than in `openapi`, which would otherwise have to know
/// every handler.
impl openapi::Rendered {
    pub fn new(served: Served) -> Result<Self, serde_json::Error> {
        serde_json::to_string(&document(served)?).map(Self)
    }
}

/// The routes of `metrics.port`'s own server.
pub fn metrics_port() -> Routes {
    let mut routes = Routes::new();
    routes.add::<metrics::__path_scrape, _, _>(metrics::scrape);
    routes
}
