//! Database failover, end to end: the real `chargeonce serve` binary is given
//! a primary and its synchronous standby in one multi-host URL
//! (`…@127.0.0.1:P1,127.0.0.1:P2/chargeonce?target_session_attrs=read-write`,
//! tokio-postgres's multi-host form), with psp-sim as the processor. Under
//! load the primary is crashed (`pg_ctl -m immediate stop`) and the standby
//! promoted, without restarting the service.
//!
//! Its own test binary: each test starts a private cluster
//! (`chargeonce_testkit::Cluster`) and processes of its own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, HashMap};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chargeonce_testkit::{Chargeonce, Cluster, Proxy, ProxyMode, Spawned};
use serde_json::Value;

/// The binary this test build made, run from the repository root.
fn binary() -> Chargeonce {
    Chargeonce::new(env!("CARGO_BIN_EXE_chargeonce"), env!("CARGO_MANIFEST_DIR"))
}

async fn start_psp_sim() -> Spawned {
    binary().psp_sim(&[]).await
}

/// `chargeonce serve` against `database_url` with psp-sim as the processor,
/// short processor timeouts and a short lease, so a charge caught by the
/// failover settles within the test's patience.
async fn start_service(database_url: &str, psp: &Spawned) -> Spawned {
    Spawned::start(service_command(database_url, psp), "/readyz").await
}

fn service_command(database_url: &str, psp: &Spawned) -> Command {
    let mut command = binary().serve_command(database_url);
    command
        .env("CHARGEONCE__PROCESSOR__KIND", "http")
        .env("CHARGEONCE__PROCESSOR__URL", &psp.url)
        .env("CHARGEONCE__PROCESSOR__TIMEOUT_MS", "1000")
        .env("CHARGEONCE__PROCESSOR__RETRIES", "1")
        .env("CHARGEONCE__IDEMPOTENCY__LEASE_MS", "5000")
        .env("CHARGEONCE__RECOVERY__INTERVAL_MS", "200")
        .env("CHARGEONCE__DEMO__ENABLED", "false");
    command
}

/// A merchant made with the real CLI; its secret API key.
async fn create_merchant(database_url: &str) -> String {
    binary()
        .run(database_url, &["merchant", "create", "Failover merchant"])
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// All psp-sim recorded: one entry per processor key.
async fn psp_payments(psp: &Spawned) -> Vec<Value> {
    let list: Value = reqwest::get(format!("{}/v1/payments", psp.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    list["data"].as_array().unwrap().clone()
}

/// One request as the client saw it: a status and body, or no answer.
#[derive(Debug, Clone)]
struct Attempt {
    key: String,
    sent: Instant,
    received: Instant,
    answer: Result<(u16, String), String>,
}

/// Every attempt of every client, in the order they ended.
#[derive(Default)]
struct Journal(Mutex<Vec<Attempt>>);

impl Journal {
    fn push(&self, attempt: Attempt) {
        self.0.lock().unwrap().push(attempt);
    }

    fn all(&self) -> Vec<Attempt> {
        self.0.lock().unwrap().clone()
    }

    /// When the first 201 came to a request sent at or after `since`.
    fn first_created_sent_after(&self, since: Instant) -> Option<Instant> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|a| a.sent >= since && matches!(a.answer, Ok((201, _))))
            .map(|a| a.received)
            .min()
    }
}

/// A key's final answer.
#[derive(Debug, Clone)]
struct Final {
    key: String,
    amount: i64,
    body: String,
    status: u16,
    reply: String,
}

/// What a client does (as `charge_until_final` in tests/api/recovery.rs):
/// the same key and body until the answer is final, pausing briefly after
/// 202, 409, 503 and no answer. Every attempt goes to the journal.
async fn charge_until_final(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    key: &str,
    body: &str,
    journal: &Journal,
) -> (u16, String) {
    charge_within(
        http,
        base,
        secret,
        key,
        body,
        journal,
        Duration::from_secs(40),
    )
    .await
    .unwrap_or_else(|| panic!("{key} never got a final answer"))
}

/// `charge_until_final` for at most `patience`; `None` if no answer was
/// final by then.
async fn charge_within(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    key: &str,
    body: &str,
    journal: &Journal,
    patience: Duration,
) -> Option<(u16, String)> {
    let started = Instant::now();
    loop {
        let sent = Instant::now();
        let result = http
            .post(format!("{base}/v1/charges"))
            .bearer_auth(secret)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_owned())
            .send()
            .await;
        let answer = match result {
            Ok(response) => {
                let status = response.status().as_u16();
                match response.text().await {
                    Ok(text) => Ok((status, text)),
                    Err(error) => Err(format!("{status} with a broken body: {error}")),
                }
            }
            Err(error) => Err(format!("no answer: {error}")),
        };
        journal.push(Attempt {
            key: key.to_owned(),
            sent,
            received: Instant::now(),
            answer: answer.clone(),
        });
        if let Ok((status @ (201 | 402), text)) = answer {
            return Some((status, text));
        }
        if started.elapsed() >= patience {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The charge id in a final answer: the charge itself (201) or a problem
/// naming it (402).
fn charge_id(status: u16, reply: &str) -> String {
    let value: Value = serde_json::from_str(reply).unwrap();
    let id = if status == 201 {
        &value["id"]
    } else {
        &value["charge_id"]
    };
    id.as_str()
        .unwrap_or_else(|| panic!("no charge id in {reply}"))
        .to_owned()
}

fn count_by_status<'a>(attempts: impl Iterator<Item = &'a Attempt>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for attempt in attempts {
        let label = match &attempt.answer {
            Ok((status, _)) => status.to_string(),
            Err(_) => "no answer".to_owned(),
        };
        *counts.entry(label).or_default() += 1;
    }
    counts
}

/// The service's WARN and ERROR log lines, counted by message.
fn warnings(service: &Spawned) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in service.log() {
        let Some(level) = ["WARN", "ERROR"].into_iter().find(|l| line.contains(l)) else {
            continue;
        };
        // `… LEVEL target: message key=value …`: the message up to its fields.
        let message = line
            .split_once(": ")
            .map_or(line.as_str(), |(_, rest)| rest)
            .split(" kind=")
            .next()
            .unwrap_or_default()
            .split(" error=")
            .next()
            .unwrap_or_default()
            .split(" cause=")
            .next()
            .unwrap_or_default();
        *counts.entry(format!("{level} {message}")).or_default() += 1;
    }
    counts
}

/// Clients sending charges at once, each its keys one after the other.
const CLIENTS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_crashes_under_load_and_the_promoted_standby_takes_over() {
    let test_started = Instant::now();
    let cluster = Cluster::start().await;
    cluster.primary().create_database("chargeonce").await;
    let url = cluster.url("chargeonce", "target_session_attrs=read-write");
    let psp = start_psp_sim().await;
    let mut service = start_service(&url, &psp).await;
    let secret = create_merchant(&url).await;
    let set_up = test_started.elapsed();

    let journal = Arc::new(Journal::default());
    let finals = Arc::new(Mutex::new(Vec::<Final>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let next_key = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (journal, finals, stop, next_key, http, base, secret) = (
                journal.clone(),
                finals.clone(),
                stop.clone(),
                next_key.clone(),
                http.clone(),
                service.url.clone(),
                secret.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let i = next_key.fetch_add(1, Ordering::Relaxed);
                    let i64_i = i64::try_from(i).unwrap();
                    // A unique amount per key, so psp-sim's payments can be
                    // told apart by key; every fifth is declined (…02).
                    let amount = 100_000 + i64_i * 100 + if i % 5 == 4 { 2 } else { 0 };
                    let key = format!("failover-{i}");
                    let body = format!(r#"{{"amount":{amount},"currency":"USD"}}"#);
                    let (status, reply) =
                        charge_until_final(&http, &base, &secret, &key, &body, &journal).await;
                    finals.lock().unwrap().push(Final {
                        key,
                        amount,
                        body,
                        status,
                        reply,
                    });
                }
            })
        })
        .collect();

    // Steady load, then the crash. The standby stays a read-only standby
    // for a second (as while a failover manager makes up its mind), then it
    // is promoted.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let stopped_at = Instant::now();
    cluster.primary().stop_immediate().await;
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(stopped_at.elapsed())).await;
    let promote_at = Instant::now();
    cluster.standby().promote().await;
    let promoted_at = Instant::now();
    let recovered_at = loop {
        if let Some(at) = journal.first_created_sent_after(stopped_at) {
            break at;
        }
        assert!(
            stopped_at.elapsed() < Duration::from_secs(25),
            "no charge succeeded within 25 s of the crash; service log:\n{}",
            service.log().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Load goes on a while on the new primary, then every client finishes
    // the key it is on.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        tokio::time::timeout(Duration::from_secs(45), client)
            .await
            .expect("a client never finished its key")
            .expect("a client panicked");
    }

    let attempts = journal.all();
    let finals = finals.lock().unwrap().clone();
    let before: Vec<_> = attempts
        .iter()
        .filter(|a| a.received < stopped_at)
        .collect();
    let during: Vec<_> = attempts
        .iter()
        .filter(|a| a.received >= stopped_at && a.received < recovered_at)
        .collect();
    let after: Vec<_> = attempts
        .iter()
        .filter(|a| a.received >= recovered_at)
        .collect();
    let ms = |d: Duration| d.as_millis();
    println!(
        "failover: set-up {} ms; {} keys, {} requests; time to recover (crash to first 201 of a \
         request sent after it) {} ms, promotion took {} ms, from promotion {} ms",
        ms(set_up),
        finals.len(),
        attempts.len(),
        ms(recovered_at - stopped_at),
        ms(promoted_at - promote_at),
        ms(recovered_at.saturating_duration_since(promote_at)),
    );
    println!(
        "failover: answers before the crash {:?}",
        count_by_status(before.iter().copied())
    );
    println!(
        "failover: answers while failing over {:?}",
        count_by_status(during.iter().copied())
    );
    println!(
        "failover: answers after {:?}",
        count_by_status(after.iter().copied())
    );
    println!("failover: the service's warnings {:?}", warnings(&service));

    // The service never died and never needed a restart.
    assert!(
        service.child.try_wait().unwrap().is_none(),
        "the service exited"
    );
    assert!(!before.is_empty(), "there was load before the crash");
    // Only answers a client knows to retry, and final ones. No 500, and no
    // request went unanswered.
    let unexpected: Vec<_> = attempts
        .iter()
        .filter(|a| !matches!(a.answer, Ok((201 | 202 | 402 | 409 | 503, _))))
        .map(|a| {
            (
                &a.key,
                a.received.saturating_duration_since(stopped_at),
                &a.answer,
            )
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "unexpected answers: {unexpected:#?}\nservice log:\n{}",
        service.log().join("\n")
    );
    // Every final answer is on the new primary: the same charge, replayed
    // with the same status and bytes; no key has two charges.
    let db = cluster.standby().connect("chargeonce").await;
    let duplicated: i64 = db
        .query_one(
            "SELECT count(*) FROM (SELECT client_idempotency_key FROM charges \
             GROUP BY client_idempotency_key HAVING count(*) > 1) AS twice",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(duplicated, 0, "a key with two charges");
    for answered in &finals {
        let id = charge_id(answered.status, &answered.reply);
        let uuid: uuid::Uuid = id.trim_start_matches("ch_").parse().unwrap();
        let row = db
            .query_opt(
                "SELECT client_idempotency_key, amount, status FROM charges WHERE id = $1",
                &[&uuid],
            )
            .await
            .unwrap()
            .unwrap_or_else(|| {
                panic!(
                    "{} was answered {} with {id}, which the new primary lacks",
                    answered.key, answered.status
                )
            });
        assert_eq!(
            row.get::<_, Option<String>>(0).as_deref(),
            Some(answered.key.as_str())
        );
        assert_eq!(row.get::<_, i64>(1), answered.amount);
        let status: String = row.get(2);
        let expected = if answered.status == 201 {
            "succeeded"
        } else {
            "failed"
        };
        assert_eq!(status, expected, "{}", answered.key);

        let replay = http
            .post(format!("{}/v1/charges", service.url))
            .bearer_auth(&secret)
            .header("Idempotency-Key", &answered.key)
            .header("Content-Type", "application/json")
            .body(answered.body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(
            replay.status().as_u16(),
            answered.status,
            "{}",
            answered.key
        );
        assert_eq!(
            replay
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.to_str().unwrap()),
            Some("true")
        );
        assert_eq!(
            replay.text().await.unwrap(),
            answered.reply,
            "{}",
            answered.key
        );
    }
    // Nothing is left pending (undone inserts are gone or finished).
    let started = Instant::now();
    loop {
        let pending: i64 = db
            .query_one("SELECT count(*) FROM charges WHERE status = 'pending'", &[])
            .await
            .unwrap()
            .get(0);
        if pending == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "{pending} charges stayed pending"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let rows: i64 = db
        .query_one("SELECT count(*) FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows,
        i64::try_from(finals.len()).unwrap(),
        "one charge per key"
    );

    // Nothing was charged twice: one payment per key (told apart by its
    // amount), and each one belongs to a charge on the new primary.
    let payments = psp_payments(&psp).await;
    let mut per_amount: HashMap<i64, usize> = HashMap::new();
    for payment in &payments {
        *per_amount
            .entry(payment["amount"].as_i64().unwrap())
            .or_default() += 1;
    }
    let charged_twice: Vec<_> = per_amount.iter().filter(|(_, &n)| n > 1).collect();
    assert!(charged_twice.is_empty(), "charged twice: {charged_twice:?}");
    for answered in &finals {
        assert_eq!(
            per_amount.get(&answered.amount),
            Some(&1),
            "{}",
            answered.key
        );
    }
    assert_eq!(
        payments.len(),
        finals.len(),
        "a payment without a key: {payments:?}"
    );
    let keys: Vec<String> = db
        .query(
            "SELECT 'chargeonce-' || replace(id::text, '-', '') FROM charges",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    for payment in &payments {
        let key = payment["idempotency_key"].as_str().unwrap();
        assert!(
            keys.iter().any(|k| k == key),
            "payment {key} has no charge on the new primary"
        );
    }

    // Still the same process, and ready.
    let ready = reqwest::get(format!("{}/readyz", service.url))
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    println!("failover: test took {} ms", ms(test_started.elapsed()));
}

/// A charge body with this amount.
fn charge_body(amount: i64) -> String {
    format!(r#"{{"amount":{amount},"currency":"USD"}}"#)
}

/// One attempt, as the journal has it.
async fn post_charge(
    http: &reqwest::Client,
    base: &str,
    secret: &str,
    key: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let journal = Journal::default();
    charge_within(http, base, secret, key, body, &journal, Duration::ZERO).await;
    journal.all().pop().unwrap().answer
}

/// A switchover as an operator does it: the primary is *fenced* first
/// (`default_transaction_read_only`, reloaded: it stays up but refuses
/// every write, on the connections already open too), then the standby is
/// promoted. While fenced, a write fails with SQLSTATE 25006
/// (read_only_sql_transaction): nothing was written, so the client is told
/// 503, not 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_primary_is_a_503_and_the_service_moves_to_the_promoted_standby() {
    let cluster = Cluster::start().await;
    cluster.primary().create_database("chargeonce").await;
    let url = cluster.url("chargeonce", "target_session_attrs=read-write");
    let psp = start_psp_sim().await;
    let service = start_service(&url, &psp).await;
    let secret = create_merchant(&url).await;
    let http = reqwest::Client::new();
    let journal = Journal::default();
    let before = charge_until_final(
        &http,
        &service.url,
        &secret,
        "before",
        &charge_body(1000),
        &journal,
    )
    .await;
    assert_eq!(before.0, 201, "{}", before.1);

    let primary = cluster.primary().connect("postgres").await;
    primary
        .batch_execute("ALTER SYSTEM SET default_transaction_read_only = on")
        .await
        .unwrap();
    primary
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..5 {
        let answer = post_charge(
            &http,
            &service.url,
            &secret,
            &format!("fenced-{i}"),
            &charge_body(2000 + i),
        )
        .await;
        let status = answer.as_ref().map(|(status, _)| *status);
        assert_eq!(
            status,
            Ok(503),
            "{answer:?}\nservice log:\n{}",
            service.log().join("\n")
        );
    }

    // The switchover: the standby is promoted. Connections open on the
    // fenced primary must not be used again; new ones find the new primary.
    cluster.standby().promote().await;
    let promoted_at = Instant::now();
    let after = charge_within(
        &http,
        &service.url,
        &secret,
        "fenced-0",
        &charge_body(2000),
        &journal,
        Duration::from_secs(15),
    )
    .await;
    let Some((status, reply)) = after else {
        panic!(
            "no final answer within 15 s of the promotion: {:?}\nservice log:\n{}",
            count_by_status(journal.all().iter()),
            service.log().join("\n")
        );
    };
    assert_eq!(status, 201, "{reply}");
    println!(
        "switchover: first 201 {} ms after the promotion",
        promoted_at.elapsed().as_millis()
    );
    let id = charge_id(status, &reply);
    let on_new_primary: i64 = cluster
        .standby()
        .connect("chargeonce")
        .await
        .query_one(
            "SELECT count(*) FROM charges WHERE id = $1",
            &[&id.trim_start_matches("ch_").parse::<uuid::Uuid>().unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(on_new_primary, 1);
    // The charge made before the switchover replays from the new primary.
    let replay = post_charge(&http, &service.url, &secret, "before", &charge_body(1000)).await;
    assert_eq!(replay, Ok(before));
}

/// The primary vanishes behind a partition: its connections, open and new,
/// stall without an error (a testkit `Proxy` in front of it, stalled), and
/// the standby is promoted. A connection attempt must not wait on the
/// stalled host for good: the next host in the URL is the new primary. A
/// service started during the partition must get through too (its
/// migrations on start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_primary_is_passed_over_for_the_promoted_standby() {
    let cluster = Cluster::start().await;
    cluster.primary().create_database("chargeonce").await;
    let proxy = Proxy::start(cluster.primary().address()).await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/chargeonce?target_session_attrs=read-write",
        proxy.port,
        cluster.standby().port()
    );
    let psp = start_psp_sim().await;
    let service = start_service(&url, &psp).await;
    let secret = create_merchant(&url).await;
    let http = reqwest::Client::new();
    let journal = Journal::default();
    let before = charge_until_final(
        &http,
        &service.url,
        &secret,
        "before",
        &charge_body(1000),
        &journal,
    )
    .await;
    assert_eq!(before.0, 201, "{}", before.1);

    proxy.set_mode(ProxyMode::Stall);
    cluster.standby().promote().await;
    let promoted_at = Instant::now();
    let after = charge_within(
        &http,
        &service.url,
        &secret,
        "after",
        &charge_body(3000),
        &journal,
        Duration::from_secs(20),
    )
    .await;
    let Some((status, reply)) = after else {
        panic!(
            "no final answer within 20 s of the promotion: {:?}\nservice log:\n{}",
            count_by_status(journal.all().iter()),
            service.log().join("\n")
        );
    };
    assert_eq!(status, 201, "{reply}");
    println!(
        "partition: first 201 {} ms after the promotion; answers {:?}",
        promoted_at.elapsed().as_millis(),
        count_by_status(journal.all().iter())
    );
    let replay = post_charge(&http, &service.url, &secret, "before", &charge_body(1000)).await;
    assert_eq!(replay, Ok(before));

    // A second instance starts (and migrates) with the primary still
    // unreachable.
    let second = start_service(&url, &psp).await;
    let created = charge_until_final(
        &http,
        &second.url,
        &secret,
        "second",
        &charge_body(4000),
        &journal,
    )
    .await;
    assert_eq!(created.0, 201, "{}", created.1);
}

/// A URL that names several hosts without `target_session_attrs`, the
/// standby first (as after a failover, when the old primary's host comes
/// back as a standby and the URL was not changed). chargeonce writes on
/// every request, so it must connect only where it can write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_hosts_without_target_session_attrs_still_lead_to_the_primary() {
    let cluster = Cluster::start().await;
    cluster.primary().create_database("chargeonce").await;
    cluster.wait_for_replay().await;
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/chargeonce",
        cluster.standby().port(),
        cluster.primary().port()
    );
    let psp = start_psp_sim().await;
    let service = start_service(&url, &psp).await;
    let secret = create_merchant(&url).await;
    let http = reqwest::Client::new();
    let journal = Journal::default();
    let created = charge_within(
        &http,
        &service.url,
        &secret,
        "standby-first",
        &charge_body(5000),
        &journal,
        Duration::from_secs(10),
    )
    .await;
    assert_eq!(
        created.as_ref().map(|(status, _)| *status),
        Some(201),
        "{created:?} {:?}",
        count_by_status(journal.all().iter())
    );
}
