//! Query strings of list endpoints: each parameter at most once, every one
//! known, every problem reported with its name (400 `invalid_request`).
//! `limit` is 1..=100 (default 10), like `GET /v1/charges`.

use crate::domain::FieldError;
use crate::error::ApiError;

pub const DEFAULT_LIMIT: i64 = 10;
pub const MAX_LIMIT: i64 = 100;

/// The parameters of one request, taken one by one by the handler;
/// `finish` reports what is left (unknown parameters) and every error.
pub struct Params {
    pairs: Vec<(String, String)>,
    errors: Vec<FieldError>,
}

impl Params {
    pub fn parse(query: &str) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).map_err(|e| {
            ApiError::invalid(format!("the query string is malformed: {e}"), vec![])
        })?;
        let mut errors = Vec::new();
        for (index, (name, _)) in pairs.iter().enumerate() {
            if pairs[..index].iter().any(|(earlier, _)| earlier == name) {
                errors.push(FieldError::new(name.clone(), "given more than once"));
            }
        }
        Ok(Self { pairs, errors })
    }

    /// The value of `name`, if given (and removes it).
    pub fn take(&mut self, name: &str) -> Option<String> {
        let index = self.pairs.iter().position(|(n, _)| n == name)?;
        let (_, value) = self.pairs.remove(index);
        // A repeated parameter was reported in `parse`; drop the rest.
        self.pairs.retain(|(n, _)| n != name);
        Some(value)
    }

    /// `limit`, 1..=100, default 10.
    pub fn limit(&mut self) -> i64 {
        match self.take("limit") {
            None => DEFAULT_LIMIT,
            Some(value) => match value.parse::<i64>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
                _ => {
                    self.errors.push(FieldError::new(
                        "limit",
                        format!("must be an integer from 1 to {MAX_LIMIT}"),
                    ));
                    DEFAULT_LIMIT
                }
            },
        }
    }

    /// `name` parsed by `parse`; `expected` says what it must be.
    pub fn parsed<T>(
        &mut self,
        name: &str,
        parse: impl FnOnce(&str) -> Option<T>,
        expected: &str,
    ) -> Option<T> {
        let value = self.take(name)?;
        let parsed = parse(&value);
        if parsed.is_none() {
            self.errors
                .push(FieldError::new(name, format!("must be {expected}")));
        }
        parsed
    }

    /// Ok if every parameter was known and valid.
    pub fn finish(mut self) -> Result<(), ApiError> {
        for (name, _) in self.pairs {
            self.errors
                .push(FieldError::new(name, "unknown query parameter"));
        }
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid("the query is invalid", self.errors))
        }
    }
}
