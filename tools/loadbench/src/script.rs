//! The pgbench scripts of a new charge and a replay (BENCHMARKS.md): **own
//! SQL**, the constants of `chargeonce::db` translated by
//! [`statement_lines`] and sent as the service sends them (the outcome's
//! statements as one pipeline between BEGIN and COMMIT), and **the floor**,
//! the least SQL this design can cost, on a minimal table of its own.

use std::sync::LazyLock;

use anyhow::{bail, ensure, Context as _, Result};
use chargeonce::db::charges::{INSERT_OR_FIND, STATEMENTS};
use chargeonce::db::events::QUEUE;
use chargeonce::db::Statement;
use chargeonce::domain::Status;
use regex::Regex;
use tokio_postgres::types::Kind;
use tokio_postgres::Client;

use crate::scenario::POOL_KEY_PREFIX;

/// A new charge's constants, in order (capture.rs checks the service's).
pub const NEW_CHARGE_STATEMENTS: &[&str] = &[
    "charges::INSERT_OR_FIND",
    "charges::RECORD_OUTCOME",
    "charges::RECORD_EVENT",
    "events::QUEUE",
];
pub const REPLAY_STATEMENTS: &[&str] = &["charges::INSERT_OR_FIND"];

/// Time-ordered like the service's UUIDv7 (random ids would scatter the
/// primary-key inserts): milliseconds, then random, 32 hex digits.
const NEW_ID_SQL: &str =
    "lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::bigint), 12, '0') \
                          || left(md5(random()::text), 20)";
const PAYMENT_ID_SQL: &str = "'sim_' || left(md5(random()::text), 24)";
const RANDOM_MAX: &str = "9223372036854775806";

/// `value` cast to `type_name`; SQL other than a bare `:variable` bracketed.
fn render(value: &str, type_name: &str) -> String {
    let name = value.strip_prefix(':');
    match name.is_some_and(|n| n.chars().all(|c| c.is_alphanumeric() || c == '_')) {
        true => format!("{value}::{type_name}"),
        false => format!("({value})::{type_name}"),
    }
}

/// `statement` on one line, each `$n` outside quotes replaced by
/// `values[n - 1]` cast to the parameter's type; ended by `\gset <prefix>`
/// if given, else `;`. A comment would swallow the line: an error.
pub fn statement_lines(
    statement: &Statement,
    values: &[&str],
    gset: Option<&str>,
) -> Result<String> {
    static TOKEN: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r#"'(?:[^']|'')*'|"[^"]*"|\$(\d+)|--|/\*|\s+"#)
            .unwrap_or_else(|e| unreachable!("{e}"))
    });
    let params = statement.params;
    ensure!(
        values.len() == params.len(),
        "{} values for {} parameters",
        values.len(),
        params.len()
    );
    let (mut used, mut problem) = (vec![false; values.len()], None);
    let sql = TOKEN.replace_all(statement.sql.trim(), |found: &regex::Captures| {
        let token = &found[0];
        let Some(n) = found.get(1) else {
            return match token.chars().next() {
                Some('\'' | '"') => token.to_owned(),
                Some(c) if c.is_whitespace() => " ".to_owned(),
                _ => {
                    problem = Some(format!("the SQL has a comment: {}", statement.sql));
                    String::new()
                }
            };
        };
        let index = n.as_str().parse::<usize>().ok().and_then(|n| n.checked_sub(1));
        let Some(index) = index.filter(|&i| i < values.len()) else {
            problem = Some(format!("{token} has no value"));
            return String::new();
        };
        used[index] = true;
        // A batched statement's array: a batch of one, as for lone requests.
        match params[index].kind() {
            Kind::Array(element) => format!("ARRAY[{}]", render(values[index], element.name())),
            _ => render(values[index], params[index].name()),
        }
    });
    if let Some(problem) = problem {
        bail!(problem);
    }
    if let Some(unused) = used.iter().position(|used| !used) {
        bail!("the statement never uses ${}", unused + 1);
    }
    Ok(match gset {
        Some(prefix) => format!("{sql} \\gset {prefix}\n"),
        None => format!("{sql};\n"),
    })
}

/// `charges::INSERT_OR_FIND` (1 of `total`) with `key`, which `draw` sets up;
/// `\gset` carries the pending or found charge on.
fn insert_or_find(draw: &str, key: &str, total: usize) -> Result<String> {
    // customer, description: NULL.
    let values = [NEW_ID_SQL, ":merchant_id", key, ":fingerprint", ":amount", ":currency"];
    let values = [&values[..], &["NULL", "NULL", ":metadata", ":lease_ms"]].concat();
    let line = statement_lines(&INSERT_OR_FIND, &values, Some("claim_"))?;
    Ok(format!("\n-- 1/{total} {}\n{draw}{line}", NEW_CHARGE_STATEMENTS[0]))
}

/// A new charge: a fresh key's pending charge, then in one transaction its
/// outcome, event (id: the charge's, one per charge) and queue row.
pub fn own_sql_new() -> Result<String> {
    let draw = format!("\\set k random(1, {RANDOM_MAX})\n");
    let mut text = insert_or_find(&draw, "'pgb-' || :run || '-' || :k", 4)?;
    text += "\\startpipeline\nBEGIN;\n";
    let (merchant, id) = (":claim_merchant_id", ":claim_id");
    // failure_code, failure_message: NULL; the event's processor attempts: 0.
    let outcome = [merchant, id, ":status", "NULL", "NULL", PAYMENT_ID_SQL];
    let event = [merchant, id, id, ":payload", ":status", "0"];
    let statements: [(&Statement, &[&str]); 3] = [
        (&STATEMENTS.record_outcome, &outcome),
        (&STATEMENTS.record_event, &event),
        (&QUEUE, &[merchant, id]),
    ];
    for (index, (statement, values)) in statements.into_iter().enumerate() {
        let name = NEW_CHARGE_STATEMENTS[index + 1];
        text +=
            &format!("\n-- {}/4 {name}\n{}", index + 2, statement_lines(statement, values, None)?);
    }
    text.push_str("\\endpipeline\nCOMMIT;\n");
    Ok(text)
}

pub fn own_sql_replay(pool_size: usize) -> Result<String> {
    let draw = format!("\\set i random(0, {})\n", pool_size.saturating_sub(1));
    insert_or_find(&draw, &format!("'{POOL_KEY_PREFIX}' || :i"), 1)
}

/// The own-SQL scripts' `-D` variables but `run`; parameters, as the
/// service's values are.
pub async fn service_variables(db: &Client) -> Result<Vec<(&'static str, String)>> {
    let sql = "SELECT c.merchant_id::text, '\\x' || encode(c.request_fingerprint, 'hex'), \
                      e.data::text FROM charges c JOIN events e ON e.charge_id = c.id \
                ORDER BY c.id LIMIT 1";
    let row = db.query_one(sql, &[]).await;
    let row = row.context("reading the merchant, fingerprint and event payload of a charge")?;
    Ok(vec![
        ("merchant_id", row.get(0)),
        ("fingerprint", row.get(1)),
        ("payload", row.get(2)),
        // The benchmark's body, {"amount":1000,"currency":"USD"}.
        ("amount", "1000".to_owned()),
        ("currency", "USD".to_owned()),
        ("metadata", "{}".to_owned()),
        // The default idempotency.lease_ms (any costs the same).
        ("lease_ms", "30000".to_owned()),
        ("status", Status::Succeeded.as_str().to_owned()),
    ])
}

/// The floor's table: what a charge needs, nothing more.
pub const FLOOR_TABLE: &str = "\
CREATE TABLE bench_charges (id uuid PRIMARY KEY, merchant_id text NOT NULL, client_idempotency_key text NOT NULL,
  request_fingerprint bytea NOT NULL, amount bigint NOT NULL CHECK (amount > 0), currency text NOT NULL, customer text,
  description text, status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(), UNIQUE (merchant_id, client_idempotency_key));
";

pub fn floor_rows(pool_size: usize) -> String {
    format!(
        "INSERT INTO bench_charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                                    amount, currency, customer, description, status) \
         SELECT gen_random_uuid(), 'm1', '{POOL_KEY_PREFIX}' || i, \
                sha256(convert_to(i::text, 'UTF8')), 1000, 'EUR', 'cus_x', 'pgbench', 'succeeded' \
           FROM generate_series(0, {}) AS i",
        pool_size.saturating_sub(1)
    )
}

pub const FLOOR_NEW: &str = "\
\\set amount random(100, 100000)
INSERT INTO bench_charges (id, merchant_id, client_idempotency_key, request_fingerprint, amount, currency, customer, description, status)
VALUES (gen_random_uuid(), 'm1', gen_random_uuid()::text, sha256(convert_to(:amount::text, 'UTF8')), :amount, 'EUR', 'cus_x', 'pgbench', 'pending')
ON CONFLICT (merchant_id, client_idempotency_key) DO NOTHING RETURNING id \\gset
UPDATE bench_charges SET status = 'succeeded', updated_at = now() WHERE id = :id;
";

/// One row by (merchant, key) through the unique index.
pub fn floor_replay(pool_size: usize) -> String {
    format!(
        "\\set i random(0, {})\n\
         SELECT id, amount, currency, customer, description, status, created_at FROM bench_charges \
         WHERE merchant_id = 'm1' AND client_idempotency_key = '{POOL_KEY_PREFIX}' || :i \\gset\n",
        pool_size.saturating_sub(1)
    )
}

#[cfg(test)]
mod tests {
    use tokio_postgres::types::Type;

    use super::*;

    #[test]
    fn parameters_become_typed_pgbench_values_on_one_line() {
        let update = Statement {
            sql: "UPDATE t SET a = $2,\n    b = 'x $9 y' WHERE id = $1 AND n < $3 AND m = $3",
            params: &[Type::UUID, Type::TEXT, Type::INT8],
        };
        assert_eq!(
            statement_lines(&update, &[":claim_id", "NULL", ":n * 2"], Some("row_")).unwrap(),
            "UPDATE t SET a = (NULL)::text, b = 'x $9 y' WHERE id = :claim_id::uuid \
             AND n < (:n * 2)::int8 AND m = (:n * 2)::int8 \\gset row_\n"
        );
        let error = |sql, values: &[&str]| {
            let statement = Statement { sql, params: &[Type::TEXT, Type::TEXT] };
            statement_lines(&statement, values, None).unwrap_err().to_string()
        };
        assert!(error("SELECT $1, $2", &[":a"]).contains("1 values for 2"));
        assert!(error("SELECT $1", &[":a", ":b"]).contains("never uses $2"));
        assert!(error("SELECT $1, $3", &[":a", ":b"]).contains("$3 has no value"));
        assert!(error("SELECT $1, $2 -- why", &[":a", ":b"]).contains("comment"));
    }

    #[test]
    fn the_services_statements_translate_and_the_floor_is_fixed() {
        let new = own_sql_new().unwrap();
        assert!(new.contains("\\set k random(1, 9223372036854775806)\n"));
        assert!(new.contains("('pgb-' || :run || '-' || :k)::text"));
        assert!(new.contains(" \\gset claim_\n") && new.contains("\\startpipeline\nBEGIN;"));
        assert!(
            new.contains("WHERE merchant_id = :claim_merchant_id::uuid AND id = :claim_id::uuid")
        );
        assert!(!new.contains('$'), "{new}");
        let replay = own_sql_replay(20_000).unwrap();
        assert!(
            replay.contains("\\set i random(0, 19999)\n")
                && replay.contains("('pool-' || :i)::text")
        );
        assert!(!replay.contains("UPDATE charges"));
        assert!(FLOOR_NEW.contains("RETURNING id \\gset\nUPDATE bench_charges"));
        assert!(floor_replay(2_000).starts_with("\\set i random(0, 1999)\n"));
        assert!(floor_rows(2_000).contains("generate_series(0, 1999)"));
    }
}
