//! README's "In your test suite", done the way a team's test suite would do
//! it: the real binary on port 0 against an empty database, the port read
//! from the line that announces it, a merchant per test, and one charge for
//! each answer the section names by its amount. The section's own text is
//! checked for every value this test relies on, so the two cannot drift.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use chargeonce_testkit::{Chargeonce, TestDatabase};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The amounts the section names, and what the simulated processor does.
const SUCCEEDS: i64 = 1000;
const DECLINED: i64 = 1002;
const INSUFFICIENT_FUNDS: i64 = 1005;
const PENDING_FIRST: i64 = 1009;

/// The section of README.md under "## In your test suite".
fn section() -> String {
    let readme = include_str!("../README.md");
    let start = readme
        .find("## In your test suite")
        .expect("README has the section");
    let rest = &readme[start + 2..];
    let end = rest.find("\n## ").map_or(rest.len(), |end| end + 2);
    readme[start..start + end].to_owned()
}

#[test]
fn the_section_names_what_the_test_relies_on() {
    let section = section();
    for promised in [
        "`chargeonce serve`",
        "`DATABASE_URL`",
        "`CHARGEONCE__SERVER__PORT=0`",
        "chargeonce listening address=127.0.0.1:0 port=",
        "`GET /readyz` answers 200",
        "`chargeonce merchant create NAME`",
        "`1000`",
        "`1002` (…02) is declined, 402 `card_declined`",
        "`1005` (…05) is declined, 402 `insufficient_funds`",
        "`1009` (…09) times out",
        "202 with the charge `pending`",
        "tests/readme.rs",
    ] {
        assert!(
            section.contains(promised),
            "README's section lacks {promised:?}"
        );
    }
}

/// `POST /v1/charges`: the status and the JSON body.
async fn charge(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    key: &str,
    amount: i64,
) -> (StatusCode, Value) {
    let answer = http
        .post(format!("{url}/v1/charges"))
        .bearer_auth(api_key)
        .header("Idempotency-Key", key)
        .json(&json!({"amount": amount, "currency": "USD"}))
        .send()
        .await
        .expect("the service answers");
    let status = answer.status();
    (status, answer.json().await.expect("a JSON body"))
}

#[tokio::test]
async fn a_test_suite_starts_chargeonce_as_the_readme_says() {
    // Step 1: the binary on an empty database (it migrates it on start), on
    // port 0 with nothing else set. The test kit's helper clears the
    // environment, sets CHARGEONCE__SERVER__PORT=0 and a RUST_LOG that keeps
    // chargeonce::startup at info, reads the port from the announcing line
    // and waits for /readyz to answer 200.
    let database = TestDatabase::empty().await;
    let binary = Chargeonce::new(
        env!("CARGO_BIN_EXE_chargeonce"),
        std::env::temp_dir(), // no config/ here: the embedded defaults
    );
    let service = binary.serve(&database.url, &[]).await;
    let announced = format!("port={}", service.port);
    let line = service
        .log()
        .into_iter()
        .find(|line| line.contains("chargeonce listening"))
        .expect("the announcing line");
    assert!(
        line.contains(" INFO chargeonce::startup: chargeonce listening address=127.0.0.1:0 ")
            && line.ends_with(&announced),
        "{line}"
    );

    // Step 2: a merchant per test; its key is all the command prints.
    let merchant = binary
        .run(&database.url, &["merchant", "create", "Checkout tests"])
        .await
        .unwrap();
    assert!(merchant.starts_with("sk_") && !merchant.contains(char::is_whitespace));
    let other = binary
        .run(&database.url, &["merchant", "create", "Another test"])
        .await
        .unwrap();

    // Step 3: the answer picked by the amount.
    let http = reqwest::Client::new();
    let url = &service.url;
    let (status, succeeded) = charge(&http, url, &merchant, "order-1", SUCCEEDS).await;
    assert_eq!(status, StatusCode::CREATED, "{succeeded}");
    assert_eq!(succeeded["status"], "succeeded");

    for (amount, code) in [
        (DECLINED, "card_declined"),
        (INSUFFICIENT_FUNDS, "insufficient_funds"),
    ] {
        let (status, declined) =
            charge(&http, url, &merchant, &format!("order-{amount}"), amount).await;
        assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{declined}");
        assert_eq!(declined["code"], code);
        assert_eq!(declined["charge"]["status"], "failed");
    }

    let (status, pending) = charge(&http, url, &merchant, "order-slow", PENDING_FIRST).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    assert_eq!(pending["status"], "pending");
    // The next call with that key finds the payment made.
    let (status, settled) = charge(&http, url, &merchant, "order-slow", PENDING_FIRST).await;
    assert_eq!(status, StatusCode::CREATED, "{settled}");
    assert_eq!(
        (settled["id"].clone(), settled["status"].clone()),
        (pending["id"].clone(), json!("succeeded"))
    );

    // Isolation: the other merchant's key "order-1" is a charge of its own,
    // and it sees nothing of the first merchant's.
    let (status, its_own) = charge(&http, url, &other, "order-1", SUCCEEDS).await;
    assert_eq!(status, StatusCode::CREATED, "{its_own}");
    assert_ne!(its_own["id"], succeeded["id"]);
    let list: Value = http
        .get(format!("{url}/v1/charges"))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&Value> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["id"])
        .collect();
    assert_eq!(ids, [&its_own["id"]]);
    let theirs = http
        .get(format!(
            "{url}/v1/charges/{}",
            succeeded["id"].as_str().unwrap()
        ))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), StatusCode::NOT_FOUND);
}
