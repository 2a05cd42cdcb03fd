//! The schema enforces what the service validates: a row the service would
//! refuse cannot be written by anything else either (migration V5 rewrote
//! the key check in a cheaper form; it must mean the same).

use chargeonce::domain::IdempotencyKey;

use crate::helpers::migrated_database;

/// Every key the service accepts is a key the database accepts, and the
/// other way round, for all three tables that hold keys.
#[tokio::test]
async fn the_key_check_accepts_exactly_the_keys_the_service_accepts() {
    let database = migrated_database().await;
    let client = database.client().await;
    client
        .batch_execute(
            "INSERT INTO merchants (id, name) \
             VALUES ('00000000-0000-7000-8000-000000000001', 'm')",
        )
        .await
        .unwrap();

    // Every character up to U+00FF (NUL cannot be stored in text), alone
    // and inside a key, and the lengths around the limit.
    let mut keys: Vec<String> = (1u8..=255)
        .flat_map(|byte| {
            let c = char::from(byte);
            [c.to_string(), format!("key-{c}-end")]
        })
        .collect();
    keys.extend(["", "a", "€", "key\u{2028}"].map(str::to_owned));
    for len in [254, 255, 256, 1000] {
        keys.push("k".repeat(len));
    }

    let statements = [
        "INSERT INTO charges (id, merchant_id, client_idempotency_key, request_fingerprint, \
                              amount, currency, status) \
         VALUES (gen_random_uuid(), '00000000-0000-7000-8000-000000000001', $1, \
                 sha256('x'), 100, 'USD', 'succeeded')",
        "UPDATE charges SET client_idempotency_key = $1 \
          WHERE id = (SELECT id FROM charges LIMIT 1)",
    ];
    let mut checked = 0;
    for key in &keys {
        // parse also takes a key in quotes and drops them; the column holds
        // what parse returns, so a key it changes is not one to store.
        let service_accepts = IdempotencyKey::parse(key).is_ok_and(|k| k.as_str() == key);
        for statement in statements {
            // One row, for the UPDATE to change.
            client.batch_execute("DELETE FROM charges").await.unwrap();
            client.execute(statements[0], &[&"seed"]).await.unwrap();
            let stored = client.execute(statement, &[key]).await;
            assert_eq!(
                stored.is_ok(),
                service_accepts,
                "{key:?} ({} bytes): {stored:?}",
                key.len()
            );
            checked += 1;
        }
    }
    assert!(checked > 1000);

    // The other tables that hold keys check them with the same expression.
    let definitions: Vec<String> = client
        .query(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
              WHERE conname IN ('charges_key_format', 'refunds_key_format', \
                                'webhook_endpoints_key_format')",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(definitions.len(), 3);
    assert!(
        definitions.iter().all(|d| *d == definitions[0]),
        "{definitions:#?}"
    );
}
