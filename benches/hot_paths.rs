//! Micro-benchmarks of the steps every charge request runs in memory: the
//! request fingerprint, parsing and validating the body, rendering the
//! charge as JSON for the answer, and the replay cache (every new charge
//! looks its key up and puts its final answer in). The load benchmark
//! (scripts/bench) says how the whole service compares with PostgreSQL;
//! these say which of our own steps got slower, without a database or a
//! network in the way.
//!
//! `cargo bench --bench hot_paths` measures (criterion compares with the
//! previous run kept in target/criterion); under `cargo test` each function
//! runs once, as a test that it still works.

// A benchmark that cannot build its input may stop there.
#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::hint::black_box;
use std::path::Path;

use chargeonce::config::Settings;
use chargeonce::domain::{
    Charge, ChargeId, Fingerprint, IdempotencyKey, MerchantId, NewCharge, Status,
};
use chargeonce::service::replay_cache::ReplayCache;
use chrono::Utc;
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Value};

/// The load benchmark's body: the smallest valid request.
fn minimal_body() -> Value {
    json!({"amount": 1000, "currency": "USD"})
}

/// A request with every field, metadata included.
fn full_body() -> Value {
    json!({
        "amount": 1999,
        "currency": "EUR",
        "customer": "cus_8f14e45fceea167a",
        "description": "Order 7 of the spring catalogue, two items",
        "metadata": {"order": "7", "cart": "c-51", "channel": "web", "campaign": "spring"}
    })
}

/// A succeeded charge with the full request's values, as the answer
/// renders it.
fn charge() -> Charge {
    let metadata = [
        ("order", "7"),
        ("cart", "c-51"),
        ("channel", "web"),
        ("campaign", "spring"),
    ];
    Charge {
        id: ChargeId::new(),
        merchant_id: MerchantId::new(),
        fingerprint: Fingerprint::of(&full_body()),
        amount: 1999,
        currency: "EUR".to_owned(),
        customer: Some("cus_8f14e45fceea167a".to_owned()),
        description: Some("Order 7 of the spring catalogue, two items".to_owned()),
        metadata: metadata
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect::<BTreeMap<_, _>>(),
        status: Status::Succeeded,
        failure_code: None,
        failure_message: None,
        lease: Default::default(),
        refunds_reserved: 0,
        amount_refunded: 0,
        processor_payment_id: Some("sim_0123456789abcdef01234567".to_owned()),
        created_at: Utc::now(),
    }
}

fn fingerprint(c: &mut Criterion) {
    let (minimal, full) = (minimal_body(), full_body());
    let mut group = c.benchmark_group("Fingerprint::of");
    group.bench_function("minimal body", |b| {
        b.iter(|| Fingerprint::of(black_box(&minimal)))
    });
    group.bench_function("full body", |b| {
        b.iter(|| Fingerprint::of(black_box(&full)))
    });
    group.finish();
}

fn parse(c: &mut Criterion) {
    let (minimal, full) = (minimal_body(), full_body());
    let mut group = c.benchmark_group("NewCharge::parse");
    group.bench_function("minimal body", |b| {
        b.iter(|| NewCharge::parse(black_box(&minimal)))
    });
    group.bench_function("full body", |b| {
        b.iter(|| NewCharge::parse(black_box(&full)))
    });
    group.finish();
}

fn render(c: &mut Criterion) {
    let charge = charge();
    c.bench_function("serde_json::to_string(&Charge)", |b| {
        b.iter(|| serde_json::to_string(black_box(&charge)))
    });
    // Every answer that stored or replayed a key, cached replays included,
    // carries its window's end (Idempotency-Key-Expires).
    let window_end = Utc::now();
    c.bench_function("IMF-fixdate of Idempotency-Key-Expires", |b| {
        b.iter(|| chargeonce::error::http_date(black_box(window_end)))
    });
}

/// The cache as a busy service has it: built from the shipped defaults
/// (32 MiB, the key's retention) and full, so each new answer pushes an
/// old one out.
fn replay_cache(c: &mut Criterion) {
    // No config folder, no variables: the defaults embedded in the binary.
    let defaults = Settings::load_from(Path::new("/nonexistent"), &HashMap::new())
        .expect("the embedded defaults load")
        .idempotency;
    let cache = ReplayCache::new(defaults.replay_cache_bytes, defaults.retention());
    let merchant = MerchantId::new();
    let key = |n: u64| IdempotencyKey::parse(&format!("order-{n}")).expect("a valid key");
    let answer = charge();
    // At most about 25,000 of these answers fit; 40,000 make sure it is
    // full. Each measured insert also formats its key (well under 0.1 µs).
    let mut next = 40_000;
    for n in 0..next {
        cache.remember(merchant, &key(n), &answer);
    }
    let mut group = c.benchmark_group("ReplayCache");
    group.bench_function("remember a new answer in a full cache", |b| {
        b.iter(|| {
            next += 1;
            cache.remember(merchant, &key(next), black_box(&answer))
        })
    });
    let recent = key(next);
    assert!(
        cache.get(merchant, &recent).is_some(),
        "the newest answer is kept"
    );
    group.bench_function("get a kept answer", |b| {
        b.iter(|| cache.get(merchant, black_box(&recent)))
    });
    group.finish();
}

criterion_group!(hot_paths, fingerprint, parse, render, replay_cache);
criterion_main!(hot_paths);
