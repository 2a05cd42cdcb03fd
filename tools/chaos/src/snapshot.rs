//! What the invariants are checked against, read once everything settled
//! from sources that do not depend on each other: the database (read
//! directly, not through the service) and psp-sim's ledger (what money
//! moved).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use serde_json::Value;
use tokio_postgres::Client as Db;

#[derive(Clone)]
pub struct ChargeRow {
    pub id: String,
    pub key: Option<String>,
    pub status: String,
    pub amount: i64,
    pub amount_refunded: i64,
    pub refunds_reserved: i64,
    pub processor_payment_id: Option<String>,
    pub processor_attempts: i32,
}

pub struct RefundRow {
    pub id: String,
    pub charge_id: String,
    pub key: Option<String>,
    pub status: String,
    pub amount: i64,
    pub processor_refund_id: Option<String>,
    pub processor_attempts: i32,
}

pub struct EventRow {
    pub id: String,
    pub kind: String,
    pub object: String,
}

/// Everything read from the database; ids as the API shows them.
pub struct Snapshot {
    pub charges: Vec<ChargeRow>,
    pub refunds: Vec<RefundRow>,
    pub events: Vec<EventRow>,
    /// Deliveries by status.
    pub deliveries: BTreeMap<String, i64>,
    /// Deliveries not `delivered`: "event id, status, last error".
    pub undelivered: Vec<String>,
}

/// `prefix_<hex>` of a uuid column, as the API writes ids.
fn id(prefix: &str, column: &str) -> String {
    format!("'{prefix}_' || replace({column}::text, '-', '')")
}

impl Snapshot {
    pub async fn read(db: &Db) -> Result<Self> {
        let query = |sql: String| async move {
            db.query(&sql, &[]).await.with_context(|| format!("reading: {sql}"))
        };
        let charges = query(format!(
            "SELECT {}, client_idempotency_key, status, amount, amount_refunded, refunds_reserved, \
                    processor_payment_id, processor_attempts FROM charges",
            id("ch", "id")
        ))
        .await?;
        let charges = (charges.iter())
            .map(|row| ChargeRow {
                id: row.get(0),
                key: row.get(1),
                status: row.get(2),
                amount: row.get(3),
                amount_refunded: row.get(4),
                refunds_reserved: row.get(5),
                processor_payment_id: row.get(6),
                processor_attempts: row.get(7),
            })
            .collect();
        let refunds = query(format!(
            "SELECT {}, {}, client_idempotency_key, status, amount, processor_refund_id, \
                    processor_attempts FROM refunds",
            id("re", "id"),
            id("ch", "charge_id")
        ))
        .await?;
        let refunds = (refunds.iter())
            .map(|row| RefundRow {
                id: row.get(0),
                charge_id: row.get(1),
                key: row.get(2),
                status: row.get(3),
                amount: row.get(4),
                processor_refund_id: row.get(5),
                processor_attempts: row.get(6),
            })
            .collect();
        let events = query(format!(
            "SELECT {}, type, coalesce({}, {}) FROM events",
            id("evt", "id"),
            id("ch", "charge_id"),
            id("re", "refund_id")
        ))
        .await?;
        let events = (events.iter())
            .map(|row| EventRow { id: row.get(0), kind: row.get(1), object: row.get(2) })
            .collect();
        let deliveries =
            query("SELECT status, count(*) FROM webhook_deliveries GROUP BY status".into()).await?;
        let deliveries = deliveries.iter().map(|row| (row.get(0), row.get(1))).collect();
        let undelivered = query(format!(
            "SELECT {} || ' ' || status || ' ' || coalesce(last_error, '') \
               FROM webhook_deliveries WHERE status <> 'delivered'",
            id("evt", "event_id")
        ))
        .await?;
        let undelivered = undelivered.iter().map(|row| row.get(0)).collect();
        Ok(Self { charges, refunds, events, deliveries, undelivered })
    }

    /// Charges and refunds not final yet.
    pub fn pending(&self) -> usize {
        let charges = self.charges.iter().filter(|c| c.status == "pending").count();
        charges + self.refunds.iter().filter(|r| r.status == "pending").count()
    }
}

/// psp-sim's ledger: `GET /v1/payments` and `GET /v1/refunds`.
pub struct Ledger {
    pub payments: Vec<Value>,
    pub refunds: Vec<Value>,
}

impl Ledger {
    pub async fn read(psp_url: &str) -> Result<Self> {
        let http = reqwest::Client::new();
        let list = |what: &'static str| {
            let request = http.get(format!("{psp_url}/v1/{what}")).send();
            async move {
                let list: Value = async { request.await?.error_for_status()?.json().await }
                    .await
                    .with_context(|| format!("reading psp-sim's {what}"))?;
                anyhow::Ok(list["data"].as_array().cloned().unwrap_or_default())
            }
        };
        Ok(Self { payments: list("payments").await?, refunds: list("refunds").await? })
    }

    /// Requests psp-sim received, faults included.
    pub fn requests(&self) -> u64 {
        let entries = self.payments.iter().chain(&self.refunds);
        entries.filter_map(|entry| entry["requests"].as_u64()).sum()
    }
}
