//! Query strings, parsed the same way by every list: each parameter at most
//! once, every one known, every problem reported with its name (400
//! `invalid_request`). A page is `limit` (1..=100, default 10) items after
//! `starting_after`, the id of the last item of the previous page.

use crate::domain::{FieldError, IdempotencyKey};
use crate::error::ApiError;

pub const DEFAULT_LIMIT: i64 = 10;
pub const MAX_LIMIT: i64 = 100;

/// The parameters of one request, taken one by one by the handler;
/// `finish` reports what is left (unknown parameters) and every error.
pub struct Params {
    pairs: Vec<(String, String)>,
    errors: Vec<FieldError>,
}

/// Where a page starts and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page<Id> {
    pub limit: i64,
    pub starting_after: Option<Id>,
}

/// What a list of charges or refunds is asked for: a page, or the one the
/// key `idempotency_key` created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageOrKey<Id> {
    Page(Page<Id>),
    Key(IdempotencyKey),
}

/// The query of a list that can also be looked up by key: a page, or
/// `idempotency_key` alone (a page's parameters with it are 400). A
/// malformed key is `idempotency_key_invalid`, as on a creation.
pub fn page_or_key<Id>(
    query: &str,
    parse_id: fn(&str) -> Option<Id>,
    id: &str,
) -> Result<PageOrKey<Id>, ApiError> {
    let mut params = Params::parse(query)?;
    let Some(key) = params.take("idempotency_key") else {
        let page = params.page(parse_id, id);
        params.finish()?;
        return Ok(PageOrKey::Page(page));
    };
    for name in ["limit", "starting_after"] {
        if params.take(name).is_some() {
            params.errors.push(FieldError::new(
                name,
                "cannot be combined with idempotency_key: a key names one object",
            ));
        }
    }
    params.finish()?;
    Ok(PageOrKey::Key(IdempotencyKey::parse(&key)?))
}

/// The query of a list that takes a page and nothing else. `parse_id`
/// reads a `starting_after`; `id` says what it must be (`a charge id
/// (ch_...)`).
pub fn page<Id>(
    query: &str,
    parse_id: fn(&str) -> Option<Id>,
    id: &str,
) -> Result<Page<Id>, ApiError> {
    let mut params = Params::parse(query)?;
    let page = params.page(parse_id, id);
    params.finish()?;
    Ok(page)
}

impl Params {
    pub fn parse(query: &str) -> Result<Self, ApiError> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query).map_err(|e| {
            ApiError::invalid(format!("the query string is malformed: {e}"), vec![])
        })?;
        let mut errors = Vec::new();
        for (index, (name, _)) in pairs.iter().enumerate() {
            let first = pairs[..index].iter().all(|(earlier, _)| earlier != name);
            let reported = errors.iter().any(|e: &FieldError| e.field == *name);
            if !first && !reported {
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

    /// `limit` and `starting_after` (see `page`).
    pub fn page<Id>(&mut self, parse_id: fn(&str) -> Option<Id>, id: &str) -> Page<Id> {
        Page {
            limit: self.limit(),
            starting_after: self.parsed("starting_after", parse_id, id),
        }
    }

    /// `limit`, 1..=100, default 10.
    fn limit(&mut self) -> i64 {
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
        let mut unknown: Vec<String> = Vec::new();
        for (name, _) in self.pairs {
            if !unknown.contains(&name) {
                unknown.push(name);
            }
        }
        for name in unknown {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(query: &str) -> Vec<String> {
        match page(query, |id| (id == "ok").then_some(()), "ok") {
            Ok(_) => Vec::new(),
            Err(ApiError::InvalidRequest { errors, .. }) => {
                errors.into_iter().map(|e| e.field).collect()
            }
            Err(other) => vec![other.to_string()],
        }
    }

    #[test]
    fn a_page_has_a_default_and_bounds() {
        assert_eq!(
            page("", |_| Some(()), "").ok(),
            Some(Page {
                limit: DEFAULT_LIMIT,
                starting_after: None
            })
        );
        assert_eq!(
            page("limit=100&starting_after=ok", |_| Some(()), "").ok(),
            Some(Page {
                limit: 100,
                starting_after: Some(())
            })
        );
        for bad in ["limit=0", "limit=101", "limit=ten", "limit="] {
            assert_eq!(fields(bad), ["limit"], "{bad}");
        }
    }

    /// Which of two values would count is ambiguous: neither does.
    #[test]
    fn a_repeated_parameter_is_named_once() {
        assert_eq!(fields("limit=1&limit=2&limit=3"), ["limit"]);
        assert_eq!(
            fields("starting_after=ok&limit=5&starting_after=ok"),
            ["starting_after"]
        );
    }

    #[test]
    fn a_key_is_looked_up_alone_and_parsed_as_on_a_creation() {
        let asked = |query: &str| page_or_key(query, |_| Some(()), "ok");
        assert_eq!(
            asked("idempotency_key=order-1").ok(),
            Some(PageOrKey::Key(IdempotencyKey::parse("order-1").unwrap()))
        );
        assert!(matches!(
            asked("limit=5").ok(),
            Some(PageOrKey::Page(Page { limit: 5, .. }))
        ));
        assert!(matches!(
            asked("idempotency_key=a%20b"),
            Err(ApiError::IdempotencyKeyInvalid(_))
        ));
        match asked("idempotency_key=k&limit=5") {
            Err(ApiError::InvalidRequest { errors, .. }) => assert_eq!(errors[0].field, "limit"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            asked("idempotency_key=k&idempotency_key=l"),
            Err(ApiError::InvalidRequest { .. })
        ));
    }

    #[test]
    fn every_problem_is_named() {
        assert_eq!(
            fields("colour=red&limit=0&starting_after=nope"),
            ["limit", "starting_after", "colour"]
        );
        // Unknown and repeated: both said, each once.
        assert_eq!(fields("x=1&x=2&x=3"), ["x", "x"]);
    }
}
