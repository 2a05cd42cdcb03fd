//! What charges and refunds share: their status, and the processor's final
//! word on them.

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
