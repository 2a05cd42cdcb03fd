//! Refunds: idempotent like charges, and never beyond their charge, even
//! when many clients with different keys race for the same money.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::helpers::{charge_body, spawn_app, spawn_app_with, Reply};
use crate::processes::{start_service, Database};

#[tokio::test]
async fn a_charge_is_refunded_in_parts_and_never_beyond_its_amount() {
    let app = spawn_app().await;
    let created = app.post_charge("order-1", &charge_body(1000)).await;
    let charge = created.json()["id"].as_str().unwrap().to_owned();

    let first = app
        .post_refund(
            &charge,
            "refund-1",
            r#"{"amount":300,"reason":"requested_by_customer","metadata":{"ticket":"7"}}"#,
        )
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    let refund = first.json();
    assert!(refund["id"].as_str().unwrap().starts_with("re_"));
    assert_eq!(refund["object"], "refund");
    assert_eq!(refund["charge"], charge.as_str());
    assert_eq!(refund["amount"], 300);
    assert_eq!(refund["currency"], "USD");
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["reason"], "requested_by_customer");
    assert_eq!(refund["metadata"], json!({"ticket": "7"}));
    assert_eq!(
        first.header("location"),
        Some(format!("/v1/refunds/{}", refund["id"].as_str().unwrap()).as_str())
    );

    let current = app.get(&format!("/v1/charges/{charge}")).await.json();
    assert_eq!(current["amount_refunded"], 300);
    assert_eq!(current["refunded"], false);

    // No amount: what remains.
    let rest = app.post_refund(&charge, "refund-2", "{}").await;
    assert_eq!(rest.status, 201, "{}", rest.body);
    assert_eq!(rest.json()["amount"], 700);
    let current = app.get(&format!("/v1/charges/{charge}")).await.json();
    assert_eq!(current["amount_refunded"], 1000);
    assert_eq!(current["refunded"], true);

    let over = app
        .post_refund(&charge, "refund-3", r#"{"amount":1}"#)
        .await;
    let problem = over.assert_problem(400, "refund_exceeds_charge");
    assert_eq!(problem["refundable_amount"], 0);
    let none_left = app.post_refund(&charge, "refund-4", "{}").await;
    none_left.assert_problem(400, "refund_exceeds_charge");

    // A replay of the charge's creation is still its first answer; GET
    // shows the charge as it is now.
    let replay = app.post_charge("order-1", &charge_body(1000)).await;
    assert_eq!(replay.body, created.body);
    assert_eq!(replay.json()["amount_refunded"], 0);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));

    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'refund.succeeded'")
            .await,
        2
    );
    assert_eq!(app.processor.calls(), 3, "one charge, two refunds");
}

#[tokio::test]
async fn refunds_are_idempotent_in_their_own_key_space() {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("shared-key", 1000).await;
    let other = app.succeeded_charge("other-charge", 500).await;

    // The key of a charge is free for a refund: separate key spaces.
    let first = app
        .post_refund(&charge, "shared-key", r#"{"amount":100}"#)
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    for _ in 0..3 {
        let replay = app
            .post_refund(&charge, "shared-key", r#"{"metadata":{},"amount":100}"#)
            .await;
        assert_eq!(replay.status, 201);
        assert_eq!(replay.body, first.body);
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    }
    app.post_refund(&charge, "shared-key", r#"{"amount":101}"#)
        .await
        .assert_problem(422, "idempotency_key_reused");
    // The same key with the same body on another charge is another request.
    app.post_refund(&other, "shared-key", r#"{"amount":100}"#)
        .await
        .assert_problem(422, "idempotency_key_reused");
    app.post_refund(&charge, "no-key", r#"{"amount":100}"#)
        .await;
    let missing = app
        .http
        .post(format!("{}/v1/charges/{charge}/refunds", app.address))
        .bearer_auth(&app.api_key)
        .header("Content-Type", "application/json")
        .body(r#"{"amount":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);

    let reserved: i64 = app
        .sql()
        .await
        .query_one(
            "SELECT refunds_reserved FROM charges WHERE client_idempotency_key = 'shared-key'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(reserved, 200, "a replay reserves nothing");
}

#[tokio::test]
async fn only_succeeded_charges_can_be_refunded_and_only_ones_own() {
    let app = spawn_app().await;
    let declined = app.post_charge("declined", &charge_body(1002)).await;
    let declined_id = declined.json()["charge_id"].as_str().unwrap().to_owned();
    let problem = app
        .post_refund(&declined_id, "r1", "{}")
        .await
        .assert_problem(400, "charge_not_refundable");
    assert!(
        problem["detail"].as_str().unwrap().contains("failed"),
        "{problem}"
    );

    // The simulated processor times out once on amounts ending in 09: pending.
    let pending = app.post_charge("pending", &charge_body(1009)).await;
    assert_eq!(pending.status, 202);
    let pending_id = pending.json()["id"].as_str().unwrap().to_owned();
    app.post_refund(&pending_id, "r2", "{}")
        .await
        .assert_problem(400, "charge_not_refundable");

    let charge = app.succeeded_charge("mine", 1000).await;
    let stranger = app.create_merchant("Someone else").await;
    app.post_refund_as(&stranger, &charge, "r3", "{}")
        .await
        .assert_problem(404, "not_found");
    app.post_refund("ch_00000000000000000000000000000000", "r4", "{}")
        .await
        .assert_problem(404, "not_found");
    app.post_refund("nonsense", "r5", "{}")
        .await
        .assert_problem(404, "not_found");
    let refund = app
        .post_refund(&charge, "r6", r#"{"amount":10}"#)
        .await
        .json();
    let refund_path = format!("/v1/refunds/{}", refund["id"].as_str().unwrap());
    assert_eq!(app.get(&refund_path).await.status, 200);
    app.get_as(&stranger, &refund_path)
        .await
        .assert_problem(404, "not_found");
    app.get_as(&stranger, &format!("/v1/charges/{charge}/refunds"))
        .await
        .assert_problem(404, "not_found");

    for bad in [
        r#"{"amount":0}"#,
        r#"{"amount":-5}"#,
        r#"{"amount":"5"}"#,
        r#"{"reason":"bored"}"#,
        r#"{"amount":5,"currency":"USD"}"#,
        r#"{"amount":5,"amount":6}"#,
    ] {
        app.post_refund(&charge, "bad", bad)
            .await
            .assert_problem(400, "invalid_request");
    }
}

#[tokio::test]
async fn a_declined_refund_gives_its_amount_back() {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("c", 1000).await;
    // The simulated processor declines refund amounts ending in 02.
    let declined = app
        .post_refund(&charge, "declined", r#"{"amount":502}"#)
        .await;
    let problem = declined.assert_problem(402, "refund_declined");
    assert_eq!(problem["refund"]["status"], "failed");
    assert_eq!(problem["refund_id"], problem["refund"]["id"]);
    let replay = app
        .post_refund(&charge, "declined", r#"{"amount":502}"#)
        .await;
    assert_eq!(replay.body, declined.body);

    let full = app.post_refund(&charge, "full", "{}").await;
    assert_eq!(full.status, 201, "{}", full.body);
    assert_eq!(full.json()["amount"], 1000, "the declined amount came back");
    assert_eq!(
        app.count("SELECT count(*) FROM events WHERE type = 'refund.failed'")
            .await,
        1
    );
}

#[tokio::test]
async fn an_unknown_refund_outcome_is_202_and_a_retry_finishes_it() {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("c", 1000).await;
    let first = app.post_refund(&charge, "slow", r#"{"amount":209}"#).await;
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(first.json()["status"], "pending");
    // Pending counts against the charge: only 791 are left meanwhile.
    app.post_refund(&charge, "too-much", r#"{"amount":792}"#)
        .await
        .assert_problem(400, "refund_exceeds_charge");

    let retry = app.post_refund(&charge, "slow", r#"{"amount":209}"#).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(retry.json()["id"], first.json()["id"]);
    let types: Vec<String> = app
        .sql()
        .await
        .query(
            "SELECT type FROM events WHERE refund_id IS NOT NULL ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(types, ["refund.pending", "refund.succeeded"]);
}

#[tokio::test]
async fn refunds_are_listed_newest_first_per_charge_and_overall() {
    let app = spawn_app().await;
    let a = app.succeeded_charge("a", 1000).await;
    let b = app.succeeded_charge("b", 1000).await;
    let mut ids = Vec::new();
    for (i, charge) in [&a, &b, &a, &b, &a].into_iter().enumerate() {
        let reply = app
            .post_refund(charge, &format!("r{i}"), r#"{"amount":10}"#)
            .await;
        ids.push(reply.json()["id"].as_str().unwrap().to_owned());
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let listed = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let all = app.get("/v1/refunds?limit=3").await.json();
    assert_eq!(
        listed(&all),
        [ids[4].clone(), ids[3].clone(), ids[2].clone()]
    );
    assert_eq!(all["has_more"], true);
    let rest = app
        .get(&format!("/v1/refunds?starting_after={}", ids[2]))
        .await
        .json();
    assert_eq!(listed(&rest), [ids[1].clone(), ids[0].clone()]);
    assert_eq!(rest["has_more"], false);
    let of_a = app.get(&format!("/v1/charges/{a}/refunds")).await.json();
    assert_eq!(
        listed(&of_a),
        [ids[4].clone(), ids[2].clone(), ids[0].clone()]
    );
    app.get("/v1/refunds?starting_after=ch_00000000000000000000000000000000")
        .await
        .assert_problem(400, "invalid_request");
}

/// 50 clients refund 100 each, with 50 different keys, from one charge of
/// 1,000 at the same moment: exactly 10 succeed and 40 are told what is left
/// (nothing), every time, and the charge's books agree with its refunds.
#[tokio::test]
async fn fifty_concurrent_refunds_with_different_keys_never_over_refund() {
    let app = spawn_app_with(|s| {
        s.processor.latency = std::time::Duration::from_millis(5);
        // 50 requests queue for a few connections; on a loaded machine the
        // queue can outlast the 1 s default wait, and a 503 would hide
        // what this test is about.
        s.database.connect_timeout = std::time::Duration::from_secs(10);
    })
    .await;
    for round in 0..20 {
        let charge = app.succeeded_charge(&format!("charge-{round}"), 1000).await;
        let replies: Vec<Reply> = futures_util::future::join_all((0..50).map(|i| {
            let (app, charge) = (&app, &charge);
            async move {
                app.post_refund(charge, &format!("r-{round}-{i}"), r#"{"amount":100}"#)
                    .await
            }
        }))
        .await;
        let mut statuses: HashMap<u16, usize> = HashMap::new();
        for reply in &replies {
            *statuses.entry(reply.status.as_u16()).or_default() += 1;
            if reply.status == 400 {
                assert_eq!(
                    reply.assert_problem(400, "refund_exceeds_charge")["refundable_amount"],
                    0
                );
            }
        }
        assert_eq!(statuses.get(&201), Some(&10), "round {round}: {statuses:?}");
        assert_eq!(statuses.get(&400), Some(&40), "round {round}: {statuses:?}");
    }
    let books = app
        .sql()
        .await
        .query(
            "SELECT c.refunds_reserved, c.amount_refunded, \
                    (SELECT coalesce(sum(amount), 0)::bigint FROM refunds r \
                      WHERE r.merchant_id = c.merchant_id AND r.charge_id = c.id) \
               FROM charges c",
            &[],
        )
        .await
        .unwrap();
    for row in books {
        let (reserved, refunded, sum): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        assert_eq!((reserved, refunded, sum), (1000, 1000, 1000));
    }
}

/// One refund sent five times at once with one key (a double click, a
/// client's eager retry), twenty times over: every copy gets the one
/// refund's answer and nothing else is made. The copies' creation locks the
/// charge before it meets the key; the first copy's outcome holds the key's
/// row and then changes the charge. Taken in those two orders, the locks
/// deadlocked in about half the rounds: PostgreSQL broke each cycle after
/// its `deadlock_timeout` (1 s) by failing one side, so the round took a
/// second and a client could get a 503. Rounds take milliseconds; a round
/// of a second or more is counted as a deadlock, and a slow machine is
/// allowed two of them.
#[tokio::test]
async fn one_refund_sent_at_once_with_one_key_is_made_once() {
    let app = spawn_app_with(|s| {
        s.idempotency.in_flight_wait = Duration::from_secs(10);
    })
    .await;
    let mut took = Vec::new();
    for round in 0..20 {
        let charge = app.succeeded_charge(&format!("charge-{round}"), 5000).await;
        let key = format!("refund-{round}");
        let started = std::time::Instant::now();
        let replies: Vec<Reply> = futures_util::future::join_all(
            (0..5).map(|_| app.post_refund(&charge, &key, r#"{"amount":1000}"#)),
        )
        .await;
        took.push(started.elapsed());
        for reply in &replies {
            assert_eq!(reply.status, 201, "round {round}: {}", reply.body);
            assert_eq!(reply.body, replies[0].body, "round {round}: one answer");
        }
    }
    let stalled = took
        .iter()
        .filter(|t| **t >= Duration::from_secs(1))
        .count();
    assert!(stalled <= 2, "{stalled} rounds stalled: {took:?}");
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 20);
}

/// The same race across two service instances (real processes) sharing one
/// database: PostgreSQL decides, not either instance.
#[tokio::test]
async fn concurrent_refunds_across_two_instances_never_over_refund() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    // As above: a queue of refunds may wait longer than the 1 s default for
    // a connection on a loaded machine.
    let env = [(
        "CHARGEONCE__DATABASE__CONNECT_TIMEOUT_MS",
        "10000".to_owned(),
    )];
    let (a, b) = tokio::join!(start_service(&db.url, &env), start_service(&db.url, &env));
    let http = reqwest::Client::new();
    let post = |base: &str, path: String, key: String, body: &'static str| {
        http.post(format!("{base}{path}"))
            .bearer_auth(&secret)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    for round in 0..20 {
        let charge: Value = post(
            &a.url,
            "/v1/charges".into(),
            format!("c{round}"),
            r#"{"amount":1000,"currency":"USD"}"#,
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let id = charge["id"].as_str().unwrap().to_owned();
        let replies = futures_util::future::join_all((0..50).map(|i| {
            let base = if i % 2 == 0 { &a.url } else { &b.url };
            let request = post(
                base,
                format!("/v1/charges/{id}/refunds"),
                format!("r{round}-{i}"),
                r#"{"amount":100}"#,
            );
            async move {
                let reply = request.await.unwrap();
                let status = reply.status().as_u16();
                (status, reply.json::<Value>().await.unwrap())
            }
        }))
        .await;
        let mut statuses: HashMap<u16, usize> = HashMap::new();
        for (status, body) in &replies {
            *statuses.entry(*status).or_default() += 1;
            if *status == 400 {
                assert_eq!(
                    body["code"], "refund_exceeds_charge",
                    "round {round}: {body}"
                );
                assert_eq!(body["refundable_amount"], 0, "round {round}: {body}");
            }
        }
        assert_eq!(statuses.get(&201), Some(&10), "round {round}: {statuses:?}");
        assert_eq!(statuses.get(&400), Some(&40), "round {round}: {statuses:?}");
    }
    // The books balance: each charge fully reserved and refunded, by
    // exactly the refunds that exist.
    let books = db
        .client()
        .await
        .query(
            "SELECT c.refunds_reserved, c.amount_refunded, \
                    (SELECT coalesce(sum(amount), 0)::bigint FROM refunds r \
                      WHERE r.merchant_id = c.merchant_id AND r.charge_id = c.id), \
                    (SELECT count(*) FROM refunds r \
                      WHERE r.merchant_id = c.merchant_id AND r.charge_id = c.id) \
               FROM charges c",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(books.len(), 20);
    for row in books {
        let books: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
        assert_eq!(books, (1000, 1000, 1000, 10));
    }
}

/// A refund's process dies after the processor refunded, before the outcome
/// was recorded. The client's retry with the same key (or, if the client is
/// gone, the recovery worker) takes the lease over and asks the processor
/// again with the refund's own key: one refund at the processor, recorded
/// once.
#[cfg(feature = "crash-points")]
#[tokio::test]
async fn a_refund_interrupted_by_a_crash_is_finished_once() {
    use crate::processes::{http_processor_env, start_psp_sim};
    use std::time::{Duration, Instant};

    for client_retries in [true, false] {
        let db = Database::migrated().await;
        let secret = db.create_merchant().await;
        let psp = start_psp_sim(&[]).await;
        let mut env = http_processor_env(&psp);
        let interval = if client_retries { "600000" } else { "100" };
        env.push(("CHARGEONCE__RECOVERY__INTERVAL_MS", interval.to_owned()));
        let http = reqwest::Client::new();
        let post = |base: &str, path: String, key: &str, body: &'static str| {
            http.post(format!("{base}{path}"))
                .bearer_auth(&secret)
                .header("Idempotency-Key", key)
                .header("Content-Type", "application/json")
                .body(body)
                .send()
        };
        let service = start_service(&db.url, &env).await;
        let charge: Value = post(
            &service.url,
            "/v1/charges".into(),
            "c",
            r#"{"amount":1000,"currency":"USD"}"#,
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        let path = format!("/v1/charges/{}/refunds", charge["id"].as_str().unwrap());
        drop(service);

        let mut crashing_env = env.clone();
        crashing_env.push(("CHARGEONCE_CRASH_AT", "after_processor_reply".to_owned()));
        let mut crashing = start_service(&db.url, &crashing_env).await;
        assert!(
            post(&crashing.url, path.clone(), "refund", r#"{"amount":400}"#)
                .await
                .is_err()
        );
        assert!(crashing.wait_exit(Duration::from_secs(5)).await.is_some());

        let restarted = start_service(&db.url, &env).await;
        let started = Instant::now();
        if !client_retries {
            // Nobody asks again: the recovery worker alone must finish it.
            let client = db.client().await;
            loop {
                let row = client
                    .query_opt("SELECT status FROM refunds WHERE status <> 'pending'", &[])
                    .await
                    .unwrap();
                if let Some(row) = row {
                    assert_eq!(row.get::<_, String>(0), "succeeded");
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(20),
                    "the recovery worker never finished the refund"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let answer = loop {
            let reply = post(&restarted.url, path.clone(), "refund", r#"{"amount":400}"#)
                .await
                .unwrap();
            if reply.status() != 409 && reply.status() != 202 {
                break reply;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "never finished"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(answer.status(), 201, "client retries: {client_retries}");
        let refunds: Value = reqwest::get(format!("{}/v1/refunds", psp.url))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let refunds = refunds["data"].as_array().unwrap();
        assert_eq!(refunds.len(), 1, "one refund at the processor: {refunds:?}");
        assert!(
            refunds[0]["requests"].as_u64().unwrap() >= 2,
            "asked again after the crash"
        );
        let client = db.client().await;
        let row = client
            .query_one(
                "SELECT refunds_reserved, amount_refunded, \
                        (SELECT count(*) FROM events WHERE type = 'refund.succeeded') \
                   FROM charges",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(
            (
                row.get::<_, i64>(0),
                row.get::<_, i64>(1),
                row.get::<_, i64>(2)
            ),
            (400, 400, 1)
        );
    }
}

/// The undo of a refund insert whose commit was unconfirmed (the 503 path,
/// as for charges): the row goes and its reservation comes back, in one
/// statement; a refund someone already works on is left alone.
#[tokio::test]
async fn undoing_an_unconfirmed_refund_gives_the_reservation_back() {
    use chargeonce::db::refunds::{self, Created};
    use chargeonce::domain::{ChargeId, IdempotencyKey, MerchantId, NewRefund, RefundId};

    let app = spawn_app().await;
    let charge = app.succeeded_charge("c", 1000).await;
    let charge = ChargeId::parse(&charge).unwrap();
    let merchant: uuid::Uuid = app
        .sql()
        .await
        .query_one("SELECT merchant_id FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    let merchant = MerchantId::from_uuid(merchant);
    let conn = app.db.conn().await.unwrap();
    let request = NewRefund::parse(&json!({"amount": 600})).unwrap();
    let create = |id, key: &str| {
        let key = IdempotencyKey::parse(key).unwrap();
        let (conn, request) = (&conn, &request);
        async move {
            refunds::create(
                conn,
                id,
                merchant,
                charge,
                &key,
                &chargeonce::domain::Fingerprint::of(&json!({})),
                request,
                std::time::Duration::from_secs(600),
            )
            .await
            .unwrap()
        }
    };
    let id = RefundId::new();
    assert!(matches!(create(id, "unconfirmed").await, Created::New(_)));
    let reserved = || async { app.count("SELECT refunds_reserved FROM charges").await };
    assert_eq!(reserved().await, 600);
    let forget = |id: RefundId| {
        chargeonce::db::records::forget_unconfirmed::<chargeonce::domain::Refund>(
            &conn,
            merchant,
            *id.as_uuid(),
        )
    };
    assert!(forget(id).await.unwrap());
    assert_eq!(reserved().await, 0);
    assert_eq!(app.count("SELECT count(*) FROM refunds").await, 0);

    // Once a takeover or an attempt touched it, the row stays.
    let id = RefundId::new();
    assert!(matches!(create(id, "worked-on").await, Created::New(_)));
    app.sql()
        .await
        .execute(
            "UPDATE refunds SET updated_at = now() + interval '1 second'",
            &[],
        )
        .await
        .unwrap();
    assert!(!forget(id).await.unwrap());
    assert_eq!(reserved().await, 600);
}

/// A retry of a refund whose first attempt is still at the processor waits
/// `idempotency.in_flight_wait`, then gets 409 with `Retry-After`, as a
/// charge does; the first attempt's answer is the one kept, and the
/// processor is asked once.
#[tokio::test]
async fn a_refund_key_still_in_flight_gets_409_then_the_first_answer() {
    use std::time::{Duration, Instant};

    let app = spawn_app_with(|s| {
        s.processor.latency = Duration::from_millis(1500);
        s.idempotency.in_flight_wait = Duration::from_millis(100);
    })
    .await;
    let charge = app.succeeded_charge("charge", 1000).await;
    let first = {
        let (url, api_key) = (
            format!("{}/v1/charges/{charge}/refunds", app.address),
            app.api_key.clone(),
        );
        tokio::spawn(async move {
            let reply = reqwest::Client::new()
                .post(url)
                .bearer_auth(api_key)
                .header("Idempotency-Key", "busy-refund")
                .header("Content-Type", "application/json")
                .body(r#"{"amount":400}"#)
                .send()
                .await
                .unwrap();
            (reply.status().as_u16(), reply.text().await.unwrap())
        })
    };
    let inserted = Instant::now();
    while app.count("SELECT count(*) FROM refunds").await == 0 {
        assert!(
            inserted.elapsed() < Duration::from_secs(5),
            "never inserted"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let second = app
        .post_refund(&charge, "busy-refund", r#"{"amount":400}"#)
        .await;
    second.assert_problem(409, "idempotency_key_in_use");
    let retry_after: u64 = second.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);

    let (status, body) = first.await.unwrap();
    assert_eq!(status, 201, "{body}");
    let replay = app
        .post_refund(&charge, "busy-refund", r#"{"amount":400}"#)
        .await;
    assert_eq!(replay.status, 201);
    assert_eq!(replay.body, body);
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.processor.calls(), 2, "one charge, one refund");
}

/// The CHECK constraints catch a bug that would break the refund rules,
/// whatever statement it comes from: reserving more than the charge, more
/// refunded than reserved, a refund reserved on a charge that did not
/// succeed.
#[tokio::test]
async fn the_database_refuses_books_that_break_the_refund_rules() {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("charge", 1000).await;
    let uuid = uuid::Uuid::parse_str(charge.trim_start_matches("ch_")).unwrap();
    let sql = app.sql().await;
    for (update, constraint) in [
        (
            "UPDATE charges SET refunds_reserved = amount + 1 WHERE id = $1",
            "charges_refunds_within_amount",
        ),
        (
            "UPDATE charges SET refunds_reserved = 100, amount_refunded = 101 WHERE id = $1",
            "charges_refunded_within_reserved",
        ),
        (
            "UPDATE charges SET refunds_reserved = 100, status = 'failed', \
                    failure_code = 'card_declined', failure_message = 'x' WHERE id = $1",
            "charges_refunds_only_of_succeeded",
        ),
    ] {
        let error = sql.execute(update, &[&uuid]).await.unwrap_err();
        assert_eq!(
            crate::helpers::broken_constraint(&error).as_deref(),
            Some(constraint),
            "{update}: {error:?}"
        );
    }
    // Within the rules the same columns take the values.
    let updated = sql
        .execute(
            "UPDATE charges SET refunds_reserved = 1000, amount_refunded = 400 WHERE id = $1",
            &[&uuid],
        )
        .await
        .unwrap();
    assert_eq!(updated, 1);
}

/// Every rule of a charge, a refund and an event is still refused under its
/// own name, though one CHECK per table checks them all (migration V10),
/// and a rule on an absent value (a NULL customer) passes, as in a CHECK.
#[tokio::test]
async fn each_rule_refuses_a_row_under_its_own_name() {
    let app = spawn_app().await;
    let charge = app.succeeded_charge("rules-charge", 1000).await;
    let refund = app
        .post_refund(&charge, "rules-refund", r#"{"amount":100}"#)
        .await;
    assert_eq!(refund.status, 201, "{}", refund.body);
    let refund = refund.json()["id"].as_str().unwrap().to_owned();
    let charge = uuid::Uuid::parse_str(charge.trim_start_matches("ch_")).unwrap();
    let refund = uuid::Uuid::parse_str(refund.trim_start_matches("re_")).unwrap();
    let sql = app.sql().await;
    for (update, id, rule) in [
        (
            "UPDATE charges SET status = 'done' WHERE id = $1",
            charge,
            "charges_status_valid",
        ),
        (
            "UPDATE charges SET currency = 'usd' WHERE id = $1",
            charge,
            "charges_currency_format",
        ),
        (
            "UPDATE charges SET amount = 0 WHERE id = $1",
            charge,
            "charges_amount_range",
        ),
        (
            "UPDATE charges SET locked_until = now() WHERE id = $1",
            charge,
            "charges_final_has_no_lease",
        ),
        (
            "UPDATE charges SET failure_code = 'card_declined' WHERE id = $1",
            charge,
            "charges_failure_iff_failed",
        ),
        (
            "UPDATE refunds SET reason = 'whim' WHERE id = $1",
            refund,
            "refunds_reason_valid",
        ),
        (
            "UPDATE refunds SET metadata = '[]' WHERE id = $1",
            refund,
            "refunds_metadata_object",
        ),
        (
            "UPDATE events SET type = 'charge.refunded' WHERE charge_id = $1",
            charge,
            "events_type_valid",
        ),
        (
            "UPDATE events SET type = 'refund.succeeded' WHERE charge_id = $1",
            charge,
            "events_about_its_object",
        ),
    ] {
        let error = sql.execute(update, &[&id]).await.unwrap_err();
        assert_eq!(
            crate::helpers::broken_constraint(&error).as_deref(),
            Some(rule),
            "{update}: {error:?}"
        );
    }
    let updated = sql
        .execute(
            "UPDATE charges SET customer = NULL, description = NULL WHERE id = $1",
            &[&charge],
        )
        .await
        .unwrap();
    assert_eq!(updated, 1);
}

/// A refund whose COMMIT outlives the statement deadline: the request
/// answers 503 ("nothing was processed") while PostgreSQL commits the row
/// a moment later. That row is undone as soon as it can be seen, so it is
/// never refunded by the recovery worker, its reservation comes back, and
/// the client's retry is a fresh refund.
#[tokio::test]
async fn a_refund_whose_commit_was_unconfirmed_is_undone_so_503_stays_true() {
    if crate::helpers::skipped_on_citus(
        "a_refund_whose_commit_was_unconfirmed_is_undone_so_503_stays_true",
        "it slows one commit with a deferred trigger, and Citus has no triggers on \
         distributed tables; the first pass covers the undo",
    )
    .await
    {
        return;
    }
    const LEASE: Duration = Duration::from_millis(3000);
    let app = spawn_app_with(|s| {
        s.database.query_timeout = Duration::from_millis(500);
        s.idempotency.lease = LEASE;
        s.recovery.interval = Duration::from_millis(100);
    })
    .await;
    let charge = app.succeeded_charge("paid", 1000).await;
    let warm = app.post_refund(&charge, "warm", r#"{"amount":100}"#).await;
    assert_eq!(warm.status, 201, "{}", warm.body);
    // The ghost's COMMIT takes 1.5 s (a deferred trigger), three times the
    // deadline; nothing interrupts it when the client gives up.
    app.sql()
        .await
        .batch_execute(
            "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
               $$BEGIN IF NEW.client_idempotency_key = 'ghost' THEN PERFORM pg_sleep(1.5); END IF; \
                 RETURN NULL; END$$; \
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON refunds \
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();",
        )
        .await
        .unwrap();

    app.post_refund(&charge, "ghost", r#"{"amount":200}"#)
        .await
        .assert_problem(503, "service_unavailable");
    // Past the landed row's lease and many recovery rounds.
    tokio::time::sleep(LEASE + Duration::from_millis(2000)).await;
    let sql = app.sql().await;
    let ghosts = sql
        .query_one(
            "SELECT count(*) FROM refunds WHERE client_idempotency_key = 'ghost'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(ghosts, 0, "the unconfirmed refund was kept");
    let books = sql
        .query_one("SELECT refunds_reserved, amount_refunded FROM charges", &[])
        .await
        .unwrap();
    assert_eq!((books.get::<_, i64>(0), books.get::<_, i64>(1)), (100, 100));

    sql.batch_execute("DROP TRIGGER slow_commit ON refunds")
        .await
        .unwrap();
    let retry = app.post_refund(&charge, "ghost", r#"{"amount":200}"#).await;
    assert_eq!(retry.status, 201, "{}", retry.body);
    assert_eq!(retry.header("idempotent-replayed"), None);
}
