//! The dev-only test kit of chargeonce, shared by the API tests, the load
//! benchmark and the chaos run:
//!
//! - [`db`]: test databases cloned from a migrated template (migrated once
//!   per run, `CREATE DATABASE … TEMPLATE`) or empty, on the test server or
//!   one a tool is given, dropped on `Drop`, leftovers of crashed runs swept
//!   on first use;
//! - [`chargeonce`]: the one way to run the `chargeonce` binary (clean
//!   environment; a command, `serve` or `psp-sim`);
//! - [`process`]: real child processes that announce their port in their log
//!   (kept in memory, or written to a file for long runs) and are killed on
//!   `Drop`, and their memory as /proc tells it;
//! - [`proxy`]: a TCP proxy that can stall or cut connections, and lose
//!   answers after the request went through;
//! - [`cluster`]: a private PostgreSQL primary with a synchronous
//!   streaming-replication standby, to crash the one and promote the other;
//!   or a single private server ([`Server`]) to crash and start again;
//! - [`citus`]: private servers as a Citus coordinator and workers.
//!
//! Nothing here is part of the service; it is never built into it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod chargeonce;
pub mod citus;
pub mod cluster;
pub mod db;
pub mod pgbouncer;
pub mod process;
pub mod proxy;

pub use chargeonce::{Chargeonce, ANNOUNCING_LOG};
pub use citus::Citus;
pub use cluster::{free_port, Cluster, Node, Server};
pub use db::{admin_url, on_citus, redact, server_address, with_database, TestDatabase};
pub use nix::sys::signal::Signal;
pub use pgbouncer::PgBouncer;
pub use process::{memory_bytes, SpawnOptions, Spawned};
pub use proxy::{Proxy, ProxyMode};
