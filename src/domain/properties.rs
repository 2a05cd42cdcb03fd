//! Property tests of the request path's pure half: parsing a body, validating
//! it, and taking its fingerprint.
#![cfg(test)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::{strict_json, Fingerprint, NewCharge};

/// The fingerprint of a body, the way the request path takes it.
fn fingerprint(body: &str) -> Fingerprint {
    let value = strict_json::parse(body.as_bytes()).expect("valid JSON");
    let charge = NewCharge::parse(&value).expect("a valid charge");
    Fingerprint::of(&charge.normalised())
}

#[derive(Debug, Clone)]
struct Request {
    amount: i64,
    currency: &'static str,
    customer: Option<String>,
    description: Option<String>,
    metadata: BTreeMap<String, String>,
}

fn text() -> impl Strategy<Value = String> {
    // Printable text of every kind, quotes, backslashes and non-ASCII
    // included; no NUL (refused) and within every limit.
    "[ -~éß€😀\t\n\"\\\\]{0,20}"
}

fn request() -> impl Strategy<Value = Request> {
    (
        1..=99_999_999_999i64,
        prop::sample::select(vec!["USD", "EUR", "JPY", "GBP", "CHF"]),
        prop::option::of(text()),
        prop::option::of(text()),
        prop::collection::btree_map("[a-z]{1,8}", text(), 0..4),
    )
        .prop_map(
            |(amount, currency, customer, description, metadata)| Request {
                amount,
                currency,
                customer,
                description,
                metadata,
            },
        )
}

/// One JSON rendering of `request`, chosen by `style`: member order, the
/// currency's case, and how absent values are written all vary.
fn render(request: &Request, style: u8) -> String {
    let currency = if style & 1 == 0 {
        request.currency.to_owned()
    } else {
        request.currency.to_lowercase()
    };
    let absent = |value: &Option<String>| match (value, style & 2) {
        (Some(text), _) => Some(json!(text)),
        (None, 0) => None,
        (None, _) => Some(Value::Null),
    };
    let mut members: Vec<(&str, Value)> = vec![
        ("amount", json!(request.amount)),
        ("currency", json!(currency)),
    ];
    if let Some(customer) = absent(&request.customer) {
        members.push(("customer", customer));
    }
    if let Some(description) = absent(&request.description) {
        members.push(("description", description));
    }
    match (request.metadata.is_empty(), style & 4, style & 8) {
        (false, _, _) => members.push(("metadata", json!(request.metadata))),
        (true, 0, 0) => {}
        (true, 0, _) => members.push(("metadata", json!({}))),
        (true, _, _) => members.push(("metadata", Value::Null)),
    }
    if style & 16 != 0 {
        members.reverse();
    }
    let separator = if style & 32 == 0 { "," } else { " ,\n\t" };
    let body: Vec<String> = members
        .iter()
        .map(|(name, value)| format!("{}:{value}", json!(name)))
        .collect();
    format!("{{{}}}", body.join(separator))
}

proptest! {
    #[test]
    fn equivalent_bodies_have_one_fingerprint(request in request(), a in 0u8..64, b in 0u8..64) {
        prop_assert_eq!(fingerprint(&render(&request, a)), fingerprint(&render(&request, b)));
    }

    #[test]
    fn any_changed_field_changes_the_fingerprint(request in request(), style in 0u8..64, which in 0usize..6, extra in text()) {
        let mut changed = request.clone();
        match which {
            0 => changed.amount = if request.amount == 1 { 2 } else { request.amount - 1 },
            1 => changed.currency = if request.currency == "USD" { "EUR" } else { "USD" },
            2 => changed.customer = Some(format!("{}x", request.customer.clone().unwrap_or_default())),
            3 => changed.description = match &request.description {
                None => Some(extra),
                Some(_) => None,
            },
            4 => { changed.metadata.insert("zz-extra".to_owned(), extra); }
            _ => match request.metadata.keys().next().cloned() {
                Some(key) => { changed.metadata.insert(key, "changed-value-".repeat(2)); }
                None => { changed.metadata.insert("k".to_owned(), String::new()); }
            },
        }
        prop_assert_ne!(fingerprint(&render(&request, style)), fingerprint(&render(&changed, style)));
    }

    #[test]
    fn no_bytes_make_the_body_path_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(value) = strict_json::parse(&bytes) {
            if let Ok(charge) = NewCharge::parse(&value) {
                let _ = Fingerprint::of(&charge.normalised());
            }
        }
    }

    #[test]
    fn no_json_makes_the_body_path_panic(value in json_value()) {
        let text = value.to_string();
        let parsed = strict_json::parse(text.as_bytes());
        prop_assert!(parsed.is_ok());
        if let Ok(charge) = NewCharge::parse(&parsed.unwrap_or_default()) {
            let _ = Fingerprint::of(&charge.normalised());
        }
    }
}

/// A second request with the same key: `first` with some of its fields
/// changed (each bit of `changes` changes one), or as it was.
fn second(first: &Request, changes: u8, extra: &str) -> Request {
    let mut second = first.clone();
    if changes & 1 != 0 {
        second.amount = if first.amount == 1 {
            2
        } else {
            first.amount - 1
        };
    }
    if changes & 2 != 0 {
        second.currency = if first.currency == "USD" {
            "EUR"
        } else {
            "USD"
        };
    }
    if changes & 4 != 0 {
        second.customer = match &first.customer {
            None => Some(extra.to_owned()),
            Some(_) => None,
        };
    }
    if changes & 8 != 0 {
        second.description = Some(format!(
            "{}x",
            first.description.clone().unwrap_or_default()
        ));
    }
    if changes & 16 != 0 {
        second
            .metadata
            .insert("zz-added".to_owned(), extra.to_owned());
    }
    if changes & 32 != 0 {
        if let Some(key) = first.metadata.keys().next().cloned() {
            second.metadata.remove(&key);
        }
    }
    if changes & 64 != 0 {
        if let Some(key) = first.metadata.keys().last().cloned() {
            second.metadata.insert(key, format!("{extra}-changed"));
        }
    }
    second
}

/// The fields that differ between two requests, by comparing them field by
/// field (not through JSON), in name order.
fn changed_fields(first: &Request, second: &Request) -> Vec<String> {
    let mut changed = Vec::new();
    if first.amount != second.amount {
        changed.push("amount".to_owned());
    }
    if first.currency != second.currency {
        changed.push("currency".to_owned());
    }
    if first.customer != second.customer {
        changed.push("customer".to_owned());
    }
    if first.description != second.description {
        changed.push("description".to_owned());
    }
    let keys: std::collections::BTreeSet<&String> = first
        .metadata
        .keys()
        .chain(second.metadata.keys())
        .collect();
    for key in keys {
        if first.metadata.get(key) != second.metadata.get(key) {
            changed.push(format!("metadata.{key}"));
        }
    }
    changed
}

/// The charge stored for `request`, as the service stores it.
fn stored_charge(request: &Request, style: u8) -> super::Charge {
    let body = render(request, style);
    super::Charge {
        id: super::ChargeId::new(),
        merchant_id: super::MerchantId::from_uuid(uuid::Uuid::nil()),
        fingerprint: fingerprint(&body),
        amount: request.amount,
        currency: request.currency.to_owned(),
        customer: request.customer.clone(),
        description: request.description.clone(),
        metadata: request.metadata.clone(),
        status: super::Status::Succeeded,
        failure_code: None,
        failure_message: None,
        lease: super::lifecycle::Lease::default(),
        refunds_reserved: 0,
        amount_refunded: 0,
        processor_payment_id: None,
        created_at: chrono::Utc::now(),
    }
}

proptest! {
    /// A key reused with another request names exactly the fields that
    /// changed, worked out from the stored charge alone; with an equivalent
    /// request (the fingerprints equal), none.
    #[test]
    fn the_differing_fields_are_exactly_the_changed_ones(
        first in request(), changes in 0u8..128, extra in text(), a in 0u8..64, b in 0u8..64,
    ) {
        let second = second(&first, changes, &extra);
        let stored = stored_charge(&first, a);
        let first_request = stored.first_request();
        prop_assert!(first_request.is_some(), "the stored charge gives back its request");
        let new_body = render(&second, b);
        let new = NewCharge::parse(&strict_json::parse(new_body.as_bytes()).expect("JSON"))
            .expect("a valid charge");
        let differing = super::differences::differing_fields(
            &first_request.unwrap_or_default(),
            &new.normalised(),
        );
        prop_assert_eq!(differing.is_empty(), stored.fingerprint == fingerprint(&new_body));
        prop_assert_eq!(differing, changed_fields(&first, &second));
    }
}

/// JSON values shaped roughly like charge requests, with every kind of
/// value in every place.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[\\u{0}-\\u{7f}éß€]{0,12}".prop_map(Value::String),
    ];
    let value = leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    });
    let field = prop::sample::select(vec![
        "amount",
        "currency",
        "customer",
        "description",
        "metadata",
        "other",
    ]);
    prop::collection::btree_map(field, value, 0..6).prop_map(|fields| {
        Value::Object(fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
    })
}
