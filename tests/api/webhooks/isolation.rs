//! No merchant can slow down another's webhooks: a merchant at its cap of
//! endpoints, all dead, or over it from before the cap existed, or with
//! hanging receivers, or with an event whose fan-out fails, leaves the
//! other merchants' events delivered at their usual pace, in one instance
//! and across two.

use std::time::{Duration, Instant};

use chargeonce::config::Settings;
use serde_json::{json, Value};

use super::{dispatcher_env, event_ids};
use crate::helpers::{charge_body, skipped_on_citus, spawn_app_with, through_pgbouncer, TestApp};
use crate::processes::{start_service, Database, Process};
use crate::webhook_receiver::{create_endpoint, post_endpoint, Answer, Hung, Received, Receiver};

/// Quick rounds and retries; the breaker's pauses short.
fn quick(settings: &mut Settings) {
    settings.webhooks.interval = Duration::from_millis(50);
    settings.webhooks.backoff_base = Duration::from_millis(200);
    settings.webhooks.max_backoff = Duration::from_secs(1);
}

/// The charge a delivered event is about.
fn charge_of(received: &Received) -> String {
    received.json()["data"]["object"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The most another merchant's event may take to arrive while one merchant
/// floods its endpoints: 2 s on one PostgreSQL. On Citus every statement is
/// a few round trips between three PostgreSQL servers that share the test
/// machine's cores with the service, so the bound is 6 s there: alone, the
/// red team's flood measured 0.9-1.4 s and the backlog behind an open
/// breaker 0.3 s, and CI's Citus pass runs the rest of the suite beside
/// them. (Before the dispatcher held a tripped endpoint's backlog back in
/// bulk, the flood took 4.5-8 s on Citus: its own deliveries, held back one
/// a round, filled the claim's window ahead of the other merchant's.)
async fn other_merchants_bound() -> Duration {
    if chargeonce_testkit::on_citus().await {
        Duration::from_secs(6)
    } else {
        Duration::from_secs(2)
    }
}

/// How long after its charge was answered each charge's event arrived at
/// `receiver`, waiting up to `limit` for all of them; the slowest first.
async fn latencies(
    receiver: &Receiver,
    charges: &[(String, Instant)],
    limit: Duration,
) -> Vec<Duration> {
    let received = receiver
        .wait_until("every charge's event", limit, |received| {
            charges
                .iter()
                .all(|(id, _)| received.iter().any(|r| charge_of(r) == *id))
        })
        .await;
    let mut latencies: Vec<Duration> = charges
        .iter()
        .map(|(id, answered)| {
            let arrived = received
                .iter()
                .filter(|r| charge_of(r) == *id)
                .map(|r| r.at)
                .min()
                .unwrap();
            arrived.saturating_duration_since(*answered)
        })
        .collect();
    latencies.sort_unstable_by(|a, b| b.cmp(a));
    latencies
}

/// A succeeded charge of the app's merchant; its id and when it was
/// answered.
async fn charge_now(app: &TestApp, key: &str) -> (String, Instant) {
    let reply = app.post_charge(key, &charge_body(100)).await;
    assert_eq!(reply.status, 201, "{}", reply.body);
    (
        reply.json()["id"].as_str().unwrap().to_owned(),
        Instant::now(),
    )
}

/// `count` succeeded charges of the app's merchant, `apart` from each
/// other; their ids and when each was answered.
async fn charges_apart(app: &TestApp, count: usize, apart: Duration) -> Vec<(String, Instant)> {
    let mut charges = Vec::new();
    for n in 0..count {
        charges.push(charge_now(app, &format!("a-{n}")).await);
        tokio::time::sleep(apart).await;
    }
    charges
}

/// `count` declined charges of the merchant whose key is `api_key`: a
/// `charge.failed` event each.
async fn decline(app: &TestApp, api_key: &str, count: usize) {
    for n in 0..count {
        let declined = app
            .post_charge_as(api_key, &format!("b-{n}"), &charge_body(102))
            .await;
        assert_eq!(declined.status, 402, "{}", declined.body);
    }
}

async fn deliveries_of(app: &TestApp, merchant_name: &str) -> i64 {
    app.sql()
        .await
        .query_one(
            "SELECT count(*) FROM webhook_deliveries d JOIN merchants m ON m.id = d.merchant_id \
              WHERE m.name = $1",
            &[&merchant_name],
        )
        .await
        .unwrap()
        .get(0)
}

/// The red team's sequence: merchant B at its cap of endpoints (the 17th
/// is refused), every one wanting `charge.failed` and pointed at a closed
/// port, makes 100 declined charges, with merchant A's 5 charges among
/// them. A's events arrive within 2 s of their charges; all of B's 1,600
/// deliveries are created within 30 s. Before, B could create 3,000
/// endpoints, and the fan-out of its events, 300,000 rows in one
/// statement, timed out round after round with A's events behind them.
#[tokio::test]
async fn a_merchant_at_its_cap_with_dead_endpoints_holds_up_no_other_merchant() {
    let app = spawn_app_with(quick).await;
    let a = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &a.url, None).await;
    let b = app.create_merchant("B").await;
    for n in 0..16 {
        let url = format!("http://127.0.0.1:9/b/{n}");
        create_endpoint(&app.address, &b, &url, Some(&["charge.failed"])).await;
    }
    let seventeenth = json!({"url": "http://127.0.0.1:9/b/16", "event_types": ["charge.failed"]});
    let (status, _, answer) =
        post_endpoint(&app.address, &b, "b-17", &seventeenth.to_string()).await;
    assert_eq!(status, 400, "{answer}");

    let started = Instant::now();
    let mut charges = Vec::new();
    for n in 0..100 {
        let declined = app
            .post_charge_as(&b, &format!("b-{n}"), &charge_body(102))
            .await;
        assert_eq!(declined.status, 402, "{}", declined.body);
        if n % 20 == 10 {
            charges.push(charge_now(&app, &format!("a-{n}")).await);
        }
    }
    let slowest = latencies(&a, &charges, Duration::from_secs(30)).await;
    println!("A's events arrived within {slowest:?} of their charges");
    assert!(
        slowest[0] < other_merchants_bound().await,
        "A's events took {slowest:?}"
    );
    while deliveries_of(&app, "B").await < 1600 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "B's deliveries: {} of 1600 after 30 s",
            deliveries_of(&app, "B").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("B's 1600 deliveries created within {:?}", started.elapsed());
}

/// A merchant that has more endpoints than the cap from before it existed
/// (1,000, put in the table directly) gets deliveries to its first 16 per
/// event, each event's in one statement: the fan-out never inserts more
/// rows than the cap, and another merchant's events go on at once.
#[tokio::test]
async fn no_fan_out_statement_inserts_more_rows_than_the_cap() {
    let app = spawn_app_with(quick).await;
    let a = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &a.url, None).await;
    let b = app.create_merchant("B").await;
    app.sql()
        .await
        .batch_execute(
            "INSERT INTO webhook_endpoints (id, merchant_id, url, secret, request_fingerprint, slot) \
             SELECT gen_random_uuid(), m.id, 'http://127.0.0.1:9/b/' || n, \
                    'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', sha256(n::text::bytea), n \
               FROM merchants m, generate_series(1, 1000) n WHERE m.name = 'B'",
        )
        .await
        .unwrap();
    let mut charges = Vec::new();
    for n in 0..50 {
        let declined = app
            .post_charge_as(&b, &format!("b-{n}"), &charge_body(102))
            .await;
        assert_eq!(declined.status, 402);
        if n % 10 == 5 {
            charges.push(charge_now(&app, &format!("a-{n}")).await);
        }
    }
    let slowest = latencies(&a, &charges, Duration::from_secs(30)).await;
    assert!(
        slowest[0] < other_merchants_bound().await,
        "A's events took {slowest:?}"
    );
    let started = Instant::now();
    while app.count("SELECT count(*) FROM event_queue").await > 0 {
        assert!(started.elapsed() < Duration::from_secs(30), "still queued");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_event: Vec<i64> = app
        .sql()
        .await
        .query(
            "SELECT count(*) FROM webhook_deliveries d JOIN merchants m ON m.id = d.merchant_id \
              WHERE m.name = 'B' GROUP BY d.event_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(per_event, vec![16; 50]);
    // The first 16 by slot.
    assert_eq!(
        app.count(
            "SELECT count(DISTINCT d.endpoint_id) FROM webhook_deliveries d \
               JOIN webhook_endpoints e ON e.id = d.endpoint_id AND e.merchant_id = d.merchant_id \
              WHERE e.slot <= 16"
        )
        .await,
        17,
        "A's endpoint and B's first 16"
    );
}

/// A backlog of 2,000 due deliveries behind one endpoint that takes no
/// attempts (put in the table directly, as a dispatcher that was away finds
/// the deliveries of an endpoint that went dead meanwhile) holds up no other
/// merchant, and is settled in bulk: none of it is attempted, and none of
/// it is due any more within `other_merchants_bound`. Before, the claim's
/// window filled with the backlog and it was settled a few deliveries a
/// round (the endpoint's share), every later delivery behind it: A's
/// events took about a second on one PostgreSQL (0.6 ms a round) and the
/// backlog was still due when they arrived. Now the rest of the window is
/// settled in the same round, by one statement for the merchant: 0.1-0.2 s
/// here, 0.3 s on Citus.
#[tokio::test]
async fn a_backlog_behind_an_open_breaker_holds_up_no_other_merchant() {
    let (app, merchant) = backlog_behind(
        "UPDATE webhook_endpoints \
            SET consecutive_failures = 5, failing_since = now(), \
                retry_at = now() + interval '1 hour' \
          WHERE merchant_id = $1",
    )
    .await;
    let held = "SELECT count(*) FROM webhook_deliveries \
                 WHERE merchant_id = $1 AND status = 'pending' AND attempts = 0 \
                   AND next_attempt_at > now() + interval '50 minutes'";
    assert_eq!(
        count_of(&app, held, merchant).await,
        2001,
        "held back, none attempted"
    );
}

/// The same behind a disabled endpoint: the backlog is given up in bulk.
#[tokio::test]
async fn a_backlog_behind_a_disabled_endpoint_holds_up_no_other_merchant() {
    let (app, merchant) =
        backlog_behind("UPDATE webhook_endpoints SET disabled_at = now() WHERE merchant_id = $1")
            .await;
    let given_up = "SELECT count(*) FROM webhook_deliveries \
                     WHERE merchant_id = $1 AND status = 'failed' AND attempts = 0 \
                       AND last_error = 'the endpoint was disabled'";
    assert_eq!(
        count_of(&app, given_up, merchant).await,
        2001,
        "given up, none attempted"
    );
}

/// Merchant B's endpoint, closed by `close` (run with B's id), with 2,001
/// due deliveries; then A's five charges, whose events must arrive within
/// `other_merchants_bound`, as must the moment none of B's deliveries is
/// due any more.
async fn backlog_behind(close: &str) -> (TestApp, uuid::Uuid) {
    let app = spawn_app_with(quick).await;
    let a = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &a.url, None).await;
    let merchant = backlog_of_b(&app, ("http://127.0.0.1:9/b", 1), close, 2000).await;
    let started = Instant::now();
    a_events_arrive_in_time(&app, &a).await;
    let due = "SELECT count(*) FROM webhook_deliveries \
                WHERE merchant_id = $1 AND status = 'pending' AND next_attempt_at <= now()";
    let bound = other_merchants_bound().await;
    while count_of(&app, due, merchant).await > 0 {
        assert!(started.elapsed() < bound, "B's backlog is not settled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("B's backlog settled within {:?}", started.elapsed());
    (app, merchant)
}

/// Merchant B, with `endpoints` endpoints at `url` first changed by `close`
/// (run with B's id), and `copies` + 1 due deliveries to each, put in the
/// table directly, as a dispatcher that was away finds them. B's id.
async fn backlog_of_b(
    app: &TestApp,
    (url, endpoints): (&str, usize),
    close: &str,
    copies: i32,
) -> uuid::Uuid {
    let b = app.create_merchant("B").await;
    // B's one real charge, made while B has no endpoint, is the backlog's
    // template: each copy gets an event and a delivery to B's endpoint.
    let declined = app.post_charge_as(&b, "b-0", &charge_body(102)).await;
    assert_eq!(declined.status, 402, "{}", declined.body);
    for _ in 0..endpoints {
        create_endpoint(&app.address, &b, url, None).await;
    }
    let sql = app.sql().await;
    let merchant: uuid::Uuid = sql
        .query_one("SELECT id FROM merchants WHERE name = 'B'", &[])
        .await
        .unwrap()
        .get(0);
    sql.execute(close, &[&merchant]).await.unwrap();
    sql.execute(
        "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                              amount, currency, customer, description, metadata, status, \
                              failure_code, failure_message, processor_payment_id, \
                              processor_attempts) \
         SELECT gen_random_uuid(), merchant_id, 'copy-' || n, request_fingerprint, amount, \
                currency, customer, description, metadata, status, failure_code, \
                failure_message, processor_payment_id, processor_attempts \
           FROM charges, generate_series(1, $2) n WHERE merchant_id = $1",
        &[&merchant, &copies],
    )
    .await
    .unwrap();
    let mut created = 0;
    for statement in [
        "INSERT INTO events (id, merchant_id, charge_id, type, data) \
         SELECT gen_random_uuid(), merchant_id, id, 'charge.failed', '{}' FROM charges \
          WHERE merchant_id = $1 AND client_idempotency_key LIKE 'copy-%'",
        "INSERT INTO webhook_deliveries (id, merchant_id, event_id, endpoint_id, status, \
                                         next_attempt_at) \
         SELECT gen_random_uuid(), ev.merchant_id, ev.id, e.id, 'pending', \
                now() - interval '1 minute' \
           FROM events ev JOIN webhook_endpoints e ON e.merchant_id = ev.merchant_id \
          WHERE ev.merchant_id = $1",
    ] {
        created = sql.execute(statement, &[&merchant]).await.unwrap();
    }
    // Counted as the statement made them, due: the dispatcher is running and
    // may take some of them before a later count.
    let expected = (u64::try_from(copies).unwrap() + 1) * endpoints as u64;
    assert_eq!(created, expected, "B's due deliveries");
    merchant
}

/// The app's merchant's five charges, 100 ms apart, whose events must reach
/// `a` within `other_merchants_bound`.
async fn a_events_arrive_in_time(app: &TestApp, a: &Receiver) {
    let charges = charges_apart(app, 5, Duration::from_millis(100)).await;
    let slowest = latencies(a, &charges, Duration::from_secs(60)).await;
    println!("A's events arrived within {slowest:?} of their charges");
    assert!(
        slowest[0] < other_merchants_bound().await,
        "A's events took {slowest:?}"
    );
}

/// A backlog of 10,000 due deliveries to 16 healthy endpoints holds up no
/// other merchant: A's events arrive within `other_merchants_bound` while
/// most of B's backlog is still due. B's deliveries end within moments and
/// each frees a slot of B's, so B is seldom at its share when the claim
/// reads, and its backlog, due before A's events, filled every window.
/// With the rounds on a connection of their own but before the claim read
/// on past the merchants of a full window, A's events waited for all of
/// B's backlog on Citus, where a round takes longer than one of B's
/// deliveries: 50 s. (Before both, rounds slowed by B's records found B
/// at its share often enough: 0.5 s on Citus. On one PostgreSQL rounds are
/// quicker, and A's took 0.1 s either way.)
#[tokio::test]
async fn a_backlog_to_a_healthy_endpoint_holds_up_no_other_merchant() {
    let app = spawn_app_with(quick).await;
    let a = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &a.url, None).await;
    let b = Receiver::start().await;
    // More endpoints than B's share needs: B's share binds, not theirs.
    let merchant = backlog_of_b(&app, (&b.url, 16), "SELECT $1::uuid", 624).await;
    a_events_arrive_in_time(&app, &a).await;
    let due = "SELECT count(*) FROM webhook_deliveries \
                WHERE merchant_id = $1 AND status = 'pending' AND next_attempt_at <= now()";
    let left = count_of(&app, due, merchant).await;
    println!(
        "B's backlog: {left} of 10,000 still due; B's receiver took {}",
        b.received().len()
    );
    assert!(
        left > 0,
        "B's backlog was drained before A's events arrived"
    );
}

/// `query`'s count, with the merchant as `$1`.
async fn count_of(app: &TestApp, query: &str, merchant: uuid::Uuid) -> i64 {
    let sql = app.sql().await;
    sql.query_one(query, &[&merchant])
        .await
        .expect(query)
        .get(0)
}

/// The poison for the fan-out: a delivery of an event about a charge
/// described as `poison` fails to insert (`how`: at once, or after
/// sleeping past the dispatcher's statement timeout).
async fn poison_fan_out(client: &tokio_postgres::Client, how: &str) {
    client
        .batch_execute(&format!(
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN \
               IF EXISTS (SELECT 1 FROM events WHERE id = NEW.event_id \
                            AND data ->> 'description' = 'poison') THEN \
                 {how}; \
               END IF; \
               RETURN NEW; \
             END $$; \
             CREATE TRIGGER poison BEFORE INSERT ON webhook_deliveries \
               FOR EACH ROW EXECUTE FUNCTION poison();"
        ))
        .await
        .unwrap();
}

const POISON: &str = r#"{"amount":100,"currency":"USD","description":"poison"}"#;

/// The queue row of the poisoned event: (failures, set aside for now, last
/// error).
async fn poisoned(client: &tokio_postgres::Client) -> Option<(i32, bool, Option<String>)> {
    client
        .query_opt(
            "SELECT q.attempts, q.next_attempt_at > now(), q.last_error FROM event_queue q \
               JOIN events e ON e.id = q.event_id AND e.merchant_id = q.merchant_id \
              WHERE e.data ->> 'description' = 'poison'",
            &[],
        )
        .await
        .unwrap()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
}

/// An event whose fan-out fails (here a trigger refuses its deliveries) is
/// set aside, counted, and tried again later, while the events queued with
/// it, before and after it in the same batch, are delivered. Before, the
/// whole batch failed round after round and nothing behind it went out.
#[tokio::test]
async fn an_event_whose_fan_out_fails_is_set_aside_and_the_others_go_on() {
    if skipped_on_citus(
        "an_event_whose_fan_out_fails_is_set_aside_and_the_others_go_on",
        "it poisons one event's fan-out with a trigger that reads the event, and Citus \
         has no triggers on distributed tables; the first pass covers setting it aside",
    )
    .await
    {
        return;
    }
    let app = spawn_app_with(|s| {
        quick(s);
        // Rounds far enough apart that the charges below queue up together.
        s.webhooks.interval = Duration::from_millis(1500);
        s.webhooks.backoff_base = Duration::from_millis(100);
        s.webhooks.max_backoff = Duration::from_millis(300);
    })
    .await;
    let receiver = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &receiver.url, None).await;
    let sql = app.sql().await;
    poison_fan_out(&sql, "RAISE EXCEPTION 'poisoned by the test'").await;
    let set_aside = || async {
        crate::observability::sample(
            &crate::observability::scrape(&app).await,
            "chargeonce_webhook_events_set_aside_total",
            &[],
        )
    };
    let before = set_aside().await;
    for n in 0..10 {
        assert_eq!(
            app.post_charge(&format!("before-{n}"), &charge_body(100))
                .await
                .status,
            201
        );
    }
    assert_eq!(app.post_charge("poison", POISON).await.status, 201);
    for n in 0..10 {
        assert_eq!(
            app.post_charge(&format!("after-{n}"), &charge_body(100))
                .await
                .status,
            201
        );
    }
    receiver
        .wait_until("the 20 good events", Duration::from_secs(15), |r| {
            r.len() >= 20
        })
        .await;
    let (failures, waiting, error) = poisoned(&sql).await.expect("the poisoned event is queued");
    assert!(failures >= 1 && waiting, "{failures} {waiting}");
    assert!(
        error
            .as_deref()
            .unwrap_or("")
            .contains("poisoned by the test"),
        "{error:?}"
    );
    assert!(set_aside().await >= before + 1.0);
    assert!(receiver
        .received()
        .iter()
        .all(|r| r.json()["data"]["object"]["description"] != "poison"));

    // Once the cause is gone, the event is tried again and delivered.
    sql.batch_execute("DROP TRIGGER poison ON webhook_deliveries")
        .await
        .unwrap();
    receiver
        .wait_until("the poisoned event, later", Duration::from_secs(15), |r| {
            r.iter()
                .any(|r| r.json()["data"]["object"]["description"] == "poison")
        })
        .await;
    assert_eq!(receiver.received().len(), 21);
}

/// The same with an event whose fan-out does not fail but hangs: the
/// dispatcher's statements run under a server-side timeout shorter than its
/// client deadline, so the batch holding it fails cleanly (its locks
/// released at once), is tried again in halves, and the event, alone, is
/// set aside; the real binary logs it with its id.
#[tokio::test]
async fn an_event_whose_fan_out_times_out_is_set_aside_and_logged_with_its_id() {
    if skipped_on_citus(
        "an_event_whose_fan_out_times_out_is_set_aside_and_logged_with_its_id",
        "it poisons one event's fan-out with a trigger that reads the event, and Citus \
         has no triggers on distributed tables; the first pass covers setting it aside",
    )
    .await
    {
        return;
    }
    let db = Database::migrated().await;
    let client = db.client().await;
    // Behind PgBouncer the service sends no statement timeout of its own:
    // the database's holds, set before PgBouncer opens a connection to it.
    if through_pgbouncer().is_some() {
        client
            .batch_execute(&format!(
                "ALTER DATABASE \"{}\" SET statement_timeout = '750ms'",
                db.name
            ))
            .await
            .unwrap();
    }
    let secret = db.create_merchant().await;
    poison_fan_out(&client, "PERFORM pg_sleep(30)").await;
    let receiver = Receiver::start().await;
    let mut env = dispatcher_env(2000);
    env.extend([
        ("CHARGEONCE__DATABASE__QUERY_TIMEOUT_MS", "1000".to_owned()),
        ("CHARGEONCE__WEBHOOKS__INTERVAL_MS", "1000".to_owned()),
        ("RUST_LOG", "info".to_owned()),
    ]);
    let service = start_service(&db.url, &env).await;
    create_endpoint(&service.url, &secret, &receiver.url, None).await;
    let http = reqwest::Client::new();
    let charge = |key: String, body: &'static str| {
        http.post(format!("{}/v1/charges", service.url))
            .bearer_auth(&secret)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    for n in 0..6 {
        assert_eq!(
            charge(format!("before-{n}"), r#"{"amount":100,"currency":"USD"}"#)
                .await
                .unwrap()
                .status(),
            201
        );
    }
    assert_eq!(charge("poison".into(), POISON).await.unwrap().status(), 201);
    for n in 0..6 {
        assert_eq!(
            charge(format!("after-{n}"), r#"{"amount":100,"currency":"USD"}"#)
                .await
                .unwrap()
                .status(),
            201
        );
    }
    receiver
        .wait_until("the 12 good events", Duration::from_secs(30), |r| {
            r.len() >= 12
        })
        .await;
    let poisoned_id: uuid::Uuid = client
        .query_one(
            "SELECT id FROM events WHERE data ->> 'description' = 'poison'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let event = format!("evt_{}", poisoned_id.simple());
    service
        .wait_for_line(Duration::from_secs(10), |line| {
            line.contains("set aside") && line.contains(&event)
        })
        .await;
    let (failures, waiting, error) = poisoned(&client).await.expect("still queued");
    assert!(failures >= 1 && waiting, "{failures} {waiting}");
    assert!(
        error.as_deref().unwrap_or("").contains("statement timeout"),
        "{error:?}"
    );
    assert_eq!(event_ids(&db).await.len(), 13);
}

/// Hanging receivers hold the slots of their own merchant only. Merchant B
/// has 16 endpoints whose receivers accept and never answer, and 40
/// declined charges (640 deliveries, each held for the 3 s timeout);
/// merchant A's events reach its healthy receiver within 1 s, every one of
/// them, while B's deliveries go on at their own pace, never more than
/// `webhooks.max_in_flight_per_endpoint` (4) at once per endpoint. Before,
/// B's deliveries took every slot and A's waited seconds.
#[tokio::test]
async fn hanging_receivers_delay_only_their_own_merchant() {
    let app = spawn_app_with(|s| {
        quick(s);
        s.webhooks.timeout = Duration::from_secs(3);
    })
    .await;
    let a = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &a.url, None).await;
    let b = app.create_merchant("B").await;
    let mut hung = Vec::new();
    for _ in 0..16 {
        let endpoint = Hung::start().await;
        create_endpoint(&app.address, &b, &endpoint.url, Some(&["charge.failed"])).await;
        hung.push(endpoint);
    }
    decline(&app, &b, 40).await;
    // B's receivers are holding deliveries.
    let started = Instant::now();
    while hung.iter().map(|h| h.counts().open).sum::<usize>() < 32 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "B's deliveries never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let charges = charges_apart(&app, 20, Duration::from_millis(150)).await;
    let slowest = latencies(&a, &charges, Duration::from_secs(30)).await;
    let accepted: usize = hung.iter().map(|h| h.counts().accepted).sum();
    println!("A's latency, slowest first: {slowest:?}; B's receivers took {accepted} requests");
    assert!(
        slowest[0] < Duration::from_secs(1),
        "A's p99 latency: {:?}",
        slowest[0]
    );
    for endpoint in &hung {
        assert!(endpoint.counts().most_open <= 4, "{:?}", endpoint.counts());
    }
    // B's backlog moves: past the first wave of attempts.
    let started = Instant::now();
    while hung.iter().map(|h| h.counts().accepted).sum::<usize>() <= 64 {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "B's deliveries stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A merchant whose attempts are slow to record holds up no other
/// merchant's events. Merchant B's two endpoints answer 500 at once, and
/// their rows are locked for about 3 s (as a long change of them would
/// hold them): each of B's failed attempts then waits for its circuit
/// breaker's update, up to the dispatcher's statement timeout, holding a
/// connection, 8 at a time. Merchant A's events must still arrive within
/// 1 s, each once (55 ms here). Before, B's waiting updates took all of the
/// dispatcher's connections and A's events waited for the lock (2.6 s);
/// with a connection of the rounds' own but not `fair::RecordTurns`, A's
/// attempts waited behind B's to be recorded, holding A's endpoint's share
/// of 4 deliveries in flight (2.1 s).
#[tokio::test]
async fn attempts_slow_to_record_delay_only_their_own_merchant() {
    let app = spawn_app_with(quick).await;
    let a = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &a.url, None).await;
    let b = app.create_merchant("B").await;
    let mut failing = Vec::new();
    for _ in 0..2 {
        let receiver = Receiver::start().await;
        receiver.otherwise(Answer::Status(500));
        create_endpoint(&app.address, &b, &receiver.url, Some(&["charge.failed"])).await;
        failing.push(receiver);
    }
    let lock = app.sql().await;
    let merchant: uuid::Uuid = lock
        .query_one("SELECT id FROM merchants WHERE name = 'B'", &[])
        .await
        .unwrap()
        .get(0);
    // The lock an UPDATE of the rows takes: the deliveries' foreign keys
    // and the claims' reads of the endpoints pass it; the breakers wait.
    lock.batch_execute("BEGIN").await.unwrap();
    let locked = lock
        .execute(
            "SELECT 1 FROM webhook_endpoints WHERE merchant_id = $1 FOR NO KEY UPDATE",
            &[&merchant],
        )
        .await
        .unwrap();
    assert_eq!(locked, 2);
    decline(&app, &b, 40).await;
    let started = Instant::now();
    while failing.iter().map(|r| r.received().len()).sum::<usize>() < 8 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "B's attempts never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let charges = charges_apart(&app, 20, Duration::from_millis(150)).await;
    lock.batch_execute("ROLLBACK").await.unwrap();
    let slowest = latencies(&a, &charges, Duration::from_secs(30)).await;
    let attempts: usize = failing.iter().map(|r| r.received().len()).sum();
    println!("A's latency, slowest first: {slowest:?}; B's receivers took {attempts} requests");
    assert!(
        slowest[0] < Duration::from_secs(1),
        "A's slowest event: {:?}",
        slowest[0]
    );
    assert_eq!(a.received().len(), charges.len(), "A's events, each once");
}

/// The same across two instances of the real binary: merchant A's events
/// arrive within 2 s whichever instance serves them, while B's 16 hanging
/// endpoints hold deliveries on both.
#[tokio::test]
async fn hanging_receivers_delay_only_their_own_merchant_across_two_instances() {
    let db = Database::migrated().await;
    let a_secret = db.create_merchant().await;
    let b_secret = db.create_merchant().await;
    let env = dispatcher_env(3000);
    let first = start_service(&db.url, &env).await;
    let second = start_service(&db.url, &env).await;
    let a = Receiver::start().await;
    create_endpoint(&first.url, &a_secret, &a.url, None).await;
    let mut hung = Vec::new();
    for _ in 0..16 {
        let endpoint = Hung::start().await;
        create_endpoint(
            &second.url,
            &b_secret,
            &endpoint.url,
            Some(&["charge.failed"]),
        )
        .await;
        hung.push(endpoint);
    }
    let declined_charges = |service: &Process, from: usize| {
        let (url, secret) = (service.url.clone(), b_secret.clone());
        async move {
            let http = reqwest::Client::new();
            for n in from..from + 20 {
                let status = http
                    .post(format!("{url}/v1/charges"))
                    .bearer_auth(&secret)
                    .header("Idempotency-Key", format!("b-{n}"))
                    .header("Content-Type", "application/json")
                    .body(charge_body(102))
                    .send()
                    .await
                    .unwrap()
                    .status();
                assert_eq!(status, 402);
            }
        }
    };
    declined_charges(&first, 0).await;
    declined_charges(&second, 20).await;
    let started = Instant::now();
    while hung.iter().map(|h| h.counts().open).sum::<usize>() < 64 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "B's deliveries never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let http = reqwest::Client::new();
    let mut charges = Vec::new();
    for n in 0..20 {
        let service = if n % 2 == 0 { &first } else { &second };
        let reply = http
            .post(format!("{}/v1/charges", service.url))
            .bearer_auth(&a_secret)
            .header("Idempotency-Key", format!("a-{n}"))
            .header("Content-Type", "application/json")
            .body(charge_body(100))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 201);
        let charge: Value = reply.json().await.unwrap();
        charges.push((charge["id"].as_str().unwrap().to_owned(), Instant::now()));
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let slowest = latencies(&a, &charges, Duration::from_secs(30)).await;
    println!("two instances: A's latency, slowest first: {slowest:?}");
    // 2 s, not the single instance's 1 s: two binaries and PostgreSQL (on
    // CI also Citus's three nodes) share two cores, and a stall of the
    // machine delays A's first few events together (seen: 1.37 s, then
    // 0.97 and falling). Without the isolation A's median was 6.6 s.
    assert!(
        slowest[0] < Duration::from_secs(2),
        "A's p99 latency: {:?}",
        slowest[0]
    );
    // Each instance holds at most 4 per endpoint.
    for endpoint in &hung {
        assert!(endpoint.counts().most_open <= 8, "{:?}", endpoint.counts());
    }
    // A's events were delivered once each.
    assert!(a.arrivals().values().all(|&n| n == 1), "{:?}", a.arrivals());
}
