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

/// A row's columns read in the order its statement selects them, each still
/// named. Looking a column up by name compares it with every name before it
/// (a charge has 17 columns: about 150 comparisons per row, a fifth of
/// decoding one); here the column expected next is checked by its one name
/// and read by position. A column that is not where expected is looked up
/// by name, so a statement that selects in another order decodes the same,
/// only slower.
pub struct Columns<'a> {
    row: &'a Row,
    next: usize,
}

impl<'a> Columns<'a> {
    pub fn new(row: &'a Row) -> Self {
        Self { row, next: 0 }
    }

    /// The column `name`, decoded exactly (as `column`); the one after it is
    /// expected next.
    pub fn next<T: FromSql<'a>>(&mut self, name: &str) -> Result<T, DbError> {
        let columns = self.row.columns();
        let position = match columns.get(self.next) {
            Some(expected) if expected.name() == name => self.next,
            _ => columns
                .iter()
                .position(|c| c.name() == name)
                .ok_or_else(|| DbError::Decode(format!("column {name}: no such column")))?,
        };
        self.next = position + 1;
        self.row
            .try_get(position)
            .map_err(|e| DbError::Decode(format!("column {name}: {e:#}")))
    }
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

    /// Columns are read by position when they come in the expected order,
    /// by name when they do not, and are never mixed up.
    #[tokio::test]
    async fn columns_decode_in_any_order() {
        let client = chargeonce_testkit::db::connect(&chargeonce_testkit::db::admin_url()).await;
        let row = client
            .query_one("SELECT 1::int8 AS a, 'two'::text AS b, 3::int8 AS c", &[])
            .await
            .expect("a row");

        let mut in_order = Columns::new(&row);
        assert_eq!(in_order.next::<i64>("a").ok(), Some(1));
        assert_eq!(in_order.next::<String>("b").ok(), Some("two".to_owned()));
        assert_eq!(in_order.next::<i64>("c").ok(), Some(3));

        let mut out_of_order = Columns::new(&row);
        assert_eq!(out_of_order.next::<i64>("c").ok(), Some(3));
        assert_eq!(out_of_order.next::<i64>("a").ok(), Some(1));
        // After `a` comes `b`, where it is expected again.
        assert_eq!(
            out_of_order.next::<String>("b").ok(),
            Some("two".to_owned())
        );

        let mut wrong = Columns::new(&row);
        assert!(
            matches!(wrong.next::<i64>("missing"), Err(DbError::Decode(m)) if m.contains("missing"))
        );
        assert!(
            matches!(wrong.next::<String>("a"), Err(DbError::Decode(m)) if m.contains("column a"))
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
