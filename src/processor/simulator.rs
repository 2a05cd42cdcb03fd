//! `chargeonce psp-sim`: a payment processor simulator that speaks
//! docs/processor-protocol.md. It honours idempotency keys (same key, same
//! payment and same answer; same key with another amount or currency, 422),
//! applies the simulated processor's decline rules, and injects faults on a
//! seeded random draw per request:
//!
//! - error: 503 before anything is recorded;
//! - lost response: the payment is recorded, then the connection is dropped
//!   without an answer;
//! - timeout: the payment is recorded, then the answer waits `hang_ms`
//!   (past any sane client timeout).
//!
//! `GET /v1/payments` lists every recorded payment with its key and how many
//! requests carried that key, for tests and benchmarks to audit.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Mutex;
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;

use super::http::{PaymentAnswer, PaymentBody};
use super::simulated_decline;

#[derive(Debug, Clone, clap::Args)]
pub struct SimulatorOptions {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8090)]
    pub port: u16,
    /// Delay before every answer.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Share of requests answered 503 before anything is recorded.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Share of requests whose payment is recorded but whose answer is lost
    /// (the connection is dropped).
    #[arg(long, default_value_t = 0.0)]
    pub lost_response_rate: f64,
    /// Share of requests whose payment is recorded but whose answer hangs for
    /// --hang-ms.
    #[arg(long, default_value_t = 0.0)]
    pub timeout_rate: f64,
    /// How long a "timeout" answer hangs.
    #[arg(long, default_value_t = 60_000)]
    pub hang_ms: u64,
    /// Seed of the fault draws, for reproducible runs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl SimulatorOptions {
    pub fn validate(&self) -> Result<(), String> {
        let rates = [
            ("--error-rate", self.error_rate),
            ("--lost-response-rate", self.lost_response_rate),
            ("--timeout-rate", self.timeout_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!("{name} must be between 0 and 1"));
            }
        }
        if rates.iter().map(|(_, r)| r).sum::<f64>() > 1.0 {
            return Err("the fault rates must add up to at most 1".to_owned());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Error,
    LostResponse,
    Timeout,
}

#[derive(Debug, Clone, Serialize)]
struct Recorded {
    #[serde(flatten)]
    answer: PaymentAnswer,
    idempotency_key: String,
}

#[derive(Default)]
struct Ledger {
    payments: Vec<Recorded>,
    by_key: HashMap<String, usize>,
    requests: HashMap<String, u64>,
}

struct Simulator {
    options: SimulatorOptions,
    rng: Mutex<StdRng>,
    ledger: Mutex<Ledger>,
}

impl Simulator {
    fn roll(&self) -> Fault {
        let draw: f64 = match self.rng.lock() {
            Ok(mut rng) => rng.gen(),
            Err(poisoned) => poisoned.into_inner().gen(),
        };
        let o = &self.options;
        if draw < o.error_rate {
            Fault::Error
        } else if draw < o.error_rate + o.lost_response_rate {
            Fault::LostResponse
        } else if draw < o.error_rate + o.lost_response_rate + o.timeout_rate {
            Fault::Timeout
        } else {
            Fault::None
        }
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Starts the simulator on `listener`; the returned server runs when awaited
/// or spawned.
pub fn build(options: SimulatorOptions, listener: TcpListener) -> std::io::Result<Server> {
    let simulator = web::Data::new(Simulator {
        rng: Mutex::new(StdRng::seed_from_u64(options.seed)),
        ledger: Mutex::new(Ledger::default()),
        options,
    });
    Ok(HttpServer::new(move || {
        App::new()
            .app_data(simulator.clone())
            .app_data(web::PayloadConfig::new(64 * 1024))
            .route("/v1/payments", web::post().to(create_payment))
            .route("/v1/payments", web::get().to(list_payments))
            .route(
                "/healthz",
                web::get().to(|| async { HttpResponse::Ok().json(json!({"status": "ok"})) }),
            )
    })
    .workers(2)
    .shutdown_timeout(1)
    .listen(listener)?
    .run())
}

pub async fn run(options: SimulatorOptions) -> std::io::Result<()> {
    let listener = TcpListener::bind((options.host.as_str(), options.port))?;
    let address = listener.local_addr()?;
    // With --port 0 this line is how a caller learns the port.
    tracing::info!(%address, port = address.port(), "psp-sim listening");
    build(options, listener)?.await
}

fn error(status: StatusCode, code: &str) -> HttpResponse {
    HttpResponse::build(status).json(json!({"error": code}))
}

async fn create_payment(
    simulator: web::Data<Simulator>,
    request: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let Some(key) = request
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
    else {
        return error(StatusCode::BAD_REQUEST, "idempotency_key_missing");
    };
    let Ok(payment) = serde_json::from_slice::<PaymentBody>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request");
    };
    if simulator.options.latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(simulator.options.latency_ms)).await;
    }
    let fault = simulator.roll();
    let (answer, replayed) = {
        let mut ledger = simulator.ledger();
        *ledger.requests.entry(key.clone()).or_default() += 1;
        if fault == Fault::Error {
            return error(StatusCode::SERVICE_UNAVAILABLE, "injected_failure");
        }
        match ledger.by_key.get(&key).copied() {
            Some(index) => {
                let existing = &ledger.payments[index].answer;
                if existing.amount != payment.amount || existing.currency != payment.currency {
                    return error(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused");
                }
                (existing.clone(), true)
            }
            None => {
                let decline = simulated_decline(payment.amount);
                let answer = PaymentAnswer {
                    id: format!("pay_{}", uuid::Uuid::new_v4().simple()),
                    status: if decline.is_some() {
                        "declined"
                    } else {
                        "succeeded"
                    }
                    .to_owned(),
                    amount: payment.amount,
                    currency: payment.currency,
                    payment_id: None,
                    decline_code: decline.map(|(code, _)| code.to_owned()),
                    message: decline.map(|(_, message)| message.to_owned()),
                };
                let index = ledger.payments.len();
                ledger.payments.push(Recorded {
                    answer: answer.clone(),
                    idempotency_key: key.clone(),
                });
                ledger.by_key.insert(key, index);
                (answer, false)
            }
        }
    };
    let status = if answer.status == "succeeded" {
        StatusCode::CREATED
    } else {
        StatusCode::PAYMENT_REQUIRED
    };
    match fault {
        Fault::LostResponse => {
            // An erroring body makes actix drop the connection: the payment
            // is made, the client never learns of it.
            let lost = futures_util::stream::once(async {
                Err::<web::Bytes, _>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected lost response",
                ))
            });
            return HttpResponse::build(status).streaming(lost);
        }
        Fault::Timeout => {
            tokio::time::sleep(Duration::from_millis(simulator.options.hang_ms)).await;
        }
        Fault::None | Fault::Error => {}
    }
    let mut response = HttpResponse::build(status);
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.json(answer)
}

async fn list_payments(simulator: web::Data<Simulator>) -> HttpResponse {
    let ledger = simulator.ledger();
    let data: Vec<_> = ledger
        .payments
        .iter()
        .map(|payment| {
            let mut entry = serde_json::to_value(payment).unwrap_or_default();
            entry["requests"] = json!(ledger
                .requests
                .get(&payment.idempotency_key)
                .copied()
                .unwrap_or(0));
            entry
        })
        .collect();
    HttpResponse::Ok().json(json!({"data": data}))
}
