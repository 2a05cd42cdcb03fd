//! The bytes below are what the service wrote before these types existed
//! (captured from its answers): the types must write them exactly, and read
//! them back.

use std::borrow::Cow;

use serde_json::json;

use super::*;

const CHARGE: &str = r#"{"id":"ch_01a244b05b7071d3a430e8027900a3bf","object":"charge","amount":1000,"currency":"USD","status":"succeeded","customer":"c1","description":"d","metadata":{"a":"1","b":"2"},"failure_code":null,"failure_message":null,"amount_refunded":0,"refunded":false,"created_at":"2026-12-05T05:32:18.164838Z"}"#;
const DECLINED: &str = r#"{"type":"urn:chargeonce:problem:card_declined","title":"Payment declined","status":402,"detail":"The card was declined.","code":"card_declined","charge":{"amount":1002,"amount_refunded":0,"created_at":"2026-12-05T05:32:18.208561Z","currency":"EUR","customer":null,"description":null,"failure_code":"card_declined","failure_message":"The card was declined.","id":"ch_01a244b05ba072b38d931df49f1c831d","metadata":{},"object":"charge","refunded":false,"status":"failed"},"charge_id":"ch_01a244b05ba072b38d931df49f1c831d"}"#;
const REFUND: &str = r#"{"id":"re_01a244b05d03711d800c58546e8bc450","object":"refund","charge":"ch_01a244b05b7071d3a430e8027900a3bf","amount":300,"currency":"USD","status":"succeeded","reason":"duplicate","metadata":{"t":"1"},"failure_code":null,"failure_message":null,"created_at":"2026-12-05T05:32:18.563860Z"}"#;
const REFUND_DECLINED: &str = r#"{"type":"urn:chargeonce:problem:refund_declined","title":"Refund declined","status":402,"detail":"The refund was declined.","code":"refund_declined","refund":{"amount":102,"charge":"ch_01a244b05b7071d3a430e8027900a3bf","created_at":"2026-12-05T05:32:18.593633Z","currency":"USD","failure_code":"refund_declined","failure_message":"The refund was declined.","id":"re_01a244b05d217289b85c9f95c6ee415f","metadata":{},"object":"refund","reason":null,"status":"failed"},"refund_id":"re_01a244b05d217289b85c9f95c6ee415f"}"#;
const EVENT: &str = r#"{"id":"evt_01a244b05d23752782d4798a37cf18b3","object":"event","type":"refund.failed","created_at":"2026-12-05T05:32:18.595884Z","data":{"object":{"amount":102,"charge":"ch_01a244b05b7071d3a430e8027900a3bf","created_at":"2026-12-05T05:32:18.593633Z","currency":"USD","failure_code":"refund_declined","failure_message":"The refund was declined.","id":"re_01a244b05d217289b85c9f95c6ee415f","metadata":{},"object":"refund","reason":null,"status":"failed"}}}"#;
const ENDPOINT_CREATED: &str = r#"{"id":"we_01a244b05c9c7773b067aad8a8cd6899","object":"webhook_endpoint","url":"http://127.0.0.1:1/x","event_types":["charge.succeeded","refund.succeeded"],"secret":"whsec_MOc5bUpz3N1mVPteNOzZNd+jf03dTkWlhCUEeF4Kauw=","enabled":true,"created_at":"2026-12-05T05:32:18.492484Z"}"#;
const ENDPOINT_DELETED: &str = r#"{"id":"we_01a244b05cd571b1b2ae7f9878e30047","object":"webhook_endpoint","url":"http://127.0.0.1:1/y","event_types":null,"enabled":false,"created_at":"2026-12-05T05:32:18.517345Z","deleted":true}"#;
const ENDPOINTS: &str = r#"{"object":"list","url":"/v1/webhook_endpoints","has_more":false,"data":[{"id":"we_01a244b05cd571b1b2ae7f9878e30047","object":"webhook_endpoint","url":"http://127.0.0.1:1/y","event_types":null,"enabled":true,"created_at":"2026-12-05T05:32:18.517345Z"}]}"#;
const DELIVERIES: &str = r#"{"object":"list","url":"/v1/events/evt_01a244b05d23752782d4798a37cf18b3/deliveries","has_more":false,"data":[{"object":"webhook_delivery","event":"evt_01a244b05d23752782d4798a37cf18b3","endpoint":"we_01a244b05cd571b1b2ae7f9878e30047","url":"http://127.0.0.1:1/y","status":"pending","attempts":1,"next_attempt_at":"2026-12-05T05:32:49.565701Z","last_status_code":null,"last_error":"refused","created_at":"2026-12-05T05:32:18.718167Z","updated_at":"2026-12-05T05:32:18.739701Z","attempt_log":[{"attempt":1,"status_code":null,"error":"refused","duration_ms":1,"created_at":"2026-12-05T05:32:18.739701Z"}]}]}"#;
const INVALID: &str = r#"{"type":"urn:chargeonce:problem:invalid_request","title":"Invalid request","status":400,"detail":"the charge request is invalid","code":"invalid_request","errors":[{"field":"zz","message":"unknown field"},{"field":"amount","message":"must be greater than 0"}]}"#;
const EXCEEDS: &str = r#"{"type":"urn:chargeonce:problem:refund_exceeds_charge","title":"Refund exceeds charge","status":400,"detail":"the refund is larger than what remains refundable of the charge (700)","code":"refund_exceeds_charge","refundable_amount":700}"#;
const NOT_FOUND: &str = r#"{"type":"urn:chargeonce:problem:not_found","title":"Not found","status":404,"detail":"no such resource","code":"not_found"}"#;

/// `text` read as `T` and written again: the same bytes.
fn round_trip<T: serde::Serialize + serde::de::DeserializeOwned>(text: &str) -> T {
    let value: T = serde_json::from_str(text).expect("reads");
    assert_eq!(serde_json::to_string(&value).expect("writes"), text);
    value
}

#[test]
fn every_object_writes_the_bytes_the_service_always_wrote() {
    let charge: Charge<'static> = round_trip(CHARGE);
    assert_eq!(charge.customer.as_deref(), Some("c1"));
    let declined: ChargeDeclined<'static> = round_trip(DECLINED);
    assert_eq!(declined.charge.status, Status::Failed);
    assert_eq!(declined.problem.code, "card_declined");
    let refund: Refund<'static> = round_trip(REFUND);
    assert_eq!(refund.reason, Some(RefundReason::Duplicate));
    let declined: RefundDeclined<'static> = round_trip(REFUND_DECLINED);
    assert_eq!(declined.refund_id, declined.refund.id);
    let event: Event<'static> = round_trip(EVENT);
    assert_eq!(event.kind, EventType::RefundFailed);
    let created: WebhookEndpoint = round_trip(ENDPOINT_CREATED);
    assert!(created.secret.is_some() && !created.deleted);
    let deleted: WebhookEndpoint = round_trip(ENDPOINT_DELETED);
    assert!(deleted.deleted && deleted.secret.is_none());
    let listed: List<WebhookEndpoint> = round_trip(ENDPOINTS);
    assert!(!listed.data[0].deleted);
    let deliveries: List<Delivery> = round_trip(DELIVERIES);
    assert_eq!(deliveries.data[0].status, DeliveryStatus::Pending);
    let invalid: Problem<'static> = round_trip(INVALID);
    assert_eq!(invalid.errors.len(), 2);
    let exceeds: Problem<'static> = round_trip(EXCEEDS);
    assert_eq!(exceeds.refundable_amount, Some(700));
    round_trip::<Problem<'static>>(NOT_FOUND);
}

/// A declined charge's members are in alphabetical order however the
/// charge's fields are ordered (how every 402 has shown them).
#[test]
fn a_declined_charge_shows_its_members_sorted() {
    let charge: Charge<'static> = serde_json::from_str(CHARGE).expect("reads");
    let declined = ChargeDeclined {
        problem: Problem::default(),
        charge_id: charge.id.clone(),
        charge,
    };
    let text = serde_json::to_string(&declined).expect("writes");
    let inner = &text[text.find(r#""charge":{"#).expect("charge") + 10..];
    assert!(inner.starts_with(r#""amount":1000,"amount_refunded":0,"created_at""#));
    assert!(text.ends_with(r#""charge_id":"ch_01a244b05b7071d3a430e8027900a3bf"}"#));
}

#[test]
fn answers_are_read_leniently() {
    // An older service: no refund members, no `object`; and members this
    // version does not know.
    let older = json!({
        "id": "ch_1", "amount": 1999, "currency": "USD", "status": "succeeded",
        "created_at": "2026-11-30T19:59:39.452451Z", "livemode": true
    });
    let charge: Charge<'static> = serde_json::from_value(older).expect("a charge");
    assert_eq!((charge.amount_refunded, charge.refunded), (0, false));
    assert!(charge.metadata.is_empty() && charge.customer.is_none());

    // Values added later.
    let mut newer: serde_json::Value = serde_json::from_str(CHARGE).expect("json");
    newer["status"] = json!("disputed");
    let charge: Charge<'static> = serde_json::from_value(newer).expect("a charge");
    assert_eq!(charge.status, Status::Unknown);
    let mut refund: serde_json::Value = serde_json::from_str(REFUND).expect("json");
    refund["reason"] = json!("expired_uncaptured");
    let refund: Refund<'static> = serde_json::from_value(refund).expect("a refund");
    assert_eq!(refund.reason, Some(RefundReason::Unknown));
    let kind: EventType = serde_json::from_value(json!("charge.disputed")).expect("a type");
    assert_eq!(kind, EventType::Unknown);
    let status: DeliveryStatus = serde_json::from_value(json!("paused")).expect("a status");
    assert_eq!(status, DeliveryStatus::Unknown);

    // A page without `has_more`, a problem without most members.
    let page: List<Charge<'static>> = serde_json::from_value(json!({"data": []})).expect("page");
    assert!(!page.has_more);
    let problem: Problem<'static> =
        serde_json::from_value(json!({"code": "teapot"})).expect("a problem");
    assert_eq!(
        (problem.code.as_ref(), problem.detail.as_ref()),
        ("teapot", "")
    );
}

/// `Unknown` is what a client read; writing it would be a lie.
#[test]
fn an_unknown_value_is_never_written() {
    assert!(serde_json::to_string(&Status::Unknown).is_err());
    assert!(serde_json::to_string(&RefundReason::Unknown).is_err());
    assert!(serde_json::to_string(&EventType::Unknown).is_err());
    assert!(serde_json::to_string(&DeliveryStatus::Unknown).is_err());
}

#[test]
fn requests_leave_out_what_is_absent() {
    let charge = serde_json::to_value(NewCharge::new(100, "USD")).expect("json");
    assert_eq!(charge, json!({"amount": 100, "currency": "USD"}));
    let full = NewCharge::new(100, "EUR")
        .customer("c")
        .description("d")
        .metadata("k", "v");
    assert_eq!(
        serde_json::to_string(&full).expect("json"),
        r#"{"amount":100,"currency":"EUR","customer":"c","description":"d","metadata":{"k":"v"}}"#
    );
    assert_eq!(
        serde_json::to_value(NewRefund::new()).expect("json"),
        json!({})
    );
    assert_eq!(
        serde_json::to_value(NewRefund::new().amount(5).reason(RefundReason::Duplicate))
            .expect("json"),
        json!({"amount": 5, "reason": "duplicate"})
    );
    let endpoint = NewWebhookEndpoint::new("https://example.com/hooks");
    assert_eq!(
        serde_json::to_value(&endpoint).expect("json"),
        json!({"url": "https://example.com/hooks"})
    );
    assert_eq!(
        serde_json::to_value(endpoint.event_type(EventType::ChargeFailed)).expect("json"),
        json!({"url": "https://example.com/hooks", "event_types": ["charge.failed"]})
    );
}

#[test]
fn a_borrowed_charge_writes_what_an_owned_one_does() {
    let owned: Charge<'static> = serde_json::from_str(CHARGE).expect("reads");
    let metadata = owned.metadata.clone().into_owned();
    let borrowed = Charge {
        currency: Cow::Borrowed("USD"),
        metadata: Cow::Borrowed(&metadata),
        ..owned.clone()
    };
    assert_eq!(borrowed, owned);
    assert_eq!(serde_json::to_string(&borrowed).expect("writes"), CHARGE);
}

#[test]
fn an_endpoints_debug_form_hides_its_secret() {
    let created: WebhookEndpoint = serde_json::from_str(ENDPOINT_CREATED).expect("reads");
    let shown = format!("{created:?}");
    assert!(!shown.contains("MOc5bUpz3N1m"), "{shown}");
    assert!(shown.contains("[redacted]"), "{shown}");
}
