//! The circuit breaker: an endpoint that keeps failing has its attempts
//! spaced out, then is disabled with a `webhook_endpoint.disabled` event
//! for its merchant; one that delivers again is forgiven.

use std::time::{Duration, Instant};

use chargeonce::config::Settings;
use serde_json::{json, Value};

use super::{newest_event, wait_for_deliveries};
use crate::helpers::{charge_body, spawn_app_with, TestApp};
use crate::observability::{sample, scrape};
use crate::webhook_receiver::{create_endpoint, get, Answer, Receiver};

fn breaker(settings: &mut Settings) {
    settings.webhooks.interval = Duration::from_millis(20);
    settings.webhooks.backoff_base = Duration::from_millis(100);
    settings.webhooks.max_backoff = Duration::from_millis(400);
    settings.webhooks.trip_after_failures = 3;
}

/// The breaker's columns of the endpoint `id` (`we_…`): failures in a
/// row, held back until a time still ahead, disabled.
async fn breaker_state(app: &TestApp, id: &str) -> (i32, bool, bool) {
    let id = uuid::Uuid::parse_str(&id[3..]).unwrap();
    let row = app
        .sql()
        .await
        .query_one(
            "SELECT consecutive_failures, coalesce(retry_at > now(), false), \
                    disabled_at IS NOT NULL \
               FROM webhook_endpoints WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// An endpoint that answers 500 to everything: after 3 failed attempts in a
/// row (`webhooks.trip_after_failures`) its deliveries are held back for a
/// pause instead of each being tried on its own schedule; once it has
/// failed for `webhooks.disable_after_ms` it is disabled: listed with
/// `"enabled": false`, sent nothing more, its pending deliveries given up,
/// and its merchant gets a `webhook_endpoint.disabled` event (delivered to
/// the merchant's endpoint that wants it). The metrics count the trip and
/// the disabling. Before, a failing endpoint was tried forever at each
/// delivery's own pace, and nothing was ever disabled.
#[tokio::test]
async fn an_endpoint_that_keeps_failing_is_spaced_out_then_disabled_with_an_event() {
    let app = spawn_app_with(|s| {
        breaker(s);
        s.webhooks.disable_after = Duration::from_millis(2500);
    })
    .await;
    let before = scrape(&app).await;
    let failing = Receiver::start().await;
    failing.otherwise(Answer::Status(500));
    let watcher = Receiver::start().await;
    let endpoint = create_endpoint(&app.address, &app.api_key, &failing.url, None).await;
    let id = endpoint["id"].as_str().unwrap().to_owned();
    create_endpoint(
        &app.address,
        &app.api_key,
        &watcher.url,
        Some(&["webhook_endpoint.disabled"]),
    )
    .await;
    for n in 0..10 {
        assert_eq!(
            app.post_charge(&format!("c-{n}"), &charge_body(100))
                .await
                .status,
            201
        );
    }
    // Tripped: held back, its deliveries waiting for the pause.
    let started = Instant::now();
    loop {
        let (failures, held, disabled) = breaker_state(&app, &id).await;
        if failures >= 3 && held {
            assert!(!disabled);
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never tripped: {failures} failures"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tripped_at = failing.received().len();

    // Disabled, with its event.
    let disabled = watcher
        .wait_until("the disabled event", Duration::from_secs(15), |r| {
            !r.is_empty()
        })
        .await;
    let attempts = failing.received().len();
    let event = disabled[0].json();
    assert_eq!(event["type"], "webhook_endpoint.disabled");
    assert_eq!(event["data"]["object"]["id"], id.as_str());
    assert_eq!(event["data"]["object"]["object"], "webhook_endpoint");
    assert_eq!(event["data"]["object"]["enabled"], false);
    assert!(event["data"]["object"].get("secret").is_none(), "{event}");
    let (status, listed) = get(
        &app.address,
        &app.api_key,
        "/v1/events?type=webhook_endpoint.disabled",
    )
    .await;
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed["data"][0]["id"], event["id"]);
    let (_, endpoints) = get(&app.address, &app.api_key, "/v1/webhook_endpoints").await;
    let endpoints: Value = serde_json::from_str(&endpoints).unwrap();
    let shown = endpoints["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == id.as_str())
        .unwrap();
    assert_eq!(
        (&shown["enabled"], shown.get("deleted")),
        (&json!(false), None)
    );
    // Ten deliveries of up to 8 attempts each at 100 to 400 ms would have
    // been far more than this in 2.5 s; the breaker held most back.
    println!("{tripped_at} attempts when it tripped, {attempts} when it was disabled");
    assert!(attempts < 25, "{attempts} attempts");

    // Nothing more goes to it: its pending deliveries are given up, and a
    // new event gets no delivery to it.
    assert_eq!(
        app.post_charge("later", &charge_body(100)).await.status,
        201
    );
    let later = newest_event(&app).await;
    let started = Instant::now();
    while app.count("SELECT count(*) FROM event_queue").await > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never fanned out"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deliveries =
        wait_for_deliveries(&app, later["id"].as_str().unwrap(), "none", |_| true).await;
    assert!(deliveries.is_empty(), "{deliveries:#?}");
    let started = Instant::now();
    while app
        .count("SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'")
        .await
        > 0
    {
        assert!(started.elapsed() < Duration::from_secs(10), "still pending");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        app.count(
            "SELECT count(*) FROM webhook_deliveries \
              WHERE status = 'failed' AND last_error = 'the endpoint was disabled'"
        )
        .await
            > 0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = failing.received().len();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(failing.received().len(), after, "attempts after disabling");

    let now = scrape(&app).await;
    for name in [
        "chargeonce_webhook_endpoints_tripped_total",
        "chargeonce_webhook_endpoints_disabled_total",
        "chargeonce_webhook_deliveries_held_total",
    ] {
        assert!(
            sample(&now, name, &[]) >= sample(&before, name, &[]) + 1.0,
            "{name}"
        );
    }
    assert!(
        sample(
            &now,
            "chargeonce_webhook_deliveries_failed_total",
            &[("reason", "endpoint_disabled")]
        ) >= 1.0
    );
}

/// An endpoint that fails a few times and then answers again has its run
/// of failures ended: its breaker counts from zero again, nothing is held
/// back, and it is never disabled.
#[tokio::test]
async fn an_endpoint_that_delivers_again_is_forgiven() {
    let app = spawn_app_with(|s| {
        breaker(s);
        s.webhooks.trip_after_failures = 5;
        s.webhooks.disable_after = Duration::from_millis(1000);
    })
    .await;
    let flaky = Receiver::start().await;
    flaky.script([Answer::Status(500), Answer::Status(503)]);
    let endpoint = create_endpoint(&app.address, &app.api_key, &flaky.url, None).await;
    let id = endpoint["id"].as_str().unwrap().to_owned();
    assert_eq!(app.post_charge("c", &charge_body(100)).await.status, 201);
    flaky
        .wait_until("the third attempt", Duration::from_secs(10), |r| {
            r.len() >= 3
        })
        .await;
    let started = Instant::now();
    while breaker_state(&app, &id).await != (0, false, false) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            breaker_state(&app, &id).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Failing again later starts a new run: not disabled for the old one,
    // which began longer than `disable_after` ago.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    flaky.script([Answer::Status(500)]);
    assert_eq!(app.post_charge("d", &charge_body(100)).await.status, 201);
    flaky
        .wait_until("the next event, retried", Duration::from_secs(10), |r| {
            r.len() >= 5
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(breaker_state(&app, &id).await, (0, false, false));
}
