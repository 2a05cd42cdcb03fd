//! A payment processor under the test's control: it speaks the processor
//! protocol (docs/processor-protocol.md) on a free port, answers whatever the
//! test scripts (status, delay), and records every call.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct Call {
    /// `/v1/payments` or `/v1/refunds`.
    pub path: String,
    pub key: String,
    pub at: Instant,
}

#[derive(Clone, Copy)]
struct Script {
    status: u16,
    delay: Duration,
}

#[derive(Clone)]
pub struct ProcessorStub {
    pub url: String,
    script: Arc<Mutex<Script>>,
    calls: Arc<Mutex<Vec<Call>>>,
    handle: actix_web::dev::ServerHandle,
}

impl ProcessorStub {
    /// A stub answering `status` to every payment and refund until told
    /// otherwise.
    pub async fn start(status: u16) -> Self {
        let script = Arc::new(Mutex::new(Script {
            status,
            delay: Duration::ZERO,
        }));
        let calls = Arc::new(Mutex::new(Vec::new()));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let state = (script.clone(), calls.clone());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::new(state.clone()))
                .route("/v1/payments", web::post().to(pay))
                .route("/v1/refunds", web::post().to(pay))
        })
        .workers(1)
        .shutdown_timeout(0)
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self {
            url,
            script,
            calls,
            handle,
        }
    }

    pub fn answer(&self, status: u16) {
        self.script.lock().unwrap().status = status;
    }

    pub fn delay(&self, delay: Duration) {
        self.script.lock().unwrap().delay = delay;
    }

    /// Every call, payments and refunds.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The calls to one path (`/v1/payments`, `/v1/refunds`).
    pub fn calls_to(&self, path: &str) -> Vec<Call> {
        let mut calls = self.calls();
        calls.retain(|call| call.path == path);
        calls
    }
}

impl Drop for ProcessorStub {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        tokio::spawn(async move { handle.stop(false).await });
    }
}

type State = (Arc<Mutex<Script>>, Arc<Mutex<Vec<Call>>>);

/// Payments and refunds alike: the scripted status, with the body the
/// protocol gives it.
async fn pay(state: web::Data<State>, request: HttpRequest, body: web::Bytes) -> HttpResponse {
    let key = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let script = *state.0.lock().unwrap();
    state.1.lock().unwrap().push(Call {
        path: request.path().to_owned(),
        key: key.clone(),
        at: Instant::now(),
    });
    if !script.delay.is_zero() {
        tokio::time::sleep(script.delay).await;
    }
    let payment: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let status = actix_web::http::StatusCode::from_u16(script.status).unwrap();
    let body = match script.status {
        201 if request.path() == "/v1/refunds" => {
            json!({"id": format!("rf_{key}"), "status": "succeeded",
                   "payment_id": payment["payment_id"],
                   "amount": payment["amount"], "currency": payment["currency"]})
        }
        201 => json!({"id": format!("pay_{key}"), "status": "succeeded",
                      "amount": payment["amount"], "currency": payment["currency"]}),
        402 => json!({"id": format!("pay_{key}"), "status": "declined",
                      "amount": payment["amount"], "currency": payment["currency"],
                      "decline_code": "card_declined", "message": "Declined."}),
        400 => json!({"error": "invalid_request", "message": "amount: \u{0007}bad\nvalue"}),
        _ => json!({"error": format!("stub answers {}", script.status)}),
    };
    HttpResponse::build(status).json(body)
}
