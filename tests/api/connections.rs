//! What a client meets at the connection level: request heads the HTTP layer
//! rejects by itself get its own bare answers, and slow or too many clients
//! are bounded in time and number.

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::processes::{start_service, Database, Process};

/// Sends `request` on a fresh connection and reads until the server closes
/// it (or 5 s pass); returns status, head and body.
async fn exchange(process: &Process, request: &[u8]) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", process.port))
        .await
        .unwrap();
    stream.write_all(request).await.unwrap();
    read_answer(&mut stream).await
}

async fn read_answer(stream: &mut TcpStream) -> (u16, String, String) {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let _ = read;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_owned())
}

/// Asserts a problem document with this status and code; returns it.
fn problem(answer: &(u16, String, String), status: u16, code: &str) -> Value {
    let (got, head, body) = answer;
    assert_eq!(*got, status, "{head}\n{body}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    let problem: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{body}"));
    assert_eq!(problem["code"], code, "{problem}");
    assert_eq!(problem["status"], status);
    problem
}

/// Asserts actix-http's own answer to a request it rejects before the App
/// sees it: this status, no body, no content type, connection closed.
fn bare(answer: &(u16, String, String), status: u16) {
    let (got, head, body) = answer;
    assert_eq!(*got, status, "{head}\n{body}");
    assert!(head.contains("content-length: 0"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(!head.contains("content-type"), "{head}");
    assert!(body.is_empty(), "{body}");
}

/// A request head that actix-http cannot take never reaches the App:
/// actix-http answers it itself, as its documentation says, with a bare
/// status and a closed connection: 400 for a head it cannot parse, 431 for
/// one too large, 408 for one not complete within `http.header_timeout_ms`.
/// None of them is an error in the log, and none charges anything.
#[tokio::test]
async fn requests_the_http_layer_rejects_get_its_own_answers() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let service = start_service(
        &db.url,
        &[("CHARGEONCE__HTTP__HEADER_TIMEOUT_MS", "1000".to_owned())],
    )
    .await;
    let post = |headers: &str, body: &str| {
        format!(
            "POST /v1/charges HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n\
             Content-Type: application/json\r\n{headers}\r\n{body}"
        )
        .into_bytes()
    };

    let unparsable = [
        post("Idempotency-Key: ab\x01c\r\nContent-Length: 2\r\n", "{}"),
        post(
            "Idempotency-Key: k\r\nX-Note: a\x07b\r\nContent-Length: 2\r\n",
            "{}",
        ),
        post(
            "Idempotency-Key: k\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n",
            "{}",
        ),
        b"GET / HTTQ/1.1\r\nHost: x\r\n\r\n".to_vec(),
    ];
    for request in unparsable {
        bare(&exchange(&service, &request).await, 400);
    }

    let many: String = (0..200).map(|i| format!("X-Header-{i}: v\r\n")).collect();
    let large = exchange(
        &service,
        format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{many}\r\n").as_bytes(),
    )
    .await;
    bare(&large, 431);

    // A head that never completes: 408 after http.header_timeout_ms (which
    // actix-http measures to about half a second).
    let started = Instant::now();
    let slow = exchange(&service, b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
    bare(&slow, 408);
    assert!(started.elapsed() < Duration::from_secs(3));

    // A chunked body whose framing breaks: actix-http ends the connection
    // without an answer when the broken chunk comes with the head; had the
    // handler been reading it, the App answers why.
    let chunked = exchange(
        &service,
        &post(
            "Idempotency-Key: k2\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n",
            "zz\r\n{}\r\n0\r\n\r\n",
        ),
    )
    .await;
    if chunked.0 != 0 {
        let detail = problem(&chunked, 400, "invalid_request")["detail"].to_string();
        assert!(detail.contains("chunked"), "{detail}");
    }

    // Client mistakes are not server errors in the log.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let errors: Vec<String> = service
        .log()
        .into_iter()
        .filter(|l| l.contains("ERROR"))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
    assert_eq!(
        db.client()
            .await
            .query_one("SELECT count(*) FROM charges", &[])
            .await
            .unwrap()
            .get::<_, i64>(0),
        0
    );
}

/// Open descriptors and resident memory of a process.
fn descriptors_and_rss(pid: u32) -> (usize, u64) {
    let descriptors = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap();
    (descriptors, rss_kb * 1024)
}

/// Slow clients cannot hold the service: a body sent a byte a second is cut
/// at `http.body_timeout_ms` with 408 and charges nothing; connections over
/// `http.max_connections` get 503 at once instead of waiting in the backlog;
/// descriptors stay bounded; afterwards the service works and its memory is
/// back down.
#[tokio::test]
async fn slow_clients_are_bounded_in_time_and_number() {
    const CAP_PER_WORKER: usize = 50;
    const SLOW_CLIENTS: usize = 300;
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let service = start_service(
        &db.url,
        &[
            ("CHARGEONCE__SERVER__WORKERS", "2".to_owned()),
            (
                "CHARGEONCE__HTTP__MAX_CONNECTIONS",
                CAP_PER_WORKER.to_string(),
            ),
            ("CHARGEONCE__HTTP__BODY_TIMEOUT_MS", "2000".to_owned()),
        ],
    )
    .await;
    let (idle_descriptors, _) = descriptors_and_rss(service.pid());

    // Each slow client sends a valid head, then its body a byte at a time.
    let head = format!(
        "POST /v1/charges HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {secret}\r\n\
         Idempotency-Key: slow\r\nContent-Type: application/json\r\nContent-Length: 31\r\n\r\n"
    );
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..SLOW_CLIENTS {
        let head = head.clone();
        let port = service.port;
        clients.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let opened = Instant::now();
            let _ = stream.write_all(head.as_bytes()).await;
            let mut answer = Vec::new();
            let body = br#"{"amount":1000,"currency":"USD"}"#;
            for byte in body.iter().take(30) {
                let mut scratch = [0u8; 1024];
                tokio::select! {
                    read = stream.read(&mut scratch) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&scratch[..n]),
                    },
                    () = tokio::time::sleep(Duration::from_millis(500)) => {
                        if stream.write_all(&[*byte]).await.is_err() { break; }
                    }
                }
            }
            let _ =
                tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut answer)).await;
            let text = String::from_utf8_lossy(&answer).into_owned();
            let status: u16 = text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
            (status, opened.elapsed(), text)
        }));
    }

    // While they hold their slots: bounded descriptors, and a new client is
    // answered at once (200 if a slot is free, else 503 problem).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (busy_descriptors, _) = descriptors_and_rss(service.pid());
    assert!(
        busy_descriptors <= idle_descriptors + 2 * CAP_PER_WORKER + 50,
        "{busy_descriptors} descriptors open (idle: {idle_descriptors})"
    );
    let asked = Instant::now();
    let health = exchange(
        &service,
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    assert!(health.0 == 200 || health.0 == 503, "{health:?}");

    let mut held = 0;
    let mut refused = 0;
    for client in clients {
        let (status, took, text) = client.await.unwrap();
        match status {
            408 => {
                held += 1;
                assert!(text.contains("request_timeout"), "{text}");
                assert!(took < Duration::from_secs(4), "cut after {took:?}");
            }
            503 => {
                refused += 1;
                assert!(text.contains("service_unavailable"), "{text}");
                assert!(took < Duration::from_secs(1), "refused after {took:?}");
            }
            other => panic!("{other}: {text}"),
        }
    }
    assert!(held > 0 && held <= 2 * CAP_PER_WORKER, "{held} held");
    assert_eq!(held + refused, SLOW_CLIENTS);
    assert!(started.elapsed() < Duration::from_secs(10));

    // Nothing was charged by a body that never finished, and the service
    // is back to normal.
    let client = db.client().await;
    let charges: i64 = client
        .query_one("SELECT count(*) FROM charges", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(charges, 0);
    let charged = reqwest::Client::new()
        .post(format!("{}/v1/charges", service.url))
        .bearer_auth(&secret)
        .header("Idempotency-Key", "after")
        .header("Content-Type", "application/json")
        .body(r#"{"amount":1000,"currency":"USD"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(charged.status(), 201);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (after_descriptors, rss) = descriptors_and_rss(service.pid());
    assert!(
        after_descriptors <= idle_descriptors + 20,
        "{after_descriptors} descriptors after, {busy_descriptors} busy, {idle_descriptors} idle"
    );
    assert!(rss < 64 * 1024 * 1024, "RSS {} MB", rss / 1024 / 1024);
}

/// `database.prepared_statements = false` (for PgBouncer in transaction
/// pooling mode) leaves no named statement on the server, whichever way a
/// statement is run; with it on, statements are prepared once per
/// connection and reused.
#[tokio::test]
async fn unnamed_statements_leave_nothing_prepared_on_the_server() {
    use chargeonce::db::{Database as Pool, Statement};

    const PREPARED: Statement = Statement {
        sql: "SELECT count(*) AS n FROM pg_prepared_statements",
        params: &[],
    };
    let database = crate::helpers::migrated_database().await;
    for prepared in [false, true] {
        let mut settings = crate::helpers::direct_settings(&database.url).database;
        settings.prepared_statements = prepared;
        let pool = Pool::new(&settings, 1).unwrap();
        let conn = pool.conn().await.unwrap();
        conn.query(&chargeonce::db::APPLIED_MIGRATION, &[])
            .await
            .unwrap();
        chargeonce::db::applied_migration(&conn).await.unwrap();
        chargeonce::db::events::delete_expired(&conn, chrono::Utc::now(), 10)
            .await
            .unwrap();
        let rows = conn.query(&PREPARED, &[]).await.unwrap();
        let count: i64 = rows[0].get("n");
        if prepared {
            assert_eq!(count, 3, "each statement prepared once");
        } else {
            assert_eq!(count, 0, "nothing named on the server");
        }
    }
}

/// A statement PostgreSQL rejects leaves its connection as good as before,
/// so the pool keeps it (no reconnect per client error); a connection the
/// server ended is replaced.
#[tokio::test]
async fn a_rejected_statement_keeps_its_connection_and_a_dead_one_is_replaced() {
    use chargeonce::db::{Database as Pool, Statement};

    const PID: Statement = Statement {
        sql: "SELECT pg_backend_pid() AS pid",
        params: &[],
    };
    const REJECTED: Statement = Statement {
        sql: "SELECT 1 / 0 AS never",
        params: &[],
    };
    const ENDED: Statement = Statement {
        sql: "SELECT pg_terminate_backend(pg_backend_pid()) AS ended",
        params: &[],
    };
    let database = crate::helpers::migrated_database().await;
    let settings = crate::helpers::direct_settings(&database.url).database;
    let pool = Pool::new(&settings, 1).unwrap();
    let pid = |rows: Vec<tokio_postgres::Row>| rows[0].get::<_, i32>("pid");

    let conn = pool.conn().await.unwrap();
    let first = pid(conn.query(&PID, &[]).await.unwrap());
    assert!(conn.query(&REJECTED, &[]).await.is_err());
    drop(conn);
    let conn = pool.conn().await.unwrap();
    assert_eq!(pid(conn.query(&PID, &[]).await.unwrap()), first);

    assert!(conn.query(&ENDED, &[]).await.is_err());
    drop(conn);
    let conn = pool.conn().await.unwrap();
    assert_ne!(pid(conn.query(&PID, &[]).await.unwrap()), first);
}
