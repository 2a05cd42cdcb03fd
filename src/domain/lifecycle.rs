//! What charges and refunds share: their status, their processing lease,
//! the processor's final word on them, and what the lifecycle engine
//! (`service::lifecycle`) and the replay cache need to know of a record.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::MerchantId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Pending,
    Succeeded,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "pending" => Some(Self::Pending),
            "succeeded" => Some(Self::Succeeded),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// The processor's final word on a charge or a refund. `processor_id` is the
/// processor's id of the payment or refund it made (or declined).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Succeeded {
        processor_id: String,
    },
    Declined {
        processor_id: Option<String>,
        code: String,
        message: String,
    },
}

impl Outcome {
    pub fn status(&self) -> Status {
        match self {
            Self::Succeeded { .. } => Status::Succeeded,
            Self::Declined { .. } => Status::Failed,
        }
    }
}

impl Outcome {
    /// The processor's id, the failure code and the failure message, as the
    /// columns of a record store them.
    pub fn columns(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        match self {
            Self::Succeeded { processor_id } => (Some(processor_id.as_str()), None, None),
            Self::Declined {
                processor_id,
                code,
                message,
            } => (
                processor_id.as_deref(),
                Some(code.as_str()),
                Some(message.as_str()),
            ),
        }
    }
}

/// The processing lease of a pending charge or refund: while
/// `locked_until` lies in the future (by the database's clock), a request or
/// the recovery worker is calling the processor for it and nobody else may.
/// Final records hold no lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lease {
    pub locked_until: Option<DateTime<Utc>>,
    /// Processor calls that ended without a final answer; they set the
    /// pace of the next one (`service::lifecycle::retry_delay`).
    pub processor_attempts: i32,
}

/// A stored charge or refund, as the lifecycle engine and the replay cache
/// see it.
pub trait Record: Clone + Send + Sync + 'static {
    fn uuid(&self) -> Uuid;
    /// The id as clients see it (`ch_…`, `re_…`), for log lines.
    fn public_id(&self) -> String;
    fn merchant(&self) -> MerchantId;
    fn status(&self) -> Status;
    fn lease(&self) -> &Lease;
    /// When the row was inserted, by the database's clock.
    fn created_at(&self) -> DateTime<Utc>;
    /// About how many bytes the record holds on the heap (its strings and
    /// maps), to bound the replay cache.
    fn heap_bytes(&self) -> usize;
    /// The public JSON of the record as the answer to its creation shows it
    /// (a charge before any refund: `Charge::into_created`). The replay
    /// cache keeps it, so a replay is not rendered again.
    fn created_json(&self) -> Result<String, serde_json::Error>;

    /// The time in the record's id (a UUIDv7): its replay window and the
    /// key's release are counted from it.
    fn id_time(&self) -> DateTime<Utc> {
        self.uuid()
            .get_timestamp()
            .and_then(|at| {
                let (seconds, nanos) = at.to_unix();
                DateTime::from_timestamp(i64::try_from(seconds).ok()?, nanos)
            })
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outcome_gives_its_status_and_its_columns() {
        let succeeded = Outcome::Succeeded {
            processor_id: "pay_1".to_owned(),
        };
        assert_eq!(succeeded.status(), Status::Succeeded);
        assert_eq!(succeeded.columns(), (Some("pay_1"), None, None));
        let declined = Outcome::Declined {
            processor_id: Some("pay_2".to_owned()),
            code: "card_declined".to_owned(),
            message: "The card was declined".to_owned(),
        };
        assert_eq!(declined.status(), Status::Failed);
        assert_eq!(
            declined.columns(),
            (
                Some("pay_2"),
                Some("card_declined"),
                Some("The card was declined")
            )
        );
        let declined_before_a_payment = Outcome::Declined {
            processor_id: None,
            code: "invalid_amount".to_owned(),
            message: "Too small".to_owned(),
        };
        assert_eq!(
            declined_before_a_payment.columns(),
            (None, Some("invalid_amount"), Some("Too small"))
        );
    }
}
