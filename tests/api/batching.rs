//! Batching across requests (`chargeonce::db::batch`): batches form only
//! under load, each request keeps the answer it would have had alone, and a
//! failed batch fails only the requests it holds.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chargeonce::db::batch::{BatchStatement, Batcher};
use chargeonce::db::charges::{self, PendingCharge};
use chargeonce::db::records;
use chargeonce::db::{Conn, DbError, Statement};
use chargeonce::domain::{
    Charge, ChargeId, Fingerprint, IdempotencyKey, MerchantId, NewCharge, Outcome, Status,
};
use futures_util::future::join_all;
use serde_json::json;
use tokio_postgres::types::Type;

use crate::helpers::{charge_body, spawn_app, spawn_app_with, Reply, TestApp};

/// Inserts numbers into a table of the test's own, slowly enough (50 ms a
/// statement) that requests queue behind a running batch, and records the
/// size of every batch it ran and the most statements it had running at
/// once. A number 0 kills the connection the statement runs on, an error of
/// the database itself; `PANICS` makes the statement panic once it ran (a
/// bug in a batch's task).
///
/// Numbers from 1000 on belong to another merchant than those below.
struct InsertNumbers {
    sizes: Arc<Mutex<Vec<usize>>>,
    batches: Arc<Mutex<Vec<Vec<i32>>>>,
    running: AtomicUsize,
    most_at_once: Arc<AtomicUsize>,
}

/// The number whose statement panics.
const PANICS: i32 = 4242;

const INSERT_NUMBERS: Statement = Statement {
    sql: "WITH slow AS (SELECT pg_sleep(0.05)), \
               doomed AS (SELECT pg_terminate_backend(pg_backend_pid()) \
                           WHERE 0 = ANY($1)) \
          INSERT INTO numbers (n) \
          SELECT n FROM unnest($1::int4[]) AS n, slow \
           WHERE NOT EXISTS (SELECT FROM doomed)",
    params: &[Type::INT4_ARRAY],
};

#[async_trait]
impl BatchStatement for InsertNumbers {
    type Item = i32;
    type Output = i32;

    fn name(&self) -> &'static str {
        "test.insert_numbers"
    }

    fn merchant(&self, n: &i32) -> MerchantId {
        MerchantId::from_uuid(uuid::Uuid::from_u128(u128::from(*n >= 1000)))
    }

    async fn run(&self, conn: &Conn, items: &[i32]) -> Result<Vec<i32>, DbError> {
        self.sizes.lock().unwrap().push(items.len());
        self.batches.lock().unwrap().push(items.to_vec());
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_at_once.fetch_max(now, Ordering::SeqCst);
        let items = items.to_vec();
        let inserted = conn.execute(&INSERT_NUMBERS, &[&items]).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        inserted?;
        assert!(!items.contains(&PANICS), "a statement that panics");
        Ok(items)
    }
}

/// A batcher over `numbers (n int CHECK (n > 0))`: at most `max_rows` a
/// batch, one batch at a time.
async fn numbers_batcher(
    app: &TestApp,
    max_rows: usize,
) -> (Batcher<InsertNumbers>, Arc<Mutex<Vec<usize>>>) {
    let (batcher, sizes, _) = counted_numbers_batcher(app, max_rows, 1).await;
    (batcher, sizes)
}

/// The same, at most `max_in_flight` batches at a time, with the most
/// statements that ran at once.
async fn counted_numbers_batcher(
    app: &TestApp,
    max_rows: usize,
    max_in_flight: usize,
) -> (
    Batcher<InsertNumbers>,
    Arc<Mutex<Vec<usize>>>,
    Arc<AtomicUsize>,
) {
    app.sql()
        .await
        .batch_execute("CREATE TABLE numbers (n int NOT NULL CHECK (n > 0))")
        .await
        .unwrap();
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let most_at_once = Arc::new(AtomicUsize::new(0));
    let statement = InsertNumbers {
        sizes: sizes.clone(),
        batches: Arc::default(),
        running: AtomicUsize::new(0),
        most_at_once: most_at_once.clone(),
    };
    (
        Batcher::with_limits(app.db.clone(), statement, max_rows, max_in_flight),
        sizes,
        most_at_once,
    )
}

/// Runs `first` and, once its statement has begun (so it holds the one
/// slot), `queued` all at once: they wait behind it and go as one batch.
async fn behind_a_running_batch(
    batcher: &Batcher<InsertNumbers>,
    sizes: &Mutex<Vec<usize>>,
    first: i32,
    queued: &[i32],
) -> (Result<i32, DbError>, Vec<Result<i32, DbError>>) {
    let running = tokio::spawn({
        let batcher = batcher.clone();
        async move { batcher.run(first).await }
    });
    while sizes.lock().unwrap().is_empty() {
        tokio::task::yield_now().await;
    }
    let queued = join_all(queued.iter().map(|&n| batcher.run(n))).await;
    (running.await.unwrap(), queued)
}

async fn stored_numbers(app: &TestApp) -> HashSet<i32> {
    app.sql()
        .await
        .query("SELECT n FROM numbers", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test]
async fn a_request_alone_goes_alone_and_batches_grow_only_under_load() {
    let app = spawn_app().await;
    let (batcher, sizes) = numbers_batcher(&app, 8).await;

    assert_eq!(batcher.run(1).await.unwrap(), 1);
    assert_eq!(
        *sizes.lock().unwrap(),
        [1],
        "a lone request waits for nobody"
    );

    // 20 at once: the first starts a batch alone, the others queue behind
    // it and go in batches of at most 8.
    let answers = join_all((2..22).map(|n| batcher.run(n))).await;
    for (n, answer) in (2..22).zip(answers) {
        assert_eq!(answer.unwrap(), n, "each request gets its own answer");
    }
    let sizes = sizes.lock().unwrap().clone();
    assert_eq!(sizes.iter().sum::<usize>(), 21, "{sizes:?}");
    assert!(sizes.iter().all(|&size| size <= 8), "{sizes:?}");
    assert!(
        sizes.len() <= 5,
        "requests that queued shared statements: {sizes:?}"
    );
    assert_eq!(stored_numbers(&app).await, (1..22).collect());
}

/// A batch holds one merchant's requests: those of another merchant that
/// queued meanwhile wait for the next batch, in their order. (On a database
/// distributed by merchant, a batch's statement then runs on one shard.)
#[tokio::test]
async fn a_batch_holds_the_requests_of_one_merchant() {
    let app = spawn_app().await;
    app.sql()
        .await
        .batch_execute("CREATE TABLE numbers (n int NOT NULL CHECK (n > 0))")
        .await
        .unwrap();
    let (sizes, batches) = (Arc::default(), Arc::new(Mutex::new(Vec::new())));
    let statement = InsertNumbers {
        sizes: Arc::clone(&sizes),
        batches: batches.clone(),
        running: AtomicUsize::new(0),
        most_at_once: Arc::default(),
    };
    let batcher = Batcher::with_limits(app.db.clone(), statement, 8, 1);
    let (first, queued) = behind_a_running_batch(&batcher, &sizes, 1, &[2, 1001, 3, 1002, 4]).await;
    assert_eq!(first.unwrap(), 1);
    let queued: Vec<i32> = queued.into_iter().map(Result::unwrap).collect();
    assert_eq!(queued, [2, 1001, 3, 1002, 4], "each request its own answer");
    assert_eq!(
        *batches.lock().unwrap(),
        [vec![1], vec![2, 3, 4], vec![1001, 1002]]
    );
}

#[tokio::test]
async fn no_more_batches_run_at_once_than_there_are_slots() {
    for slots in [1, 2] {
        let app = spawn_app().await;
        let (batcher, sizes, most_at_once) = counted_numbers_batcher(&app, 4, slots).await;
        let answers = join_all((1..21).map(|n| batcher.run(n))).await;
        assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        assert_eq!(
            most_at_once.load(Ordering::SeqCst),
            slots,
            "20 requests at once with {slots} slot(s): batches {:?}",
            sizes.lock().unwrap()
        );
    }
}

#[tokio::test]
async fn a_batch_task_that_panics_loses_its_batch_only_and_frees_its_slot() {
    let app = spawn_app().await;
    let (batcher, sizes) = numbers_batcher(&app, 8).await;

    // PANICS holds the one slot, 5 and 6 queue behind it; its task panics.
    let (first, queued) = tokio::time::timeout(
        Duration::from_secs(10),
        behind_a_running_batch(&batcher, &sizes, PANICS, &[5, 6]),
    )
    .await
    .expect("the requests queued behind the panicked batch are answered");
    let lost = first.unwrap_err();
    assert!(matches!(lost, DbError::BatchLost), "{lost:?}");
    let queued: Vec<i32> = queued.into_iter().map(Result::unwrap).collect();
    assert_eq!(queued, [5, 6]);

    // The slot is free again: a request alone goes at once.
    let alone = tokio::time::timeout(Duration::from_secs(10), batcher.run(8)).await;
    assert_eq!(alone.expect("the slot was freed").unwrap(), 8);
    assert_eq!(*sizes.lock().unwrap(), [1, 2, 1]);
}

/// A panicking batch with nobody queued behind it has no one to pass its
/// slot to: it frees the slot, and the next requests go at once.
#[tokio::test]
async fn a_lone_batch_task_that_panics_frees_its_slot() {
    let app = spawn_app().await;
    let (batcher, sizes) = numbers_batcher(&app, 8).await;

    let lost = tokio::time::timeout(Duration::from_secs(10), batcher.run(PANICS))
        .await
        .expect("the panicked batch's request is answered")
        .unwrap_err();
    assert!(matches!(lost, DbError::BatchLost), "{lost:?}");
    // Let the panicked task finish unwinding, so the slot is freed with an
    // empty queue (the case under test), not handed to a waiting request.
    tokio::time::sleep(Duration::from_millis(100)).await;

    for n in [8, 9] {
        let alone = tokio::time::timeout(Duration::from_secs(10), batcher.run(n)).await;
        assert_eq!(alone.expect("the slot was freed").unwrap(), n);
    }
    assert_eq!(*sizes.lock().unwrap(), [1, 1, 1]);
}

#[tokio::test]
async fn a_row_the_database_refuses_fails_only_its_own_request() {
    let app = spawn_app().await;
    let (batcher, sizes) = numbers_batcher(&app, 8).await;

    // 100 holds the one slot while the others queue into one batch.
    let (first, queued) = behind_a_running_batch(&batcher, &sizes, 100, &[5, -1, 7, 9]).await;
    assert_eq!(first.unwrap(), 100);
    let [five, minus_one, seven, nine]: [Result<i32, DbError>; 4] = queued.try_into().unwrap();
    assert_eq!(five.unwrap(), 5);
    assert_eq!(seven.unwrap(), 7);
    assert_eq!(nine.unwrap(), 9);
    let refused = minus_one.unwrap_err();
    assert!(
        matches!(refused, DbError::Query(ref e) if e.code() == Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)),
        "the refused row gets the error it would have had alone: {refused:?}"
    );
    assert_eq!(
        *sizes.lock().unwrap(),
        [1, 4, 1, 1, 1, 1],
        "the failed batch went again row by row"
    );
    assert_eq!(stored_numbers(&app).await, HashSet::from([100, 5, 7, 9]));
}

#[tokio::test]
async fn a_database_failure_reaches_every_request_of_the_batch_and_stores_none() {
    let app = spawn_app().await;
    let (batcher, sizes) = numbers_batcher(&app, 8).await;

    let (first, queued) = behind_a_running_batch(&batcher, &sizes, 100, &[5, 0, 7]).await;
    assert_eq!(first.unwrap(), 100);
    for answer in queued {
        let error = answer.unwrap_err();
        assert!(matches!(error, DbError::Batch(_)), "{error:?}");
        assert!(
            error.is_transient(),
            "a lost connection: retry later ({error:?})"
        );
    }
    assert_eq!(*sizes.lock().unwrap(), [1, 3], "not retried row by row");
    assert_eq!(stored_numbers(&app).await, HashSet::from([100]));

    // The batcher goes on working on a new connection.
    assert_eq!(batcher.run(8).await.unwrap(), 8);
}

async fn merchant_of(app: &TestApp) -> MerchantId {
    let id: uuid::Uuid = app
        .sql()
        .await
        .query_one("SELECT id FROM merchants", &[])
        .await
        .unwrap()
        .get(0);
    MerchantId::from_uuid(id)
}

fn pending(merchant: MerchantId, key: &str, amount: i64) -> PendingCharge {
    let body = json!({"amount": amount, "currency": "USD"});
    PendingCharge {
        id: ChargeId::new(),
        merchant,
        key: IdempotencyKey::parse(key).unwrap(),
        fingerprint: Fingerprint::of(&body),
        request: NewCharge::parse(&body).unwrap(),
    }
}

/// Pending charges of `merchant`, one per key (amounts 100, 200, …),
/// inserted in one `charges::insert_or_find_many`, in the keys' order.
async fn created_pending(conn: &Conn, merchant: MerchantId, keys: &[&str]) -> Vec<Charge> {
    let items: Vec<PendingCharge> = (1..)
        .zip(keys)
        .map(|(n, key)| pending(merchant, key, 100 * n))
        .collect();
    charges::insert_or_find_many(conn, &items, Duration::from_secs(30))
        .await
        .unwrap()
        .into_iter()
        .map(|answer| answer.unwrap().0)
        .collect()
}

#[tokio::test]
async fn duplicate_keys_in_one_statement_make_one_charge() {
    let app = spawn_app().await;
    let merchant = merchant_of(&app).await;
    let lease = Duration::from_secs(30);
    let conn = app.db.conn().await.unwrap();

    let items = [
        pending(merchant, "key-b", 100),
        pending(merchant, "key-a", 200),
        pending(merchant, "key-b", 300),
    ];
    let answers = charges::insert_or_find_many(&conn, &items, lease)
        .await
        .unwrap();
    let [b, a, b_again]: [(chargeonce::domain::Charge, bool); 3] = answers
        .into_iter()
        .map(|answer| answer.expect("a charge for every item"))
        .collect::<Vec<_>>()
        .try_into()
        .unwrap();
    assert!(b.1 && a.1, "the first of each key is inserted");
    assert_eq!(b.0.id, items[0].id);
    assert_eq!(a.0.id, items[1].id);
    assert!(!b_again.1, "the duplicate finds the first one's charge");
    assert_eq!(b_again.0.id, b.0.id);
    assert_eq!(
        b_again.0.fingerprint, items[0].fingerprint,
        "so the service sees a different body (422)"
    );
    assert_eq!(app.charge_rows().await, 2);

    // A later statement finds the stored charge for a taken key.
    let items = [
        pending(merchant, "key-a", 200),
        pending(merchant, "key-c", 400),
    ];
    let answers = charges::insert_or_find_many(&conn, &items, lease)
        .await
        .unwrap();
    let (found, created) = answers[0].clone().unwrap();
    assert!(!created);
    assert_eq!(found.id, a.0.id);
    assert!(answers[1].as_ref().unwrap().1);
    assert_eq!(app.charge_rows().await, 3);
}

/// A key taken by a charge that commits while the statement waits for it
/// (on the unique index) is invisible to the statement's own read, which
/// began before that commit. The item is looked up again alone, so it still
/// gets the charge in this call, not created, and so does a duplicate of it
/// in the same batch.
#[tokio::test]
async fn a_key_committed_while_the_statement_waits_is_found_in_the_same_call() {
    let app = spawn_app().await;
    let merchant = merchant_of(&app).await;
    let other = app.sql().await;
    other.batch_execute("BEGIN").await.unwrap();
    let earlier = ChargeId::new();
    other
        .execute(
            "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                  amount, currency, status) \
             VALUES ($1, $2, 'raced', sha256('x'), 100, 'USD', 'succeeded')",
            &[earlier.as_uuid(), merchant.as_uuid()],
        )
        .await
        .unwrap();

    let conn = app.db.conn().await.unwrap();
    let items = [
        pending(merchant, "raced", 100),
        pending(merchant, "fresh", 200),
        pending(merchant, "raced", 100),
    ];
    let call = charges::insert_or_find_many(&conn, &items, Duration::from_secs(30));
    let commit = async {
        // Long enough for the statement to be waiting on the index.
        tokio::time::sleep(Duration::from_millis(300)).await;
        other.batch_execute("COMMIT").await.unwrap();
    };
    let (answers, ()) = tokio::join!(call, commit);
    let answers = answers.unwrap();
    let raced = answers[0].clone().expect("the raced key's charge");
    assert_eq!((raced.0.id, raced.1), (earlier, false));
    let again = answers[2].clone().expect("the duplicate's charge");
    assert_eq!((again.0.id, again.1), (earlier, false));
    assert!(answers[1].as_ref().expect("the fresh key").1);
    assert_eq!(app.charge_rows().await, 2);
}

/// The undo of an unconfirmed insert says whether it deleted the row: the
/// service's undo task stops looking only when it has. A row someone has
/// worked on since its insert (a takeover, an attempt) stays, and a row
/// already gone is not deleted twice.
#[tokio::test]
async fn undoing_an_unconfirmed_insert_says_whether_it_deleted_the_row() {
    let app = spawn_app().await;
    let merchant = merchant_of(&app).await;
    let conn = app.db.conn().await.unwrap();
    let items = [
        pending(merchant, "undone", 100),
        pending(merchant, "kept", 200),
    ];
    charges::insert_or_find_many(&conn, &items, Duration::from_secs(30))
        .await
        .unwrap();
    let [undone, kept] = [items[0].id, items[1].id];
    app.sql()
        .await
        .execute(
            "UPDATE charges SET updated_at = now() + interval '1 second' WHERE id = $1",
            &[kept.as_uuid()],
        )
        .await
        .unwrap();

    let forget =
        |id: ChargeId| records::forget_unconfirmed::<Charge>(&conn, merchant, *id.as_uuid());
    assert!(forget(undone).await.unwrap());
    assert!(!forget(undone).await.unwrap());
    assert!(!forget(kept).await.unwrap());
    assert_eq!(app.charge_rows().await, 1);
}

/// The idempotency contract through HTTP while batches form: many requests
/// at once on a pool small enough that they queue, each key sent twice with
/// the same body and once with another.
#[tokio::test]
async fn concurrent_requests_in_batches_keep_their_answers() {
    let app = spawn_app_with(|s| {
        s.database.pool_size = 4;
        s.database.batch_rows = 64;
    })
    .await;
    let keys: Vec<String> = (0..20).map(|i| format!("batched-{i}")).collect();
    let requests = keys.iter().enumerate().flat_map(|(i, key)| {
        let amount = 1000 + i as i64 * 10;
        [
            (key.clone(), amount),
            (key.clone(), amount),
            (key.clone(), amount + 1),
        ]
    });
    let answers = join_all(requests.map(|(key, amount)| {
        let app = &app;
        async move {
            let reply = app.post_charge(&key, &charge_body(amount)).await;
            (key, amount, reply)
        }
    }))
    .await;

    // Per key, whichever body reached the database first owns the key: its
    // requests all answer with one charge (or 409 while it is in flight),
    // the other body's get 422.
    let mut by_key: HashMap<&str, Vec<(i64, &Reply)>> = HashMap::new();
    for (key, amount, reply) in &answers {
        by_key.entry(key).or_default().push((*amount, reply));
    }
    for (key, replies) in by_key {
        let owners: HashSet<i64> = replies
            .iter()
            .filter(|(_, reply)| reply.status != 422)
            .map(|(amount, _)| *amount)
            .collect();
        assert_eq!(owners.len(), 1, "{key}: one body owns the key: {replies:?}");
        let mut ids = HashSet::new();
        for (amount, reply) in &replies {
            if !owners.contains(amount) {
                reply.assert_problem(422, "idempotency_key_reused");
                continue;
            }
            match reply.status.as_u16() {
                201 => {
                    ids.insert(reply.json()["id"].as_str().unwrap().to_owned());
                }
                409 => {
                    reply.assert_problem(409, "idempotency_key_in_use");
                }
                other => panic!("{key}: {other} {}", reply.body),
            }
        }
        assert!(ids.len() <= 1, "{key}: one charge per key: {ids:?}");
    }
    assert_eq!(app.charge_rows().await, 20);
    assert_eq!(app.processor.calls(), 20, "one payment per key");
}

fn succeeded(processor_id: &str) -> Outcome {
    Outcome::Succeeded {
        processor_id: processor_id.to_owned(),
    }
}

/// Outcomes of several charges in one transaction (`records::record_outcomes`):
/// each pending charge takes its own outcome and one event; a charge that
/// is final already, the second mention of a charge named twice and a
/// charge named with another merchant take none, and answer `None` as they
/// would alone.
#[tokio::test]
async fn outcomes_in_one_transaction_each_record_their_own() {
    let app = spawn_app().await;
    let merchant = merchant_of(&app).await;
    let conn = app.db.conn().await.unwrap();
    let created = created_pending(
        &conn,
        merchant,
        &["outcome-1", "outcome-2", "outcome-3", "outcome-4"],
    )
    .await;
    let [first, second, done, foreign] = <[Charge; 4]>::try_from(created).unwrap();
    let alone = records::record_outcomes(&conn, &[(done.clone(), succeeded("pay_done"))])
        .await
        .unwrap();
    assert_eq!(alone[0].as_ref().unwrap().status, Status::Succeeded);
    let mut other_merchant = foreign.clone();
    other_merchant.merchant_id = MerchantId::new();

    let declined = Outcome::Declined {
        processor_id: Some("pay_2".to_owned()),
        code: "card_declined".to_owned(),
        message: "The card was declined.".to_owned(),
    };
    let answers = records::record_outcomes(
        &conn,
        &[
            (first.clone(), succeeded("pay_1")),
            (second.clone(), declined),
            (done.clone(), succeeded("pay_again")),
            (first.clone(), succeeded("pay_twice")),
            (other_merchant, succeeded("pay_foreign")),
        ],
    )
    .await
    .unwrap();
    assert_eq!(answers.len(), 5, "an answer per item");
    let recorded = answers[0].as_ref().expect("the first is recorded");
    assert_eq!(recorded.id, first.id);
    assert_eq!(recorded.status, Status::Succeeded);
    assert_eq!(recorded.processor_payment_id.as_deref(), Some("pay_1"));
    assert_eq!(recorded.lease.locked_until, None);
    let failed = answers[1].as_ref().expect("the second is recorded");
    assert_eq!(failed.id, second.id);
    assert_eq!(failed.status, Status::Failed);
    assert_eq!(failed.failure_code.as_deref(), Some("card_declined"));
    assert_eq!(failed.processor_payment_id.as_deref(), Some("pay_2"));
    assert!(answers[2].is_none(), "a final charge keeps its outcome");
    assert!(answers[3].is_none(), "a charge named twice takes the first");
    assert!(
        answers[4].is_none(),
        "a charge is found by its merchant too"
    );

    let sql = app.sql().await;
    let rows = sql
        .query(
            "SELECT c.client_idempotency_key, c.status, c.processor_payment_id, \
                    array_agg(e.type ORDER BY e.id), array_agg(e.data->>'status' ORDER BY e.id) \
               FROM charges c \
               JOIN events e ON e.merchant_id = c.merchant_id AND e.charge_id = c.id \
              GROUP BY c.id, c.client_idempotency_key, c.status, c.processor_payment_id \
              ORDER BY c.client_idempotency_key",
            &[],
        )
        .await
        .unwrap();
    // Key, status, payment id, then its events' types and statuses.
    type Stored = (String, String, Option<String>, Vec<String>, Vec<String>);
    let stored: Vec<Stored> = rows
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4)))
        .collect();
    let row = |key: &str, status: &str, payment: &str, event: &str| {
        (
            key.to_owned(),
            status.to_owned(),
            Some(payment.to_owned()),
            vec![event.to_owned()],
            vec![status.to_owned()],
        )
    };
    assert_eq!(
        stored,
        [
            row("outcome-1", "succeeded", "pay_1", "charge.succeeded"),
            row("outcome-2", "failed", "pay_2", "charge.failed"),
            row("outcome-3", "succeeded", "pay_done", "charge.succeeded"),
        ],
        "one event per recorded outcome, with the charge as recorded"
    );
    let pending: i64 = sql
        .query_one(
            "SELECT count(*) FROM charges WHERE status = 'pending' AND id = $1",
            &[foreign.id.as_uuid()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(pending, 1, "the foreign merchant's item changed nothing");
}

/// A charge that another transaction changes while a batch of outcomes
/// waits for its lock (a takeover once the lease ran out, say) still takes
/// the outcome, as it would alone: its statement sees the charge as that
/// transaction left it, pending still. The rest of the batch is recorded as
/// usual.
#[tokio::test]
async fn a_charge_changed_while_the_batch_waits_for_it_still_takes_its_outcome() {
    let app = spawn_app().await;
    let merchant = merchant_of(&app).await;
    let conn = app.db.conn().await.unwrap();
    let created = created_pending(&conn, merchant, &["waited-1", "waited-2"]).await;
    let [taken, other] = <[Charge; 2]>::try_from(created).unwrap();

    let sql = app.sql().await;
    sql.batch_execute("BEGIN").await.unwrap();
    sql.execute(
        "UPDATE charges SET locked_until = now() + interval '60 seconds', updated_at = now() \
          WHERE id = $1",
        &[taken.id.as_uuid()],
    )
    .await
    .unwrap();
    let batch = {
        let outcomes = [
            (taken.clone(), succeeded("pay_taken")),
            (other.clone(), succeeded("pay_other")),
        ];
        let conn = app.db.conn().await.unwrap();
        tokio::spawn(async move { records::record_outcomes(&conn, &outcomes).await })
    };
    // From another session: `sql`'s open transaction sees one snapshot of
    // the activity. On Citus the batch waits on a worker, whose sessions
    // citus_stat_activity shows.
    let activity = if chargeonce_testkit::on_citus().await {
        "citus_stat_activity"
    } else {
        "pg_stat_activity"
    };
    let waiting = crate::plans::count_reaching(
        &app.sql().await,
        &format!(
            "SELECT count(*) FROM {activity} \
              WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ),
        &[],
        1,
        Duration::from_secs(10),
    )
    .await;
    assert!(waiting >= 1, "the batch never waited for the lock");
    sql.batch_execute("COMMIT").await.unwrap();

    let answers = batch.await.unwrap().unwrap();
    for (answer, (charge, payment)) in answers
        .iter()
        .zip([(&taken, "pay_taken"), (&other, "pay_other")])
    {
        let recorded = answer.as_ref().expect("each charge takes its outcome");
        assert_eq!(recorded.id, charge.id);
        assert_eq!(recorded.status, Status::Succeeded);
        assert_eq!(recorded.processor_payment_id.as_deref(), Some(payment));
    }
    let events = app
        .count("SELECT count(*) FROM events WHERE type = 'charge.succeeded'")
        .await;
    assert_eq!(events, 2, "one event per charge");
}
