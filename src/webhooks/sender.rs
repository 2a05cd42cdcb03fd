//! One delivery attempt: `POST` the event's JSON to the endpoint, signed,
//! within `webhooks.timeout_ms`, and say what came of it. Never retries by
//! itself; the dispatcher decides when to try again.
//!
//! The client follows no redirects (a 3xx is an unsuccessful answer: a
//! redirect could lead to an address the target rules refuse) and uses no
//! proxy (a proxy would connect on our behalf, past the address check).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use url::Url;

use super::signature;
use super::targets::{PublicOnlyResolver, TargetPolicy, TargetRefused};
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
    /// The kind of outcome, for the metrics.
    pub kind: AttemptKind,
}

/// The kinds of outcome the metrics tell apart (their `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    /// A 2xx answer.
    Delivered,
    /// Any other answer, 3xx included.
    FailedStatus,
    /// No answer within `webhooks.timeout_ms`.
    Timeout,
    /// No connection: the host did not resolve, the connection was refused
    /// or the address unreachable, TLS failed.
    FailedConnect,
    /// Connected, but the connection closed or broke before an answer.
    FailedNoAnswer,
    /// The address is private and `webhooks.allow_private_targets` is off:
    /// nothing was sent.
    RefusedTarget,
    /// The stored URL, secret or event could not be used: nothing was sent.
    Unsendable,
}

impl AttemptKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Delivered => "delivered",
            Self::FailedStatus => "failed_status",
            Self::Timeout => "timeout",
            Self::FailedConnect => "failed_connect",
            Self::FailedNoAnswer => "failed_no_answer",
            Self::RefusedTarget => "refused_target",
            Self::Unsendable => "unsendable",
        }
    }
}

impl AttemptOutcome {
    /// Delivered: the receiver answered 2xx.
    pub fn delivered(&self) -> bool {
        self.status_code.is_some_and(response_delivered)
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
        let (status_code, error, kind) = match result {
            Ok(Ok(response)) => {
                let status = response.status().as_u16();
                // The answer counts once its status is in; reading the body
                // only serves to reuse the connection, so it gets what is
                // left of the time and its failure changes nothing.
                let left = self.timeout.saturating_sub(started.elapsed());
                let _ = tokio::time::timeout(left, drain(response)).await;
                let kind = if response_delivered(status) {
                    AttemptKind::Delivered
                } else {
                    AttemptKind::FailedStatus
                };
                (Some(status), None, kind)
            }
            Ok(Err((kind, error))) => (None, Some(truncate(error)), kind),
            Err(_) => (
                None,
                Some(format!(
                    "no answer within {} ms (webhooks.timeout_ms)",
                    self.timeout.as_millis()
                )),
                AttemptKind::Timeout,
            ),
        };
        AttemptOutcome {
            status_code,
            error,
            duration: started.elapsed(),
            kind,
        }
    }

    async fn attempt(
        &self,
        url: &str,
        secret: &WebhookSecret,
        event: &Event,
    ) -> Result<reqwest::Response, (AttemptKind, String)> {
        let unsendable = |text: String| (AttemptKind::Unsendable, text);
        let url =
            Url::parse(url).map_err(|e| unsendable(format!("the endpoint URL is invalid: {e}")))?;
        self.targets
            .check_literal(&url)
            .map_err(|e| (AttemptKind::RefusedTarget, e.to_string()))?;
        let key = secret
            .signing_key()
            .ok_or_else(|| unsendable("the endpoint's secret is malformed".to_owned()))?;
        let body = event
            .to_json()
            .map_err(|e| unsendable(format!("cannot render the event: {e}")))?;
        let id = event.id.to_string();
        let timestamp = crate::clock::now().timestamp();
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
            .map_err(|e| (failure_kind(&e), error_chain(&e.without_url())))
    }
}

fn response_delivered(status: u16) -> bool {
    (200..300).contains(&status)
}

/// What kind of failure a request that got no answer had.
fn failure_kind(error: &reqwest::Error) -> AttemptKind {
    if error.is_timeout() {
        return AttemptKind::Timeout;
    }
    // `PublicOnlyResolver` refusing the host's address fails the connection
    // with its `TargetRefused` somewhere down the chain of causes.
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(TargetRefused::Private { .. }) = error.downcast_ref::<TargetRefused>() {
            return AttemptKind::RefusedTarget;
        }
        cause = error.source();
    }
    if error.is_connect() {
        AttemptKind::FailedConnect
    } else {
        AttemptKind::FailedNoAnswer
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EventId, EventType, MerchantId};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn sender(allow_private_targets: bool, timeout: Duration) -> Sender {
        let settings = WebhookSettings {
            timeout,
            max_attempts: 1,
            allow_private_targets,
            interval: Duration::from_secs(1),
            batch_size: 1,
            backoff_base: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
            max_endpoints_per_merchant: 1,
            max_in_flight_per_endpoint: 1,
            trip_after_failures: 1,
            disable_after: Duration::from_secs(1),
        };
        Sender::new(&settings).expect("the client builds")
    }

    fn event() -> Event {
        Event {
            id: EventId::new(),
            merchant_id: MerchantId::new(),
            event_type: EventType::ChargeSucceeded,
            data: serde_json::json!({"id": "ch_test"}),
            created_at: chrono::Utc::now(),
        }
    }

    /// A local server that reads a request and then does `then` with the
    /// connection; its URL.
    async fn server(then: &'static [u8], hold: Duration) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("a bound port");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = vec![0; 64 * 1024];
                    let _ = stream.read(&mut buffer).await;
                    tokio::time::sleep(hold).await;
                    let _ = stream.write_all(then).await;
                });
            }
        });
        format!("http://{address}/hooks")
    }

    async fn kind(sender: &Sender, url: &str) -> AttemptKind {
        sender
            .send(url, &WebhookSecret::generate(), &event())
            .await
            .kind
    }

    #[tokio::test]
    async fn each_outcome_has_its_kind() {
        let lax = sender(true, Duration::from_millis(500));
        let ok = server(b"HTTP/1.1 204 No Content\r\n\r\n", Duration::ZERO).await;
        assert_eq!(kind(&lax, &ok).await, AttemptKind::Delivered);
        let moved = server(
            b"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n",
            Duration::ZERO,
        )
        .await;
        assert_eq!(kind(&lax, &moved).await, AttemptKind::FailedStatus);
        let closed = server(b"", Duration::ZERO).await;
        assert_eq!(kind(&lax, &closed).await, AttemptKind::FailedNoAnswer);
        let slow = server(b"", Duration::from_secs(5)).await;
        assert_eq!(kind(&lax, &slow).await, AttemptKind::Timeout);
        // Nothing listens on port 9 (discard) here.
        assert_eq!(
            kind(&lax, "http://127.0.0.1:9/hooks").await,
            AttemptKind::FailedConnect
        );
        assert_eq!(kind(&lax, "not a URL").await, AttemptKind::Unsendable);

        let strict = sender(false, Duration::from_millis(500));
        // An IP literal, refused before connecting; a name, by the resolver.
        assert_eq!(
            kind(&strict, &ok).await,
            AttemptKind::RefusedTarget,
            "literal"
        );
        assert_eq!(
            kind(&strict, "http://localhost:9/hooks").await,
            AttemptKind::RefusedTarget,
            "resolved"
        );
    }
}
