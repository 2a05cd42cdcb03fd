//! A fuzz run of what a request's bytes meet first: the strict JSON parser,
//! the body parsers of charges, refunds and webhook endpoints, and the
//! `Idempotency-Key` parser. `cargo fuzz` needs a nightly toolchain, which
//! these machines cannot fetch, so this is a proptest-driven run instead:
//! arbitrary bytes, and JSON made to look like the real bodies (so the
//! parsers' deep paths are reached, not only "not JSON").
//!
//! `cargo test --test fuzz` runs 500 cases per target (part of the suite);
//! `FUZZ_CASES=N` sets the count, and `.ci/run` gives it a longer run.
//! What must hold for every input: no panic; whatever is accepted satisfies
//! the database's checks (so it can never turn into a 500 there), and its
//! normalised form parses back to the same request (the fingerprint of a
//! retry is stable).

// A failed expectation is the finding.
#![allow(clippy::expect_used, clippy::panic)]

use chargeonce::domain::{
    strict_json, Fingerprint, IdempotencyKey, NewCharge, NewRefund, NewWebhookEndpoint,
};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

fn config() -> ProptestConfig {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(500);
    ProptestConfig {
        cases,
        // A failure is reported with its input; nothing written to the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Strings of every kind: ASCII, control characters, quotes, non-ASCII,
/// NUL, long runs.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,12}",
        ".{0,12}",
        "[\\x00-\\x1f\"\\\\é€😀]{0,6}",
        "[a-z]{250,260}",
        "[A-Za-z]{0,4}",
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        (-3i64..100_000_000_003).prop_map(Value::from),
    ]
}

/// Any JSON value, a few levels deep.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        text().prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// An object with the members of a real body (each maybe present, with a
/// likely or an arbitrary value) and maybe others.
fn body_like(members: &'static [&'static str]) -> BoxedStrategy<Value> {
    let member = |name: &'static str| {
        let likely = match name {
            "amount" => prop_oneof![number(), (1i64..10_000).prop_map(Value::from)].boxed(),
            "currency" => prop_oneof!["[A-Za-z]{3}", "[a-zA-Z]{0,5}"]
                .prop_map(Value::String)
                .boxed(),
            // Around the limit of 50 entries, or a few of any kind.
            "metadata" => prop_oneof![
                prop::collection::btree_map("[a-z]{1,3}", "[ -~]{0,3}", 48..53)
                    .prop_map(|map| json!(map)),
                prop::collection::btree_map(text(), value(), 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
            .boxed(),
            "url" => prop_oneof![
                "https?://[a-z0-9.-]{1,20}(:[0-9]{1,6})?(/[ -~]{0,10})?",
                ".{0,20}",
            ]
            .prop_map(Value::String)
            .boxed(),
            "event_types" => prop::collection::vec(
                prop_oneof![
                    Just("charge.succeeded".to_owned()),
                    Just("refund.failed".to_owned()),
                    text()
                ],
                0..4,
            )
            .prop_map(|types| json!(types))
            .boxed(),
            "reason" => prop_oneof![
                Just("duplicate".to_owned()),
                Just("requested_by_customer".to_owned()),
                text()
            ]
            .prop_map(Value::String)
            .boxed(),
            _ => prop_oneof![text().prop_map(Value::String), Just(Value::Null)].boxed(),
        };
        prop::option::of(prop_oneof![likely, value()])
    };
    let known: Vec<_> = members.iter().map(|&name| member(name)).collect();
    (known, prop::collection::btree_map(text(), value(), 0..2))
        .prop_map(move |(values, extra)| {
            let mut object: Map<String, Value> = extra.into_iter().collect();
            for (name, value) in members.iter().zip(values) {
                if let Some(value) = value {
                    object.insert((*name).to_owned(), value);
                }
            }
            Value::Object(object)
        })
        .boxed()
}

/// Bytes as a client might send them: arbitrary, or JSON text of a value
/// with a byte changed, a member repeated or the text cut short.
fn bytes_of(body: BoxedStrategy<Value>) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        body.clone().prop_map(|v| v.to_string().into_bytes()),
        (body.clone(), any::<prop::sample::Index>(), any::<u8>()).prop_map(|(v, at, byte)| {
            let mut bytes = v.to_string().into_bytes();
            let at = at.index(bytes.len());
            bytes[at] = byte;
            bytes
        }),
        (body.clone(), any::<prop::sample::Index>()).prop_map(|(v, at)| {
            let bytes = v.to_string().into_bytes();
            bytes[..at.index(bytes.len())].to_vec()
        }),
        body.prop_map(|v| {
            // The first member again, as a gateway reading the first would
            // see another request than the last-wins parser.
            let text = v.to_string();
            match text.find(',') {
                Some(comma) => format!("{},{}", &text[..comma], &text[1..]).into_bytes(),
                None => text.into_bytes(),
            }
        }),
    ]
}

/// What the schema's checks on text columns refuse: NUL (PostgreSQL text
/// cannot hold it).
fn storable(text: &str) -> bool {
    !text.contains('\0')
}

fn check_charge(bytes: &[u8]) {
    let Ok(body) = strict_json::parse(bytes) else {
        return;
    };
    let Ok(charge) = NewCharge::parse(&body) else {
        return;
    };
    let amount = charge.amount.minor_units();
    assert!((1..=99_999_999_999).contains(&amount), "{amount}");
    let currency = charge.currency.as_str();
    assert!(
        currency.len() == 3 && currency.bytes().all(|b| b.is_ascii_uppercase()),
        "{currency:?}"
    );
    for text in [&charge.customer, &charge.description]
        .into_iter()
        .flatten()
    {
        assert!(storable(text), "{text:?}");
    }
    assert!(charge
        .customer
        .as_ref()
        .is_none_or(|c| c.chars().count() <= 255));
    assert!(charge
        .description
        .as_ref()
        .is_none_or(|d| d.chars().count() <= 1000));
    for (key, value) in &charge.metadata {
        assert!(storable(key) && storable(value), "{key:?}: {value:?}");
    }
    // The normalised form is itself a valid body meaning the same request.
    let normalised = charge.normalised();
    let again = NewCharge::parse(&normalised).expect("the normalised form parses");
    assert_eq!(
        Fingerprint::of(&again.normalised()),
        Fingerprint::of(&normalised)
    );
}

fn check_refund(bytes: &[u8]) {
    let Ok(body) = strict_json::parse(bytes) else {
        return;
    };
    let Ok(refund) = NewRefund::parse(&body) else {
        return;
    };
    if let Some(amount) = refund.amount {
        assert!(amount.minor_units() > 0);
    }
    for (key, value) in &refund.metadata {
        assert!(storable(key) && storable(value), "{key:?}: {value:?}");
    }
    let normalised = refund.normalised();
    let again = NewRefund::parse(&normalised).expect("the normalised form parses");
    assert_eq!(
        Fingerprint::of(&again.normalised()),
        Fingerprint::of(&normalised)
    );
}

fn check_endpoint(bytes: &[u8]) {
    let Ok(body) = strict_json::parse(bytes) else {
        return;
    };
    let Ok(endpoint) = NewWebhookEndpoint::parse(&body) else {
        return;
    };
    let url = endpoint.url.as_str();
    assert!(
        (url.starts_with("http://") || url.starts_with("https://")) && url.len() <= 2048,
        "{url}"
    );
    let normalised = endpoint.normalised();
    let again = NewWebhookEndpoint::parse(&normalised).expect("the normalised form parses");
    assert_eq!(again.url, endpoint.url);
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn charge_bodies(bytes in bytes_of(body_like(&["amount", "currency", "customer", "description", "metadata"]))) {
        check_charge(&bytes);
    }

    #[test]
    fn refund_bodies(bytes in bytes_of(body_like(&["amount", "reason", "metadata"]))) {
        check_refund(&bytes);
    }

    #[test]
    fn webhook_endpoint_bodies(bytes in bytes_of(body_like(&["url", "event_types"]))) {
        check_endpoint(&bytes);
    }

    #[test]
    fn idempotency_keys(raw in prop_oneof![".{0,300}", "\"?[!-~]{0,260}\"?", "[ -~]{250,260}"]) {
        if let Ok(key) = IdempotencyKey::parse(&raw) {
            // What the database's key check accepts (migration V5).
            let key = key.as_str();
            prop_assert!((1..=255).contains(&key.len()), "{key:?}");
            prop_assert!(key.bytes().all(|b| b.is_ascii_graphic()), "{key:?}");
        }
    }
}
