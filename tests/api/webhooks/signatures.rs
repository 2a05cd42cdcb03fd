//! Signatures: every delivery is signed per Standard Webhooks, checked by an
//! HMAC written here from the spec and by the `standardwebhooks` package.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use tokio::sync::OnceCell;

use super::fast;
use crate::helpers::{charge_body, spawn_app_with};
use crate::webhook_receiver::{create_endpoint, get, Received, Receiver};

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
