//! What the invariants are checked against, read once everything settled:
//! the database (directly, not through the service) and psp-sim's ledger
//! (what money moved).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use serde::Deserialize;
use serde_json::Value;
use tokio_postgres::Client as Db;

/// A charge or a refund row; ids as the API shows them. A refund has its
/// charge's id and no refunded amounts; a charge has no charge id.
#[derive(Clone, Default, Deserialize)]
#[serde(default)]
pub struct Row {
    pub id: String,
    pub charge_id: Option<String>,
    pub key: Option<String>,
    pub status: String,
    pub amount: i64,
    pub amount_refunded: i64,
    pub refunds_reserved: i64,
    /// The processor's payment or refund id.
    pub processor_id: Option<String>,
    pub processor_attempts: i32,
}

#[derive(Deserialize)]
pub struct EventRow {
    pub id: String,
    pub kind: String,
    pub object: String,
}

pub struct Snapshot {
    pub charges: Vec<Row>,
    pub refunds: Vec<Row>,
    pub events: Vec<EventRow>,
    pub deliveries: BTreeMap<String, i64>,
    /// Deliveries not `delivered`: "event id, status, last error".
    pub undelivered: Vec<String>,
}

/// `prefix_<hex>` of a uuid column, as the API writes ids.
fn id(prefix: &str, column: &str) -> String {
    format!("'{prefix}_' || replace({column}::text, '-', '')")
}

/// The rows of `sql`, read as JSON into `T` by column name.
async fn rows<T: serde::de::DeserializeOwned>(db: &Db, sql: &str) -> Result<Vec<T>> {
    let json = format!("SELECT coalesce(json_agg(r), '[]')::text FROM ({sql}) r");
    let text: String =
        db.query_one(&json, &[]).await.with_context(|| format!("reading: {sql}"))?.get(0);
    serde_json::from_str(&text).with_context(|| format!("reading: {sql}"))
}

impl Snapshot {
    pub async fn read(db: &Db) -> Result<Self> {
        let charges = format!(
            "SELECT {} AS id, client_idempotency_key AS key, status, amount, amount_refunded, \
                    refunds_reserved, processor_payment_id AS processor_id, processor_attempts \
               FROM charges",
            id("ch", "id")
        );
        let refunds = format!(
            "SELECT {} AS id, {} AS charge_id, client_idempotency_key AS key, status, amount, \
                    0 AS amount_refunded, 0 AS refunds_reserved, \
                    processor_refund_id AS processor_id, processor_attempts FROM refunds",
            id("re", "id"),
            id("ch", "charge_id")
        );
        let events = format!(
            "SELECT {} AS id, type AS kind, coalesce({}, {}) AS object FROM events",
            id("evt", "id"),
            id("ch", "charge_id"),
            id("re", "refund_id")
        );
        let undelivered = format!(
            "SELECT {} || ' ' || status || ' ' || coalesce(last_error, '') \
               FROM webhook_deliveries WHERE status <> 'delivered'",
            id("evt", "event_id")
        );
        let deliveries = "SELECT status, count(*) FROM webhook_deliveries GROUP BY status";
        let query = |sql| async move {
            db.query(sql, &[]).await.with_context(|| format!("reading: {sql}"))
        };
        Ok(Self {
            charges: rows(db, &charges).await?,
            refunds: rows(db, &refunds).await?,
            events: rows(db, &events).await?,
            deliveries: query(deliveries).await?.iter().map(|r| (r.get(0), r.get(1))).collect(),
            undelivered: query(&undelivered).await?.iter().map(|r| r.get(0)).collect(),
        })
    }

    pub fn objects(&self) -> impl Iterator<Item = (&'static str, &Row)> {
        let charges = self.charges.iter().map(|row| ("charge", row));
        charges.chain(self.refunds.iter().map(|row| ("refund", row)))
    }

    pub fn pending(&self) -> usize {
        self.objects().filter(|(_, row)| row.status == "pending").count()
    }
}

/// psp-sim's ledger: `GET /v1/payments` and `GET /v1/refunds`.
pub struct Ledger {
    pub payments: Vec<Value>,
    pub refunds: Vec<Value>,
}

impl Ledger {
    pub async fn read(psp_url: &str) -> Result<Self> {
        let http = &reqwest::Client::new();
        let list = |what: &'static str| async move {
            let list: Value = async {
                http.get(format!("{psp_url}/v1/{what}"))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await
            }
            .await
            .with_context(|| format!("reading psp-sim's {what}"))?;
            anyhow::Ok(list["data"].as_array().cloned().unwrap_or_default())
        };
        Ok(Self { payments: list("payments").await?, refunds: list("refunds").await? })
    }

    /// Requests psp-sim received, faults included.
    pub fn requests(&self) -> u64 {
        let entries = self.payments.iter().chain(&self.refunds);
        entries.filter_map(|entry| entry["requests"].as_u64()).sum()
    }
}
