//! The kit's primary/standby cluster does what failover tests rely on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chargeonce_testkit::Cluster;

#[tokio::test]
async fn an_acknowledged_commit_survives_a_crash_of_the_primary_on_the_promoted_standby() {
    let cluster = Cluster::start().await;
    let (primary, standby) = (cluster.primary(), cluster.standby());
    assert_ne!(primary.port(), standby.port());
    assert_eq!(primary.in_recovery().await, Some(false));
    assert_eq!(standby.in_recovery().await, Some(true));

    primary.create_database("kit").await;
    let client = primary.connect("kit").await;
    let setting: String = client
        .query_one("SHOW synchronous_standby_names", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(setting, "standby");
    client
        .batch_execute("CREATE TABLE t (x int); INSERT INTO t SELECT generate_series(1, 100)")
        .await
        .unwrap();

    // The standby refuses writes until it is promoted.
    cluster.wait_for_replay().await;
    let error = standby
        .connect("kit")
        .await
        .batch_execute("INSERT INTO t VALUES (0)")
        .await
        .unwrap_err();
    assert_eq!(
        error.code(),
        Some(&tokio_postgres::error::SqlState::READ_ONLY_SQL_TRANSACTION)
    );

    primary.stop_immediate().await;
    assert_eq!(primary.in_recovery().await, None, "the primary is down");
    standby.promote().await;
    assert_eq!(standby.in_recovery().await, Some(false));

    let promoted = standby.connect("kit").await;
    let rows: i64 = promoted
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        rows, 100,
        "every acknowledged row is on the promoted standby"
    );
    // It commits without waiting for a standby of its own.
    tokio::time::timeout(
        Duration::from_secs(5),
        promoted.batch_execute("INSERT INTO t VALUES (101)"),
    )
    .await
    .expect("a commit on the promoted standby does not wait")
    .unwrap();

    let (root, port) = (cluster.root().to_owned(), standby.port());
    drop(cluster);
    assert!(!root.exists(), "the folder is removed");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the servers are stopped"
    );
}
