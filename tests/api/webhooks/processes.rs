//! The real binary: killed mid-dispatch, two instances at once, what it
//! logs, a record the database refuses, a graceful stop.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use chargeonce_testkit::Signal;

use super::{create_charges, dispatcher_env, event_ids, wait_all_delivered};
use crate::processes::{start_service, Database};
use crate::webhook_receiver::{create_endpoint, duplicates, Answer, Receiver};

#[tokio::test]
async fn a_dispatcher_killed_mid_delivery_loses_no_event_and_resends_with_the_same_id() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    // A slow receiver: the kill finds deliveries in flight.
    receiver.delay(Duration::from_millis(1500));
    let env = dispatcher_env(3000);
    let mut first = start_service(&db.url, &env).await;
    create_endpoint(&first.url, &secret, &receiver.url, None).await;
    create_charges(&[&first], &secret, 20).await;

    receiver.wait_for_in_flight(Duration::from_secs(10)).await;
    first.signal(Signal::SIGKILL);
    first
        .wait_exit(Duration::from_secs(5))
        .await
        .expect("killed");
    let in_flight_at_kill: HashSet<String> =
        receiver.received().iter().map(|r| r.id.clone()).collect();

    // Another instance takes over once the killed one's leases run out
    // (timeout + 5 s).
    let _second = start_service(&db.url, &env).await;
    wait_all_delivered(&db, &receiver, 20, Duration::from_secs(40)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let arrivals = receiver.arrivals();
    let events = event_ids(&db).await;
    assert_eq!(events.len(), 20);
    let missing: Vec<_> = events
        .iter()
        .filter(|id| !arrivals.contains_key(*id))
        .collect();
    assert!(missing.is_empty(), "lost: {missing:?}");
    // What was in flight when the process died was sent again, with the
    // same webhook-id and the same body: a receiver deduplicates by the id.
    let twice = duplicates(&arrivals);
    assert!(
        !in_flight_at_kill.is_empty() && in_flight_at_kill.iter().all(|id| twice.contains(id)),
        "in flight at the kill: {in_flight_at_kill:?}; arrived twice: {twice:?}"
    );
    let received = receiver.received();
    for id in &twice {
        let bodies: HashSet<&Vec<u8>> = received
            .iter()
            .filter(|r| &r.id == id)
            .map(|r| &r.body)
            .collect();
        assert_eq!(bodies.len(), 1, "{id} came with different bodies");
    }
    assert!(receiver.overlaps().is_empty(), "{:?}", receiver.overlaps());
    let unique: HashSet<&String> = received.iter().map(|r| &r.id).collect();
    println!(
        "killed mid-dispatch: {} events, {} requests, {} ids deduplicated, {} sent twice \
         (all of them in flight at the kill)",
        events.len(),
        received.len(),
        unique.len(),
        twice.len()
    );
}

/// The local ports of `pid`'s TCP sockets connected to `remote_port`
/// (Linux: its socket inodes in /proc/<pid>/fd, their ports in
/// /proc/net/tcp). Only sockets to one remote port: the kernel may give two
/// processes the same local port for connections to different peers (A's
/// database connection and B's webhook connection), which would count a
/// request for both.
fn local_ports(pid: u32, remote_port: u16) -> HashSet<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .filter_map(|link| {
                    let link = link.to_string_lossy().into_owned();
                    Some(link.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut ports = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = |field: &str| {
                field
                    .rsplit(':')
                    .next()
                    .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            };
            if fields.len() > 9
                && inodes.contains(fields[9])
                && port(fields[2]) == Some(remote_port)
            {
                if let Some(local) = port(fields[1]) {
                    ports.insert(local);
                }
            }
        }
    }
    ports
}

#[tokio::test]
async fn two_instances_deliver_500_events_none_lost_none_sent_twice_at_once() {
    const EVENTS: usize = 500;
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    // Long enough for requests to meet, if the leases let them.
    receiver.delay(Duration::from_millis(5));
    let mut env = dispatcher_env(2000);
    env.push(("CHARGEONCE__WEBHOOKS__BATCH_SIZE", "50".to_owned()));
    env.push(("RUST_LOG", "info,chargeonce=debug".to_owned()));
    let a = start_service(&db.url, &env).await;
    let b = start_service(&db.url, &env).await;
    let endpoint = create_endpoint(&a.url, &secret, &receiver.url, None).await;
    let endpoint_secret = endpoint["secret"].as_str().unwrap().to_owned();

    let started = Instant::now();
    create_charges(&[&a, &b], &secret, EVENTS).await;
    wait_all_delivered(&db, &receiver, EVENTS, Duration::from_secs(60)).await;
    let took = started.elapsed();
    // Time for a late duplicate to show.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let arrivals = receiver.arrivals();
    let events = event_ids(&db).await;
    let missing = events
        .iter()
        .filter(|id| !arrivals.contains_key(*id))
        .count();
    let twice = duplicates(&arrivals);
    let overlaps = receiver.overlaps();
    let received = receiver.received();
    let (ports_a, ports_b) = (
        local_ports(a.pid(), receiver.port),
        local_ports(b.pid(), receiver.port),
    );
    let by_a = received
        .iter()
        .filter(|r| ports_a.contains(&r.peer.port()))
        .count();
    let by_b = received
        .iter()
        .filter(|r| ports_b.contains(&r.peer.port()))
        .count();
    println!(
        "two instances: {} events, {} requests in {took:?} (charges included); sent by A {by_a}, \
         by B {by_b}, unattributed {}; lost {missing}, duplicates {}, overlapping {}",
        events.len(),
        received.len(),
        received.len().saturating_sub(by_a + by_b),
        received.len() - arrivals.len(),
        overlaps.len()
    );
    assert_eq!(events.len(), EVENTS);
    assert_eq!(missing, 0);
    assert!(
        overlaps.is_empty(),
        "sent twice at the same time: {overlaps:?}"
    );
    // No crash, no lost lease: not even an at-least-once duplicate.
    assert!(twice.is_empty(), "sent twice: {twice:?}");
    assert!(
        by_a > 0 && by_b > 0,
        "both instances delivered (A {by_a}, B {by_b})"
    );
    let attempts = db
        .client()
        .await
        .query_one(
            "SELECT count(*), max(attempts) FROM webhook_deliveries",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(attempts.get::<_, i64>(0), EVENTS as i64);
    assert_eq!(attempts.get::<_, Option<i32>>(1), Some(1));

    // The signing secret appears in no log line of either instance.
    let key = &endpoint_secret["whsec_".len()..];
    for (name, process) in [("A", &a), ("B", &b)] {
        let log = process.log();
        assert!(!log.is_empty());
        let leaks: Vec<&String> = log.iter().filter(|line| line.contains(key)).collect();
        assert!(
            leaks.is_empty(),
            "instance {name} logged the secret: {leaks:?}"
        );
    }
}

/// What the dispatcher logs at info: each failed attempt, numbered from 1
/// as the delivery's attempt log numbers it; and deliveries given up for
/// deleted endpoints only when there were some: rounds that give nothing
/// up say nothing of it.
#[tokio::test]
async fn the_dispatcher_logs_each_failed_attempt_by_number_and_nothing_idle() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    receiver.script([Answer::Status(500), Answer::Status(500)]);
    let mut env = dispatcher_env(3000);
    env.push(("RUST_LOG", "info".to_owned()));
    let service = start_service(&db.url, &env).await;
    create_endpoint(&service.url, &secret, &receiver.url, None).await;
    create_charges(&[&service], &secret, 1).await;
    wait_all_delivered(&db, &receiver, 1, Duration::from_secs(10)).await;
    // Many more rounds (one every 20 ms) with nothing to give up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = service.log();
    let retried: Vec<_> = log
        .iter()
        .filter(|line| line.contains("webhook attempt failed; will retry"))
        .collect();
    assert_eq!(retried.len(), 2, "{log:#?}");
    assert!(retried[0].contains("attempt=1"), "{}", retried[0]);
    assert!(retried[1].contains("attempt=2"), "{}", retried[1]);
    let spoken: Vec<_> = log
        .iter()
        .filter(|line| line.contains("deleted webhook endpoints"))
        .collect();
    assert!(spoken.is_empty(), "{spoken:#?}");
}

/// An attempt whose record the database refuses for good (not a database
/// that is away) is not retried: the dispatcher says so at once and leaves
/// the delivery to come due again when its lease runs out.
#[tokio::test]
async fn an_attempt_the_database_refuses_to_record_is_given_up_at_once() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    db.client()
        .await
        // A check no attempt passes: refused for good, on every shard.
        .batch_execute(
            "ALTER TABLE webhook_attempts ADD CONSTRAINT refused_by_the_test \
               CHECK (false) NOT VALID",
        )
        .await
        .unwrap();
    let receiver = Receiver::start().await;
    let service = start_service(&db.url, &dispatcher_env(3000)).await;
    create_endpoint(&service.url, &secret, &receiver.url, None).await;
    create_charges(&[&service], &secret, 1).await;
    receiver
        .wait_until("the attempt", Duration::from_secs(10), |r| !r.is_empty())
        .await;
    // At once: well within the delivery's lease (8 s).
    service
        .wait_for_line(Duration::from_secs(2), |line| {
            line.contains("cannot record a webhook attempt; the delivery comes due")
        })
        .await;
}

/// A graceful stop (SIGTERM) waits for the attempts in flight and records
/// them: a delivery the receiver was answering is delivered, not left to
/// come due again and be sent twice.
#[tokio::test]
async fn a_graceful_stop_records_the_attempts_in_flight() {
    let db = Database::migrated().await;
    let secret = db.create_merchant().await;
    let receiver = Receiver::start().await;
    receiver.delay(Duration::from_millis(1000));
    let mut service = start_service(&db.url, &dispatcher_env(3000)).await;
    create_endpoint(&service.url, &secret, &receiver.url, None).await;
    create_charges(&[&service], &secret, 1).await;
    receiver.wait_for_in_flight(Duration::from_secs(10)).await;
    service.signal(Signal::SIGTERM);
    service
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("stopped");
    let row = db
        .client()
        .await
        .query_one("SELECT status, attempts FROM webhook_deliveries", &[])
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i32>(1)),
        ("delivered".to_owned(), 1)
    );
}
