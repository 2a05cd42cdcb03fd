//! The invariants (RELIABILITY.md), from independent sources: the database
//! (read directly), psp-sim's ledger, the receiver, what clients were told.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, Result};
use serde::Deserialize;
use tokio_postgres::Client as Db;

use crate::receiver::Tally;
use crate::workload::{Outage, Outcome, Seen};

/// A charge or a refund (with `charge_id`, no refunded amounts).
#[derive(Clone, Default, Deserialize)]
#[serde(default)]
pub struct Row {
    pub id: String,
    pub charge_id: Option<String>,
    pub key: Option<String>,
    pub status: String,
    pub amount: i64,
    pub amount_refunded: i64,
    pub refunds_reserved: i64,
    pub processor_id: Option<String>,
    pub processor_attempts: i32,
}

#[derive(Deserialize)]
pub struct EventRow {
    pub id: String,
    pub kind: String,
    pub object: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
pub struct Snapshot {
    pub charges: Vec<Row>,
    pub refunds: Vec<Row>,
    pub events: Vec<EventRow>,
    pub deliveries: BTreeMap<String, i64>,
    /// Deliveries not `delivered`: "event id, status, last error".
    pub undelivered: Vec<String>,
}

impl Snapshot {
    /// Everything in one statement, as JSON whose names are the fields';
    /// ids as the API writes them, `prefix_<hex>`.
    pub async fn read(db: &Db) -> Result<Self> {
        let id = |prefix, column| format!("'{prefix}_' || replace({column}::text, '-', '')");
        let (charge, refund, event) = (id("ch", "id"), id("re", "id"), id("evt", "id"));
        let (charge_of, refund_of) = (id("ch", "charge_id"), id("re", "refund_id"));
        let event_of = id("evt", "event_id");
        // Each row built by json_build_object: on Citus a subquery's row
        // reaches json_agg without its column names.
        let sql = format!(
            "SELECT json_build_object(\
               'charges', (SELECT coalesce(json_agg(json_build_object('id', {charge}, \
                 'key', client_idempotency_key, 'status', status, 'amount', amount, \
                 'amount_refunded', amount_refunded, 'refunds_reserved', refunds_reserved, \
                 'processor_id', processor_payment_id, \
                 'processor_attempts', processor_attempts)), '[]') FROM charges), \
               'refunds', (SELECT coalesce(json_agg(json_build_object('id', {refund}, \
                 'charge_id', {charge_of}, 'key', client_idempotency_key, 'status', status, \
                 'amount', amount, 'processor_id', processor_refund_id, \
                 'processor_attempts', processor_attempts)), '[]') FROM refunds), \
               'events', (SELECT coalesce(json_agg(json_build_object('id', {event}, \
                 'kind', type, 'object', coalesce({charge_of}, {refund_of}))), '[]') FROM events), \
               'deliveries', (SELECT coalesce(json_object_agg(status, n), '{{}}') FROM \
                 (SELECT status, count(*) AS n FROM webhook_deliveries GROUP BY status) d), \
               'undelivered', (SELECT coalesce(json_agg({event_of} || ' ' || status || ' ' || \
                 coalesce(last_error, '')), '[]') FROM webhook_deliveries \
                 WHERE status <> 'delivered')\
             )::text"
        );
        let text: String = db.query_one(&sql, &[]).await.context("reading the database")?.get(0);
        serde_json::from_str(&text).context("reading the database")
    }

    pub fn objects(&self) -> impl Iterator<Item = (&'static str, &Row)> {
        let charges = self.charges.iter().map(|row| ("charge", row));
        charges.chain(self.refunds.iter().map(|row| ("refund", row)))
    }

    pub fn pending(&self) -> usize {
        self.objects().filter(|(_, row)| row.status == "pending").count()
    }
}

/// psp-sim's ledger: `GET /v1/payments` and `GET /v1/refunds`.
pub struct Ledger {
    pub payments: Vec<Entry>,
    pub refunds: Vec<Entry>,
}

/// A payment or a refund (with `payment_id`) as psp-sim lists it.
#[derive(Default, Deserialize)]
#[serde(default)]
pub struct Entry {
    pub id: String,
    pub status: String,
    pub amount: i64,
    pub idempotency_key: String,
    pub payment_id: Option<String>,
    /// Requests received for its key, faults included.
    pub requests: u64,
}

#[derive(Deserialize)]
struct List {
    data: Vec<Entry>,
}

impl Ledger {
    pub async fn read(psp_url: &str) -> Result<Self> {
        let http = &reqwest::Client::new();
        let list = |what| async move {
            let get = http.get(format!("{psp_url}/v1/{what}")).send().await;
            reqwest::Result::Ok(get?.error_for_status()?.json::<List>().await?.data)
        };
        let payments = list("payments").await.context("reading psp-sim's payments")?;
        Ok(Self { payments, refunds: list("refunds").await.context("reading psp-sim's refunds")? })
    }

    pub fn requests(&self) -> u64 {
        self.payments.iter().chain(&self.refunds).map(|entry| entry.requests).sum()
    }
}

pub struct Verdict {
    pub name: &'static str,
    pub checked: usize,
    pub violations: Vec<String>,
}

impl Verdict {
    fn new(name: &'static str) -> Self {
        Self { name, checked: 0, violations: Vec::new() }
    }

    fn fail(&mut self, violation: String) {
        self.violations.push(violation);
    }
}

/// Every invariant, in the order of RELIABILITY.md.
pub fn check(
    db: &Snapshot,
    ledger: &Ledger,
    received: &Tally,
    told: &Seen,
    settled: bool,
) -> Vec<Verdict> {
    vec![
        one_row_per_operation(db, told),
        one_payment_per_operation(db, ledger),
        all_final(db, told, settled),
        no_over_refund(db, ledger),
        one_event_per_change(db),
        events_received(db, received),
        documented_answers(told),
        same_key_same_answer(db, told),
    ]
}

fn one_row_per_operation(db: &Snapshot, told: &Seen) -> Verdict {
    let mut verdict = Verdict::new("one row per logical operation (idempotency key)");
    let mut rows: HashMap<(&str, &str), usize> = HashMap::new();
    for (what, row) in db.objects() {
        if let Some(key) = &row.key {
            *rows.entry((what, key)).or_default() += 1;
        }
    }
    for (key, record) in &told.records {
        let Some(operation) = &record.operation else {
            continue;
        };
        verdict.checked += 1;
        let rows = rows.get(&(operation.kind, key.as_str())).copied().unwrap_or(0);
        let refused = !record.outcomes.is_empty()
            && record.outcomes.iter().all(|o| matches!(o, Outcome::Refused(_)));
        let expected_ok = match (refused, record.outcomes.is_empty()) {
            (true, _) => rows == 0,
            (false, true) => rows <= 1,
            (false, false) => rows == 1,
        };
        if !expected_ok {
            let refused = if refused { " for a refused request" } else { "" };
            verdict.fail(format!("{} key {key}: {rows} rows{refused}", operation.kind));
        }
    }
    for (what, row) in db.objects() {
        if row.key.as_ref().is_none_or(|key| !told.records.contains_key(key)) {
            verdict.fail(format!("{what} {} has a key no client sent", row.id));
        }
    }
    verdict
}

/// `ch_<hex>` → `chargeonce-<hex>`, `re_…` → `chargeonce-refund-…`.
fn processor_key(id: &str) -> String {
    match id.split_once('_') {
        Some(("re", hex)) => format!("chargeonce-refund-{hex}"),
        Some((_, hex)) => format!("chargeonce-{hex}"),
        None => id.to_owned(),
    }
}

fn one_payment_per_operation(db: &Snapshot, ledger: &Ledger) -> Verdict {
    let mut verdict =
        Verdict::new("at most one processor payment per operation, none without its row");
    // Charges against payments, refunds against refunds.
    for (what, rows, book) in
        [("charge", &db.charges, &ledger.payments), ("refund", &db.refunds, &ledger.refunds)]
    {
        let mut by_key: HashMap<&str, Vec<&Entry>> = HashMap::new();
        for entry in book {
            by_key.entry(&entry.idempotency_key).or_default().push(entry);
        }
        for Row { id, status, processor_id, .. } in rows.iter() {
            verdict.checked += 1;
            let entries = by_key.remove(processor_key(id).as_str()).unwrap_or_default();
            if entries.len() > 1 {
                verdict.fail(format!("{what} {id}: {} processor entries", entries.len()));
            }
            let moved = entries.iter().find(|e| e.status == "succeeded");
            match (status.as_str(), moved) {
                ("succeeded", Some(entry)) if Some(&entry.id) == processor_id.as_ref() => {}
                ("succeeded", Some(Entry { id: made, .. })) => verdict.fail(format!(
                    "{what} {id}: succeeded with {processor_id:?}, the processor has {made}"
                )),
                ("succeeded", None) => verdict
                    .fail(format!("{what} {id}: succeeded, the processor has no such {what}")),
                ("failed", Some(Entry { id: made, .. })) => {
                    verdict.fail(format!("{what} {id}: failed, yet the processor made {made}"))
                }
                _ => {}
            }
        }
        for (key, entries) in &by_key {
            for Entry { id, status, .. } in entries {
                verdict
                    .fail(format!("processor {what} {id} (key {key}, {status}) has no {what} row"));
            }
        }
    }
    verdict
}

fn all_final(db: &Snapshot, told: &Seen, settled: bool) -> Verdict {
    let mut verdict = Verdict::new("every charge and refund final within the bound");
    for (what, row) in db.objects() {
        verdict.checked += 1;
        if row.status == "pending" {
            verdict.fail(format!("{what} {} still pending", row.id));
        }
    }
    for (key, record) in &told.records {
        if record.outcomes.is_empty() && record.operation.is_some() {
            verdict.fail(format!("key {key}: no final answer to the client"));
        }
    }
    if !settled {
        verdict.fail("not settled within the bound (see above)".to_owned());
    }
    verdict
}

fn no_over_refund(db: &Snapshot, ledger: &Ledger) -> Verdict {
    let mut verdict = Verdict::new("no refunded total exceeds its charge");
    let mut refunded: HashMap<&str, (i64, i64)> = HashMap::new();
    for refund in &db.refunds {
        let entry = refunded.entry(refund.charge_id.as_deref().unwrap_or_default()).or_default();
        match refund.status.as_str() {
            "succeeded" => {
                entry.0 += refund.amount;
                entry.1 += refund.amount;
            }
            "pending" => entry.1 += refund.amount,
            _ => {}
        }
    }
    for charge in &db.charges {
        verdict.checked += 1;
        let (succeeded, reserved) = refunded.get(charge.id.as_str()).copied().unwrap_or((0, 0));
        if succeeded > charge.amount || reserved > charge.amount {
            verdict.fail(format!(
                "charge {}: {succeeded} refunded ({reserved} with pending) of {}",
                charge.id, charge.amount
            ));
        }
        if charge.amount_refunded != succeeded || charge.refunds_reserved != reserved {
            verdict.fail(format!(
                "charge {}: amount_refunded {} / refunds_reserved {}, its refunds say {succeeded} / {reserved}",
                charge.id, charge.amount_refunded, charge.refunds_reserved
            ));
        }
    }
    let mut at_processor: HashMap<&str, i64> = HashMap::new();
    for refund in ledger.refunds.iter().filter(|refund| refund.status == "succeeded") {
        *at_processor.entry(refund.payment_id.as_deref().unwrap_or_default()).or_default() +=
            refund.amount;
    }
    for Entry { id, amount, .. } in &ledger.payments {
        let refunded = at_processor.get(id.as_str()).copied().unwrap_or(0);
        if refunded > *amount {
            verdict.fail(format!("processor payment {id}: {refunded} refunded of {amount}"));
        }
    }
    verdict
}

fn one_event_per_change(db: &Snapshot) -> Verdict {
    let mut verdict = Verdict::new("one event per committed state change");
    let mut events: HashMap<(&str, &str), usize> = HashMap::new();
    for event in &db.events {
        *events.entry((&event.object, &event.kind)).or_default() += 1;
    }
    for (what, Row { id, status, processor_attempts: unknown_answers, .. }) in db.objects() {
        verdict.checked += 1;
        for state in ["pending", "succeeded", "failed"] {
            let kind = format!("{what}.{state}");
            let count = events.get(&(id.as_str(), kind.as_str())).copied().unwrap_or(0);
            // `pending` is a change once the first answer was unknown;
            // the final state is one once reached.
            let expected = match state {
                "pending" => usize::from(*unknown_answers > 0),
                final_state => usize::from(status == final_state),
            };
            if count != expected {
                verdict.fail(format!(
                    "{what} {id} ({status}): {count} {kind} events, expected {expected}"
                ));
            }
        }
    }
    verdict
}

fn events_received(db: &Snapshot, received: &Tally) -> Verdict {
    let mut verdict = Verdict::new("every event reached the receiver (2xx) at least once");
    for event in &db.events {
        verdict.checked += 1;
        if received.acknowledged.get(&event.id).copied().unwrap_or(0) == 0 {
            verdict.fail(format!("event {} ({}) never acknowledged", event.id, event.kind));
        }
    }
    for delivery in &db.undelivered {
        verdict.fail(format!("delivery {delivery}"));
    }
    for id in &received.mismatched {
        verdict.fail(format!("webhook-id {id}: the body is another event"));
    }
    verdict
}

fn documented_answers(told: &Seen) -> Verdict {
    let mut verdict = Verdict::new("only documented statuses (no 500; 503 only while faults ran)");
    verdict.checked = told.records.len();
    verdict.violations.extend(told.bad_answers.iter().cloned());
    verdict
}

/// On Citus, while a worker was down: its merchants were answered 503, the
/// others were served and never answered 503; no attempt went unanswered.
pub fn worker_outage(outage: &Outage) -> Verdict {
    let mut verdict = Verdict::new("a worker down: 503 for its merchants, the others served");
    let [stopped, others] = &outage.answers;
    let n = |answers: &BTreeMap<String, u64>, status| answers.get(status).copied().unwrap_or(0);
    let all: u64 = stopped.values().chain(others.values()).sum();
    verdict.checked = usize::try_from(all).unwrap_or(usize::MAX);
    let served = n(others, "201") + n(others, "402") + n(others, "400");
    let unanswered = n(stopped, "no answer") + n(others, "no answer");
    let failures = [
        (n(stopped, "503") == 0, "no 503 for the merchants on the stopped worker".to_owned()),
        (served == 0, "no final answer for the merchants on the other worker".to_owned()),
        (n(others, "503") > 0, format!("503 ×{} for the other merchants", n(others, "503"))),
        (unanswered > 0, format!("{unanswered} attempts without an answer")),
    ];
    let failed = failures.into_iter().filter(|(failed, _)| *failed);
    verdict.violations.extend(failed.map(|(_, what)| what));
    verdict
}

fn same_key_same_answer(db: &Snapshot, told: &Seen) -> Verdict {
    let mut verdict = Verdict::new("one key, one answer, as recorded");
    let status_of: HashMap<&str, &str> =
        db.objects().map(|(_, row)| (row.id.as_str(), row.status.as_str())).collect();
    for (key, record) in &told.records {
        let Some(first) = record.outcomes.first() else {
            continue;
        };
        verdict.checked += 1;
        if record.outcomes.iter().any(|o| o != first) {
            verdict.fail(format!("key {key}: different answers {:?}", record.outcomes));
        }
        if let Outcome::Final { id, status } = first {
            match status_of.get(id.as_str()) {
                Some(recorded) if recorded == status => {}
                recorded => verdict
                    .fail(format!("key {key}: told {id} {status}, the database has {recorded:?}")),
            }
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::workload::Record;
    use crate::workload::{charge_operation, Operation};

    const CHARGE: &str = "ch_0000000000000000000000000000000a";
    const REFUND: &str = "re_0000000000000000000000000000000b";

    struct World {
        db: Snapshot,
        ledger: Ledger,
        received: Tally,
        told: Seen,
    }

    impl World {
        fn violated(&self) -> Vec<&'static str> {
            let verdicts = check(&self.db, &self.ledger, &self.received, &self.told, true);
            let violated = verdicts.into_iter().filter(|verdict| !verdict.violations.is_empty());
            violated.map(|verdict| verdict.name).collect()
        }
    }

    fn entry(value: serde_json::Value) -> Entry {
        serde_json::from_value(value).unwrap()
    }

    /// One succeeded charge of 1000 with a succeeded refund of 400, its
    /// events, its payment and refund at the processor, all received.
    fn world() -> World {
        let db: Snapshot = serde_json::from_value(json!({
            "charges": [{"id": CHARGE, "key": "k-charge", "status": "succeeded", "amount": 1000,
                "amount_refunded": 400, "refunds_reserved": 400, "processor_id": "pay_1"}],
            "refunds": [{"id": REFUND, "charge_id": CHARGE, "key": "k-refund",
                "status": "succeeded", "amount": 400, "processor_id": "rf_1",
                "processor_attempts": 1}],
            "events": [
                {"id": "evt_1", "kind": "charge.succeeded", "object": CHARGE},
                {"id": "evt_2", "kind": "refund.pending", "object": REFUND},
                {"id": "evt_3", "kind": "refund.succeeded", "object": REFUND},
            ],
        }))
        .unwrap();
        let ledger = Ledger {
            payments: vec![entry(json!({
                "id": "pay_1", "status": "succeeded", "amount": 1000,
                "idempotency_key": "chargeonce-0000000000000000000000000000000a",
            }))],
            refunds: vec![entry(json!({
                "id": "rf_1", "status": "succeeded", "amount": 400, "payment_id": "pay_1",
                "idempotency_key": "chargeonce-refund-0000000000000000000000000000000b",
            }))],
        };
        let acknowledged = ["evt_1", "evt_2", "evt_3"].map(|id| (id.to_owned(), 1)).into();
        let records = [("k-charge", "charge", CHARGE), ("k-refund", "refund", REFUND)]
            .map(|(key, kind, id)| {
                let operation =
                    Operation { kind, key: key.into(), ..charge_operation(1000, 0, false) };
                let outcomes = vec![Outcome::Final { id: id.to_owned(), status: "succeeded" }];
                (key.to_owned(), Record { operation: Some(operation), outcomes })
            })
            .into();
        let (received, told) =
            (Tally { acknowledged, ..Tally::default() }, Seen { records, ..Seen::default() });
        World { db, ledger, received, told }
    }

    #[test]
    fn a_consistent_world_passes() {
        assert_eq!(world().violated(), Vec::<&str>::new());
    }

    #[test]
    fn a_payment_without_its_charge_is_a_violation() {
        let mut world = world();
        world.ledger.payments.push(entry(json!({
            "id": "pay_2", "status": "succeeded", "amount": 1000,
            "idempotency_key": "chargeonce-0000000000000000000000000000000c",
        })));
        assert_eq!(
            world.violated(),
            ["at most one processor payment per operation, none without its row"]
        );
    }

    #[test]
    fn an_over_refund_is_a_violation() {
        let mut world = world();
        world.db.charges[0].amount = 300;
        assert!(world.violated().contains(&"no refunded total exceeds its charge"));
    }

    #[test]
    fn a_missing_or_unreceived_event_is_a_violation() {
        let mut world = world();
        world.db.events.remove(1);
        world.received.acknowledged.remove("evt_3");
        assert_eq!(
            world.violated(),
            [
                "one event per committed state change",
                "every event reached the receiver (2xx) at least once"
            ]
        );
    }

    #[test]
    fn a_500_and_a_second_row_for_a_key_are_violations() {
        let mut world = world();
        let twin = "ch_0000000000000000000000000000000d";
        let failed = Row { id: twin.to_owned(), status: "failed".to_owned(), ..Row::default() };
        world.db.charges.push(Row { amount: 1000, key: Some("k-charge".to_owned()), ..failed });
        let event = json!({"id": "evt_4", "kind": "charge.failed", "object": twin});
        world.db.events.push(serde_json::from_value(event).unwrap());
        world.received.acknowledged.insert("evt_4".to_owned(), 1);
        world.told.bad_answers.push("500 for key k on instance 0".to_owned());
        assert_eq!(
            world.violated(),
            [
                "one row per logical operation (idempotency key)",
                "only documented statuses (no 500; 503 only while faults ran)"
            ]
        );
    }

    #[test]
    fn a_503_beside_a_stopped_worker_is_a_violation() {
        let answers = |pairs: &[(&str, u64)]| {
            pairs.iter().map(|(status, n)| ((*status).to_owned(), *n)).collect()
        };
        let mut outage = Outage {
            since: None,
            answers: [answers(&[("503", 9)]), answers(&[("201", 5), ("409", 1)])],
        };
        assert_eq!(worker_outage(&outage).violations, Vec::<String>::new());
        outage.answers[1] = answers(&[("201", 5), ("503", 2)]);
        assert_eq!(worker_outage(&outage).violations, ["503 ×2 for the other merchants"]);
    }
}
