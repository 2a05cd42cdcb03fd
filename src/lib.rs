//! chargeonce: payment charges created exactly once per logical request.
//! See ARCHITECTURE.md for the map.

pub mod backoff;
pub mod cli;
pub mod clock;
pub mod config;
pub mod crash;
pub mod db;
pub mod domain;
pub mod error;
pub mod http;
pub mod metrics;
pub mod processor;
pub mod service;
pub mod startup;
pub mod telemetry;
pub mod webhooks;
pub mod workers;

// README's Rust examples (the client) are compiled as doctests, so they
// cannot rot; chargeonce-client is a dev-dependency.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
