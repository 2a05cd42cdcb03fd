//! The client against a scripted HTTP server: what it sends on each attempt,
//! which answers it retries, how long it waits, and when it gives up. The
//! real service is exercised by the server package's `tests/api/client.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use chargeonce_client::{
    ChargeStatus, Client, Error, IdempotencyKey, ListParams, NewCharge, NewRefund, RefundStatus,
    RetryPolicy, StatusCode,
};
use futures_util::TryStreamExt;
use serde_json::{json, Value};
use wiremock::matchers::{method, path, query_param, query_param_is_missing};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

/// Short waits, so a test that retries a few times takes milliseconds.
fn quick_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        deadline: Duration::from_secs(10),
    }
}

fn client_with(server: &MockServer, policy: RetryPolicy) -> Client {
    Client::builder(server.uri(), "sk_test_secret")
        .retry_policy(policy)
        .build()
        .unwrap()
}

fn charge(status: &str) -> Value {
    json!({
        "id": "ch_0192f1c2a3b47c5d8e9f0a1b2c3d4e5f", "object": "charge", "amount": 1999,
        "currency": "USD", "status": status, "customer": null, "description": null,
        "metadata": {}, "failure_code": null, "failure_message": null,
        "created_at": "2026-11-30T19:59:39.452451Z"
    })
}

fn refund(status: &str) -> Value {
    json!({
        "id": "re_1", "object": "refund", "charge": "ch_1", "amount": 500, "currency": "USD",
        "status": status, "reason": null, "metadata": {}, "failure_code": null,
        "failure_message": null, "created_at": "2026-11-30T19:59:39Z"
    })
}

fn problem(status: u16, code: &str, extra: Value) -> ResponseTemplate {
    let mut body = json!({
        "type": format!("urn:chargeonce:problem:{code}"), "title": "Problem",
        "status": status, "detail": format!("detail of {code}"), "code": code
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    ResponseTemplate::new(status).set_body_raw(body.to_string(), "application/problem+json")
}

fn json_answer(status: u16, body: Value) -> ResponseTemplate {
    ResponseTemplate::new(status).set_body_raw(body.to_string(), "application/json")
}

/// Answers `first` `times` times, then `then` for good.
async fn script(
    server: &MockServer,
    route: &str,
    first: ResponseTemplate,
    times: u64,
    then: ResponseTemplate,
) {
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(first)
        .up_to_n_times(times)
        .mount(server)
        .await;
    Mock::given(method("POST"))
        .and(path(route))
        .respond_with(then)
        .mount(server)
        .await;
}

async fn requests(server: &MockServer) -> Vec<Request> {
    server.received_requests().await.unwrap()
}

fn header<'a>(request: &'a Request, name: &str) -> &'a str {
    request.headers.get(name).unwrap().to_str().unwrap()
}

#[tokio::test]
async fn a_503_waits_for_retry_after_and_retries_with_the_same_key_and_body() {
    let server = MockServer::start().await;
    script(
        &server,
        "/v1/charges",
        problem(503, "service_unavailable", json!({})).insert_header("Retry-After", "1"),
        1,
        json_answer(201, charge("succeeded")),
    )
    .await;
    let client = client_with(&server, quick_policy());

    let operation = client.charge_operation(&NewCharge::new(1999, "USD").metadata("order", "7"));
    let started = Instant::now();
    let charged = operation.send().await.unwrap();
    let elapsed = started.elapsed();

    assert_eq!(charged.status, ChargeStatus::Succeeded);
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed < Duration::from_secs(3),
        "Retry-After: 1 replaces the 10 ms backoff; took {elapsed:?}"
    );
    let sent = requests(&server).await;
    assert_eq!(sent.len(), 2);
    for request in &sent {
        assert_eq!(header(request, "idempotency-key"), operation.key().as_str());
        assert_eq!(header(request, "authorization"), "Bearer sk_test_secret");
        assert_eq!(header(request, "content-type"), "application/json");
        assert_eq!(
            request.body, sent[0].body,
            "the same bytes on every attempt"
        );
    }
    let body: Value = serde_json::from_slice(&sent[0].body).unwrap();
    assert_eq!(
        body,
        json!({"amount": 1999, "currency": "USD", "metadata": {"order": "7"}})
    );
}

#[tokio::test]
async fn retryable_answers_are_retried_until_the_attempts_run_out() {
    for (answer, code) in [
        (problem(500, "internal_error", json!({})), "internal_error"),
        (problem(429, "rate_limited", json!({})), "rate_limited"),
        (
            problem(409, "idempotency_key_in_use", json!({})).insert_header("Retry-After", "0"),
            "idempotency_key_in_use",
        ),
        (
            ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>"),
            "",
        ),
    ] {
        let server = MockServer::start().await;
        script(&server, "/v1/charges", answer.clone(), 100, answer).await;
        let client = client_with(&server, quick_policy());
        let key = IdempotencyKey::from("order-1001");

        let error = client
            .create_charge_with_key(&NewCharge::new(100, "USD"), key.clone())
            .await
            .unwrap_err();

        let Error::GaveUp { last, attempts, .. } = &error else {
            panic!("{code}: {error:?}")
        };
        assert_eq!(*attempts, 4, "{code}");
        assert!(matches!(**last, Error::Api { .. }), "{code}: {last:?}");
        assert_eq!(error.idempotency_key(), Some(&key), "{code}");
        assert!(error.is_retryable());
        let sent = requests(&server).await;
        assert_eq!(sent.len(), 4, "{code}");
        assert!(sent
            .iter()
            .all(|r| header(r, "idempotency-key") == "order-1001"));
    }
}

#[tokio::test]
async fn final_answers_are_returned_after_one_request() {
    let declined = {
        let mut failed = charge("failed");
        failed["failure_code"] = json!("card_declined");
        failed["failure_message"] = json!("The card was declined.");
        json!({"charge_id": failed["id"], "charge": failed})
    };
    type Expected = fn(&Error) -> bool;
    let cases: Vec<(ResponseTemplate, Expected)> = vec![
        (
            problem(
                400,
                "invalid_request",
                json!({"errors": [{"field": "amount", "message": "must be greater than 0"}]}),
            ),
            |e| matches!(e, Error::InvalidRequest { errors, .. } if errors[0].field == "amount"),
        ),
        (problem(401, "unauthenticated", json!({})), |e| {
            matches!(e, Error::Unauthenticated { .. })
        }),
        (problem(402, "card_declined", declined), |e| {
            matches!(e, Error::Declined { code, charge, .. }
                if code == "card_declined" && charge.status == ChargeStatus::Failed)
        }),
        (problem(404, "not_found", json!({})), |e| {
            matches!(e, Error::NotFound { .. })
        }),
        (problem(413, "payload_too_large", json!({})), |e| {
            e.status() == Some(StatusCode::PAYLOAD_TOO_LARGE)
        }),
        (problem(415, "unsupported_media_type", json!({})), |e| {
            e.status() == Some(StatusCode::UNSUPPORTED_MEDIA_TYPE)
        }),
        (problem(422, "idempotency_key_reused", json!({})), |e| {
            matches!(e, Error::KeyReused { .. })
        }),
    ];
    for (answer, expected) in cases {
        let server = MockServer::start().await;
        script(&server, "/v1/charges", answer.clone(), 100, answer).await;
        let client = client_with(&server, quick_policy());
        let operation = client.charge_operation(&NewCharge::new(1002, "USD"));

        let error = operation.send().await.unwrap_err();

        assert!(expected(&error), "{error:?}");
        assert!(!error.is_retryable(), "{error:?}");
        assert_eq!(error.idempotency_key(), Some(operation.key()));
        assert_eq!(requests(&server).await.len(), 1, "{error:?}");
    }
}

#[tokio::test]
async fn a_pending_charge_is_retried_with_the_same_key_until_it_is_final() {
    let server = MockServer::start().await;
    script(
        &server,
        "/v1/charges",
        json_answer(202, charge("pending")),
        2,
        json_answer(201, charge("succeeded")),
    )
    .await;
    let client = client_with(&server, quick_policy());
    let operation = client.charge_operation(&NewCharge::new(1009, "USD"));

    let charged = operation.send().await.unwrap();

    assert_eq!(charged.status, ChargeStatus::Succeeded);
    let sent = requests(&server).await;
    assert_eq!(sent.len(), 3);
    assert!(sent
        .iter()
        .all(|r| header(r, "idempotency-key") == operation.key().as_str()));
}

#[tokio::test]
async fn a_charge_still_pending_when_the_attempts_run_out_is_an_error_with_the_charge() {
    let server = MockServer::start().await;
    let pending = json_answer(202, charge("pending"));
    script(&server, "/v1/charges", pending.clone(), 100, pending).await;
    let client = client_with(&server, quick_policy());
    let operation = client.charge_operation(&NewCharge::new(1009, "USD"));

    let error = operation.send().await.unwrap_err();

    let Error::Pending { charge, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(charge.status, ChargeStatus::Pending);
    assert_eq!(error.idempotency_key(), Some(operation.key()));
    assert!(error.is_retryable());
    assert_eq!(requests(&server).await.len(), 4);
}

#[tokio::test]
async fn a_retry_after_past_the_deadline_gives_up_at_once() {
    let server = MockServer::start().await;
    let busy = problem(503, "service_unavailable", json!({})).insert_header("Retry-After", "30");
    script(&server, "/v1/charges", busy.clone(), 100, busy).await;
    let policy = RetryPolicy {
        deadline: Duration::from_secs(5),
        ..quick_policy()
    };
    let client = client_with(&server, policy);

    let started = Instant::now();
    let error = client
        .create_charge(&NewCharge::new(100, "USD"))
        .await
        .unwrap_err();

    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no pointless sleep"
    );
    let Error::GaveUp { last, attempts, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(*attempts, 1);
    assert!(matches!(
        **last,
        Error::Api { retry_after: Some(d), .. } if d == Duration::from_secs(30)
    ));
}

#[tokio::test]
async fn the_deadline_bounds_slow_attempts_too() {
    let server = MockServer::start().await;
    let slow = json_answer(201, charge("succeeded")).set_delay(Duration::from_secs(5));
    script(&server, "/v1/charges", slow.clone(), 100, slow).await;
    let policy = RetryPolicy {
        deadline: Duration::from_millis(600),
        ..quick_policy()
    };
    let client = client_with(&server, policy);

    let started = Instant::now();
    let error = client
        .create_charge(&NewCharge::new(100, "USD"))
        .await
        .unwrap_err();

    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_millis(1500), "took {elapsed:?}");
    let Error::GaveUp { last, .. } = &error else {
        panic!("{error:?}")
    };
    assert!(
        matches!(&**last, Error::Transport { source, .. } if source.is_timeout()),
        "{last:?}"
    );
}

#[tokio::test]
async fn no_server_at_all_is_retried_then_reported_with_the_key() {
    // A port that was just free: connecting is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::builder(format!("http://127.0.0.1:{port}"), "sk")
        .retry_policy(quick_policy())
        .build()
        .unwrap();
    let operation = client.charge_operation(&NewCharge::new(100, "USD"));

    let error = operation.send().await.unwrap_err();

    let Error::GaveUp { last, attempts, .. } = &error else {
        panic!("{error:?}")
    };
    assert_eq!(*attempts, 4);
    assert!(matches!(**last, Error::Transport { .. }), "{last:?}");
    assert_eq!(error.idempotency_key(), Some(operation.key()));
}

#[tokio::test]
async fn an_invalid_key_is_refused_before_anything_is_sent() {
    let server = MockServer::start().await;
    let client = client_with(&server, quick_policy());
    let error = client
        .create_charge_with_key(
            &NewCharge::new(100, "USD"),
            IdempotencyKey::from("two words"),
        )
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidKey { .. }), "{error:?}");
    assert!(requests(&server).await.is_empty());
}

#[tokio::test]
async fn a_read_returns_a_pending_charge_as_it_is() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/charges/ch_0192f1c2a3b47c5d8e9f0a1b2c3d4e5f"))
        .respond_with(json_answer(200, charge("pending")))
        .mount(&server)
        .await;
    let client = client_with(&server, quick_policy());
    let charge = client
        .get_charge("ch_0192f1c2a3b47c5d8e9f0a1b2c3d4e5f")
        .await
        .unwrap();
    assert_eq!(charge.status, ChargeStatus::Pending);
    let sent = requests(&server).await;
    assert!(sent[0].headers.get("idempotency-key").is_none());
}

#[tokio::test]
async fn listing_follows_has_more_with_starting_after() {
    let server = MockServer::start().await;
    let item = |id: &str| {
        let mut c = charge("succeeded");
        c["id"] = json!(id);
        c
    };
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("limit", "2"))
        .and(query_param_is_missing("starting_after"))
        .respond_with(json_answer(
            200,
            json!({"object": "list", "url": "/v1/charges", "has_more": true, "data": [item("ch_4"), item("ch_3")]}),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("limit", "2"))
        .and(query_param("starting_after", "ch_3"))
        .respond_with(json_answer(
            200,
            json!({"object": "list", "url": "/v1/charges", "has_more": true, "data": [item("ch_2"), item("ch_1")]}),
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/charges"))
        .and(query_param("starting_after", "ch_1"))
        .respond_with(json_answer(
            200,
            json!({"object": "list", "url": "/v1/charges", "has_more": false, "data": []}),
        ))
        .mount(&server)
        .await;
    let client = client_with(&server, quick_policy());

    let ids: Vec<String> = client
        .list_charges(ListParams::new().limit(2))
        .map_ok(|c| c.id)
        .try_collect()
        .await
        .unwrap();

    assert_eq!(ids, ["ch_4", "ch_3", "ch_2", "ch_1"]);
    assert_eq!(requests(&server).await.len(), 3);
}

#[tokio::test]
async fn a_listing_error_ends_the_stream_after_it_is_yielded() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .respond_with(problem(401, "unauthenticated", json!({})))
        .mount(&server)
        .await;
    let client = client_with(&server, quick_policy());
    let results: Vec<_> =
        futures_util::StreamExt::collect(client.list_refunds(ListParams::new())).await;
    assert_eq!(results.len(), 1);
    assert!(matches!(results[0], Err(Error::Unauthenticated { .. })));
}

#[tokio::test]
async fn refunds_follow_the_same_contract() {
    let route = "/v1/charges/ch_1/refunds";

    // 201: the refund. 202 pending first, as for charges.
    let server = MockServer::start().await;
    script(
        &server,
        route,
        json_answer(202, refund("pending")),
        1,
        json_answer(201, refund("succeeded")),
    )
    .await;
    let client = client_with(&server, quick_policy());
    let operation = client.refund_operation("ch_1", &NewRefund::new().amount(500));
    let refunded = operation.send().await.unwrap();
    assert_eq!(refunded.status, RefundStatus::Succeeded);
    let sent = requests(&server).await;
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|r| header(r, "idempotency-key") == operation.key().as_str()));
    assert_eq!(
        serde_json::from_slice::<Value>(&sent[0].body).unwrap(),
        json!({"amount": 500})
    );

    // 400 refund_exceeds_charge, with what is left.
    let server = MockServer::start().await;
    let exceeds = problem(
        400,
        "refund_exceeds_charge",
        json!({"refundable_amount": 250}),
    );
    script(&server, route, exceeds.clone(), 100, exceeds).await;
    let error = client_with(&server, quick_policy())
        .create_refund("ch_1", &NewRefund::new().amount(500))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            Error::RefundExceedsCharge {
                refundable_amount: 250,
                ..
            }
        ),
        "{error:?}"
    );
    assert_eq!(requests(&server).await.len(), 1);

    // 400 charge_not_refundable.
    let server = MockServer::start().await;
    let refused = problem(400, "charge_not_refundable", json!({}));
    script(&server, route, refused.clone(), 100, refused).await;
    let error = client_with(&server, quick_policy())
        .create_refund("ch_1", &NewRefund::new())
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::ChargeNotRefundable { .. }),
        "{error:?}"
    );

    // 402: the processor declined the refund.
    let server = MockServer::start().await;
    let mut failed = refund("failed");
    failed["failure_code"] = json!("expired_card");
    let declined = problem(402, "expired_card", json!({"refund": failed}));
    script(&server, route, declined.clone(), 100, declined).await;
    let error = client_with(&server, quick_policy())
        .create_refund("ch_1", &NewRefund::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, Error::RefundDeclined { code, refund, .. } if code == "expired_card" && refund.id == "re_1"),
        "{error:?}"
    );
    assert_eq!(requests(&server).await.len(), 1);

    // GET /v1/refunds/{id}.
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds/re_1"))
        .respond_with(json_answer(200, refund("succeeded")))
        .mount(&server)
        .await;
    let got = client_with(&server, quick_policy())
        .get_refund("re_1")
        .await
        .unwrap();
    assert_eq!(got.charge, "ch_1");
}
