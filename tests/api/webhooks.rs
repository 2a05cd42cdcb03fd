//! Webhooks end to end, against a real receiver the test starts
//! (`webhook_receiver`): endpoints (idempotent creation, strict bodies, the
//! secret shown at creation only, soft delete), deliveries that follow the
//! endpoints' event types, signatures checked by an HMAC written here from
//! the spec and by the `standardwebhooks` package from PyPI, retries after
//! a 500 and a dropped connection, private targets refused under the
//! production configuration, retention, and the real binary killed
//! mid-dispatch and run as two instances at once.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use chargeonce::config::{ProcessorKind, Settings};
use chargeonce_testkit::Signal;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::sync::OnceCell;
use uuid::Uuid;

use crate::helpers::{charge_body, spawn_app, spawn_app_with, TestApp};
use crate::processes::{start_service, Database, Process};
use crate::webhook_receiver::{
    create_endpoint, delete_endpoint, duplicates, get, post_endpoint, Answer, Received, Receiver,
};

/// Webhook settings for in-process tests: a quick pace and quick retries.
fn fast(settings: &mut Settings) {
    settings.webhooks.interval = Duration::from_millis(20);
    settings.webhooks.timeout = Duration::from_secs(2);
    settings.webhooks.backoff_base = Duration::from_millis(50);
    settings.webhooks.max_backoff = Duration::from_millis(200);
}

/// A port nothing listens on: endpoints that must never be reached.
const NOWHERE: &str = "http://127.0.0.1:9/hooks";

async fn newest_event(app: &TestApp) -> Value {
    app.get("/v1/events?limit=1").await.json()["data"][0].clone()
}

/// Polls the deliveries of `event` until `done` holds for them.
async fn wait_for_deliveries(
    app: &TestApp,
    event: &str,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let page = app.get(&format!("/v1/events/{event}/deliveries")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let deliveries = page.json()["data"].as_array().unwrap().clone();
        if done(&deliveries) {
            return deliveries;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "waited for {what}: {deliveries:#?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn endpoint_creation_is_idempotent_and_shows_the_secret_only_then() {
    let app = spawn_app().await;
    let body =
        r#"{"url":"HTTP://127.0.0.1:9/hooks","event_types":["charge.failed","charge.succeeded"]}"#;
    let (status, replayed, first) = post_endpoint(&app.address, &app.api_key, "we-1", body).await;
    assert_eq!((status, replayed), (201, None), "{first}");
    let created: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(
        created.as_object().unwrap().keys().collect::<Vec<_>>(),
        [
            "created_at",
            "enabled",
            "event_types",
            "id",
            "object",
            "secret",
            "url"
        ]
    );
    assert!(created["id"].as_str().unwrap().starts_with("we_"));
    assert_eq!(created["object"], "webhook_endpoint");
    assert_eq!(created["url"], NOWHERE, "stored normalised");
    assert_eq!(
        created["event_types"],
        json!(["charge.succeeded", "charge.failed"])
    );
    assert_eq!(created["enabled"], true);
    let secret = created["secret"].as_str().unwrap().to_owned();
    let key = secret.strip_prefix("whsec_").expect("whsec_ prefix");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(key)
        .unwrap();
    assert!(decoded.len() >= 24, "{} random bytes", decoded.len());

    // The same request, spelled differently: the first answer again, secret
    // included, byte for byte.
    let same = r#"{ "event_types": ["charge.succeeded", "charge.failed", "charge.failed"],
                    "url": "http://127.0.0.1:9/hooks" }"#;
    let (status, replayed, again) = post_endpoint(&app.address, &app.api_key, "we-1", same).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(again, first);

    // Another request with the key: 422, and nothing new.
    let (status, _, reused) = post_endpoint(
        &app.address,
        &app.api_key,
        "we-1",
        r#"{"url":"http://127.0.0.1:9/other"}"#,
    )
    .await;
    assert_eq!(status, 422, "{reused}");
    assert_eq!(
        serde_json::from_str::<Value>(&reused).unwrap()["code"],
        "idempotency_key_reused"
    );
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 1);

    // No key at all.
    let missing = app
        .http
        .post(format!("{}/v1/webhook_endpoints", app.address))
        .bearer_auth(&app.api_key)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    assert_eq!(
        missing.json::<Value>().await.unwrap()["code"],
        "idempotency_key_missing"
    );

    // The endpoints' key space is their own, and each merchant's.
    assert_eq!(app.post_charge("we-1", &charge_body(100)).await.status, 201);
    let other = app.create_merchant("Other").await;
    let (status, replayed, theirs) = post_endpoint(&app.address, &other, "we-1", body).await;
    assert_eq!((status, replayed), (201, None));
    let theirs: Value = serde_json::from_str(&theirs).unwrap();
    assert_ne!(theirs["id"], created["id"]);
    assert_ne!(theirs["secret"], created["secret"]);

    // The list: newest first, without any secret.
    let second = create_endpoint(&app.address, &app.api_key, NOWHERE, None).await;
    assert_eq!(second["event_types"], Value::Null);
    let (status, list) = get(&app.address, &app.api_key, "/v1/webhook_endpoints").await;
    assert_eq!(status, 200);
    assert!(!list.contains("whsec_") && !list.contains(key), "{list}");
    assert!(!list.contains(&second["secret"].as_str().unwrap()[6..]));
    let list: Value = serde_json::from_str(&list).unwrap();
    let listed: Vec<&Value> = list["data"].as_array().unwrap().iter().collect();
    assert_eq!(
        listed.iter().map(|e| &e["id"]).collect::<Vec<_>>(),
        [&second["id"], &created["id"]]
    );
    let mut shown = created.clone();
    shown.as_object_mut().unwrap().remove("secret");
    assert_eq!(listed[1], &shown);
    let (_, page) = get(&app.address, &app.api_key, "/v1/webhook_endpoints?limit=1").await;
    let page: Value = serde_json::from_str(&page).unwrap();
    assert_eq!(
        (page["data"].as_array().unwrap().len(), &page["has_more"]),
        (1, &json!(true))
    );
    let (_, theirs_listed) = get(&app.address, &other, "/v1/webhook_endpoints").await;
    assert!(theirs_listed.contains(theirs["id"].as_str().unwrap()));
    assert!(!theirs_listed.contains(created["id"].as_str().unwrap()));
}

#[tokio::test]
async fn endpoint_bodies_are_parsed_strictly() {
    let app = spawn_app().await;
    let long = format!("https://example.test/{}", "a".repeat(2048));
    let cases: Vec<(String, Vec<&str>)> = vec![
        (r#"{}"#.into(), vec!["url"]),
        (r#"{"url": null}"#.into(), vec!["url"]),
        (r#"{"url": "ftp://example.test/"}"#.into(), vec!["url"]),
        (r#"{"url": "example.test/hooks"}"#.into(), vec!["url"]),
        (r#"{"url": 42}"#.into(), vec!["url"]),
        (json!({ "url": long }).to_string(), vec!["url"]),
        (
            r#"{"url": "https://example.test/", "event_types": []}"#.into(),
            vec!["event_types"],
        ),
        (
            r#"{"url": "https://example.test/", "event_types": "charge.failed"}"#.into(),
            vec!["event_types"],
        ),
        (
            r#"{"url": "https://example.test/", "event_types": ["charge.failed", "charge.refunded"]}"#
                .into(),
            vec!["event_types[1]"],
        ),
        (
            r#"{"url": "https://example.test/", "enabled": false}"#.into(),
            vec!["enabled"],
        ),
        (
            r#"{"url": "https://example.test/", "secret": "whsec_mine"}"#.into(),
            vec!["secret"],
        ),
        (r#"["https://example.test/"]"#.into(), vec![""]),
    ];
    for (body, fields) in cases {
        let key = Uuid::new_v4().to_string();
        let (status, _, answer) = post_endpoint(&app.address, &app.api_key, &key, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let problem: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], "invalid_request");
        let named: Vec<&str> = problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        assert_eq!(named, fields, "{body}: {problem}");
    }
    // A member twice is refused, not "last one wins".
    let (status, _, _) = post_endpoint(
        &app.address,
        &app.api_key,
        "twice",
        r#"{"url": "https://a.test/", "url": "https://b.test/"}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 0);
}

#[tokio::test]
async fn deliveries_follow_event_types_and_stop_when_the_endpoint_is_deleted() {
    let app = spawn_app_with(fast).await;
    let (all, failed_only, deleted) = (
        Receiver::start().await,
        Receiver::start().await,
        Receiver::start().await,
    );
    let to_all = create_endpoint(&app.address, &app.api_key, &all.url, None).await;
    create_endpoint(
        &app.address,
        &app.api_key,
        &failed_only.url,
        Some(&["charge.failed"]),
    )
    .await;
    let gone = create_endpoint(&app.address, &app.api_key, &deleted.url, None).await;
    let gone_id = gone["id"].as_str().unwrap();
    let (status, answer) = delete_endpoint(&app.address, &app.api_key, gone_id).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["id"], gone["id"]);
    assert_eq!(
        (&answer["deleted"], &answer["enabled"]),
        (&json!(true), &json!(false))
    );
    assert!(answer.get("secret").is_none(), "{answer}");
    // Deleting again: 404, as for any endpoint that does not exist; and
    // nobody deletes another merchant's endpoint.
    let (status, _) = delete_endpoint(&app.address, &app.api_key, gone_id).await;
    assert_eq!(status, 404);
    let other = app.create_merchant("Other").await;
    let (status, _) = delete_endpoint(&app.address, &other, to_all["id"].as_str().unwrap()).await;
    assert_eq!(status, 404);
    let (status, _) = delete_endpoint(&app.address, &app.api_key, "we_nope").await;
    assert_eq!(status, 404);

    assert_eq!(app.post_charge("ok", &charge_body(100)).await.status, 201);
    assert_eq!(app.post_charge("no", &charge_body(102)).await.status, 402);
    all.wait_until("both events", Duration::from_secs(10), |r| r.len() >= 2)
        .await;
    failed_only
        .wait_until("the failed charge's event", Duration::from_secs(10), |r| {
            !r.is_empty()
        })
        .await;
    // Time for anything that should not come to come.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let types = |r: &Receiver| -> Vec<String> {
        r.received()
            .iter()
            .map(|r| r.json()["type"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut to_all_types = types(&all);
    to_all_types.sort();
    assert_eq!(to_all_types, ["charge.failed", "charge.succeeded"]);
    assert_eq!(types(&failed_only), ["charge.failed"]);
    assert!(deleted.received().is_empty());

    // The failed charge's event went to two endpoints, once each.
    let failed_event = newest_event(&app).await;
    assert_eq!(failed_event["type"], "charge.failed");
    let deliveries = wait_for_deliveries(
        &app,
        failed_event["id"].as_str().unwrap(),
        "two delivered",
        |d| d.len() == 2 && d.iter().all(|d| d["status"] == "delivered"),
    )
    .await;
    let urls: HashSet<&str> = deliveries
        .iter()
        .map(|d| d["url"].as_str().unwrap())
        .collect();
    assert_eq!(
        urls,
        HashSet::from([all.url.as_str(), failed_only.url.as_str()])
    );

    // An endpoint deleted while its delivery waits for a retry: the
    // delivery is given up, and no attempt starts after the deletion.
    let flaky = Receiver::start().await;
    flaky.otherwise(Answer::Status(503));
    let flaky_endpoint = create_endpoint(&app.address, &app.api_key, &flaky.url, None).await;
    assert_eq!(
        app.post_charge("third", &charge_body(300)).await.status,
        201
    );
    flaky
        .wait_until("two failed attempts", Duration::from_secs(10), |r| {
            r.len() >= 2
        })
        .await;
    let given_up_total = |text: &str| {
        crate::observability::sample(
            text,
            "chargeonce_webhook_deliveries_failed_total",
            &[("reason", "endpoint_deleted")],
        )
    };
    let given_up_before = given_up_total(&crate::observability::scrape(&app).await);
    let (status, _) = delete_endpoint(
        &app.address,
        &app.api_key,
        flaky_endpoint["id"].as_str().unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    let deleted_at = Instant::now();
    let third = newest_event(&app).await;
    let deliveries = wait_for_deliveries(
        &app,
        third["id"].as_str().unwrap(),
        "the deleted endpoint's delivery to be given up",
        |d| {
            d.iter()
                .any(|d| d["url"] == flaky.url.as_str() && d["status"] == "failed")
        },
    )
    .await;
    let given_up = deliveries
        .iter()
        .find(|d| d["url"] == flaky.url.as_str())
        .unwrap();
    assert_eq!(given_up["last_error"], "the endpoint was deleted");
    assert_eq!(given_up["next_attempt_at"], Value::Null);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // One attempt may have been on its way when the endpoint was deleted.
    let late = flaky
        .received()
        .iter()
        .filter(|r| r.at > deleted_at + Duration::from_millis(50))
        .count();
    assert_eq!(late, 0, "attempts after the deletion");
    // Counted (the recorder is shared by the tests of this binary: only
    // the increase is asserted).
    assert!(given_up_total(&crate::observability::scrape(&app).await) >= given_up_before + 1.0);
    // And the dispatcher goes on with the other endpoints.
    let sent = all.received().len();
    assert_eq!(
        app.post_charge("fourth", &charge_body(400)).await.status,
        201
    );
    all.wait_until("the next event", Duration::from_secs(10), |r| {
        r.len() > sent
    })
    .await;
}

/// The `webhook-signature` of `received`, computed here from the Standard
/// Webhooks spec, independently of the service's code: base64 of
/// HMAC-SHA256, keyed with the secret's base64 after `whsec_`, over
/// `"{id}.{timestamp}.{body}"`.
fn expected_signature(secret: &str, received: &Received) -> String {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", received.id, received.timestamp).as_bytes());
    mac.update(&received.body);
    let digest = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// The `standardwebhooks` package, pinned, in a virtualenv under target/,
/// installed once per run (in seconds, from PyPI) unless it is there.
const STANDARDWEBHOOKS: &str = "standardwebhooks==1.1.0";

async fn standardwebhooks_python() -> PathBuf {
    static PYTHON: OnceCell<PathBuf> = OnceCell::const_new();
    PYTHON
        .get_or_init(|| async {
            tokio::task::spawn_blocking(install_standardwebhooks)
                .await
                .unwrap()
        })
        .await
        .clone()
}

fn install_standardwebhooks() -> PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("standardwebhooks-venv");
    let python = venv.join("bin").join("python");
    let version = STANDARDWEBHOOKS.split("==").nth(1).unwrap();
    let installed = Command::new(&python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('standardwebhooks'))",
        ])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == version);
    if installed {
        return python;
    }
    let run = |command: &mut Command, what: &str| {
        let output = command
            .output()
            .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
        assert!(
            output.status.success(),
            "{what} failed, so the signatures cannot be checked with the standardwebhooks \
             package (needs python3 with venv, e.g. apt-get install python3-venv, and PyPI):\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(
        Command::new("python3")
            .args(["-m", "venv", "--clear"])
            .arg(&venv),
        "python3 -m venv",
    );
    run(
        Command::new(venv.join("bin").join("pip")).args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            STANDARDWEBHOOKS,
        ]),
        &format!("pip install {STANDARDWEBHOOKS}"),
    );
    python
}

/// Verifies every delivery with `standardwebhooks.Webhook(secret).verify`,
/// and checks that it refuses a tampered body and a wrong secret.
async fn verify_with_standardwebhooks(secret: &str, received: &[Received]) {
    const SCRIPT: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
secret, other_secret = sys.argv[1], sys.argv[2]
deliveries = json.load(sys.stdin)
for d in deliveries:
    Webhook(secret).verify(d["body"], d["headers"])
    for webhook, body in ((Webhook(secret), d["body"] + " "), (Webhook(other_secret), d["body"])):
        try:
            webhook.verify(body, d["headers"])
        except WebhookVerificationError:
            continue
        sys.exit("a tampered delivery verified")
print(len(deliveries))
"#;
    let python = standardwebhooks_python().await;
    let input = serde_json::to_vec(
        &received
            .iter()
            .map(|r| json!({"body": String::from_utf8(r.body.clone()).unwrap(), "headers": r.headers()}))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let other_secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode([7u8; 32])
    );
    let secret = secret.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = Command::new(python)
            .args(["-c", SCRIPT, &secret, &other_secret])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(&input).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "standardwebhooks refused a delivery: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        received.len().to_string()
    );
}

#[tokio::test]
async fn signatures_verify_by_the_spec_and_with_standardwebhooks() {
    let app = spawn_app_with(fast).await;
    let receiver = Receiver::start().await;
    let endpoint = create_endpoint(&app.address, &app.api_key, &receiver.url, None).await;
    let secret = endpoint["secret"].as_str().unwrap();
    for (i, amount) in [100, 102, 300].into_iter().enumerate() {
        app.post_charge(&format!("sig-{i}"), &charge_body(amount))
            .await;
    }
    let received = receiver
        .wait_until("three events", Duration::from_secs(10), |r| r.len() >= 3)
        .await;
    let now = chrono::Utc::now().timestamp();
    for delivery in &received {
        assert!(delivery.id.starts_with("evt_"), "{}", delivery.id);
        assert_eq!(delivery.content_type, "application/json");
        let timestamp: i64 = delivery.timestamp.parse().unwrap();
        assert!((now - timestamp).abs() < 60, "timestamp {timestamp}");
        // The body is the event as the API shows it, byte for byte.
        let (status, event) = get(
            &app.address,
            &app.api_key,
            &format!("/v1/events/{}", delivery.id),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(event.as_bytes(), delivery.body.as_slice());
        assert_eq!(delivery.signature, expected_signature(secret, delivery));
    }
    verify_with_standardwebhooks(secret, &received).await;
}

/// A receiver that accepts connections and never answers (a hung server):
/// the dispatcher waits `webhooks.timeout_ms` on each attempt, and holds no
/// transaction and no lock meanwhile, so charges are created at their usual
/// pace.
#[tokio::test]
async fn a_hung_receiver_never_blocks_charge_creation() {
    let app = spawn_app_with(|s| {
        fast(s);
        s.webhooks.timeout = Duration::from_secs(30);
    })
    .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let hole = {
        let held = held.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                held.lock().unwrap().push(socket);
            }
        })
    };
    create_endpoint(&app.address, &app.api_key, &url, None).await;
    assert_eq!(
        app.post_charge("first", &charge_body(100)).await.status,
        201
    );
    let started = Instant::now();
    while held.lock().unwrap().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never delivered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // While an attempt hangs: charges (each with its event) at once, and no
    // session of this database idle in a transaction.
    for n in 0..20 {
        let started = Instant::now();
        let reply = app
            .post_charge(&format!("during-{n}"), &charge_body(100))
            .await;
        assert_eq!(reply.status, 201, "{}", reply.body);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "charge {n} took {:?} while a delivery hung",
            started.elapsed()
        );
    }
    let idle_in_transaction = app
        .count(
            "SELECT count(*) FROM pg_stat_activity \
              WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )
        .await;
    assert_eq!(idle_in_transaction, 0);
    assert!(!held.lock().unwrap().is_empty(), "the attempt still hangs");
    assert_eq!(app.count("SELECT count(*) FROM charges").await, 21);
    hole.abort();
}

#[tokio::test]
async fn a_receiver_failing_twice_gets_the_event_on_the_third_attempt() {
    let app = spawn_app_with(fast).await;
    let receiver = Receiver::start().await;
    receiver.script([Answer::Status(500), Answer::Drop]);
    create_endpoint(&app.address, &app.api_key, &receiver.url, None).await;
    assert_eq!(
        app.post_charge("retry", &charge_body(100)).await.status,
        201
    );

    receiver
        .wait_until("a third attempt", Duration::from_secs(10), |r| r.len() >= 3)
        .await;
    let event = newest_event(&app).await;
    let event_id = event["id"].as_str().unwrap();
    let deliveries = wait_for_deliveries(&app, event_id, "delivered", |d| {
        d.first().is_some_and(|d| d["status"] == "delivered")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let received = receiver.received();
    assert_eq!(
        received.iter().map(|r| r.answer).collect::<Vec<_>>(),
        [Answer::Status(500), Answer::Drop, Answer::Status(200)]
    );
    // Every attempt: the same id and the same body, its own signature time.
    assert!(received.iter().all(|r| r.id == event_id));
    assert!(received.iter().all(|r| r.body == received[0].body));

    assert_eq!(deliveries.len(), 1);
    let delivery = &deliveries[0];
    assert_eq!(delivery["attempts"], 3);
    assert_eq!(delivery["last_status_code"], 200);
    assert_eq!(delivery["last_error"], Value::Null);
    assert_eq!(delivery["next_attempt_at"], Value::Null);
    let log = delivery["attempt_log"].as_array().unwrap();
    assert_eq!(log.len(), 3, "{delivery:#}");
    assert_eq!(
        log.iter().map(|a| a["attempt"].clone()).collect::<Vec<_>>(),
        [json!(1), json!(2), json!(3)]
    );
    assert_eq!(
        (&log[0]["status_code"], &log[0]["error"]),
        (&json!(500), &Value::Null)
    );
    assert_eq!(log[1]["status_code"], Value::Null);
    let dropped = log[1]["error"].as_str().unwrap();
    assert!(
        !dropped.is_empty() && !dropped.contains(&receiver.url),
        "{dropped}"
    );
    assert_eq!(log[2]["status_code"], 200);
    for attempt in log {
        assert!(attempt["duration_ms"].as_i64().unwrap() >= 0);
        assert!(attempt["created_at"].is_string());
    }
}

fn production_settings() -> Settings {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let vars = HashMap::from([("CHARGEONCE_ENV".to_owned(), "production".to_owned())]);
    Settings::load_from(&config, &vars).expect("config/production.toml loads")
}

#[tokio::test]
async fn private_targets_are_refused_under_the_production_configuration() {
    let production = production_settings();
    assert!(!production.webhooks.allow_private_targets);
    let app = spawn_app_with(move |s| {
        let (database, server) = (s.database.clone(), s.server.clone());
        *s = production;
        s.database = database;
        s.server = server;
        // Production's processor is a remote one; a charge needs one here.
        s.processor.kind = ProcessorKind::Simulated;
        fast(s);
    })
    .await;
    let receiver = Receiver::start().await;
    let by_name = receiver.url.replace("127.0.0.1", "localhost");
    for url in [
        receiver.url.as_str(),
        by_name.as_str(),
        "http://10.1.2.3/hooks",
        "https://192.168.0.10/hooks",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]:8080/",
        "http://[fe80::1]/",
        "http://[fd00::5]/",
        "http://0.0.0.0:8080/",
        "http://[::ffff:127.0.0.1]/",
        "http://0x7f000001/",
    ] {
        let body = json!({ "url": url }).to_string();
        let (status, _, answer) = post_endpoint(&app.address, &app.api_key, url, &body).await;
        assert_eq!(status, 400, "{url}: {answer}");
        let problem: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], "invalid_request");
        assert_eq!(problem["errors"][0]["field"], "url", "{problem}");
        assert!(
            problem["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains("private"),
            "{problem}"
        );
    }
    // A public address is fine. (No event of this test is of its type, so
    // nothing is ever sent there.)
    create_endpoint(
        &app.address,
        &app.api_key,
        "http://93.184.216.34/hooks",
        Some(&["refund.failed"]),
    )
    .await;
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 1);

    // At delivery time, too: endpoints stored as if their addresses had
    // been public when they were created.
    let sql = app.sql().await;
    for url in [&receiver.url, &by_name] {
        sql.execute(
            "INSERT INTO webhook_endpoints (id, merchant_id, url, secret, request_fingerprint) \
             SELECT $1, id, $2, 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', sha256('x') FROM merchants",
            &[&Uuid::now_v7(), url],
        )
        .await
        .unwrap();
    }
    assert_eq!(
        app.post_charge("private", &charge_body(100)).await.status,
        201
    );
    let event = newest_event(&app).await;
    let deliveries = wait_for_deliveries(
        &app,
        event["id"].as_str().unwrap(),
        "attempts at both private targets",
        |d| d.len() == 2 && d.iter().all(|d| d["attempts"].as_i64() >= Some(1)),
    )
    .await;
    for delivery in &deliveries {
        let error = delivery["attempt_log"][0]["error"].as_str().unwrap_or("");
        assert!(error.contains("private"), "{delivery:#}");
        assert_eq!(delivery["attempt_log"][0]["status_code"], Value::Null);
    }
    assert!(receiver.received().is_empty(), "nothing reached it");

    // The development defaults allow them.
    let development = spawn_app().await;
    create_endpoint(
        &development.address,
        &development.api_key,
        &receiver.url,
        None,
    )
    .await;
    create_endpoint(&development.address, &development.api_key, &by_name, None).await;
}

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

// The real binary.

/// Settings (as environment) for a quick dispatcher.
fn dispatcher_env(timeout_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("CHARGEONCE__WEBHOOKS__INTERVAL_MS", "20".to_owned()),
        ("CHARGEONCE__WEBHOOKS__TIMEOUT_MS", timeout_ms.to_string()),
        ("CHARGEONCE__WEBHOOKS__BACKOFF_BASE_MS", "100".to_owned()),
        ("CHARGEONCE__WEBHOOKS__MAX_BACKOFF_MS", "500".to_owned()),
    ]
}

/// Creates `count` charges through `services` in turn, 16 at a time.
async fn create_charges(services: &[&Process], secret: &str, count: usize) {
    use futures_util::StreamExt;
    let http = reqwest::Client::new();
    let urls: Vec<String> = services.iter().map(|s| s.url.clone()).collect();
    futures_util::stream::iter(0..count)
        .map(|i| {
            let request = http
                .post(format!("{}/v1/charges", urls[i % urls.len()]))
                .bearer_auth(secret)
                .header("Idempotency-Key", format!("charge-{i}"))
                .header("Content-Type", "application/json")
                .body(charge_body(100 + 100 * i as i64));
            async move {
                let status = request.send().await.expect("charge answered").status();
                assert_eq!(status, 201);
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
}

async fn event_ids(db: &Database) -> HashSet<String> {
    db.client()
        .await
        .query("SELECT id FROM events", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| format!("evt_{}", row.get::<_, Uuid>(0).simple()))
        .collect()
}

async fn undelivered(db: &Database) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Waits until every event of `db` has arrived at `receiver` and every
/// delivery is recorded as delivered.
async fn wait_all_delivered(db: &Database, receiver: &Receiver, events: usize, limit: Duration) {
    let started = Instant::now();
    loop {
        let ids = event_ids(db).await;
        let arrived = receiver.arrivals();
        if ids.len() == events
            && ids.iter().all(|id| arrived.contains_key(id))
            && undelivered(db).await == 0
        {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "after {limit:?}: {} events, {} arrived, {} not delivered",
            ids.len(),
            ids.iter().filter(|id| arrived.contains_key(*id)).count(),
            undelivered(db).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_dispatcher_killed_mid_delivery_loses_no_event_and_resends_with_the_same_id() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    // A slow receiver: the kill finds deliveries in flight.
    receiver.delay(Duration::from_millis(1500));
    let env = dispatcher_env(3000);
    let mut first = start_service(&db.url, &env).await;
    create_endpoint(&first.url, &secret, &receiver.url, None).await;
    create_charges(&[&first], &secret, 20).await;

    receiver.wait_for_in_flight(Duration::from_secs(10)).await;
    first.signal(Signal::SIGKILL);
    first
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("killed");
    let in_flight_at_kill: HashSet<String> =
        receiver.received().iter().map(|r| r.id.clone()).collect();

    // Another instance takes over once the killed one's leases run out
    // (timeout + 5 s).
    let _second = start_service(&db.url, &env).await;
    wait_all_delivered(&db, &receiver, 20, Duration::from_secs(40)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let arrivals = receiver.arrivals();
    let events = event_ids(&db).await;
    assert_eq!(events.len(), 20);
    let missing: Vec<_> = events
        .iter()
        .filter(|id| !arrivals.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    // What was in flight when the process died was sent again, with the
    // same webhook-id and the same body: a receiver deduplicates by the id.
    let twice = duplicates(&arrivals);
    assert!(
        !in_flight_at_kill.is_empty() && in_flight_at_kill.iter().all(|id| twice.contains(id)),
        "in flight at the kill: {in_flight_at_kill:?}; arrived twice: {twice:?}"
    );
    let received = receiver.received();
    for id in &twice {
        let bodies: HashSet<&Vec<u8>> = received
            .iter()
            .filter(|r| &r.id == id)
            .map(|r| &r.body)
            .collect();
        assert_eq!(bodies.len(), 1, "{id} came with different bodies");
    }
    assert!(receiver.overlaps().is_empty(), "{:?}", receiver.overlaps());
    let unique: HashSet<&String> = received.iter().map(|r| &r.id).collect();
    println!(
        "killed mid-dispatch: {} events, {} requests, {} ids deduplicated, {} sent twice \
         (all of them in flight at the kill)",
        events.len(),
        received.len(),
        unique.len(),
        twice.len()
    );
}

/// The local ports of `pid`'s TCP sockets connected to `remote_port`
/// (Linux: its socket inodes in /proc/<pid>/fd, their ports in
/// /proc/net/tcp). Only sockets to one remote port: the kernel may give two
/// processes the same local port for connections to different peers (A's
/// database connection and B's webhook connection), which would count a
/// request for both.
fn local_ports(pid: u32, remote_port: u16) -> HashSet<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_string_lossy().into_owned();
                    Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut ports = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |field: &str| {
                field
                    .rsplit(':')
                    .next()
                    .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            };
            if fields.len() > 9
                && inodes.contains(fields[9])
                && port(fields[2]) == Some(remote_port)
            {
                if let Some(local) = port(fields[1]) {
                    ports.insert(local);
                }
            }
        }
    }
    ports
}

#[tokio::test]
async fn two_instances_deliver_500_events_none_lost_none_sent_twice_at_once() {
    const EVENTS: usize = 500;
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    // Long enough for requests to meet, if the leases let them.
    receiver.delay(Duration::from_millis(5));
    let mut env = dispatcher_env(2000);
    env.push(("CHARGEONCE__WEBHOOKS__BATCH_SIZE", "50".to_owned()));
    env.push(("RUST_LOG", "info,chargeonce=debug".to_owned()));
    let a = start_service(&db.url, &env).await;
    let b = start_service(&db.url, &env).await;
    let endpoint = create_endpoint(&a.url, &secret, &receiver.url, None).await;
    let endpoint_secret = endpoint["secret"].as_str().unwrap().to_owned();

    let started = Instant::now();
    create_charges(&[&a, &b], &secret, EVENTS).await;
    wait_all_delivered(&db, &receiver, EVENTS, Duration::from_secs(60)).await;
    let took = started.elapsed();
    // Time for a late duplicate to show.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let arrivals = receiver.arrivals();
    let events = event_ids(&db).await;
    let missing = events
        .iter()
        .filter(|id| !arrivals.contains_key(*id))
        .count();
    let twice = duplicates(&arrivals);
    let overlaps = receiver.overlaps();
    let received = receiver.received();
    let (ports_a, ports_b) = (
        local_ports(a.pid(), receiver.port),
        local_ports(b.pid(), receiver.port),
    );
    let by_a = received
        .iter()
        .filter(|r| ports_a.contains(&r.peer.port()))
        .count();
    let by_b = received
        .iter()
        .filter(|r| ports_b.contains(&r.peer.port()))
        .count();
    println!(
        "two instances: {} events, {} requests in {took:?} (charges included); sent by A {by_a}, \
         by B {by_b}, unattributed {}; lost {missing}, duplicates {}, overlapping {}",
        events.len(),
        received.len(),
        received.len().saturating_sub(by_a + by_b),
        received.len() - arrivals.len(),
        overlaps.len()
    );
    assert_eq!(events.len(), EVENTS);
    assert_eq!(missing, 0);
    assert!(
        overlaps.is_empty(),
        "sent twice at the same time: {overlaps:?}"
    );
    // No crash, no lost lease: not even an at-least-once duplicate.
    assert!(twice.is_empty(), "sent twice: {twice:?}");
    assert!(
        by_a > 0 && by_b > 0,
        "both instances delivered (A {by_a}, B {by_b})"
    );
    let attempts = db
        .client()
        .await
        .query_one(
            "SELECT count(*), max(attempts) FROM webhook_deliveries",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(attempts.get::<_, i64>(0), EVENTS as i64);
    assert_eq!(attempts.get::<_, Option<i32>>(1), Some(1));

    // The signing secret appears in no log line of either instance.
    let key = &endpoint_secret["whsec_".len()..];
    for (name, process) in [("A", &a), ("B", &b)] {
        let log = process.log();
        assert!(!log.is_empty());
        let leaks: Vec<&String> = log.iter().filter(|line| line.contains(key)).collect();
        assert!(
            leaks.is_empty(),
            "instance {name} logged the secret: {leaks:?}"
        );
    }
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
               FROM events e JOIN charges c ON c.id = e.charge_id \
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

/// The database goes away while a receiver holds a delivery: the attempt's
/// outcome is recorded as soon as the database is back (retried within the
/// delivery's lease), so the delivery is marked delivered at once and never
/// sent again.
#[tokio::test]
async fn an_attempt_is_recorded_once_the_database_is_back() {
    use chargeonce_testkit::{Proxy, ProxyMode};
    use secrecy::ExposeSecret;

    let proxy = Proxy::start(crate::helpers::database_address()).await;
    let app = spawn_app_with(|s| {
        fast(s);
        s.database.url = proxy.url_for(s.database.url.expose_secret()).into();
        s.database.connect_timeout = Duration::from_millis(300);
    })
    .await;
    let receiver = Receiver::start().await;
    receiver.delay(Duration::from_millis(800));
    create_endpoint(&app.address, &app.api_key, &receiver.url, None).await;
    assert_eq!(app.post_charge("held", &charge_body(100)).await.status, 201);

    receiver.wait_for_in_flight(Duration::from_secs(10)).await;
    // The receiver answers while the database is cut off.
    proxy.set_mode(ProxyMode::Cut);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    proxy.set_mode(ProxyMode::Forward);
    let back = Instant::now();
    // The delivery's lease is the timeout + 5 s = 7 s: recorded well before
    // it runs out, not sent again when it does.
    let sql = app.sql().await;
    loop {
        let row = sql
            .query_one("SELECT status, attempts FROM webhook_deliveries", &[])
            .await
            .unwrap();
        if row.get::<_, String>(0) == "delivered" {
            assert_eq!(row.get::<_, i32>(1), 1);
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(3),
            "not recorded within 3 s of the database coming back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(receiver.received().len(), 1);
}

/// What the dispatcher logs at info: each failed attempt, numbered from 1
/// as the delivery's attempt log numbers it; and deliveries given up for
/// deleted endpoints only when there were some: rounds that give nothing
/// up say nothing of it.
#[tokio::test]
async fn the_dispatcher_logs_each_failed_attempt_by_number_and_nothing_idle() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    receiver.script([Answer::Status(500), Answer::Status(500)]);
    let mut env = dispatcher_env(3000);
    env.push(("RUST_LOG", "info".to_owned()));
    let service = start_service(&db.url, &env).await;
    create_endpoint(&service.url, &secret, &receiver.url, None).await;
    create_charges(&[&service], &secret, 1).await;
    wait_all_delivered(&db, &receiver, 1, Duration::from_secs(10)).await;
    // Many more rounds (one every 20 ms) with nothing to give up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = service.log();
    let retried: Vec<_> = log
        .iter()
        .filter(|line| line.contains("webhook attempt failed; will retry"))
        .collect();
    assert_eq!(retried.len(), 2, "{log:#?}");
    assert!(retried[0].contains("attempt=1"), "{}", retried[0]);
    assert!(retried[1].contains("attempt=2"), "{}", retried[1]);
    let spoken: Vec<_> = log
        .iter()
        .filter(|line| line.contains("deleted webhook endpoints"))
        .collect();
    assert!(spoken.is_empty(), "{spoken:#?}");
}

/// An attempt whose record the database refuses for good (not a database
/// that is away) is not retried: the dispatcher says so at once and leaves
/// the delivery to come due again when its lease runs out.
#[tokio::test]
async fn an_attempt_the_database_refuses_to_record_is_given_up_at_once() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION refuse_attempt() RETURNS trigger LANGUAGE plpgsql AS \
               $$BEGIN RAISE EXCEPTION 'refused by the test'; END$$; \
             CREATE TRIGGER refuse_attempt BEFORE INSERT ON webhook_attempts \
               FOR EACH ROW EXECUTE FUNCTION refuse_attempt();",
        )
        .await
        .unwrap();
    let receiver = Receiver::start().await;
    let service = start_service(&db.url, &dispatcher_env(3000)).await;
    create_endpoint(&service.url, &secret, &receiver.url, None).await;
    create_charges(&[&service], &secret, 1).await;
    receiver
        .wait_until("the attempt", Duration::from_secs(10), |r| !r.is_empty())
        .await;
    // At once: well within the delivery's lease (8 s).
    service
        .wait_for_line(Duration::from_secs(2), |line| {
            line.contains("cannot record a webhook attempt; the delivery comes due")
        })
        .await;
}

/// A graceful stop (SIGTERM) waits for the attempts in flight and records
/// them: a delivery the receiver was answering is delivered, not left to
/// come due again and be sent twice.
#[tokio::test]
async fn a_graceful_stop_records_the_attempts_in_flight() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    receiver.delay(Duration::from_millis(1000));
    let mut service = start_service(&db.url, &dispatcher_env(3000)).await;
    create_endpoint(&service.url, &secret, &receiver.url, None).await;
    create_charges(&[&service], &secret, 1).await;
    receiver.wait_for_in_flight(Duration::from_secs(10)).await;
    service.signal(Signal::SIGTERM);
    service
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("stopped");
    let row = db
        .client()
        .await
        .query_one("SELECT status, attempts FROM webhook_deliveries", &[])
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i32>(1)),
        ("delivered".to_owned(), 1)
    );
}
