//! The faults, counted: proxy cuts and stalls, SIGKILLs. Each holds
//! `Counts::quiet` to read; a Citus worker's outage holds it to write, so
//! that what its neighbours see is the outage's doing alone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use chargeonce_testkit::{ProxyMode, Server};
use rand::Rng;
use tokio::sync::Mutex;

use crate::stack::Instance;
use crate::workload::{lock, Shared};

/// Before a worker stops: the other faults' after-effects are over.
const QUIET: Duration = Duration::from_secs(4);

#[derive(Debug, Default)]
pub struct Counts {
    pub cuts: AtomicUsize,
    pub stalls: AtomicUsize,
    pub kills: AtomicUsize,
    pub restarts: AtomicUsize,
    pub failed_starts: AtomicUsize,
    pub quiet: tokio::sync::RwLock<()>,
}

pub type Instances = Arc<Vec<Mutex<Instance>>>;

fn pause(min_ms: u64, max_ms: u64) -> Duration {
    Duration::from_millis(rand::thread_rng().gen_range(min_ms..=max_ms))
}

/// Cuts and stalls at random until `until`, each undone after 0.5–3 s.
pub async fn network(instances: Instances, counts: Arc<Counts>, until: Instant) {
    while Instant::now() < until {
        tokio::time::sleep(pause(500, 2000)).await;
        let _fault = counts.quiet.read().await;
        if Instant::now() >= until {
            break;
        }
        let (index, stall) = (rand::thread_rng().gen_range(0..instances.len()), rand::random());
        // Not one being restarted: it must reach PostgreSQL to be ready.
        let Ok(instance) = instances[index].try_lock() else {
            continue;
        };
        if instance.process.is_none() {
            continue;
        }
        let (mode, count) = match stall {
            true => (ProxyMode::Stall, &counts.stalls),
            false => (ProxyMode::Cut, &counts.cuts),
        };
        count.fetch_add(1, Ordering::Relaxed);
        instance.proxy.set_mode(mode);
        drop(instance);
        tokio::time::sleep(pause(500, 3000)).await;
        instances[index].lock().await.proxy.set_mode(ProxyMode::Forward);
    }
}

/// SIGKILL of a random instance every 2–5 s, started again after 0–1 s;
/// the error of a start that failed for good.
pub async fn crashes(instances: Instances, counts: Arc<Counts>, until: Instant) -> Result<()> {
    while Instant::now() < until {
        tokio::time::sleep(pause(2000, 5000)).await;
        let _fault = counts.quiet.read().await;
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

/// A Citus worker stopped for `down`, other faults paused from [`QUIET`] before.
pub async fn worker_outage(
    worker: &mut Server,
    counts: &Counts,
    shared: &Shared,
    down: Duration,
) -> Duration {
    let _quiet = counts.quiet.write().await;
    tokio::time::sleep(QUIET).await;
    worker.node().stop_immediate().await;
    let stopped = Instant::now();
    lock(&shared.seen).outage.since = Some(stopped);
    tokio::time::sleep(down).await;
    lock(&shared.seen).outage.since = None;
    worker.start_again().await;
    stopped.elapsed()
}
