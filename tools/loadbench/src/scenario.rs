//! What the clients send: closed loops counting the answers in the measured
//! window, seeded keys (every run sends the same); and the burst.

use std::time::Instant;

use anyhow::Result;
use futures_util::future::join_all;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Barrier;

use crate::database::Wal;
use crate::http::{Api, Http};
use crate::stats::{Sample, Tally};
use crate::Plan;

/// Same-key requests released together in a burst.
pub const BURST: usize = 50;
pub const MIX_NEW_PERCENT: u32 = 90;
/// The replays' keys, `pool-0` … `pool-<N-1>`, as the scripts build them.
pub const POOL_KEY_PREFIX: &str = "pool-";

pub fn pool_key(index: usize) -> String {
    format!("{POOL_KEY_PREFIX}{index}")
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Workload {
    New,
    Replay,
    Mix,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Replay => "replay",
            Self::Mix => "mix",
        }
    }
}

pub struct Keys {
    workload: Workload,
    prefix: String,
    next: u64,
    pool_size: usize,
    rng: StdRng,
}

impl Keys {
    /// The same every run; no round's fresh keys another's.
    pub fn new(workload: Workload, connections: usize, client: usize, plan: &Plan) -> Self {
        let round = plan.round;
        Self {
            workload,
            prefix: format!("{}-{connections}-{client}-{round}", workload.name()),
            next: 0,
            pool_size: plan.pool_size,
            rng: StdRng::seed_from_u64(((round * 1_000 + connections) * 1_000 + client) as u64),
        }
    }

    pub fn next_key(&mut self) -> String {
        let fresh = match self.workload {
            Workload::New => true,
            Workload::Replay => false,
            Workload::Mix => self.rng.gen_range(0..100) < MIX_NEW_PERCENT,
        };
        if fresh {
            self.next += 1;
            format!("{}-{}", self.prefix, self.next)
        } else {
            pool_key(self.rng.gen_range(0..self.pool_size))
        }
    }
}

pub async fn closed_loop(
    api: &Api,
    workload: Workload,
    connections: usize,
    plan: &Plan,
) -> Result<Sample> {
    let clients = Http::connect_many(api.addr, connections).await?;
    let measured_from = Instant::now() + plan.warmup;
    let until = measured_from + plan.measure;
    let runs = clients.into_iter().enumerate().map(|(client, mut http)| async move {
        let mut keys = Keys::new(workload, connections, client, plan);
        let (mut tally, mut answered) = (Tally::new()?, 0);
        while Instant::now() < until {
            let answer = http.send(&api.charge(&keys.next_key())?).await?;
            answered += 1;
            if (measured_from..=until).contains(&answer.finished) {
                tally.record(&answer);
            }
        }
        anyhow::Ok((tally, answered))
    });
    let (mut tally, mut wal) = (Tally::new()?, Wal::default());
    for result in join_all(runs).await {
        let (client, answered) = result?;
        tally.merge(&client)?;
        wal.requests += answered;
    }
    Ok(Sample { tally, seconds: plan.measure.as_secs_f64(), wal })
}

pub async fn send_all(api: &Api, connections: usize, keys: &[String]) -> Result<Tally> {
    let clients = Http::connect_many(api.addr, connections).await?;
    let runs = clients.into_iter().enumerate().map(|(client, mut http)| async move {
        let mut tally = Tally::new()?;
        for key in keys.iter().skip(client).step_by(connections) {
            tally.record(&http.send(&api.charge(key)?).await?);
        }
        anyhow::Ok(tally)
    });
    let mut tally = Tally::new()?;
    for result in join_all(runs).await {
        tally.merge(&result?)?;
    }
    Ok(tally)
}

pub struct BurstCounts {
    pub rounds: u64,
    /// Rounds in which not exactly one request created the charge.
    pub not_created_once: u64,
}

/// Rounds of BURST requests of a fresh key, one per connection, released
/// together, each round once the last answered.
pub async fn bursts(api: &Api, plan: &Plan) -> Result<(Sample, BurstCounts)> {
    let mut connections = Http::connect_many(api.addr, BURST).await?;
    let measured_from = Instant::now() + plan.warmup;
    let until = measured_from + plan.measure;
    let mut tally = Tally::new()?;
    let mut counts = BurstCounts { rounds: 0, not_created_once: 0 };
    let mut window: Option<(Instant, Instant)> = None;
    for round in 1.. {
        if Instant::now() >= until {
            break;
        }
        let request = api.charge(&format!("burst-{round}"))?;
        let barrier = Barrier::new(BURST);
        let started = Instant::now();
        let sends = connections.iter_mut().map(|http| async {
            barrier.wait().await;
            http.send(&request).await
        });
        let answers = join_all(sends).await.into_iter().collect::<Result<Vec<_>>>()?;
        if started < measured_from {
            continue;
        }
        window = Some((window.map_or(started, |(first, _)| first), Instant::now()));
        counts.rounds += 1;
        let created = answers.iter().filter(|a| a.is_success() && !a.replayed).count();
        counts.not_created_once += u64::from(created != 1);
        answers.iter().for_each(|answer| tally.record(answer));
    }
    let seconds = window.map_or(0.0, |(first, last)| (last - first).as_secs_f64());
    Ok((Sample { tally, seconds, wal: Wal::default() }, counts))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fresh_pooled_or_mixed_the_same_every_run_and_new_each_round() {
        let plan = |round| Plan { pool_size: 100, round, ..Plan::new(true) };
        let draw = |workload, round| {
            let mut keys = Keys::new(workload, 32, 3, &plan(round));
            (0..1000).map(|_| keys.next_key()).collect::<Vec<_>>()
        };
        assert_eq!(draw(Workload::New, 0)[..2], ["new-32-3-0-1", "new-32-3-0-2"]);
        let pooled =
            |key: &String| key.strip_prefix(POOL_KEY_PREFIX).and_then(|i| i.parse::<usize>().ok());
        assert!(draw(Workload::Replay, 0).iter().all(|key| pooled(key).is_some_and(|i| i < 100)));
        let mix = draw(Workload::Mix, 0);
        assert_eq!(mix, draw(Workload::Mix, 0));
        let fresh = mix.iter().filter(|k| k.starts_with("mix-")).count();
        assert!((850..950).contains(&fresh), "{fresh} of 1000 new");
        for workload in [Workload::New, Workload::Mix] {
            let (first, later) = (draw(workload, 0), draw(workload, 1));
            let repeated = later.iter().filter(|k| pooled(k).is_none() && first.contains(k));
            assert_eq!(repeated.count(), 0, "the second round of {workload:?} repeats a new key");
        }
        assert_ne!(draw(Workload::Replay, 0), draw(Workload::Replay, 1));
    }
}
