//! The faults the run injects while it lasts, each counted:
//! - network: a random instance's proxy to PostgreSQL cuts every
//!   connection (and refuses new ones) or stalls them (a partition: no
//!   error, nothing moves) for 0.5–3 s;
//! - crashes: SIGKILL of a random instance every few seconds, started
//!   again (same port) after a short pause.
//!
//! The PostgreSQL restart is in `main` (it owns the server); psp-sim's and
//! the receiver's faults are their own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chargeonce_testkit::ProxyMode;
use rand::Rng;
use tokio::sync::Mutex;

use crate::stack::Instance;

#[derive(Debug, Default)]
pub struct Counts {
    pub cuts: AtomicUsize,
    pub stalls: AtomicUsize,
    pub kills: AtomicUsize,
    pub restarts: AtomicUsize,
    pub failed_starts: AtomicUsize,
}

pub type Instances = Arc<Vec<Mutex<Instance>>>;

fn pause(min_ms: u64, max_ms: u64) -> Duration {
    Duration::from_millis(rand::thread_rng().gen_range(min_ms..=max_ms))
}

/// Cuts and stalls at random until `until`; every proxy forwards again when
/// it returns.
pub async fn network(instances: Instances, counts: Arc<Counts>, until: Instant) {
    while Instant::now() < until {
        tokio::time::sleep(pause(500, 2000)).await;
        let (index, stall) = {
            let mut rng = rand::thread_rng();
            (rng.gen_range(0..instances.len()), rng.gen_bool(0.5))
        };
        // An instance being restarted is left alone: it must reach
        // PostgreSQL to become ready.
        let Ok(instance) = instances[index].try_lock() else {
            continue;
        };
        if instance.process.is_none() {
            continue;
        }
        let mode = if stall {
            counts.stalls.fetch_add(1, Ordering::Relaxed);
            ProxyMode::Stall
        } else {
            counts.cuts.fetch_add(1, Ordering::Relaxed);
            ProxyMode::Cut
        };
        instance.proxy.set_mode(mode);
        drop(instance);
        tokio::time::sleep(pause(500, 3000)).await;
        instances[index].lock().await.proxy.set_mode(ProxyMode::Forward);
    }
}

/// SIGKILL of a random instance every 2–5 s, started again after 0–1 s,
/// until `until`. Returns the first error of a start that failed for good.
pub async fn crashes(
    instances: Instances,
    counts: Arc<Counts>,
    until: Instant,
) -> anyhow::Result<()> {
    while Instant::now() < until {
        tokio::time::sleep(pause(2000, 5000)).await;
        if Instant::now() >= until {
            break;
        }
        let index = rand::thread_rng().gen_range(0..instances.len());
        let mut instance = instances[index].lock().await;
        instance.kill();
        counts.kills.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(pause(0, 1000)).await;
        instance.proxy.set_mode(ProxyMode::Forward);
        let failed = instance.start(20).await?;
        counts.failed_starts.fetch_add(failed, Ordering::Relaxed);
        counts.restarts.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
