//! What the service asks PostgreSQL per request, read back from
//! pg_stat_statements, and the check that it is exactly what the pgbench
//! scripts run.
//!
//! The scripts are built from the constants of `chargeonce::db` (see
//! `script`), not from the captured texts. The capture is the proof that
//! they match the service: every statement the service executed must be one
//! of the [`KNOWN`] constants, and the ones it executes (about) once per
//! request must be exactly the ones the script for that flow runs. When the
//! service's request path changes, the benchmark stops with the statement's
//! text instead of comparing against the wrong SQL. The capture also gives
//! the round trips per request, background statements included.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{bail, Context as _, Result};
use chargeonce::db::{self, Statement};

use crate::database::BenchDatabase;
use crate::http::Api;
use crate::scenario::send_all;
use crate::service::ServiceBinary;

/// Every statement of `chargeonce::db`, by name (`db::ALL_STATEMENTS`). One
/// the service executes that is not among them stops the benchmark; one that
/// runs per request must be in the scripts of `script`.
pub const KNOWN: &[(&str, Statement)] = db::ALL_STATEMENTS;

/// A statement that runs at least this often per request is part of the
/// request path; rarer ones (a cached lookup, the background workers) are
/// only counted as round trips.
const PER_REQUEST: f64 = 0.5;

/// One statement as pg_stat_statements recorded it.
pub struct Seen {
    pub text: String,
    pub calls: i64,
    /// The name of the [`KNOWN`] constant it is, if any.
    pub constant: Option<&'static str>,
}

pub struct Captured {
    pub statements: Vec<Seen>,
    pub requests: usize,
}

pub struct Capture {
    pub new: Captured,
    pub replay: Captured,
}

impl Captured {
    fn new(rows: Vec<(String, i64)>, requests: usize) -> Self {
        let statements = rows
            .into_iter()
            .map(|(text, calls)| Seen {
                constant: identify(&text),
                text,
                calls,
            })
            .collect();
        Self {
            statements,
            requests,
        }
    }

    pub fn per_request(&self, seen: &Seen) -> f64 {
        seen.calls as f64 / self.requests as f64
    }

    pub fn round_trips(&self) -> f64 {
        let calls: i64 = self.statements.iter().map(|s| s.calls).sum();
        calls as f64 / self.requests as f64
    }

    /// Fails unless every statement seen is known and the ones run per
    /// request are `expected` (constant names, a name once per execution).
    pub fn require_same_as(&self, expected: &[&str], flow: &str) -> Result<()> {
        let unknown: Vec<String> = self
            .statements
            .iter()
            .filter(|seen| seen.constant.is_none())
            .map(|seen| format!("  {} calls: {}", seen.calls, one_line(&seen.text)))
            .collect();
        if !unknown.is_empty() {
            bail!(
                "while handling {} {flow}s the service ran statements the benchmark does not \
                 know:\n{}\nEvery statement the service runs should be a constant of \
                 chargeonce::db: add it to db::ALL_STATEMENTS and, if it \
                 runs per request, to the pgbench scripts in tools/loadbench/src/script.rs",
                self.requests,
                unknown.join("\n")
            );
        }
        let mut seen: Vec<&str> = Vec::new();
        for statement in &self.statements {
            let copies = self.per_request(statement).round() as usize;
            if self.per_request(statement) >= PER_REQUEST {
                let name = statement.constant.unwrap_or_default();
                seen.extend(std::iter::repeat_n(name, copies.max(1)));
            }
        }
        let mut expected = expected.to_vec();
        seen.sort_unstable();
        expected.sort_unstable();
        if seen != expected {
            bail!(
                "every {flow} runs [{}] (pg_stat_statements, {} requests), but its pgbench \
                 script runs [{}]: the service's request path changed; update the script in \
                 tools/loadbench/src/script.rs",
                seen.join(", "),
                self.requests,
                expected.join(", ")
            );
        }
        Ok(())
    }

    pub fn write(&self, path: &Path, what: &str) -> Result<()> {
        let mut text = format!(
            "-- pg_stat_statements after {} {what} (calls, the constant, the normalised text)\n",
            self.requests
        );
        for seen in &self.statements {
            let _ = writeln!(
                text,
                "\n-- {} calls, {}\n{};",
                seen.calls,
                seen.constant.unwrap_or("unknown"),
                seen.text
            );
        }
        fs::write(path, text).with_context(|| format!("writing {}", path.display()))
    }
}

/// Starts a service, resets pg_stat_statements, sends each key once in
/// sequence on one connection, and returns what the database executed
/// meanwhile, without the statements about pg_stat_statements (ours).
///
/// Each capture has a fresh service so that all its statements are
/// prepared after the reset: pg_stat_statements then stores them
/// normalised, literals as $n too. (A statement prepared before a reset
/// comes back with its literals as written; [`shape`] matches either.)
pub async fn capture(
    binary: &ServiceBinary,
    database: &BenchDatabase,
    api_key: &str,
    keys: &[String],
    out_dir: &Path,
) -> Result<Captured> {
    let service = binary.start(&database.url).await;
    let api = Api::new(service.port, api_key)?;
    let db = &database.client;
    db.batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .context("resetting pg_stat_statements")?;
    send_all(&api, 1, keys)
        .await?
        .require_success("the captured requests")?;
    let rows = db
        .query(
            "SELECT query, calls FROM pg_stat_statements \
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                AND query NOT ILIKE '%pg_stat_statements%' \
              ORDER BY calls DESC, query",
            &[],
        )
        .await
        .context("reading pg_stat_statements")?;
    let rows = rows
        .iter()
        .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1)))
        .collect();
    Ok(Captured::new(rows, keys.len()))
}

/// The known constant a captured text is.
fn identify(text: &str) -> Option<&'static str> {
    let captured = shape(text);
    KNOWN
        .iter()
        .find(|(_, statement)| shape(statement.sql) == captured)
        .map(|(name, _)| *name)
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The text with every value slot, a `$n` parameter or a literal (string,
/// number, TRUE, FALSE, NULL), as `?` and its whitespace collapsed.
/// pg_stat_statements stores a statement with its literals replaced by
/// further `$n`, so a captured text and the constant it came from have the
/// same shape, and two different statements do not.
pub fn shape(sql: &str) -> String {
    let chars: Vec<char> = sql.chars().collect();
    let mut out = String::with_capacity(sql.len());
    let mut i = 0;
    let word_char = |c: char| c.is_alphanumeric() || c == '_' || c == '$';
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            if !out.is_empty() && !out.ends_with(' ') {
                out.push(' ');
            }
            i += 1;
        } else if c == '\'' {
            // A string literal; '' inside it is a quote.
            i += 1;
            while i < chars.len() {
                if chars[i] == '\'' && chars.get(i + 1) == Some(&'\'') {
                    i += 2;
                } else if chars[i] == '\'' {
                    break;
                } else {
                    i += 1;
                }
            }
            i += 1;
            out.push('?');
        } else if c == '"' {
            // A quoted identifier, kept as it is.
            let end = chars[i + 1..]
                .iter()
                .position(|&d| d == '"')
                .map_or(chars.len(), |p| i + 2 + p);
            out.extend(&chars[i..end]);
            i = end;
        } else if c == '$' && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
            i += 1;
            while chars.get(i).is_some_and(char::is_ascii_digit) {
                i += 1;
            }
            out.push('?');
        } else if c.is_ascii_digit() {
            // A number (an identifier's digits never get here: words are
            // consumed whole below).
            while chars
                .get(i)
                .is_some_and(|d| d.is_ascii_digit() || *d == '.')
            {
                i += 1;
            }
            out.push('?');
        } else if word_char(c) {
            let start = i;
            while chars.get(i).is_some_and(|&d| word_char(d)) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if ["true", "false", "null"].contains(&word.to_ascii_lowercase().as_str()) {
                out.push('?');
            } else {
                out.push_str(&word);
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out.trim_end().trim_end_matches(';').trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chargeonce::db::{charges, merchants};

    /// What pg_stat_statements makes of a statement: literals replaced by
    /// $n numbered after the statement's own parameters.
    fn normalised(sql: &str, first: usize) -> String {
        let mut next = first;
        let mut out = String::new();
        let mut in_string = false;
        for c in sql.chars() {
            match (in_string, c) {
                (false, '\'') => in_string = true,
                (true, '\'') => {
                    in_string = false;
                    out.push_str(&format!("${next}"));
                    next += 1;
                }
                (true, _) => {}
                (false, _) => out.push(c),
            }
        }
        out
    }

    #[test]
    fn a_captured_text_is_its_constant() {
        let sql = charges::RECORD_OUTCOME.sql;
        let captured = normalised(sql, charges::RECORD_OUTCOME.params.len() + 1);
        assert_ne!(captured, sql);
        assert_eq!(identify(&captured), Some("charges::RECORD_OUTCOME"));
        // Prepared before a reset: literals as written.
        assert_eq!(identify(sql), Some("charges::RECORD_OUTCOME"));
        assert_eq!(
            identify("SELECT merchant_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS $2"),
            Some("merchants::FIND_BY_DIGEST")
        );
        assert_eq!(identify("SELECT $1 FROM pg_class"), None);
    }

    #[test]
    fn every_known_statement_has_a_shape_of_its_own() {
        for (i, a) in KNOWN.iter().enumerate() {
            for b in &KNOWN[i + 1..] {
                assert_ne!(
                    shape(a.1.sql),
                    shape(b.1.sql),
                    "{} and {} look alike",
                    a.0,
                    b.0
                );
            }
        }
    }

    #[test]
    fn shapes_ignore_values_and_layout_but_not_words() {
        assert_eq!(
            shape("SELECT  a1, 'it''s', 42, 1.5,\n TRUE FROM t WHERE x = $12;"),
            "SELECT a1, ?, ?, ?, ? FROM t WHERE x = ?"
        );
        assert_eq!(shape(r#"SELECT "Null" FROM t"#), r#"SELECT "Null" FROM t"#);
        assert_ne!(shape("SELECT a FROM t"), shape("SELECT b FROM t"));
    }

    fn captured(rows: &[(&str, i64)]) -> Captured {
        Captured::new(
            rows.iter().map(|(t, c)| ((*t).to_owned(), *c)).collect(),
            100,
        )
    }

    #[test]
    fn the_request_path_must_be_what_the_script_runs() {
        let insert = charges::INSERT_OR_FIND_MANY.sql;
        let outcome = charges::RECORD_OUTCOME.sql;
        let lookup = merchants::FIND_BY_DIGEST.sql;
        let expected = ["charges::INSERT_OR_FIND_MANY", "charges::RECORD_OUTCOME"];

        let same = captured(&[(insert, 100), (outcome, 100), (lookup, 1)]);
        same.require_same_as(&expected, "new charge").unwrap();
        assert!((same.round_trips() - 2.01).abs() < 1e-9);

        let missing = captured(&[(insert, 100), (lookup, 1)]);
        let error = missing
            .require_same_as(&expected, "new charge")
            .unwrap_err();
        assert!(
            error.to_string().contains("request path changed"),
            "{error}"
        );

        let unknown = captured(&[(insert, 100), (outcome, 100), ("SELECT 1", 3)]);
        let error = unknown
            .require_same_as(&expected, "new charge")
            .unwrap_err();
        assert!(error.to_string().contains("does not know"), "{error}");
        assert!(error.to_string().contains("SELECT 1"), "{error}");
    }
}
