//! Events for the API: list, read, and the deliveries of one event. Every
//! statement names the merchant, so another merchant's event is as absent
//! as one that never existed.

use crate::db::{self, Database};
use crate::domain::{Delivery, Event, EventId, EventType, MerchantId};

use super::ServiceError;

/// The events API. Cheap to clone; each HTTP worker has its own (its pool).
#[derive(Clone)]
pub struct Events {
    db: Database,
}

impl Events {
    pub fn new(db: Database) -> Self {
        Self { db }
    }

    /// Up to `limit` events, newest first, after `starting_after`, only of
    /// `of_type` if given.
    pub async fn list(
        &self,
        merchant: MerchantId,
        limit: i64,
        starting_after: Option<EventId>,
        of_type: Option<EventType>,
    ) -> Result<Vec<Event>, ServiceError> {
        let conn = self.db.conn().await?;
        Ok(db::events::list(&conn, merchant, limit, starting_after, of_type).await?)
    }

    pub async fn get(&self, merchant: MerchantId, id: EventId) -> Result<Event, ServiceError> {
        let conn = self.db.conn().await?;
        db::events::find(&conn, merchant, id)
            .await?
            .ok_or(ServiceError::NotFound)
    }

    /// The event's deliveries to each endpoint, with their attempts; 404 if
    /// the merchant has no such event (an event without endpoints has none).
    pub async fn deliveries(
        &self,
        merchant: MerchantId,
        id: EventId,
    ) -> Result<Vec<Delivery>, ServiceError> {
        let conn = self.db.conn().await?;
        if db::events::find(&conn, merchant, id).await?.is_none() {
            return Err(ServiceError::NotFound);
        }
        Ok(db::webhook_deliveries::of_event(&conn, merchant, id).await?)
    }
}
