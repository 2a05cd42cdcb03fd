//! Webhook endpoints, the request that creates one, and the deliveries of
//! an event to them.

use serde::{Deserialize, Serialize};

use crate::EventType;

/// A webhook endpoint. Its signing secret is shown in the answer to its
/// creation (and its replays) only; the answer to its deletion says
/// `"enabled": false, "deleted": true`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct WebhookEndpoint {
    /// `we_…`, made by the service.
    #[cfg_attr(feature = "schema", schema(pattern = "^we_[0-9a-f]{32}$"))]
    pub id: String,
    /// Always `webhook_endpoint`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub object: WebhookEndpointObject,
    /// Where events are sent, as normalised.
    pub url: String,
    /// The event types sent; null: every type.
    #[cfg_attr(feature = "schema", schema(required))]
    pub event_types: Option<Vec<EventType>>,
    /// The signing secret, `whsec_` and the base64 of 32 bytes (Standard
    /// Webhooks): in the answer to the creation only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schema(pattern = "^whsec_[A-Za-z0-9+/=]+$", nullable = false)
    )]
    pub secret: Option<String>,
    /// False once deleted.
    pub enabled: bool,
    /// When it was created, RFC 3339 with microseconds.
    #[cfg_attr(feature = "schema", schema(format = DateTime))]
    pub created_at: String,
    /// `true` in the answer to the deletion only.
    #[serde(default, skip_serializing_if = "crate::is_false")]
    pub deleted: bool,
}

/// Not the secret: a value that may be logged must not carry it.
impl std::fmt::Debug for WebhookEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookEndpoint")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .field("enabled", &self.enabled)
            .field("created_at", &self.created_at)
            .field("deleted", &self.deleted)
            .finish()
    }
}

/// The `object` member of a webhook endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WebhookEndpointObject {
    /// `webhook_endpoint`.
    #[default]
    WebhookEndpoint,
}

/// `POST /v1/webhook_endpoints`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "schema", schema(as = WebhookEndpointRequest, example = json!({"url": "https://example.com/webhooks", "event_types": ["charge.succeeded", "charge.failed"]})))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct NewWebhookEndpoint {
    /// An absolute http:// or https:// URL naming a host, at most 2048
    /// characters once normalised. Private addresses may be refused
    /// (webhooks.allow_private_targets).
    #[cfg_attr(
        feature = "schema",
        schema(
            max_length = 2048,
            pattern = "^[Hh][Tt][Tt][Pp][Ss]?://[A-Za-z0-9.-]+(:[1-9][0-9]{0,3})?(/[!-~]*)?$",
            example = "https://example.com/webhooks"
        )
    )]
    pub url: String,
    /// The event types to send; left out or null: every type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schema(min_items = 1))]
    pub event_types: Option<Vec<EventType>>,
}

impl NewWebhookEndpoint {
    /// An endpoint at `url` for every event type.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            event_types: None,
        }
    }

    /// Adds one event type to send (by default, every type is sent).
    pub fn event_type(mut self, event_type: EventType) -> Self {
        self.event_types
            .get_or_insert_with(Vec::new)
            .push(event_type);
        self
    }
}

/// The delivery of one event to one endpoint, with its attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct Delivery {
    /// Always `webhook_delivery`.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schema(required))]
    pub object: DeliveryObject,
    /// The event's id.
    #[cfg_attr(feature = "schema", schema(pattern = "^evt_[0-9a-f]{32}$"))]
    pub event: String,
    /// The endpoint's id.
    #[cfg_attr(feature = "schema", schema(pattern = "^we_[0-9a-f]{32}$"))]
    pub endpoint: String,
    /// The endpoint's URL.
    pub url: String,
    /// Where the delivery stands.
    pub status: DeliveryStatus,
    /// Attempts so far.
    pub attempts: i32,
    /// While pending: when the next attempt is due.
    #[cfg_attr(feature = "schema", schema(required, format = DateTime))]
    pub next_attempt_at: Option<String>,
    /// The endpoint's HTTP status at the last attempt, if it answered.
    #[cfg_attr(feature = "schema", schema(required))]
    pub last_status_code: Option<i32>,
    /// Why the last attempt failed, if it did.
    #[cfg_attr(feature = "schema", schema(required))]
    pub last_error: Option<String>,
    /// When the delivery was created, RFC 3339 with microseconds.
    #[cfg_attr(feature = "schema", schema(format = DateTime))]
    pub created_at: String,
    /// When it last changed.
    #[cfg_attr(feature = "schema", schema(format = DateTime))]
    pub updated_at: String,
    /// Every attempt, oldest first.
    pub attempt_log: Vec<DeliveryAttempt>,
}

/// The `object` member of a delivery.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum DeliveryObject {
    /// `webhook_delivery`.
    #[default]
    WebhookDelivery,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DeliveryStatus {
    /// Not delivered yet; attempted again at `next_attempt_at`.
    Pending,
    /// A 2xx answer.
    Delivered,
    /// Given up: out of attempts, or its endpoint was deleted.
    Failed,
    /// A status this version does not know (read only).
    #[serde(other, skip_serializing)]
    Unknown,
}

/// What one attempt got: the receiver's status code, or why there was none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
pub struct DeliveryAttempt {
    /// 1 for the first.
    pub attempt: i32,
    /// The endpoint's HTTP status; null if none came.
    #[cfg_attr(feature = "schema", schema(required))]
    pub status_code: Option<i32>,
    /// Why there was no 2xx answer, if there was none.
    #[cfg_attr(feature = "schema", schema(required))]
    pub error: Option<String>,
    /// How long the attempt took.
    pub duration_ms: i32,
    /// When it was made, RFC 3339 with microseconds.
    #[cfg_attr(feature = "schema", schema(format = DateTime))]
    pub created_at: String,
}
