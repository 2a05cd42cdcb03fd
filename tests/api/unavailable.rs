//! PostgreSQL unreachable: fail closed, quickly, with 503 + Retry-After; never
//! treat a key as new without asking the database, never call the processor.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::helpers::{admin_url, charge_body, spawn_app_with};

/// A TCP forwarder to PostgreSQL that a test can cut: closing it drops the
/// listener and every forwarded connection, as a network partition would.
struct Proxy {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

async fn start_proxy(listen: SocketAddr, target: SocketAddr) -> (Proxy, u16) {
    let listener = TcpListener::bind(listen).await.expect("bind proxy");
    let port = listener.local_addr().unwrap().port();
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                _ = stopped.changed() => break,
                accepted = listener.accept() => {
                    let Ok((mut inbound, _)) = accepted else { continue };
                    connections.spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                }
            }
        }
        connections.abort_all();
    });
    (Proxy { stop, task }, port)
}

impl Proxy {
    async fn cut(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

fn postgres_address() -> SocketAddr {
    let config: tokio_postgres::Config = admin_url().parse().unwrap();
    let host = match &config.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(host) => host.clone(),
        #[allow(unreachable_patterns)]
        _ => panic!("this test needs PostgreSQL over TCP"),
    };
    let host = if host == "localhost" {
        "127.0.0.1".to_owned()
    } else {
        host
    };
    format!(
        "{host}:{}",
        config.get_ports().first().copied().unwrap_or(5432)
    )
    .parse()
    .unwrap()
}

/// `url` with its host and port replaced by 127.0.0.1:`port`.
fn via_port(url: &str, port: u16) -> String {
    let scheme_end = url.find("://").unwrap() + 3;
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!(
        "{}{user}127.0.0.1:{port}{}",
        &url[..scheme_end],
        &rest[authority_end..]
    )
}

#[tokio::test]
async fn an_unreachable_database_gives_503_quickly_and_charges_nothing() {
    let target = postgres_address();
    let (proxy, port) = start_proxy("127.0.0.1:0".parse().unwrap(), target).await;
    let app = spawn_app_with(|s| {
        s.database.url = via_port(&s.database.url, port);
        s.database.connect_timeout_ms = 500;
    })
    .await;
    let before = app.post_charge("before", &charge_body(100)).await;
    assert_eq!(before.status, 201, "{}", before.body);

    proxy.cut().await;
    for (key, amount) in [("during", 200), ("before", 100)] {
        let started = Instant::now();
        let reply = app.post_charge(key, &charge_body(amount)).await;
        let elapsed = started.elapsed();
        reply.assert_problem(503, "service_unavailable");
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert!(elapsed < Duration::from_secs(3), "took {elapsed:?}");
    }
    assert_eq!(app.get("/readyz").await.status, 503);
    assert_eq!(app.processor.calls(), 1, "nothing reached the processor");

    // The database comes back: the service recovers by itself.
    let (proxy, _) = start_proxy(format!("127.0.0.1:{port}").parse().unwrap(), target).await;
    let after = app.post_charge("during", &charge_body(200)).await;
    assert_eq!(after.status, 201, "{}", after.body);
    assert_eq!(
        after.header("idempotent-replayed"),
        None,
        "the 503 stored nothing"
    );
    let replay = app.post_charge("before", &charge_body(100)).await;
    assert_eq!(replay.body, before.body);
    assert_eq!(app.charge_rows().await, 2);
    proxy.cut().await;
}
