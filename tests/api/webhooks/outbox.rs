//! The outbox's rows: an event is written once and never rewritten by the
//! fan-out; retention deletes old events once they are done with.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{fast, NOWHERE};
use crate::helpers::{charge_body, spawn_app_with};
use crate::webhook_receiver::{create_endpoint, delete_endpoint, Receiver};

#[tokio::test]
async fn retention_deletes_old_delivered_events_and_keeps_the_rest() {
    let app = spawn_app_with(|s| {
        s.events.retention_days = 1;
        s.events.sweep_interval = Duration::from_millis(100);
        // The dispatcher sleeps: the rows below are set up by hand.
        s.webhooks.interval = Duration::from_secs(3600);
    })
    .await;
    let endpoint = create_endpoint(&app.address, &app.api_key, NOWHERE, None).await;
    let endpoint_id = Uuid::parse_str(&endpoint["id"].as_str().unwrap()[3..]).unwrap();
    let mut charges = Vec::new();
    for i in 0..3 {
        let charge = app
            .post_charge(&format!("c-{i}"), &charge_body(100))
            .await
            .json();
        charges.push(Uuid::parse_str(&charge["id"].as_str().unwrap()[3..]).unwrap());
    }
    // The three charges' own events are recent; one is delivered.
    let sql = app.sql().await;
    let recent_delivered: Uuid = sql
        .query_one(
            "DELETE FROM event_queue \
              WHERE event_id = (SELECT id FROM events ORDER BY id DESC LIMIT 1) \
              RETURNING event_id",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    let two_days_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 48 * 3600;
    // An event enters the queue with the statement that writes it; a
    // dispatched one has left it again.
    let old_event = |charge: Uuid, event_type: &str, dispatched: bool| {
        let id = Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, two_days_ago, 0));
        let sql = &sql;
        let event_type = event_type.to_owned();
        async move {
            sql.execute(
                "INSERT INTO events (id, merchant_id, charge_id, type, data, created_at) \
                 SELECT $1, id, $2, $3, '{}', now() - interval '2 days' FROM merchants",
                &[&id, &charge, &event_type],
            )
            .await
            .unwrap();
            if !dispatched {
                sql.execute(
                    "INSERT INTO event_queue (event_id, merchant_id, type) \
                     SELECT $1, id, $2 FROM merchants",
                    &[&id, &event_type],
                )
                .await
                .unwrap();
            }
            id
        }
    };
    let delivery = |event: Uuid, status: &str| {
        let sql = &sql;
        let status = status.to_owned();
        async move {
            let id = Uuid::new_v4();
            sql.execute(
                "INSERT INTO webhook_deliveries (id, merchant_id, event_id, endpoint_id, status, \
                                                 attempts, next_attempt_at) \
                 SELECT $1, id, $2, $3, $4, 1, now() + interval '1 hour' FROM merchants",
                &[&id, &event, &endpoint_id, &status],
            )
            .await
            .unwrap();
            sql.execute(
                "INSERT INTO webhook_attempts (id, merchant_id, delivery_id, attempt, status_code, \
                                               duration_ms) \
                 SELECT $1, id, $2, 1, 500, 3 FROM merchants",
                &[&Uuid::now_v7(), &id],
            )
            .await
            .unwrap();
        }
    };
    // One transaction: the sweep (every 100 ms) sees these rows at once,
    // never an old event whose delivery is yet to come (it deleted one
    // before its attempt was added: a foreign key error).
    sql.batch_execute("BEGIN").await.unwrap();
    let old_delivered = old_event(charges[0], "charge.pending", true).await;
    delivery(old_delivered, "delivered").await;
    let old_failed = old_event(charges[0], "charge.failed", true).await;
    delivery(old_failed, "failed").await;
    let old_without_endpoints = old_event(charges[1], "charge.pending", true).await;
    let old_pending = old_event(charges[1], "charge.failed", true).await;
    delivery(old_pending, "pending").await;
    let old_undispatched = old_event(charges[2], "charge.pending", false).await;
    delivery(recent_delivered, "delivered").await;
    sql.batch_execute("COMMIT").await.unwrap();

    let gone = [old_delivered, old_failed, old_without_endpoints];
    let started = Instant::now();
    loop {
        let left: i64 = sql
            .query_one(
                "SELECT count(*) FROM events WHERE id = ANY ($1)",
                &[&&gone[..]],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the sweep never deleted the delivered old events"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Their deliveries and attempts went with them; everything else stays.
    let kept: Vec<Uuid> = sql
        .query("SELECT id FROM events ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(kept.len(), 3 + 2, "{kept:?}");
    assert!(kept.contains(&old_pending) && kept.contains(&old_undispatched));
    assert!(kept.contains(&recent_delivered));
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_deliveries").await,
        2
    );
    assert_eq!(app.count("SELECT count(*) FROM webhook_attempts").await, 2);
    app.get(&format!("/v1/events/evt_{}", old_delivered.simple()))
        .await
        .assert_problem(404, "not_found");
}

/// The outbox's event rows are written once: the fan-out takes an event off
/// `event_queue` and never locks or rewrites the event itself (migration
/// V6; before it, every fan-out locked each event and updated it, JSON and
/// all). So a fanned-out event is still the very row version its charge's
/// outcome statement wrote, with the same transaction id as the charge's
/// final version. An event nobody wants has not even been locked since; a
/// delivered one carries the key-share lock that the delivery's foreign key
/// takes on it, which is not a change.
#[tokio::test]
async fn fanning_out_leaves_the_event_row_as_it_was_written() {
    let app = spawn_app_with(fast).await;
    let receiver = Receiver::start().await;
    create_endpoint(&app.address, &app.api_key, &receiver.url, None).await;
    let unwatched = app.create_merchant("No endpoints").await;
    assert_eq!(app.post_charge("once", &charge_body(100)).await.status, 201);
    assert_eq!(
        app.post_charge("twice", &charge_body(102)).await.status,
        402
    );
    assert_eq!(
        app.post_charge_as(&unwatched, "alone", &charge_body(100))
            .await
            .status,
        201
    );
    receiver
        .wait_until("both events", Duration::from_secs(10), |r| r.len() >= 2)
        .await;
    let started = Instant::now();
    while app.count("SELECT count(*) FROM event_queue").await > 0 {
        assert!(started.elapsed() < Duration::from_secs(10), "still queued");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let sql = app.sql().await;
    let rows = sql
        .query(
            "SELECT m.name, e.type, e.xmin::text, e.xmax::text, c.xmin::text \
               FROM events e \
               JOIN charges c ON c.merchant_id = e.merchant_id AND c.id = e.charge_id \
               JOIN merchants m ON m.id = e.merchant_id \
              ORDER BY e.id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), 3);
    for row in rows {
        let (merchant, event_type): (String, String) = (row.get(0), row.get(1));
        let (written_by, locked_by, charge_final_by): (String, String, String) =
            (row.get(2), row.get(3), row.get(4));
        assert_eq!(
            written_by, charge_final_by,
            "{merchant} {event_type}: the event was rewritten after its charge's outcome"
        );
        if merchant == "No endpoints" {
            assert_eq!(locked_by, "0", "{event_type}: the event was locked");
        }
    }
}

/// An event is queued for the fan-out only when a live endpoint of its
/// merchant wants its type: a merchant without one pays no fan-out, and an
/// endpoint sees the events that happen once it exists.
#[tokio::test]
async fn an_event_is_queued_only_when_a_live_endpoint_wants_its_type() {
    let app = spawn_app_with(|s| {
        // The dispatcher sleeps: the queue keeps what enters it.
        s.webhooks.interval = Duration::from_secs(3600);
    })
    .await;
    let charge = |key: &'static str| {
        let app = &app;
        async move {
            let made = app.post_charge(key, &charge_body(100)).await;
            assert_eq!(made.status.as_u16(), 201, "{}", made.body);
        }
    };
    let rows = |table: &'static str| {
        let app = &app;
        async move { app.count(&format!("SELECT count(*) FROM {table}")).await }
    };

    charge("no-endpoint").await;
    assert_eq!((rows("events").await, rows("event_queue").await), (1, 0));

    create_endpoint(
        &app.address,
        &app.api_key,
        NOWHERE,
        Some(&["refund.succeeded"]),
    )
    .await;
    charge("refunds-only").await;
    assert_eq!((rows("events").await, rows("event_queue").await), (2, 0));

    let all = create_endpoint(&app.address, &app.api_key, NOWHERE, None).await;
    charge("every-type").await;
    assert_eq!((rows("events").await, rows("event_queue").await), (3, 1));

    // A deleted endpoint wants nothing any more.
    let (status, answer) =
        delete_endpoint(&app.address, &app.api_key, all["id"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{answer}");
    charge("after-delete").await;
    assert_eq!((rows("events").await, rows("event_queue").await), (4, 1));
}
