//! Metrics nobody scrapes must not cost memory without bound. The recorder
//! keeps each histogram sample until it is folded into its buckets; before
//! the upkeep thread (`chargeonce::metrics::UPKEEP_EVERY`) only a scrape of
//! `/metrics` did that, and the sustained run (RELIABILITY.md) grew by
//! 7 MB a minute with nobody scraping.
//!
//! A binary of its own: it reads this process's peak resident memory,
//! which other tests in the same process would disturb.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use chargeonce::metrics;

/// VmHWM, the most resident memory this process has had, in bytes.
fn peak_rss() -> u64 {
    chargeonce_testkit::memory_bytes("self", "VmHWM:").expect("VmHWM in /proc/self/status")
}

#[test]
fn unscraped_histograms_stay_bounded() {
    const ROUNDS: u64 = 10;
    const PER_ROUND: u64 = 1_500_000;
    // Installs the recorder (and its upkeep), as the service does at start.
    let _handle = metrics::handle();
    // The request path's histogram, as the service records it; the handle
    // is looked up once so the loop costs only the recording.
    let histogram = ::metrics::histogram!(
        metrics::HTTP_DURATION,
        "route" => "/v1/charges",
        "method" => "POST",
        "status" => "201"
    );
    let before = peak_rss();
    for _ in 0..ROUNDS {
        for i in 0..PER_ROUND {
            histogram.record((i % 100) as f64 / 1000.0);
        }
        // Time for the upkeep to fold this round's samples away.
        std::thread::sleep(metrics::UPKEEP_EVERY + Duration::from_millis(500));
    }
    let grew = peak_rss().saturating_sub(before);
    // Every sample kept costs at least 8 bytes: 120 MB or more (without
    // the upkeep the peak grew by 247 MB). Folded after each round, about
    // one round's worth is held at once (25 MB measured).
    let all_kept = ROUNDS * PER_ROUND * 8;
    println!(
        "peak RSS grew by {:.1} MB over {} samples ({:.1} MB if all were kept)",
        grew as f64 / 1e6,
        ROUNDS * PER_ROUND,
        all_kept as f64 / 1e6
    );
    assert!(
        grew < all_kept / 2,
        "peak RSS grew by {grew} bytes: the samples were kept"
    );
}
