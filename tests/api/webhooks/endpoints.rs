//! Webhook endpoints: idempotent creation, strict bodies, the secret shown
//! at creation only, soft delete.

use base64::Engine as _;
use serde_json::{json, Value};
use uuid::Uuid;

use super::NOWHERE;
use crate::helpers::{charge_body, spawn_app};
use crate::webhook_receiver::{create_endpoint, delete_endpoint, get, post_endpoint};

#[tokio::test]
async fn endpoint_creation_is_idempotent_and_shows_the_secret_only_then() {
    let app = spawn_app().await;
    let body =
        r#"{"url":"HTTP://127.0.0.1:9/hooks","event_types":["charge.failed","charge.succeeded"]}"#;
    let (status, replayed, first) = post_endpoint(&app.address, &app.api_key, "we-1", body).await;
    assert_eq!((status, replayed), (201, None), "{first}");
    let created: Value = serde_json::from_str(&first).unwrap();
    assert_eq!(
        created.as_object().unwrap().keys().collect::<Vec<_>>(),
        [
            "created_at",
            "enabled",
            "event_types",
            "id",
            "object",
            "secret",
            "url"
        ]
    );
    assert!(created["id"].as_str().unwrap().starts_with("we_"));
    assert_eq!(created["object"], "webhook_endpoint");
    assert_eq!(created["url"], NOWHERE, "stored normalised");
    assert_eq!(
        created["event_types"],
        json!(["charge.succeeded", "charge.failed"])
    );
    assert_eq!(created["enabled"], true);
    let secret = created["secret"].as_str().unwrap().to_owned();
    let key = secret.strip_prefix("whsec_").expect("whsec_ prefix");
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(key)
        .unwrap();
    assert!(decoded.len() >= 24, "{} random bytes", decoded.len());

    // The same request, spelled differently: the first answer again, secret
    // included, byte for byte.
    let same = r#"{ "event_types": ["charge.succeeded", "charge.failed", "charge.failed"],
                    "url": "http://127.0.0.1:9/hooks" }"#;
    let (status, replayed, again) = post_endpoint(&app.address, &app.api_key, "we-1", same).await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(again, first);

    // Another request with the key: 422, and nothing new.
    let (status, _, reused) = post_endpoint(
        &app.address,
        &app.api_key,
        "we-1",
        r#"{"url":"http://127.0.0.1:9/other"}"#,
    )
    .await;
    assert_eq!(status, 422, "{reused}");
    assert_eq!(
        serde_json::from_str::<Value>(&reused).unwrap()["code"],
        "idempotency_key_reused"
    );
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 1);

    // No key at all.
    let missing = app
        .http
        .post(format!("{}/v1/webhook_endpoints", app.address))
        .bearer_auth(&app.api_key)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 400);
    assert_eq!(
        missing.json::<Value>().await.unwrap()["code"],
        "idempotency_key_missing"
    );

    // The endpoints' key space is their own, and each merchant's.
    assert_eq!(app.post_charge("we-1", &charge_body(100)).await.status, 201);
    let other = app.create_merchant("Other").await;
    let (status, replayed, theirs) = post_endpoint(&app.address, &other, "we-1", body).await;
    assert_eq!((status, replayed), (201, None));
    let theirs: Value = serde_json::from_str(&theirs).unwrap();
    assert_ne!(theirs["id"], created["id"]);
    assert_ne!(theirs["secret"], created["secret"]);

    // The list: newest first, without any secret.
    let second = create_endpoint(&app.address, &app.api_key, NOWHERE, None).await;
    assert_eq!(second["event_types"], Value::Null);
    let (status, list) = get(&app.address, &app.api_key, "/v1/webhook_endpoints").await;
    assert_eq!(status, 200);
    assert!(!list.contains("whsec_") && !list.contains(key), "{list}");
    assert!(!list.contains(&second["secret"].as_str().unwrap()[6..]));
    let list: Value = serde_json::from_str(&list).unwrap();
    let listed: Vec<&Value> = list["data"].as_array().unwrap().iter().collect();
    assert_eq!(
        listed.iter().map(|e| &e["id"]).collect::<Vec<_>>(),
        [&second["id"], &created["id"]]
    );
    let mut shown = created.clone();
    shown.as_object_mut().unwrap().remove("secret");
    assert_eq!(listed[1], &shown);
    let (_, page) = get(&app.address, &app.api_key, "/v1/webhook_endpoints?limit=1").await;
    let page: Value = serde_json::from_str(&page).unwrap();
    assert_eq!(
        (page["data"].as_array().unwrap().len(), &page["has_more"]),
        (1, &json!(true))
    );
    let (_, theirs_listed) = get(&app.address, &other, "/v1/webhook_endpoints").await;
    assert!(theirs_listed.contains(theirs["id"].as_str().unwrap()));
    assert!(!theirs_listed.contains(created["id"].as_str().unwrap()));
}

#[tokio::test]
async fn endpoint_bodies_are_parsed_strictly() {
    let app = spawn_app().await;
    let long = format!("https://example.test/{}", "a".repeat(2048));
    let cases: Vec<(String, Vec<&str>)> = vec![
        (r#"{}"#.into(), vec!["url"]),
        (r#"{"url": null}"#.into(), vec!["url"]),
        (r#"{"url": "ftp://example.test/"}"#.into(), vec!["url"]),
        (r#"{"url": "example.test/hooks"}"#.into(), vec!["url"]),
        (r#"{"url": 42}"#.into(), vec!["url"]),
        (json!({ "url": long }).to_string(), vec!["url"]),
        (
            r#"{"url": "https://example.test/", "event_types": []}"#.into(),
            vec!["event_types"],
        ),
        (
            r#"{"url": "https://example.test/", "event_types": "charge.failed"}"#.into(),
            vec!["event_types"],
        ),
        (
            r#"{"url": "https://example.test/", "event_types": ["charge.failed", "charge.refunded"]}"#
                .into(),
            vec!["event_types[1]"],
        ),
        (
            r#"{"url": "https://example.test/", "enabled": false}"#.into(),
            vec!["enabled"],
        ),
        (
            r#"{"url": "https://example.test/", "secret": "whsec_mine"}"#.into(),
            vec!["secret"],
        ),
        (r#"["https://example.test/"]"#.into(), vec![""]),
    ];
    for (body, fields) in cases {
        let key = Uuid::new_v4().to_string();
        let (status, _, answer) = post_endpoint(&app.address, &app.api_key, &key, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let problem: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], "invalid_request");
        let named: Vec<&str> = problem["errors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["field"].as_str().unwrap())
            .collect();
        assert_eq!(named, fields, "{body}: {problem}");
    }
    // A member twice is refused, not "last one wins".
    let (status, _, _) = post_endpoint(
        &app.address,
        &app.api_key,
        "twice",
        r#"{"url": "https://a.test/", "url": "https://b.test/"}"#,
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 0);
}

/// An endpoint's URL is stored as sent: one the URL parser would have to
/// rewrite is refused, 400 naming `url`, and nothing is stored. Before,
/// each of these was 201 and stored repaired: the CR LF and the header
/// after it as `xX-Injected:%201`, NUL as `%00`, `http:///x` as the host
/// `x`, the user name dropped or kept, the fragment kept though never sent.
#[tokio::test]
async fn a_url_the_parser_would_repair_is_refused_naming_url() {
    let app = spawn_app().await;
    for url in [
        "http://127.0.0.1:18100/x\r\nX-Injected: 1",
        "http://127.0.0.1:18100/x\nX-Injected: 1",
        "http://127.0.0.1:18100/x\u{0}",
        "http://127.0.0.1:18100/x\u{1}y",
        "http://127.0.0.1:18100/\tx",
        "http://127.0.0.1:18100/x\u{7f}",
        "http:///x",
        "https:///",
        "http://user:secret@127.0.0.1:18100/x",
        "http://@127.0.0.1:18100/x",
        "http://127.0.0.1:18100/x#fragment",
        "http://127.0.0.1:18100/a/../x",
        "http://127.0.0.1:18100\\x",
        "http://127.0.0.1:18100/a b",
        " http://127.0.0.1:18100/x",
        "http://0x7f000001:18100/x",
        "http://b\u{fc}cher.example/x",
    ] {
        let body = json!({ "url": url }).to_string();
        let (status, _, answer) = post_endpoint(
            &app.address,
            &app.api_key,
            &Uuid::new_v4().to_string(),
            &body,
        )
        .await;
        assert_eq!(status, 400, "{url:?}: {answer}");
        let problem: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(problem["code"], "invalid_request", "{url:?}: {problem}");
        assert_eq!(
            problem["errors"],
            json!([{"field": "url", "message": problem["errors"][0]["message"]}]),
            "{url:?}"
        );
    }
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 0);

    // The documented normalisation, and nothing else: what was sent, with
    // the scheme and host in lower case, no default port, a path of `/`.
    for (sent, stored) in [
        (
            "HTTP://127.0.0.1:9/Hooks?A=B",
            "http://127.0.0.1:9/Hooks?A=B",
        ),
        ("https://API.Example.COM:443", "https://api.example.com/"),
        (
            "http://127.0.0.1:9/x%0D%0AX-Injected:%201",
            "http://127.0.0.1:9/x%0D%0AX-Injected:%201",
        ),
    ] {
        let endpoint = create_endpoint(&app.address, &app.api_key, sent, None).await;
        assert_eq!(endpoint["url"], stored, "{sent:?}");
        let id = Uuid::parse_str(&endpoint["id"].as_str().unwrap()[3..]).unwrap();
        let row: String = app
            .sql()
            .await
            .query_one("SELECT url FROM webhook_endpoints WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(row, stored);
    }
}

/// A merchant has at most `webhooks.max_endpoints_per_merchant` live
/// endpoints (16 by default), also when it creates them all at once: the
/// 17th is 400 `invalid_request` saying why. A replay of an earlier
/// creation still answers; deleting an endpoint frees its place (rotating a
/// secret by create-then-delete works); other merchants are not affected.
/// Before, a merchant could create thousands.
#[tokio::test]
async fn the_17th_live_endpoint_is_refused_and_a_deleted_one_frees_its_place() {
    let app = spawn_app().await;
    let body = |n: usize| json!({ "url": format!("http://127.0.0.1:9/hooks/{n}") }).to_string();
    // 40 creations at once, each with its own key: 16 get a place.
    let answers = futures_util::future::join_all((0..40).map(|n| {
        let (address, key, body) = (&app.address, &app.api_key, body(n));
        async move { post_endpoint(address, key, &format!("cap-{n}"), &body).await }
    }))
    .await;
    let created: Vec<usize> = (0..40).filter(|&n| answers[n].0 == 201).collect();
    assert_eq!(created.len(), 16, "{answers:?}");
    for (status, _, answer) in answers.iter().filter(|a| a.0 != 201) {
        assert_eq!(*status, 400, "{answer}");
        let problem: Value = serde_json::from_str(answer).unwrap();
        assert_eq!(problem["code"], "invalid_request");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains("16 webhook endpoints")
                && detail.contains("webhooks.max_endpoints_per_merchant")
                && detail.contains("delete one"),
            "{detail}"
        );
    }
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_endpoints WHERE deleted_at IS NULL")
            .await,
        16
    );
    // A replay of a creation that got a place: the first answer again.
    let first = created[0];
    let (status, replayed, again) = post_endpoint(
        &app.address,
        &app.api_key,
        &format!("cap-{first}"),
        &body(first),
    )
    .await;
    assert_eq!((status, replayed.as_deref()), (201, Some("true")));
    assert_eq!(again, answers[first].2);

    // Rotation: delete one, and the next creation gets its place.
    let (status, _, refused) = post_endpoint(&app.address, &app.api_key, "next", &body(99)).await;
    assert_eq!(status, 400, "{refused}");
    let gone: Value = serde_json::from_str(&answers[first].2).unwrap();
    let (status, _) =
        delete_endpoint(&app.address, &app.api_key, gone["id"].as_str().unwrap()).await;
    assert_eq!(status, 200);
    let (status, _, created_now) =
        post_endpoint(&app.address, &app.api_key, "next", &body(99)).await;
    assert_eq!(status, 201, "{created_now}");
    let (status, _, _) = post_endpoint(&app.address, &app.api_key, "after", &body(100)).await;
    assert_eq!(status, 400);

    // Another merchant has its own 16.
    let other = app.create_merchant("Other").await;
    create_endpoint(&app.address, &other, NOWHERE, None).await;
}

/// Replaying the creation of an endpoint that was deleted no longer hands
/// out its signing secret, nor says it is live: 409
/// `webhook_endpoint_deleted` naming it. Before, it answered 201 `"enabled":
/// true` with the secret, for as long as the key is kept (forever).
#[tokio::test]
async fn a_deleted_endpoints_creation_replayed_is_409_without_its_secret() {
    let app = spawn_app().await;
    let body = json!({ "url": NOWHERE }).to_string();
    let (status, _, first) = post_endpoint(&app.address, &app.api_key, "gone", &body).await;
    assert_eq!(status, 201, "{first}");
    let created: Value = serde_json::from_str(&first).unwrap();
    let secret = created["secret"].as_str().unwrap();
    let (status, _) =
        delete_endpoint(&app.address, &app.api_key, created["id"].as_str().unwrap()).await;
    assert_eq!(status, 200);

    let replay = app
        .http
        .post(format!("{}/v1/webhook_endpoints", app.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", "gone")
        .header("Content-Type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 409);
    assert_eq!(replay.headers()["content-type"], "application/problem+json");
    assert!(replay.headers().get("idempotent-replayed").is_none());
    let text = replay.text().await.unwrap();
    assert!(!text.contains(&secret[6..]), "{text}");
    let problem: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(problem["code"], "webhook_endpoint_deleted");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains(created["id"].as_str().unwrap()),
        "{problem}"
    );
    // Another body with the key is still a reused key.
    let (status, _, reused) = post_endpoint(
        &app.address,
        &app.api_key,
        "gone",
        &json!({ "url": "http://127.0.0.1:9/other" }).to_string(),
    )
    .await;
    assert_eq!(status, 422, "{reused}");
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoints").await, 1);
}
