//! The client: configuration, the calls of the API, and one HTTP exchange.
//!
//! Invariants:
//! - A create call is an operation ([`ChargeOperation`], [`RefundOperation`])
//!   that holds its idempotency key and its body bytes from the moment it is
//!   made; every attempt, and every later `send` of the same operation,
//!   sends exactly those. Nothing here makes a key except the constructors
//!   of an operation.
//! - Reads (`get_*`, `list_*`) carry no key: they change nothing, so
//!   retrying them is always safe.
//! - The secret key lives only in a sensitive default header; it is never
//!   printed by `Debug` or put in an error.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt, TryStreamExt};
use reqwest::header::{self, HeaderMap, HeaderValue};
use reqwest::{Method, Url};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::model::{Page, Resource};
use crate::retry::{self, RetryPolicy};
use crate::{Charge, Error, IdempotencyKey, ListParams, NewCharge, NewRefund, Refund};

/// The default bound on one attempt (connect, send, answer).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The default bound on opening a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

const USER_AGENT: &str = concat!("chargeonce-client/", env!("CARGO_PKG_VERSION"));

/// A chargeonce API client for one merchant (one secret key). Cheap to
/// clone: clones share one connection pool.
///
/// ```no_run
/// use chargeonce_client::{Client, NewCharge};
///
/// # async fn run() -> Result<(), chargeonce_client::Error> {
/// let client = Client::new("http://127.0.0.1:8080", "sk_...")?;
/// let charge = client.create_charge(&NewCharge::new(1999, "USD")).await?;
/// println!("{} {:?}", charge.id, charge.status);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    http: reqwest::Client,
    base_url: Url,
    request_timeout: Duration,
    retry_policy: RetryPolicy,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Deliberately without the secret key.
        f.debug_struct("Client")
            .field("base_url", &self.inner.base_url.as_str())
            .field("request_timeout", &self.inner.request_timeout)
            .field("retry_policy", &self.inner.retry_policy)
            .finish_non_exhaustive()
    }
}

/// Configures a [`Client`]: timeouts and the retry policy.
///
/// ```no_run
/// use std::time::Duration;
/// use chargeonce_client::{Client, RetryPolicy};
///
/// # fn run() -> Result<(), chargeonce_client::Error> {
/// let client = Client::builder("https://payments.internal", "sk_...")
///     .request_timeout(Duration::from_secs(5))
///     .retry_policy(RetryPolicy { max_attempts: 5, ..RetryPolicy::default() })
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClientBuilder {
    base_url: String,
    secret_key: String,
    request_timeout: Duration,
    connect_timeout: Duration,
    retry_policy: RetryPolicy,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("base_url", &self.base_url)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retry_policy", &self.retry_policy)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// The bound on one attempt: connecting, sending and reading the answer
    /// (default 10 s). The retry policy's deadline bounds the whole call.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// The bound on opening a connection (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How calls are retried (default [`RetryPolicy::default`]).
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policy = policy;
        self
    }

    /// Builds the client. Fails on a base URL that is not `http(s)://…` or a
    /// secret key that cannot be sent in a header.
    pub fn build(self) -> Result<Client, Error> {
        let base_url = Url::parse(&self.base_url)
            .map_err(|e| Error::Config(format!("base URL {:?}: {e}", self.base_url)))?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.cannot_be_a_base() {
            return Err(Error::Config(format!(
                "base URL {:?} must be http:// or https://",
                self.base_url
            )));
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", self.secret_key))
            .map_err(|_| {
                Error::Config("the secret key has characters a header cannot carry".into())
            })?;
        authorization.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, authorization);
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let http = reqwest::Client::builder()
            .default_headers(headers)
            .user_agent(USER_AGENT)
            .connect_timeout(self.connect_timeout)
            .build()
            .map_err(|e| Error::Config(format!("HTTP client: {e}")))?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base_url,
                request_timeout: self.request_timeout,
                retry_policy: self.retry_policy,
            }),
        })
    }
}

impl Client {
    /// A client with the default timeouts and retry policy. `base_url` is
    /// where the service answers, e.g. `http://127.0.0.1:8080` (a path
    /// prefix such as `https://gw.example/payments/` is kept).
    pub fn new(base_url: impl Into<String>, secret_key: impl Into<String>) -> Result<Self, Error> {
        Self::builder(base_url, secret_key).build()
    }

    /// A builder to set timeouts and the retry policy.
    pub fn builder(base_url: impl Into<String>, secret_key: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            secret_key: secret_key.into(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            retry_policy: RetryPolicy::default(),
        }
    }

    /// The retry policy every call follows.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry_policy
    }

    /// A new logical charge with a fresh key. Nothing is sent until
    /// [`ChargeOperation::send`]; read the key first with
    /// [`ChargeOperation::key`] if it must outlive this process.
    pub fn charge_operation(&self, charge: &NewCharge) -> ChargeOperation {
        self.charge_operation_with_key(charge, IdempotencyKey::new())
    }

    /// A logical charge under a key the caller already has: one it stored
    /// before a restart, or one derived from its own order id.
    pub fn charge_operation_with_key(
        &self,
        charge: &NewCharge,
        key: IdempotencyKey,
    ) -> ChargeOperation {
        ChargeOperation {
            client: self.clone(),
            url: self.url(&["v1", "charges"]),
            key,
            body: to_body(charge),
        }
    }

    /// Creates a charge exactly once, with a fresh key and retries. The key
    /// is in every error ([`Error::idempotency_key`]).
    pub async fn create_charge(&self, charge: &NewCharge) -> Result<Charge, Error> {
        self.charge_operation(charge).send().await
    }

    /// Creates a charge under `key`; see [`Client::charge_operation_with_key`].
    pub async fn create_charge_with_key(
        &self,
        charge: &NewCharge,
        key: IdempotencyKey,
    ) -> Result<Charge, Error> {
        self.charge_operation_with_key(charge, key).send().await
    }

    /// A new logical refund of `charge_id` with a fresh key.
    pub fn refund_operation(&self, charge_id: &str, refund: &NewRefund) -> RefundOperation {
        self.refund_operation_with_key(charge_id, refund, IdempotencyKey::new())
    }

    /// A logical refund under a key the caller already has.
    pub fn refund_operation_with_key(
        &self,
        charge_id: &str,
        refund: &NewRefund,
        key: IdempotencyKey,
    ) -> RefundOperation {
        RefundOperation {
            client: self.clone(),
            url: self.url(&["v1", "charges", charge_id, "refunds"]),
            key,
            body: to_body(refund),
        }
    }

    /// Refunds (part of) a charge exactly once, with a fresh key and
    /// retries.
    pub async fn create_refund(
        &self,
        charge_id: &str,
        refund: &NewRefund,
    ) -> Result<Refund, Error> {
        self.refund_operation(charge_id, refund).send().await
    }

    /// Refunds under `key`; see [`Client::refund_operation_with_key`].
    pub async fn create_refund_with_key(
        &self,
        charge_id: &str,
        refund: &NewRefund,
        key: IdempotencyKey,
    ) -> Result<Refund, Error> {
        self.refund_operation_with_key(charge_id, refund, key)
            .send()
            .await
    }

    /// A charge by id, in whatever state it is (pending included).
    pub async fn get_charge(&self, id: &str) -> Result<Charge, Error> {
        self.read(self.url(&["v1", "charges", id])).await
    }

    /// A refund by id, in whatever state it is.
    pub async fn get_refund(&self, id: &str) -> Result<Refund, Error> {
        self.read(self.url(&["v1", "refunds", id])).await
    }

    /// The charge an idempotency key created, as it is now (pending
    /// included), or `None` if the key names no charge (never used with
    /// this merchant's secret key, or released after its hold). Sends
    /// nothing that could charge: use it when a process lost the answer (a
    /// crash, a reload, a reconciliation job) to decide whether to send the
    /// operation again. The charge carries `idempotency_key_expires_at`:
    /// past it, sending the operation again gets
    /// [`Error::KeyExpired`], never a second charge.
    ///
    /// ```no_run
    /// # async fn run(client: chargeonce_client::Client) -> Result<(), chargeonce_client::Error> {
    /// // The key stored with order 1001 before its first attempt.
    /// let key = chargeonce_client::IdempotencyKey::from("order-1001".to_owned());
    /// match client.find_by_key(&key).await? {
    ///     Some(charge) => println!("order 1001 is {:?}", charge.status),
    ///     None => println!("order 1001 was never charged: safe to send"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn find_by_key(&self, key: &IdempotencyKey) -> Result<Option<Charge>, Error> {
        self.find_one_by_key(self.url(&["v1", "charges"]), key)
            .await
    }

    /// The refund an idempotency key created; like [`Client::find_by_key`].
    pub async fn find_refund_by_key(&self, key: &IdempotencyKey) -> Result<Option<Refund>, Error> {
        self.find_one_by_key(self.url(&["v1", "refunds"]), key)
            .await
    }

    async fn find_one_by_key<T: Resource>(
        &self,
        mut url: Url,
        key: &IdempotencyKey,
    ) -> Result<Option<T>, Error> {
        if !key.is_valid() {
            return Err(Error::InvalidKey {
                idempotency_key: key.clone(),
            });
        }
        url.query_pairs_mut()
            .append_pair("idempotency_key", key.as_str());
        let page: Page<T> = self.read(url).await?;
        Ok(page.data.into_iter().next())
    }

    /// Every charge, newest first, fetched a page at a time as the stream is
    /// read (following `has_more` with `starting_after`). An error ends the
    /// stream after it is yielded.
    ///
    /// ```no_run
    /// use futures_util::TryStreamExt;
    /// use chargeonce_client::{Client, ListParams};
    ///
    /// # async fn run(client: Client) -> Result<(), chargeonce_client::Error> {
    /// let mut charges = client.list_charges(ListParams::new().limit(100));
    /// while let Some(charge) = charges.try_next().await? {
    ///     println!("{} {}", charge.id, charge.amount);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn list_charges(&self, params: ListParams) -> BoxStream<'static, Result<Charge, Error>> {
        self.list(self.url(&["v1", "charges"]), params)
    }

    /// Every refund, newest first; like [`Client::list_charges`]
    /// (`GET /v1/refunds`).
    pub fn list_refunds(&self, params: ListParams) -> BoxStream<'static, Result<Refund, Error>> {
        self.list(self.url(&["v1", "refunds"]), params)
    }

    /// `base_url` with `segments` appended, each percent-encoded, so an id
    /// can never change the path.
    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.inner.base_url.clone();
        // Always Ok: `build` refused bases that cannot have a path.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// POSTs `body` under `key` until the resource is final, or fails.
    async fn create<T: Resource>(
        &self,
        url: &Url,
        key: &IdempotencyKey,
        body: &str,
    ) -> Result<T, Error> {
        if !key.is_valid() {
            return Err(Error::InvalidKey {
                idempotency_key: key.clone(),
            });
        }
        let policy = &self.inner.retry_policy;
        retry::run(policy, self.inner.request_timeout, |timeout| async move {
            let resource: T = self
                .exchange(Method::POST, url, Some((key, body)), timeout)
                .await?;
            // 202 pending: an error so the policy retries it with the same
            // key, which makes the service ask the processor again.
            if resource.is_pending() {
                Err(resource.into_pending_error(Some(key.clone())))
            } else {
                Ok(resource)
            }
        })
        .await
    }

    /// GETs `url` with retries.
    async fn read<T: DeserializeOwned>(&self, url: Url) -> Result<T, Error> {
        let policy = &self.inner.retry_policy;
        let url = &url;
        retry::run(policy, self.inner.request_timeout, |timeout| {
            self.exchange(Method::GET, url, None, timeout)
        })
        .await
    }

    fn list<T: Resource>(
        &self,
        base: Url,
        params: ListParams,
    ) -> BoxStream<'static, Result<T, Error>> {
        let client = self.clone();
        let limit = params.limit;
        // The state is the next page's cursor: `None` once there is no next
        // page, `Some(None)` for the first page without a cursor.
        stream::try_unfold(Some(params.starting_after), move |cursor| {
            let client = client.clone();
            let mut url = base.clone();
            async move {
                let Some(starting_after) = cursor else {
                    return Ok(None);
                };
                {
                    let mut query = url.query_pairs_mut();
                    if let Some(limit) = limit {
                        query.append_pair("limit", &limit.to_string());
                    }
                    if let Some(after) = &starting_after {
                        query.append_pair("starting_after", after);
                    }
                }
                let page: Page<T> = client.read(url).await?;
                // An empty page that claims more would loop forever.
                let next = match (page.has_more, page.data.last()) {
                    (true, Some(last)) => Some(Some(last.id().to_owned())),
                    _ => None,
                };
                Ok(Some((page.data, next)))
            }
        })
        .map_ok(|items| stream::iter(items.into_iter().map(Ok)))
        .try_flatten()
        .boxed()
    }

    /// One request and its answer: the resource for a 2xx, else the error.
    async fn exchange<T: DeserializeOwned>(
        &self,
        method: Method,
        url: &Url,
        keyed_body: Option<(&IdempotencyKey, &str)>,
        timeout: Duration,
    ) -> Result<T, Error> {
        let key = keyed_body.map(|(key, _)| key.clone());
        let transport = |source| Error::Transport {
            source,
            idempotency_key: key.clone(),
        };
        let mut request = self
            .inner
            .http
            .request(method, url.clone())
            .timeout(timeout);
        if let Some((key, body)) = keyed_body {
            request = request
                .header("Idempotency-Key", key.as_str())
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(transport)?;
        if !status.is_success() {
            return Err(Error::from_answer(status, &headers, &body, key));
        }
        serde_json::from_slice(&body).map_err(|e| Error::UnexpectedResponse {
            status,
            message: format!("the body is not the expected JSON: {e}"),
            idempotency_key: key.clone(),
        })
    }
}

/// The JSON of a request body, made once per operation so every attempt
/// sends the same bytes.
fn to_body<T: Serialize>(value: &T) -> String {
    // Request types hold strings, integers and string maps, which always
    // serialise. Were that ever to fail, the empty body would be refused
    // with 400 invalid_request: nothing would be charged.
    serde_json::to_string(value).unwrap_or_default()
}

/// One logical charge: its key and body, fixed when it was made. `send` may
/// be called again (after an error that [`is_retryable`](Error::is_retryable),
/// say) and sends the same key and body, so at most one charge is ever made.
///
/// ```no_run
/// use chargeonce_client::{Client, IdempotencyKey, NewCharge};
///
/// # async fn run(client: Client) -> Result<(), chargeonce_client::Error> {
/// let order = NewCharge::new(1999, "USD").metadata("order_id", "1001");
/// let operation = client.charge_operation(&order);
/// // Store the key with the order *before* sending, so a restart resumes
/// // the same charge instead of making a second one.
/// let stored: String = operation.key().as_str().to_owned();
/// let charge = operation.send().await?;
///
/// // After a restart: the same order, the stored key.
/// let again = client
///     .create_charge_with_key(&order, IdempotencyKey::from(stored))
///     .await?;
/// assert_eq!(again.id, charge.id);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ChargeOperation {
    client: Client,
    url: Url,
    key: IdempotencyKey,
    body: String,
}

impl ChargeOperation {
    /// The idempotency key every attempt sends.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Sends the charge, retrying per the client's [`RetryPolicy`], and
    /// returns it once it succeeded. A declined charge is
    /// [`Error::Declined`]; one still pending when the policy runs out is
    /// [`Error::Pending`].
    pub async fn send(&self) -> Result<Charge, Error> {
        self.client.create(&self.url, &self.key, &self.body).await
    }
}

/// One logical refund: like [`ChargeOperation`], for
/// `POST /v1/charges/{id}/refunds`.
#[derive(Debug, Clone)]
pub struct RefundOperation {
    client: Client,
    url: Url,
    key: IdempotencyKey,
    body: String,
}

impl RefundOperation {
    /// The idempotency key every attempt sends.
    pub fn key(&self) -> &IdempotencyKey {
        &self.key
    }

    /// Sends the refund with retries and returns it once it succeeded. A
    /// declined refund is [`Error::RefundDeclined`]; one still pending when
    /// the policy runs out is [`Error::RefundPending`].
    pub async fn send(&self) -> Result<Refund, Error> {
        self.client.create(&self.url, &self.key, &self.body).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(base: &str) -> Client {
        Client::new(base, "sk_test").expect("client")
    }

    #[test]
    fn paths_are_appended_to_the_base_and_ids_are_encoded() {
        assert_eq!(
            client("http://127.0.0.1:8080")
                .url(&["v1", "charges", "ch_1"])
                .as_str(),
            "http://127.0.0.1:8080/v1/charges/ch_1"
        );
        assert_eq!(
            client("https://gw.example/payments/")
                .url(&["v1", "charges"])
                .as_str(),
            "https://gw.example/payments/v1/charges"
        );
        assert_eq!(
            client("http://h")
                .url(&["v1", "charges", "../x?y"])
                .as_str(),
            "http://h/v1/charges/..%2Fx%3Fy"
        );
    }

    #[test]
    fn bad_configuration_is_refused() {
        for base in ["not a url", "ftp://h", "mailto:a@b"] {
            assert!(
                matches!(Client::new(base, "sk"), Err(Error::Config(_))),
                "{base}"
            );
        }
        assert!(matches!(
            Client::new("http://h", "sk\nX-Injected: 1"),
            Err(Error::Config(_))
        ));
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let shown = format!("{:?}", client("http://h"));
        assert!(!shown.contains("sk_test"), "{shown}");
        let builder = format!("{:?}", Client::builder("http://h", "sk_test"));
        assert!(!builder.contains("sk_test"), "{builder}");
    }

    #[test]
    fn an_operation_keeps_one_key_and_one_body() {
        let client = client("http://h");
        let operation = client.charge_operation(&NewCharge::new(100, "USD"));
        let copy = operation.clone();
        assert_eq!(operation.key(), copy.key());
        assert_eq!(operation.body, r#"{"amount":100,"currency":"USD"}"#);
        let other = client.charge_operation(&NewCharge::new(100, "USD"));
        assert_ne!(operation.key(), other.key(), "a new operation, a new key");
    }

    #[test]
    fn calls_can_be_spawned() {
        fn assert_send<T: Send>(_: &T) {}
        let client = client("http://h");
        let charge = NewCharge::new(1, "USD");
        assert_send(&client.create_charge(&charge));
        assert_send(&client.get_charge("ch_1"));
        assert_send(&client.list_charges(ListParams::new()));
    }
}
