//! Bad input: a clear problem+json answer with the right status, and nothing
//! written, nothing charged.

use serde_json::Value;

use crate::helpers::spawn_app;

struct Case {
    name: &'static str,
    content_type: Option<&'static str>,
    key: Option<String>,
    body: Vec<u8>,
    status: u16,
    code: &'static str,
    fields: &'static [&'static str],
}

fn case(
    name: &'static str,
    body: &str,
    status: u16,
    code: &'static str,
    fields: &'static [&'static str],
) -> Case {
    Case {
        name,
        content_type: Some("application/json"),
        key: Some(format!("key-{}", name.replace(' ', "-"))),
        body: body.as_bytes().to_vec(),
        status,
        code,
        fields,
    }
}

fn cases() -> Vec<Case> {
    let ok = r#"{"amount":100,"currency":"USD"}"#;
    let mut cases = vec![
        case(
            "amount as string",
            r#"{"amount":"100","currency":"USD"}"#,
            400,
            "invalid_request",
            &["amount"],
        ),
        case(
            "currency as number",
            r#"{"amount":100,"currency":840}"#,
            400,
            "invalid_request",
            &["currency"],
        ),
        case(
            "negative amount",
            r#"{"amount":-100,"currency":"USD"}"#,
            400,
            "invalid_request",
            &["amount"],
        ),
        case(
            "zero amount",
            r#"{"amount":0,"currency":"USD"}"#,
            400,
            "invalid_request",
            &["amount"],
        ),
        case(
            "huge amount",
            r#"{"amount":100000000000,"currency":"USD"}"#,
            400,
            "invalid_request",
            &["amount"],
        ),
        case(
            "amount past i64",
            r#"{"amount":99999999999999999999,"currency":"USD"}"#,
            400,
            "invalid_request",
            &["amount"],
        ),
        case(
            "fractional amount",
            r#"{"amount":10.5,"currency":"USD"}"#,
            400,
            "invalid_request",
            &["amount"],
        ),
        case(
            "missing amount",
            r#"{"currency":"USD"}"#,
            400,
            "invalid_request",
            &["amount"],
        ),
        case(
            "unknown currency",
            r#"{"amount":100,"currency":"XYZ"}"#,
            400,
            "invalid_request",
            &["currency"],
        ),
        case(
            "unknown field",
            r#"{"amount":100,"currency":"USD","capture":true}"#,
            400,
            "invalid_request",
            &["capture"],
        ),
        case(
            "metadata not an object",
            r#"{"amount":100,"currency":"USD","metadata":"x"}"#,
            400,
            "invalid_request",
            &["metadata"],
        ),
        case(
            "metadata value not a string",
            r#"{"amount":100,"currency":"USD","metadata":{"n":1}}"#,
            400,
            "invalid_request",
            &["metadata.n"],
        ),
        case(
            "customer not a string",
            r#"{"amount":100,"currency":"USD","customer":7}"#,
            400,
            "invalid_request",
            &["customer"],
        ),
        case(
            "several at once",
            r#"{"amount":-1,"currency":"dollars","x":1}"#,
            400,
            "invalid_request",
            &["amount", "currency", "x"],
        ),
        case("array body", "[1,2,3]", 400, "invalid_request", &[""]),
        case(
            "NUL in description",
            r#"{"amount":100,"currency":"USD","description":"a\u0000b"}"#,
            400,
            "invalid_request",
            &["description"],
        ),
        case(
            "NUL in customer",
            r#"{"amount":100,"currency":"USD","customer":"\u0000"}"#,
            400,
            "invalid_request",
            &["customer"],
        ),
        case(
            "NUL in a metadata value",
            r#"{"amount":100,"currency":"USD","metadata":{"k":"v\u0000"}}"#,
            400,
            "invalid_request",
            &["metadata.k"],
        ),
        case(
            "NUL in a metadata key",
            r#"{"amount":100,"currency":"USD","metadata":{"k\u0000":"v"}}"#,
            400,
            "invalid_request",
            &["metadata.k\u{0}"],
        ),
        case(
            "duplicate member",
            r#"{"amount":1,"currency":"USD","amount":5000}"#,
            400,
            "invalid_request",
            &[],
        ),
        case(
            "duplicate member in metadata",
            r#"{"amount":1,"currency":"USD","metadata":{"a":"1","a":"2"}}"#,
            400,
            "invalid_request",
            &[],
        ),
        case(
            "invalid JSON",
            r#"{"amount":100,"currency":"USD""#,
            400,
            "invalid_request",
            &[],
        ),
        case("empty body", "", 400, "invalid_request", &[]),
    ];
    let long_description = format!(
        r#"{{"amount":100,"currency":"USD","description":"{}"}}"#,
        "d".repeat(1001)
    );
    cases.push(Case {
        body: long_description.into_bytes(),
        ..case(
            "description too long",
            "",
            400,
            "invalid_request",
            &["description"],
        )
    });
    let oversized = format!(
        r#"{{"amount":100,"currency":"USD","description":"{}"}}"#,
        "d".repeat(70 * 1024)
    );
    cases.push(Case {
        body: oversized.into_bytes(),
        ..case("oversized body", "", 413, "payload_too_large", &[])
    });
    cases.push(Case {
        content_type: Some("text/plain"),
        ..case("text content type", ok, 415, "unsupported_media_type", &[])
    });
    cases.push(Case {
        content_type: Some("application/x-www-form-urlencoded"),
        ..case(
            "form content type",
            "amount=100&currency=USD",
            415,
            "unsupported_media_type",
            &[],
        )
    });
    cases.push(Case {
        content_type: None,
        ..case("no content type", ok, 415, "unsupported_media_type", &[])
    });
    cases.push(Case {
        key: None,
        ..case("key missing", ok, 400, "idempotency_key_missing", &[])
    });
    cases.push(Case {
        key: Some(String::new()),
        ..case("key empty", ok, 400, "idempotency_key_invalid", &[])
    });
    cases.push(Case {
        key: Some("\"\"".into()),
        ..case("key empty quoted", ok, 400, "idempotency_key_invalid", &[])
    });
    cases.push(Case {
        key: Some("k".repeat(256)),
        ..case("key too long", ok, 400, "idempotency_key_invalid", &[])
    });
    cases.push(Case {
        key: Some("has space".into()),
        ..case("key with space", ok, 400, "idempotency_key_invalid", &[])
    });
    cases.push(Case {
        key: Some("tab\tkey".into()),
        ..case("key with tab", ok, 400, "idempotency_key_invalid", &[])
    });
    cases
}

#[tokio::test]
async fn bad_input_is_rejected_and_writes_nothing() {
    let app = spawn_app().await;
    let auth = format!("Bearer {}", app.api_key);
    for case in cases() {
        let mut headers = vec![("Authorization", auth.as_str())];
        if let Some(content_type) = case.content_type {
            headers.push(("Content-Type", content_type));
        }
        if let Some(key) = &case.key {
            headers.push(("Idempotency-Key", key.as_str()));
        }
        let reply = app.post_charge_raw(&headers, case.body.clone()).await;
        assert_eq!(
            reply.status.as_u16(),
            case.status,
            "{}: {}",
            case.name,
            reply.body
        );
        let problem = reply.assert_problem(case.status, case.code);
        let mut fields: Vec<&str> = problem["errors"]
            .as_array()
            .map(|errors| errors.iter().filter_map(|e| e["field"].as_str()).collect())
            .unwrap_or_default();
        fields.sort_unstable();
        assert_eq!(fields, case.fields, "{}: {problem}", case.name);
        if !case.fields.is_empty() {
            let messages: Vec<&Value> = problem["errors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| &e["message"])
                .collect();
            assert!(
                messages
                    .iter()
                    .all(|m| m.as_str().is_some_and(|m| !m.is_empty())),
                "{}",
                case.name
            );
        }
    }
    assert_eq!(
        app.charge_rows().await,
        0,
        "no bad request may write a charge"
    );
    assert_eq!(
        app.processor.calls(),
        0,
        "no bad request may reach the processor"
    );
}

#[tokio::test]
async fn a_non_ascii_key_is_invalid() {
    let app = spawn_app().await;
    // Header values are bytes; send one that is not visible ASCII.
    let reply = app
        .http
        .post(format!("{}/v1/charges", app.address))
        .bearer_auth(&app.api_key)
        .header("Content-Type", "application/json")
        .header(
            "Idempotency-Key",
            reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        )
        .body(r#"{"amount":100,"currency":"USD"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 400);
    assert_eq!(
        reply.json::<Value>().await.unwrap()["code"],
        "idempotency_key_invalid"
    );
    assert_eq!(app.charge_rows().await, 0);
}

#[tokio::test]
async fn a_rejected_request_leaves_the_key_free() {
    let app = spawn_app().await;
    app.post_charge("fix-me", r#"{"amount":-1,"currency":"USD"}"#)
        .await
        .assert_problem(400, "invalid_request");
    let fixed = app
        .post_charge("fix-me", r#"{"amount":1,"currency":"USD"}"#)
        .await;
    assert_eq!(fixed.status, 201, "{}", fixed.body);
    assert_eq!(fixed.header("idempotent-replayed"), None);
}

/// Ambiguous requests are refused before anything is stored: two copies of a
/// member (a gateway reading the first would see another amount than the
/// one charged), two `Idempotency-Key` or two `Authorization` headers.
#[tokio::test]
async fn ambiguous_requests_are_refused_with_a_reason() {
    let app = spawn_app().await;
    let reply = app
        .post_charge("dup", r#"{"amount":1,"currency":"USD","amount":5000}"#)
        .await;
    let problem = reply.assert_problem(400, "invalid_request");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("\"amount\" appears more than once"),
        "{problem}"
    );

    let auth = format!("Bearer {}", app.api_key);
    let two_keys = app
        .post_charge_raw(
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/json"),
                ("Idempotency-Key", "one"),
                ("Idempotency-Key", "two"),
            ],
            br#"{"amount":1,"currency":"USD"}"#.to_vec(),
        )
        .await;
    let problem = two_keys.assert_problem(400, "idempotency_key_invalid");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("more than once"),
        "{problem}"
    );

    let two_authorizations = app
        .post_charge_raw(
            &[
                ("Authorization", auth.as_str()),
                ("Authorization", "Bearer sk_other"),
                ("Content-Type", "application/json"),
                ("Idempotency-Key", "three"),
            ],
            br#"{"amount":1,"currency":"USD"}"#.to_vec(),
        )
        .await;
    two_authorizations.assert_problem(401, "unauthenticated");
    assert_eq!(app.charge_rows().await, 0);
}

/// What the parser treats as the same request is the same request for the
/// key too: absent, `null` and `{}` metadata, key order, spacing and the
/// currency's case. A different value is still a different request.
#[tokio::test]
async fn equivalent_bodies_replay_and_different_ones_do_not() {
    let app = spawn_app().await;
    let first = app
        .post_charge("same", r#"{"amount":1500,"currency":"usd"}"#)
        .await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.json()["currency"], "USD");
    for equivalent in [
        r#"{"amount":1500,"currency":"USD"}"#,
        r#"{"currency":"Usd","amount":1500,"metadata":{}}"#,
        r#"{"amount":1500,"currency":"USD","description":null,"customer":null,"metadata":null}"#,
    ] {
        let replay = app.post_charge("same", equivalent).await;
        assert_eq!(replay.status, 201, "{equivalent}: {}", replay.body);
        assert_eq!(replay.body, first.body, "{equivalent}");
        assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    }
    for different in [
        r#"{"amount":1500,"currency":"EUR"}"#,
        r#"{"amount":1500,"currency":"USD","description":""}"#,
        r#"{"amount":1500,"currency":"USD","metadata":{"k":"v"}}"#,
    ] {
        app.post_charge("same", different)
            .await
            .assert_problem(422, "idempotency_key_reused");
    }
    assert_eq!(app.charge_rows().await, 1);
}

/// Clients that name the charset (`application/json; charset=utf-8`, as
/// many HTTP libraries do by default) are served; JSON in another charset
/// is 415, not read as something it is not.
#[tokio::test]
async fn a_utf8_charset_parameter_is_accepted_and_another_charset_is_415() {
    let app = spawn_app().await;
    let auth = format!("Bearer {}", app.api_key);
    let body = br#"{"amount":1000,"currency":"USD","description":"caf\u00e9"}"#.to_vec();
    for (n, content_type) in [
        "application/json; charset=utf-8",
        "Application/JSON;charset=UTF-8",
        "application/json; charset=\"utf-8\"",
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("charset-{n}");
        let reply = app
            .post_charge_raw(
                &[
                    ("Authorization", auth.as_str()),
                    ("Idempotency-Key", key.as_str()),
                    ("Content-Type", content_type),
                ],
                body.clone(),
            )
            .await;
        assert_eq!(reply.status, 201, "{content_type}: {}", reply.body);
        assert_eq!(reply.json()["description"], "café");
    }
    let reply = app
        .post_charge_raw(
            &[
                ("Authorization", auth.as_str()),
                ("Idempotency-Key", "latin1"),
                ("Content-Type", "application/json; charset=iso-8859-1"),
            ],
            body,
        )
        .await;
    reply.assert_problem(415, "unsupported_media_type");
    assert_eq!(app.charge_rows().await, 3);
}
