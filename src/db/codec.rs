//! Column types that decode exactly: a value the schema's CHECK constraints
//! should not allow is an error (a 500 with a log line), never silently a
//! default.

use std::error::Error;

use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::Row;

use super::DbError;
use crate::domain::{Fingerprint, RefundReason, Status};

/// Column `name` of `row`, decoded exactly; a missing column or a value that
/// does not decode names the column in the error.
pub fn column<'a, T: FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, DbError> {
    row.try_get(name)
        .map_err(|e| DbError::Decode(format!("column {name}: {e:#}")))
}

type BoxError = Box<dyn Error + Sync + Send>;

impl<'a> FromSql<'a> for Status {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        Status::parse(text).ok_or_else(|| format!("unknown charge status {text:?}").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

impl<'a> FromSql<'a> for RefundReason {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        let text = <&str as FromSql>::from_sql(ty, raw)?;
        RefundReason::parse(text).ok_or_else(|| format!("unknown refund reason {text:?}").into())
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

impl<'a> FromSql<'a> for Fingerprint {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        let bytes = <&[u8] as FromSql>::from_sql(ty, raw)?;
        Fingerprint::from_bytes(bytes)
            .ok_or_else(|| format!("a fingerprint has 32 bytes, not {}", bytes.len()).into())
    }

    fn accepts(ty: &Type) -> bool {
        <&[u8] as FromSql>::accepts(ty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_statuses_and_short_fingerprints_are_errors() {
        assert_eq!(
            Status::from_sql(&Type::TEXT, b"succeeded").ok(),
            Some(Status::Succeeded)
        );
        assert!(Status::from_sql(&Type::TEXT, b"refunded").is_err());
        assert!(Fingerprint::from_sql(&Type::BYTEA, &[0; 31]).is_err());
        assert_eq!(
            Fingerprint::from_sql(&Type::BYTEA, &[7; 32]).ok(),
            Fingerprint::from_bytes(&[7; 32])
        );
    }

    /// Each type reads only the column type it is stored in: a statement
    /// that selects another type is refused by tokio-postgres before any
    /// byte is decoded, instead of bytes read as something they are not.
    #[test]
    fn each_type_accepts_only_its_column_type() {
        for ty in [Type::TEXT, Type::VARCHAR] {
            assert!(Status::accepts(&ty), "{ty}");
            assert!(RefundReason::accepts(&ty), "{ty}");
            assert!(!Fingerprint::accepts(&ty), "{ty}");
        }
        assert!(Fingerprint::accepts(&Type::BYTEA));
        for ty in [Type::BYTEA, Type::INT4, Type::UUID] {
            assert!(!Status::accepts(&ty), "{ty}");
            assert!(!RefundReason::accepts(&ty), "{ty}");
        }
        assert!(!Fingerprint::accepts(&Type::INT4));
    }
}
