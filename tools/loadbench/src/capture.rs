//! What the service asks PostgreSQL per request (pg_stat_statements): every
//! statement a constant of `db::ALL_STATEMENTS`, those run per request the
//! script's, so a changed request path stops the benchmark. Also round trips.

use std::sync::LazyLock;

use anyhow::{bail, Context as _, Result};
use chargeonce::db;
use regex::Regex;

use crate::bench::ServiceBinary;
use crate::database::BenchDatabase;
use crate::http::Api;
use crate::scenario::send_all;

/// At least this often per request: on the request path (rarer ones, a
/// cached lookup or a worker's, only count as round trips).
const PER_REQUEST: f64 = 0.5;
/// The dispatcher's, once per lone request; it fans out the script's events too.
const BACKGROUND: &[&str] = &["events::FAN_OUT"];
/// What [`identify`] calls BEGIN, COMMIT and ROLLBACK: round trips only.
const TRANSACTION_CONTROL: &str = "Conn::transaction";

pub struct Seen {
    pub text: String,
    pub calls: i64,
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
        let statements = (rows.into_iter())
            .map(|(text, calls)| Seen { constant: identify(&text), text, calls })
            .collect();
        Self { statements, requests }
    }

    pub fn per_request(&self, seen: &Seen) -> f64 {
        seen.calls as f64 / self.requests as f64
    }

    pub fn round_trips(&self) -> f64 {
        self.statements.iter().map(|s| s.calls).sum::<i64>() as f64 / self.requests as f64
    }

    /// Fails unless every statement is known and those per request `expected`.
    pub fn require_same_as(&self, expected: &[&str], flow: &str) -> Result<()> {
        let unknown: Vec<String> = (self.statements.iter())
            .filter(|seen| seen.constant.is_none())
            .map(|seen| format!("  {} calls: {}", seen.calls, shape(&seen.text)))
            .collect();
        if !unknown.is_empty() {
            bail!(
                "while handling {} {flow}s the service ran statements the benchmark does not \
                 know:\n{}\nEvery statement the service runs should be a constant of \
                 chargeonce::db: add it to db::ALL_STATEMENTS and, if it runs per request, to \
                 the pgbench scripts in tools/loadbench/src/script.rs",
                self.requests,
                unknown.join("\n")
            );
        }
        let mut seen: Vec<&str> = Vec::new();
        for statement in &self.statements {
            let constant = statement.constant.unwrap_or_default();
            let scripted = !BACKGROUND.contains(&constant) && constant != TRANSACTION_CONTROL;
            if scripted && self.per_request(statement) >= PER_REQUEST {
                let copies = (self.per_request(statement).round() as usize).max(1);
                seen.extend(std::iter::repeat_n(constant, copies));
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
}

/// What the database ran while a fresh service handled each key in turn.
pub async fn capture(
    binary: &ServiceBinary,
    database: &BenchDatabase,
    api_key: &str,
    keys: &[String],
) -> Result<Captured> {
    let service = binary.start(&database.url).await;
    let api = Api::new(service.port, api_key)?;
    let db = &database.client;
    let reset = db.batch_execute("SELECT pg_stat_statements_reset()").await;
    reset.context("resetting pg_stat_statements")?;
    send_all(&api, 1, keys).await?.require_success("the captured requests")?;
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
    Ok(Captured::new(rows.iter().map(|row| (row.get(0), row.get(1))).collect(), keys.len()))
}

fn identify(text: &str) -> Option<&'static str> {
    let captured = shape(text);
    if ["BEGIN", "COMMIT", "ROLLBACK"].contains(&captured.as_str()) {
        return Some(TRANSACTION_CONTROL);
    }
    let mut known = db::ALL_STATEMENTS.iter();
    known.find(|(_, statement)| shape(statement.sql) == captured).map(|(name, _)| *name)
}

/// Every value slot (`$n`, literals, TRUE, FALSE, NULL) as `?`, whitespace
/// collapsed: pg_stat_statements stores literals as `$n`.
pub fn shape(sql: &str) -> String {
    static SLOT: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r#"(?i)"[^"]*"|'(?:[^']|'')*'|\$\d+|\b\d+(?:\.\d+)?\b|\b(?:true|false|null)\b|\s+"#,
        )
        .unwrap_or_else(|e| unreachable!("{e}"))
    });
    let shaped = SLOT.replace_all(sql.trim(), |found: &regex::Captures| {
        let found = &found[0];
        match found.chars().next() {
            Some('"') => found.to_owned(),
            Some(c) if c.is_whitespace() => " ".to_owned(),
            _ => "?".to_owned(),
        }
    });
    shaped.trim_end_matches(';').trim_end().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chargeonce::db::charges;

    #[test]
    fn a_captured_text_is_its_constant_and_no_two_constants_look_alike() {
        // As pg_stat_statements stores it: its literals as further $n.
        let sql = charges::STATEMENTS.record_outcome.sql;
        let mut next = charges::STATEMENTS.record_outcome.params.len();
        let literal = Regex::new("'[^']*'").unwrap();
        let captured = literal.replace_all(sql, |_: &regex::Captures| {
            next += 1;
            format!("${next}")
        });
        assert_ne!(captured, sql);
        assert_eq!(identify(&captured), Some("charges::RECORD_OUTCOME"));
        assert_eq!(identify(sql), Some("charges::RECORD_OUTCOME"));
        assert_eq!(identify("SELECT $1 FROM pg_class"), None);
        assert_eq!(identify("COMMIT"), Some("Conn::transaction"));
        let known = db::ALL_STATEMENTS;
        for (i, a) in known.iter().enumerate() {
            for b in &known[i + 1..] {
                assert_ne!(shape(a.1.sql), shape(b.1.sql), "{} and {} look alike", a.0, b.0);
            }
        }
        assert_eq!(
            shape("SELECT  a1, 'it''s', 42, 1.5,\n TRUE, \"Null\" FROM t WHERE x = $12;"),
            r#"SELECT a1, ?, ?, ?, ?, "Null" FROM t WHERE x = ?"#
        );
    }

    #[test]
    fn the_request_path_must_be_what_the_script_runs() {
        let (insert, outcome) =
            (charges::INSERT_OR_FIND.sql, charges::STATEMENTS.record_outcome.sql);
        let captured = |rows: &[(&str, i64)]| {
            Captured::new(rows.iter().map(|(t, c)| ((*t).to_owned(), *c)).collect(), 100)
        };
        let expected = ["charges::INSERT_OR_FIND", "charges::RECORD_OUTCOME"];
        let lookup = chargeonce::db::merchants::FIND_BY_DIGEST.sql;
        let fan_out = chargeonce::db::events::FAN_OUT.sql;
        let same =
            captured(&[(insert, 100), (outcome, 100), ("COMMIT", 100), (lookup, 1), (fan_out, 90)]);
        same.require_same_as(&expected, "new charge").unwrap();
        assert!((same.round_trips() - 3.91).abs() < 1e-9);
        let missing =
            captured(&[(insert, 100), (lookup, 1)]).require_same_as(&expected, "new charge");
        assert!(missing.unwrap_err().to_string().contains("request path changed"));
        let unknown = captured(&[(insert, 100), (outcome, 100), ("SELECT 1", 3)]);
        let error = unknown.require_same_as(&expected, "new charge").unwrap_err().to_string();
        assert!(error.contains("does not know") && error.contains("SELECT ?"), "{error}");
    }
}
