//! The customers: `chargeonce-client` without retries (the loop is here, so
//! every status is seen), each attempt to the next instance, one key and body
//! per operation. At random: a charge, a burst (one key to every instance at
//! once) or a refund race (RELIABILITY.md).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chargeonce_client::{Client, Error, IdempotencyKey, NewCharge, NewRefund, RetryPolicy};
use rand::Rng;
use tokio::task::JoinSet;

/// Past the service's query + connect timeouts: a stalled database is a 503.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(6);
/// A customer's patience per operation; the rest is resumed after the faults.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long a 503 is excused after the faults (a connection opened in a
/// partition may still time out).
const GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 201 or 402: the object's id and final status.
    Final { id: String, status: &'static str },
    /// A final refusal without an object (400 `refund_exceeds_charge`).
    Refused(String),
}

#[derive(Debug, Clone)]
pub struct Operation {
    /// "charge" or "refund".
    pub kind: &'static str,
    /// Whose: an index into the merchants.
    pub merchant: usize,
    pub key: IdempotencyKey,
    pub charge: NewCharge,
    pub refund: Option<(String, NewRefund)>,
    pub burst: bool,
}

#[derive(Debug, Default)]
pub struct Record {
    pub operation: Option<Operation>,
    /// Every final answer any sender got (a burst has several).
    pub outcomes: Vec<Outcome>,
}

pub struct Shared {
    /// Per merchant, one client per instance.
    clients: Vec<Vec<Client>>,
    /// Per merchant: whether it is on the worker that stops (Citus).
    on_stopped_worker: Vec<bool>,
    next: AtomicUsize,
    pub seen: Mutex<Seen>,
}

#[derive(Default)]
pub struct Seen {
    /// Answers by status ("201", …, "no answer").
    pub statuses: BTreeMap<String, u64>,
    /// Answers that break the documented contract, with key and instance.
    pub bad_answers: Vec<String>,
    pub records: HashMap<String, Record>,
    /// When the faults stopped: 503 is excused until [`GRACE`] after.
    pub calm_since: Option<Instant>,
    pub attempts: usize,
    pub refund_races: usize,
    pub outage: Outage,
}

/// Answers to attempts begun while a Citus worker was down.
#[derive(Debug, Default)]
pub struct Outage {
    pub since: Option<Instant>,
    /// By status: merchants on the stopped worker, then the others.
    pub answers: [BTreeMap<String, u64>; 2],
}

impl Shared {
    pub fn new(urls: &[String], merchants: &[(String, bool)]) -> anyhow::Result<Self> {
        let client = |url: &String, secret| {
            Client::builder(url.clone(), secret)
                .request_timeout(ATTEMPT_TIMEOUT)
                .connect_timeout(Duration::from_secs(2))
                .retry_policy(RetryPolicy::no_retries())
                .build()
        };
        let clients = (merchants.iter())
            .map(|(secret, _)| urls.iter().map(|url| client(url, secret)).collect())
            .collect::<Result<_, _>>()?;
        let on_stopped_worker = merchants.iter().map(|(_, stopped)| *stopped).collect();
        Ok(Self { clients, on_stopped_worker, next: AtomicUsize::new(0), seen: Mutex::default() })
    }

    fn instances(&self) -> usize {
        self.clients[0].len()
    }

    fn next_instance(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) % self.instances()
    }

    fn count(&self, status: &str, merchant: usize, began: Instant) {
        let mut seen = lock(&self.seen);
        *seen.statuses.entry(status.to_owned()).or_default() += 1;
        if seen.outage.since.is_some_and(|since| since <= began) {
            let side = usize::from(!self.on_stopped_worker[merchant]);
            *seen.outage.answers[side].entry(status.to_owned()).or_default() += 1;
        }
    }

    fn register(&self, operation: &Operation) {
        let key = operation.key.as_str().to_owned();
        lock(&self.seen).records.entry(key).or_default().operation = Some(operation.clone());
    }

    /// One attempt: its final outcome, or None to try again.
    async fn attempt(&self, operation: &Operation, instance: usize) -> Option<Outcome> {
        lock(&self.seen).attempts += 1;
        let (began, key) = (Instant::now(), operation.key.clone());
        let client = &self.clients[operation.merchant][instance];
        let result = match &operation.refund {
            None => {
                client.charge_operation_with_key(&operation.charge, key).send().await.map(|c| c.id)
            }
            Some((charge, refund)) => {
                client.refund_operation_with_key(charge, refund, key).send().await.map(|r| r.id)
            }
        };
        let status = result.as_ref().err().map(|error| error.status().map(|s| s.as_u16()));
        let answer = match status {
            None => "201".to_owned(),
            Some(status) => status.map_or_else(|| "no answer".to_owned(), |s| s.to_string()),
        };
        self.count(&answer, operation.merchant, began);
        let (key, bad) =
            (operation.key.as_str(), |answer| lock(&self.seen).bad_answers.push(answer));
        let failed = |id| Some(Outcome::Final { id, status: "failed" });
        match (result, status.flatten()) {
            (Ok(id), _) => Some(Outcome::Final { id, status: "succeeded" }),
            (Err(Error::Declined { charge, .. }), _) => failed(charge.id),
            (Err(Error::RefundDeclined { refund, .. }), _) => failed(refund.id),
            (Err(Error::RefundExceedsCharge { .. }), _) => {
                Some(Outcome::Refused("refund_exceeds_charge".to_owned()))
            }
            (Err(_), None | Some(202 | 409)) => None,
            (Err(error), Some(503)) => {
                if matches!(error, Error::Api { retry_after: None, .. }) {
                    bad(format!("503 without Retry-After for key {key}"));
                }
                if lock(&self.seen).calm_since.is_some_and(|since| since.elapsed() > GRACE) {
                    bad(format!("503 after faults stopped: key {key} on instance {instance}"));
                }
                None
            }
            (Err(error), Some(other)) => {
                bad(format!("{other} for key {key} on instance {instance}: {error}"));
                // A 500 may be passing; the key is resumed like any other.
                None
            }
        }
    }

    /// Attempts round-robin from `first`, with jittered backoff, until a final
    /// answer (recorded) or `deadline`; whether it got one.
    async fn drive(&self, operation: &Operation, first: usize, deadline: Instant) -> bool {
        let (mut instance, mut pause) = (first, 50);
        loop {
            if let Some(outcome) = self.attempt(operation, instance).await {
                let key = operation.key.as_str().to_owned();
                lock(&self.seen).records.entry(key).or_default().outcomes.push(outcome);
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            let jitter = rand::thread_rng().gen_range(pause / 2..=pause);
            tokio::time::sleep(Duration::from_millis(jitter)).await;
            pause = (pause * 2).min(800);
            instance = (instance + 1) % self.instances();
        }
    }

    pub fn unfinished(&self) -> Vec<Operation> {
        (lock(&self.seen).records.values())
            .filter(|record| record.outcomes.is_empty())
            .filter_map(|record| record.operation.clone())
            .collect()
    }

    pub async fn resume_unfinished(self: &Arc<Self>, deadline: Instant) {
        let operations = self.unfinished().into_iter().map(|op| (self.next_instance(), op));
        send_all(self, operations, deadline).await;
    }
}

pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

pub async fn customer(shared: Arc<Shared>, merchant: usize, until: Instant) {
    while Instant::now() < until {
        let (roll, amount): (f64, i64) = {
            let mut rng = rand::thread_rng();
            (rng.gen(), rng.gen_range(100..100_000))
        };
        let operation = charge_operation(amount, merchant, (0.55..0.75).contains(&roll));
        shared.register(&operation);
        if operation.burst {
            let senders = (0..shared.instances()).map(|instance| (instance, operation.clone()));
            send_all(&shared, senders, deadline(until)).await;
        } else if roll < 0.55 {
            let first = shared.next_instance();
            shared.drive(&operation, first, deadline(until)).await;
        } else {
            lock(&shared.seen).refund_races += 1;
            refund_race(&shared, &operation, until).await;
        }
    }
}

fn deadline(until: Instant) -> Instant {
    (Instant::now() + PATIENCE).min(until)
}

pub fn charge_operation(amount: i64, merchant: usize, burst: bool) -> Operation {
    Operation {
        kind: "charge",
        merchant,
        key: IdempotencyKey::new(),
        charge: NewCharge::new(amount, "USD").description("chaos"),
        refund: None,
        burst,
    }
}

async fn send_all(
    shared: &Arc<Shared>,
    operations: impl Iterator<Item = (usize, Operation)>,
    deadline: Instant,
) {
    let mut senders = JoinSet::new();
    for (instance, operation) in operations {
        let shared = shared.clone();
        senders.spawn(async move { shared.drive(&operation, instance, deadline).await });
    }
    while senders.join_next().await.is_some() {}
}

/// A charge, then at once one refund of 45 % of it per instance, each its own key.
async fn refund_race(shared: &Arc<Shared>, operation: &Operation, until: Instant) {
    let first = shared.next_instance();
    if !shared.drive(operation, first, deadline(until)).await {
        return;
    }
    let charge_id = {
        let seen = lock(&shared.seen);
        match seen.records.get(operation.key.as_str()).and_then(|r| r.outcomes.first()) {
            Some(Outcome::Final { id, status: "succeeded" }) => id.clone(),
            _ => return,
        }
    };
    let amount = operation.charge.amount * 45 / 100;
    let refunds = (0..shared.instances()).map(|instance| {
        let refund = Operation {
            kind: "refund",
            key: IdempotencyKey::new(),
            refund: Some((charge_id.clone(), NewRefund::new().amount(amount))),
            ..operation.clone()
        };
        shared.register(&refund);
        (instance, refund)
    });
    send_all(shared, refunds, deadline(until)).await;
}
