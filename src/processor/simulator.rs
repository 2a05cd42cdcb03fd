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
//! Refunds (`POST /v1/refunds`) follow the same rules: deduplicated by key,
//! the same faults, a refund only of a succeeded payment and never beyond
//! its amount (422 `refund_exceeds_payment`), declined `refund_declined`
//! when the amount ends in `02`.
//!
//! `GET /v1/payments` and `GET /v1/refunds` list every recorded payment or
//! refund with its key and how many requests carried that key, for tests
//! and benchmarks to audit.

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

use super::http::{PaymentAnswer, PaymentBody, RefundBody};
use super::{simulated_decline, simulated_refund_decline};

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

/// What was made under each key, in order.
#[derive(Default)]
struct Book {
    entries: Vec<Recorded>,
    by_key: HashMap<String, usize>,
}

impl Book {
    fn get(&self, key: &str) -> Option<&PaymentAnswer> {
        self.by_key
            .get(key)
            .map(|&index| &self.entries[index].answer)
    }

    fn record(&mut self, key: String, answer: PaymentAnswer) {
        self.by_key.insert(key.clone(), self.entries.len());
        self.entries.push(Recorded {
            answer,
            idempotency_key: key,
        });
    }
}

#[derive(Default)]
struct Ledger {
    payments: Book,
    refunds: Book,
    /// Requests per key, faults included.
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
            .route("/v1/refunds", web::post().to(create_refund))
            .route("/v1/refunds", web::get().to(list_refunds))
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
    let Ok(payment) = serde_json::from_slice::<PaymentBody>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request");
    };
    handle(&simulator, &request, |ledger, key| {
        if let Some(existing) = ledger.payments.get(&key) {
            if existing.amount != payment.amount || existing.currency != payment.currency {
                return Err((StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"));
            }
            return Ok((existing.clone(), true));
        }
        let decline = simulated_decline(payment.amount);
        let answer = answer("pay", payment.amount, payment.currency, None, decline);
        ledger.payments.record(key, answer.clone());
        Ok((answer, false))
    })
    .await
}

async fn create_refund(
    simulator: web::Data<Simulator>,
    request: HttpRequest,
    body: web::Bytes,
) -> HttpResponse {
    let Ok(refund) = serde_json::from_slice::<RefundBody>(&body) else {
        return error(StatusCode::BAD_REQUEST, "invalid_request");
    };
    handle(&simulator, &request, |ledger, key| {
        if let Some(existing) = ledger.refunds.get(&key) {
            if existing.amount != refund.amount
                || existing.payment_id.as_deref() != Some(refund.payment_id.as_str())
            {
                return Err((StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"));
            }
            return Ok((existing.clone(), true));
        }
        let Some(payment) = ledger
            .payments
            .entries
            .iter()
            .map(|recorded| &recorded.answer)
            .find(|p| p.id == refund.payment_id && p.status == "succeeded")
        else {
            return Err((StatusCode::NOT_FOUND, "payment_not_found"));
        };
        let refunded: i64 = ledger
            .refunds
            .entries
            .iter()
            .map(|recorded| &recorded.answer)
            .filter(|r| {
                r.payment_id.as_deref() == Some(payment.id.as_str()) && r.status == "succeeded"
            })
            .map(|r| r.amount)
            .sum();
        if refunded + refund.amount > payment.amount {
            return Err((StatusCode::UNPROCESSABLE_ENTITY, "refund_exceeds_payment"));
        }
        let decline = simulated_refund_decline(refund.amount);
        let answer = answer(
            "rf",
            refund.amount,
            refund.currency,
            Some(refund.payment_id),
            decline,
        );
        ledger.refunds.record(key, answer.clone());
        Ok((answer, false))
    })
    .await
}

/// A new answer: succeeded, or declined with `decline`'s code and message.
fn answer(
    prefix: &str,
    amount: i64,
    currency: String,
    payment_id: Option<String>,
    decline: Option<(&str, &str)>,
) -> PaymentAnswer {
    PaymentAnswer {
        id: format!("{prefix}_{}", uuid::Uuid::new_v4().simple()),
        status: if decline.is_some() {
            "declined"
        } else {
            "succeeded"
        }
        .to_owned(),
        amount,
        currency,
        payment_id,
        decline_code: decline.map(|(code, _)| code.to_owned()),
        message: decline.map(|(_, message)| message.to_owned()),
    }
}

/// What payments and refunds share: the key, the latency, the fault draw,
/// the ledger under its lock (`decide` finds or records the answer, or
/// refuses), then the answer with the drawn fault.
async fn handle(
    simulator: &Simulator,
    request: &HttpRequest,
    decide: impl FnOnce(
        &mut Ledger,
        String,
    ) -> Result<(PaymentAnswer, bool), (StatusCode, &'static str)>,
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
        match decide(&mut ledger, key) {
            Ok(decided) => decided,
            Err((status, code)) => return error(status, code),
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
    list(&simulator, |ledger| &ledger.payments)
}

async fn list_refunds(simulator: web::Data<Simulator>) -> HttpResponse {
    list(&simulator, |ledger| &ledger.refunds)
}

fn list(simulator: &Simulator, book: impl Fn(&Ledger) -> &Book) -> HttpResponse {
    let ledger = simulator.ledger();
    let data: Vec<_> = book(&ledger)
        .entries
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
