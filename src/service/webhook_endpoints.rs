//! Webhook endpoints: created exactly once per idempotency key, listed,
//! deleted. Creation is one statement (`insert_or_find`): nothing leaves the
//! process, so unlike a charge there is no lease and nothing to resume; the
//! key's row is either ours, or an earlier request's to replay (or, with a
//! different body, a 422).
//!
//! A merchant has at most `webhooks.max_endpoints_per_merchant` live
//! endpoints; a creation past that is refused (a replay of an earlier one
//! is not). With `webhooks.allow_private_targets = false` the URL's host
//! must resolve to public addresses only, checked before anything is
//! stored.

use crate::config::WebhookSettings;
use crate::db::webhook_endpoints::Inserted;
use crate::db::{self, Database};
use crate::domain::{
    FieldError, IdempotencyKey, MerchantId, NewWebhookEndpoint, RequestFingerprint,
    WebhookEndpoint, WebhookEndpointId, WebhookSecret,
};
use crate::webhooks::TargetPolicy;

use super::ServiceError;
use crate::domain::differences::differing_fields;

/// An endpoint to answer a creation with; `replayed` when the key already
/// existed.
#[derive(Debug)]
pub struct EndpointReply {
    pub endpoint: WebhookEndpoint,
    pub replayed: bool,
}

/// The endpoint flows. Cheap to clone; each HTTP worker has its own (its
/// pool).
#[derive(Clone)]
pub struct WebhookEndpoints {
    db: Database,
    targets: TargetPolicy,
    max_endpoints: i32,
}

impl WebhookEndpoints {
    pub fn new(db: Database, settings: &WebhookSettings) -> Self {
        Self {
            db,
            targets: TargetPolicy::new(settings.allow_private_targets),
            max_endpoints: settings.max_endpoints_per_merchant,
        }
    }

    /// The same flows on another pool.
    pub fn with_database(&self, db: Database) -> Self {
        Self { db, ..self.clone() }
    }

    pub async fn create(
        &self,
        merchant: MerchantId,
        key: &IdempotencyKey,
        fingerprint: RequestFingerprint,
        request: &NewWebhookEndpoint,
    ) -> Result<EndpointReply, ServiceError> {
        // Before the key is looked at: a replay whose host has since moved
        // to a private address is refused too, which is what a new request
        // would get.
        if let Err(refused) = self.targets.check(&request.url).await {
            return Err(ServiceError::Invalid {
                detail: "the webhook endpoint is invalid".into(),
                errors: vec![FieldError::new("url", refused.to_string())],
            });
        }
        let conn = self.db.conn().await?;
        let found = db::webhook_endpoints::insert_or_find(
            &conn,
            WebhookEndpointId::new(),
            merchant,
            key,
            &fingerprint.current,
            request,
            &WebhookSecret::generate(),
            self.max_endpoints,
        )
        .await?;
        let (endpoint, created) = match found {
            Some(Inserted::Created(endpoint)) => (endpoint, true),
            Some(Inserted::Found(endpoint)) => (endpoint, false),
            Some(Inserted::Full) => {
                return Err(ServiceError::Invalid {
                    detail: format!(
                        "this merchant already has {} webhook endpoints, the most it may have \
                         (webhooks.max_endpoints_per_merchant): delete one to create another",
                        self.max_endpoints
                    ),
                    errors: Vec::new(),
                })
            }
            None => return Err(ServiceError::KeyContended),
        };
        // Same key, different request: a client bug. Never act on it; say
        // which fields differ.
        if !fingerprint.matches(&endpoint.fingerprint) {
            let differing_fields = endpoint
                .first_request()
                .map(|first| differing_fields(&first, &request.normalised()));
            crate::metrics::mismatched_fields(
                "webhook_endpoint",
                differing_fields.as_deref().unwrap_or_default(),
            );
            return Err(ServiceError::KeyReused { differing_fields });
        }
        Ok(EndpointReply {
            endpoint,
            replayed: !created,
        })
    }

    /// Live endpoints, newest first, after `starting_after`.
    pub async fn list(
        &self,
        merchant: MerchantId,
        limit: i64,
        starting_after: Option<WebhookEndpointId>,
    ) -> Result<Vec<WebhookEndpoint>, ServiceError> {
        let conn = self.db.conn().await?;
        Ok(db::webhook_endpoints::list(&conn, merchant, limit, starting_after).await?)
    }

    /// Deletes a live endpoint: no new deliveries to it, pending ones are
    /// given up, and its place counts no more against the merchant's cap. A
    /// deleted (or unknown) endpoint is `NotFound`.
    pub async fn delete(
        &self,
        merchant: MerchantId,
        id: WebhookEndpointId,
    ) -> Result<WebhookEndpoint, ServiceError> {
        let conn = self.db.conn().await?;
        db::webhook_endpoints::delete(&conn, merchant, id)
            .await?
            .ok_or(ServiceError::NotFound)
    }
}
