//! One delivery attempt: `POST` the event's JSON to the endpoint, signed,
//! within `webhooks.timeout_ms`, and say what came of it. Never retries by
//! itself; the dispatcher decides when to try again.
//!
//! The client follows no redirects (a 3xx is an unsuccessful answer: a
//! redirect could lead to an address the target rules refuse) and uses no
//! proxy (a proxy would connect on our behalf, past the address check).

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;
use url::Url;

use super::signature;
use super::targets::{PublicOnlyResolver, TargetPolicy};
use crate::config::WebhookSettings;
use crate::domain::{Event, WebhookSecret};
use crate::telemetry::error_chain;

/// Most bytes of a receiver's answer read (and thrown away) so its
/// connection can be used again; a longer answer closes the connection.
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// Longest error text kept for an attempt.
const MAX_ERROR_CHARS: usize = 500;

/// What one attempt got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptOutcome {
    /// The receiver's status code, if it answered.
    pub status_code: Option<u16>,
    /// Why there was no answer (or no attempt at all: a refused target).
    pub error: Option<String>,
    pub duration: Duration,
}

impl AttemptOutcome {
    /// Delivered: the receiver answered 2xx.
    pub fn delivered(&self) -> bool {
        self.status_code
            .is_some_and(|code| (200..300).contains(&code))
    }
}

/// The HTTP client of the dispatcher. Cheap to clone.
#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
    targets: TargetPolicy,
    timeout: Duration,
}

impl Sender {
    pub fn new(settings: &WebhookSettings) -> Result<Self, reqwest::Error> {
        let targets = TargetPolicy::new(settings.allow_private_targets);
        let mut builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("chargeonce-webhooks/", env!("CARGO_PKG_VERSION")))
            .pool_idle_timeout(Duration::from_secs(30));
        if !targets.allows_private() {
            builder = builder.dns_resolver(Arc::new(PublicOnlyResolver));
        }
        Ok(Self {
            client: builder.build()?,
            targets,
            timeout: settings.timeout,
        })
    }

    /// Sends `event` to `url`, signed with `secret`. The `webhook-id` is the
    /// event's id: the same on every attempt and for every endpoint, so a
    /// receiver deduplicates by it. The timestamp is this attempt's.
    pub async fn send(&self, url: &str, secret: &WebhookSecret, event: &Event) -> AttemptOutcome {
        let started = Instant::now();
        // reqwest's own timeout bounds the request; this one also bounds
        // resolving (and anything else) before it.
        let result = tokio::time::timeout(self.timeout, self.attempt(url, secret, event)).await;
        let (status_code, error) = match result {
            Ok(Ok(response)) => {
                let status = response.status().as_u16();
                // The answer counts once its status is in; reading the body
                // only serves to reuse the connection, so it gets what is
                // left of the time and its failure changes nothing.
                let left = self.timeout.saturating_sub(started.elapsed());
                let _ = tokio::time::timeout(left, drain(response)).await;
                (Some(status), None)
            }
            Ok(Err(error)) => (None, Some(truncate(error))),
            Err(_) => (
                None,
                Some(format!(
                    "no answer within {} ms (webhooks.timeout_ms)",
                    self.timeout.as_millis()
                )),
            ),
        };
        AttemptOutcome {
            status_code,
            error,
            duration: started.elapsed(),
        }
    }

    async fn attempt(
        &self,
        url: &str,
        secret: &WebhookSecret,
        event: &Event,
    ) -> Result<reqwest::Response, String> {
        let url = Url::parse(url).map_err(|e| format!("the endpoint URL is invalid: {e}"))?;
        self.targets
            .check_literal(&url)
            .map_err(|e| e.to_string())?;
        let key = secret
            .signing_key()
            .ok_or("the endpoint's secret is malformed")?;
        let body = event
            .to_json()
            .map_err(|e| format!("cannot render the event: {e}"))?;
        let id = event.id.to_string();
        let timestamp = Utc::now().timestamp();
        let signature = signature::sign(&key, &id, timestamp, &body);
        self.client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await
            // Without the URL: the merchant knows it, and it may carry a
            // token that has no place in our logs.
            .map_err(|e| error_chain(&e.without_url()))
    }
}

/// Reads and drops up to `MAX_ANSWER_BYTES` of an answer.
async fn drain(mut response: reqwest::Response) {
    let mut read = 0;
    while let Ok(Some(chunk)) = response.chunk().await {
        read += chunk.len();
        if read > MAX_ANSWER_BYTES {
            return;
        }
    }
}

fn truncate(mut text: String) -> String {
    if let Some((index, _)) = text.char_indices().nth(MAX_ERROR_CHARS) {
        text.truncate(index);
        text.push('…');
    }
    text
}
