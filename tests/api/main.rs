//! End-to-end tests of the API against a real PostgreSQL. One binary: every
//! test has its own database and application, and they run in parallel.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod batching;
mod binary;
mod charges;
mod client;
mod clock;
mod concurrency;
mod connections;
mod demo;
mod events;
mod helpers;
mod lists;
mod lookup;
mod observability;
mod openapi;
mod plans;
mod processes;
mod processor;
mod processor_stub;
mod recovery;
mod refunds;
mod replay_cache;
mod retention;
mod reuse;
mod schema;
mod security;
mod tenancy;
mod unavailable;
mod validation;
mod webhook_receiver;
mod webhooks;
