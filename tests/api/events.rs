//! The events API: every state change of a charge is an event, listed
//! newest first with a cursor and a type filter, readable by id, and only
//! by its own merchant.

use serde_json::Value;

use chargeonce::db::{events, webhook_deliveries, webhook_endpoints};

use crate::helpers::{charge_body, migrated_database, spawn_app};
use crate::plans::generic_plan;

fn ids(page: &Value) -> Vec<String> {
    page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect()
}

/// `2026-11-30T19:59:39.452451Z`: RFC 3339, microseconds, UTC.
fn assert_micros_utc(text: &str) {
    assert!(
        text.len() == 27 && text.ends_with('Z') && text.as_bytes()[19] == b'.',
        "{text}"
    );
    chrono::DateTime::parse_from_rfc3339(text).unwrap();
}

#[tokio::test]
async fn events_are_listed_newest_first_with_a_cursor_and_a_type_filter() {
    let app = spawn_app().await;
    let first = app.post_charge("e-1", &charge_body(100)).await.json();
    let declined = app.post_charge("e-2", &charge_body(102)).await;
    assert_eq!(declined.status, 402);
    let third = app.post_charge("e-3", &charge_body(300)).await.json();

    let all = app.get("/v1/events").await;
    assert_eq!(all.status, 200, "{}", all.body);
    let all = all.json();
    assert_eq!(all["object"], "list");
    assert_eq!(all["has_more"], false);
    let listed = ids(&all);
    assert_eq!(listed.len(), 3);
    let mut sorted = listed.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(listed, sorted, "newest first");
    let types: Vec<&str> = all["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["charge.succeeded", "charge.failed", "charge.succeeded"]
    );

    // The shape, and the object as the change left it.
    let newest = &all["data"][0];
    assert!(newest["id"].as_str().unwrap().starts_with("evt_"));
    assert_eq!(newest["object"], "event");
    assert_micros_utc(newest["created_at"].as_str().unwrap());
    assert_eq!(newest["data"]["object"], third);
    assert_eq!(
        newest.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["created_at", "data", "id", "object", "type"]
    );
    assert_eq!(all["data"][2]["data"]["object"], first);
    assert_eq!(
        all["data"][1]["data"]["object"]["failure_code"],
        "card_declined"
    );

    // One by id: the same JSON as in the list.
    let one = app.get(&format!("/v1/events/{}", listed[1])).await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json(), all["data"][1]);

    // Pages.
    let page = app.get("/v1/events?limit=2").await.json();
    assert_eq!(ids(&page), listed[..2]);
    assert_eq!(page["has_more"], true);
    let rest = app
        .get(&format!("/v1/events?limit=2&starting_after={}", listed[1]))
        .await
        .json();
    assert_eq!(ids(&rest), listed[2..]);
    assert_eq!(rest["has_more"], false);

    // The type filter, also with the cursor.
    let failed = app.get("/v1/events?type=charge.failed").await.json();
    assert_eq!(ids(&failed), [listed[1].clone()]);
    let succeeded_after = app
        .get(&format!(
            "/v1/events?type=charge.succeeded&starting_after={}",
            listed[0]
        ))
        .await
        .json();
    assert_eq!(ids(&succeeded_after), [listed[2].clone()]);
    let none = app.get("/v1/events?type=refund.succeeded").await.json();
    assert_eq!(ids(&none), Vec::<String>::new());
}

#[tokio::test]
async fn a_bad_query_is_400_naming_each_parameter() {
    let app = spawn_app().await;
    let cases = [
        ("type=charge.bogus", vec!["type"]),
        ("type=", vec!["type"]),
        ("limit=0", vec!["limit"]),
        ("limit=101", vec!["limit"]),
        (
            "starting_after=ch_00000000000000000000000000000000",
            vec!["starting_after"],
        ),
        ("colour=red", vec!["colour"]),
        ("limit=5&limit=6", vec!["limit"]),
        ("type=CHARGE.SUCCEEDED&limit=x", vec!["limit", "type"]),
    ];
    for (query, fields) in cases {
        let reply = app.get(&format!("/v1/events?{query}")).await;
        let problem = reply.assert_problem(400, "invalid_request");
        let mut named: Vec<&str> = problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        named.sort();
        assert_eq!(named, fields, "{query}: {problem}");
    }
    let problem = app.get("/v1/events?type=nope").await.json();
    assert!(
        problem["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("charge.succeeded"),
        "the message lists the valid types: {problem}"
    );
}

#[tokio::test]
async fn another_merchants_event_is_404_and_not_listed() {
    let app = spawn_app().await;
    let other = app.create_merchant("Other").await;
    app.post_charge("mine", &charge_body(500)).await;
    let mine = ids(&app.get("/v1/events").await.json());
    assert_eq!(mine.len(), 1);

    for path in [
        format!("/v1/events/{}", mine[0]),
        format!("/v1/events/{}/deliveries", mine[0]),
        "/v1/events/evt_123".to_owned(),
        "/v1/events/ch_0192a0b0c0d0e0f00000000000000000".to_owned(),
        "/v1/events/evt_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz/deliveries".to_owned(),
    ] {
        app.get_as(&other, &path)
            .await
            .assert_problem(404, "not_found");
    }
    let listed = app.get_as(&other, "/v1/events").await.json();
    assert_eq!(ids(&listed), Vec::<String>::new());
    // Even with the other merchant's event as a cursor.
    let after = app
        .get_as(&other, &format!("/v1/events?starting_after={}", mine[0]))
        .await
        .json();
    assert_eq!(ids(&after), Vec::<String>::new());

    app.get_as("sk_wrong", "/v1/events")
        .await
        .assert_problem(401, "unauthenticated");
    app.get_as("sk_wrong", &format!("/v1/events/{}", mine[0]))
        .await
        .assert_problem(401, "unauthenticated");
}

/// Like `plans.rs` for charges: on empty, never-analyzed tables every
/// statement of the outbox and of webhooks goes through an index, never a
/// scan of a whole table that grows with every charge (a generic plan made
/// while the table is small is kept as it grows); and a statement that
/// names its row by key never reads the partial index of due deliveries,
/// whose predicate its status condition could imply.
#[tokio::test]
async fn outbox_statements_do_not_depend_on_statistics() {
    if crate::helpers::skipped_on_citus(
        "outbox_statements_do_not_depend_on_statistics",
        "PostgreSQL's plans of a plain table; on Citus each worker plans the statement \
         for its shard, a plain table the first pass checks",
    )
    .await
    {
        return;
    }
    use chargeonce::db::Statement;
    // A probe of the primary key, or of an index led by the merchant (the
    // events' listing, the live endpoints') by both of its columns: not
    // the merchant's range of it, filtered.
    const BY_MERCHANT_AND_ID: &str = "Index Cond: ((merchant_id = $1) AND (id = $2))";
    let database = migrated_database().await;
    let client = database.client().await;
    let cases: [(&str, &Statement, &str); 28] = [
        ("events::LIST", &events::LIST, "events_listing"),
        ("events::FIND", &events::FIND, "events_listing"),
        ("events::FIND", &events::FIND, BY_MERCHANT_AND_ID),
        ("events::QUEUE", &events::QUEUE, "events_listing"),
        ("events::QUEUE", &events::QUEUE, BY_MERCHANT_AND_ID),
        ("events::QUEUED", &events::QUEUED, "event_queue_pkey"),
        ("events::FAN_OUT", &events::FAN_OUT, "event_queue_pkey"),
        // The merchant's live endpoints (the partial index of them), only
        // once the event is taken.
        (
            "events::FAN_OUT",
            &events::FAN_OUT,
            "webhook_endpoints_of_merchant",
        ),
        ("events::SET_ASIDE", &events::SET_ASIDE, "event_queue_pkey"),
        ("events::BACKLOG", &events::BACKLOG, "event_queue_pkey"),
        (
            "events::BACKLOG",
            &events::BACKLOG,
            "webhook_deliveries_due",
        ),
        (
            "events::EXPIRED",
            &events::EXPIRED,
            "webhook_deliveries_one_per_endpoint",
        ),
        (
            "events::DELETE_EXPIRED",
            &events::DELETE_EXPIRED,
            "webhook_deliveries_one_per_endpoint",
        ),
        (
            "events::DELETE_EXPIRED",
            &events::DELETE_EXPIRED,
            "event_queue_pkey",
        ),
        (
            "webhook_deliveries::DUE",
            &webhook_deliveries::DUE,
            "webhook_deliveries_due",
        ),
        (
            "webhook_deliveries::CLAIM",
            &webhook_deliveries::CLAIM,
            "webhook_deliveries_pkey",
        ),
        (
            "webhook_deliveries::RECORD_ATTEMPT",
            &webhook_deliveries::RECORD_ATTEMPT,
            "webhook_deliveries_pkey",
        ),
        (
            "webhook_deliveries::OF_EVENT",
            &webhook_deliveries::OF_EVENT,
            "webhook_deliveries_one_per_endpoint",
        ),
        (
            "webhook_endpoints::INSERT",
            &webhook_endpoints::INSERT,
            "webhook_endpoints_one_per_slot",
        ),
        (
            "webhook_endpoints::SLOTS_TAKEN",
            &webhook_endpoints::SLOTS_TAKEN,
            "webhook_endpoints_one_per_slot",
        ),
        (
            "webhook_endpoints::FIND_BY_KEY",
            &webhook_endpoints::FIND_BY_KEY,
            "webhook_endpoints_merchant_key_unique",
        ),
        (
            "webhook_endpoints::LIST",
            &webhook_endpoints::LIST,
            "webhook_endpoints_of_merchant",
        ),
        (
            "webhook_endpoints::DELETE",
            &webhook_endpoints::DELETE,
            BY_MERCHANT_AND_ID,
        ),
        (
            "webhook_endpoints::FAILED",
            &webhook_endpoints::FAILED,
            BY_MERCHANT_AND_ID,
        ),
        (
            "webhook_endpoints::RECOVERED",
            &webhook_endpoints::RECOVERED,
            "webhook_endpoints_pkey",
        ),
        (
            "webhook_endpoints::DISABLE",
            &webhook_endpoints::DISABLE,
            BY_MERCHANT_AND_ID,
        ),
        (
            "webhook_endpoints::DISABLED_EVENT",
            &webhook_endpoints::DISABLED_EVENT,
            "webhook_endpoints_pkey",
        ),
        (
            "webhook_deliveries::INSERT_ATTEMPT",
            &webhook_deliveries::INSERT_ATTEMPT,
            "webhook_deliveries_pkey",
        ),
    ];
    let mut failures = Vec::new();
    for (name, statement, index) in cases {
        let plan = generic_plan(&client, statement).await;
        if !plan.contains(index) {
            failures.push(format!("{name} does not use {index}:\n{plan}"));
        }
        for table in [
            "events",
            "event_queue",
            "webhook_deliveries",
            "webhook_attempts",
            "webhook_endpoints",
        ] {
            if plan.contains(&format!("Seq Scan on {table} ")) {
                failures.push(format!("{name} scans all of {table}:\n{plan}"));
            }
        }
    }
    for (name, statement) in [
        ("webhook_deliveries::CLAIM", &webhook_deliveries::CLAIM),
        (
            "webhook_deliveries::RECORD_ATTEMPT",
            &webhook_deliveries::RECORD_ATTEMPT,
        ),
        ("events::DELETE_EXPIRED", &events::DELETE_EXPIRED),
    ] {
        let plan = generic_plan(&client, statement).await;
        if plan.contains("webhook_deliveries_due") {
            failures.push(format!("{name} reads the due deliveries:\n{plan}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// On a database distributed by merchant (Citus), a statement that looks
/// across merchants may only read, without locking: Citus refuses `FOR
/// UPDATE … SKIP LOCKED` across shards and a multi-shard UPDATE with
/// `now()` in a CASE, and a change across merchants would lock rows on
/// every node. So the workers' statements that look across merchants are
/// plain reads, and every statement that changes or locks existing rows
/// names its merchant (`merchant_id = $n`): what the workers change they
/// change merchant by merchant (`events::FAN_OUT`,
/// `webhook_deliveries::CLAIM`, …). No statement uses `ctid` (a row's place
/// on one node) or a subquery of no columns (`SELECT FROM`, which Citus
/// mishandles). Before, the fan-out, the claim and event retention locked
/// and changed rows of every merchant in one statement.
#[test]
fn statements_across_merchants_only_read() {
    const ACROSS_MERCHANTS: [&str; 8] = [
        "charges::ABANDONED",
        "charges::EXPIRED_KEYS",
        "refunds::ABANDONED",
        "refunds::EXPIRED_KEYS",
        "events::QUEUED",
        "events::EXPIRED",
        "events::BACKLOG",
        "webhook_deliveries::DUE",
    ];
    let mut changing = 0;
    for (name, statement) in chargeonce::db::ALL_STATEMENTS {
        let sql = statement
            .sql
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_uppercase();
        assert!(!sql.contains("CTID"), "{name} uses ctid");
        assert!(
            !sql.contains("SELECT FROM"),
            "{name} has a subquery of no columns"
        );
        let changes: Vec<&str> = [
            "UPDATE ",
            "DELETE ",
            "FOR UPDATE",
            "FOR SHARE",
            "FOR NO KEY",
            "SKIP LOCKED",
        ]
        .into_iter()
        .filter(|change| sql.contains(change))
        .collect();
        if ACROSS_MERCHANTS.contains(name) {
            assert!(
                changes.is_empty() && !sql.contains("INSERT "),
                "{name} looks across merchants and changes or locks rows ({changes:?})"
            );
        } else if !changes.is_empty() && !name.starts_with("merchants::") {
            changing += 1;
            assert!(
                statement.sql.contains("merchant_id = $"),
                "{name} changes or locks rows ({changes:?}) without naming its merchant"
            );
        }
    }
    assert!(
        changing >= 20,
        "the statements that change rows ({changing})"
    );
    for name in ACROSS_MERCHANTS {
        assert!(
            chargeonce::db::ALL_STATEMENTS
                .iter()
                .any(|(known, _)| *known == name),
            "{name} is not a statement"
        );
    }
}

/// An event's merchant is its charge's: the composite reference to the
/// charge refuses any other, existing or not, so the schema needs no
/// direct reference from events to merchants (dropped in V6).
#[tokio::test]
async fn an_event_of_another_merchant_than_its_charges_is_refused() {
    let app = spawn_app().await;
    let charge = app.post_charge("c", &charge_body(100)).await.json();
    let charge_id = uuid::Uuid::parse_str(&charge["id"].as_str().unwrap()[3..]).unwrap();
    let other = app.create_merchant("Other").await;
    assert!(other.starts_with("sk_"));
    let sql = app.sql().await;
    let other_id: uuid::Uuid = sql
        .query_one("SELECT id FROM merchants WHERE name = 'Other'", &[])
        .await
        .unwrap()
        .get(0);
    for (merchant, which) in [
        (other_id, "another merchant"),
        (uuid::Uuid::new_v4(), "no merchant"),
    ] {
        let refused = sql
            .execute(
                "INSERT INTO events (id, merchant_id, charge_id, type, data) \
                 VALUES (gen_random_uuid(), $2, $1, 'charge.pending', '{}')",
                &[&charge_id, &merchant],
            )
            .await
            .expect_err(which);
        let constraint = crate::helpers::broken_constraint(&refused);
        assert_eq!(constraint.as_deref(), Some("events_charge_fkey"), "{which}");
    }
}
