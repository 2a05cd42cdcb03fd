//! What the simulated clients send, and how a run is timed.
//!
//! Each scenario is a closed loop: `connections` clients, each with its own
//! keep-alive connection, send their next request when the previous answer
//! is complete, for a warm-up and then a measured window; only answers that
//! arrive within the window count. The keys decide what the service does:
//! a fresh key is a new charge, a key of the charges created beforehand (the
//! pool) is a replay. Each client draws from its own seeded generator, so a
//! run sends the same keys every time.
//!
//! The burst is different: rounds of [`BURST`] requests with one fresh key,
//! released together by a barrier; exactly one of them may create the
//! charge.

use std::time::Instant;

use anyhow::Result;
use futures_util::future::join_all;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::Barrier;

use crate::http::{connect_many, Answer, Api, Http};
use crate::proc::{cpu_between, CpuClock, CpuShare};
use crate::stats::{Sample, Tally};
use crate::Plan;

/// Requests of one key released together in the burst scenario.
pub const BURST: usize = 50;
/// Share of new charges in the mix scenario; the rest are replays.
pub const MIX_NEW_PERCENT: u32 = 90;
/// The keys of the charges replays re-send: `pool-0` … `pool-<N-1>`. The
/// pgbench scripts build the same keys.
pub const POOL_KEY_PREFIX: &str = "pool-";

pub fn pool_key(index: usize) -> String {
    format!("{POOL_KEY_PREFIX}{index}")
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Workload {
    /// A fresh key for every request.
    New,
    /// Keys of the pool, same body: every request is a replay.
    Replay,
    /// MIX_NEW_PERCENT new, the rest replays.
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

/// The keys one simulated client sends.
pub struct Keys {
    workload: Workload,
    prefix: String,
    next: u64,
    pool_size: usize,
    rng: StdRng,
}

impl Keys {
    /// The keys of `client` of `connections` in `plan`'s round: the same
    /// every run, and no round's fresh keys the same as another's.
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

/// `connections` clients in a closed loop for warm-up + measure.
pub async fn closed_loop(
    api: &Api,
    workload: Workload,
    connections: usize,
    plan: &Plan,
    service_pid: u32,
) -> Result<Sample> {
    let clients = connect_many(api.addr, connections).await?;
    let measured_from = Instant::now() + plan.warmup;
    let until = measured_from + plan.measure;
    let runs = clients.into_iter().enumerate().map(|(client, http)| {
        let keys = Keys::new(workload, connections, client, plan);
        client_loop(api, http, keys, measured_from, until)
    });
    let (results, cpu) = tokio::join!(
        join_all(runs),
        cpu_between(measured_from, until, service_pid)
    );
    let mut tally = Tally::new()?;
    for result in results {
        tally.merge(&result?)?;
    }
    Ok(Sample {
        tally,
        seconds: plan.measure.as_secs_f64(),
        cpu: Some(cpu?),
    })
}

async fn client_loop(
    api: &Api,
    mut http: Http,
    mut keys: Keys,
    measured_from: Instant,
    until: Instant,
) -> Result<Tally> {
    let mut tally = Tally::new()?;
    while Instant::now() < until {
        let answer = http.send(api.charge(&keys.next_key())?).await?;
        if (measured_from..=until).contains(&answer.finished) {
            tally.record(&answer);
        }
    }
    Ok(tally)
}

/// Sends each key once, spread over `connections` sequential clients.
pub async fn send_all(api: &Api, connections: usize, keys: &[String]) -> Result<Tally> {
    let clients = connect_many(api.addr, connections).await?;
    let runs = clients
        .into_iter()
        .enumerate()
        .map(|(client, mut http)| async move {
            let mut tally = Tally::new()?;
            for key in keys.iter().skip(client).step_by(connections) {
                tally.record(&http.send(api.charge(key)?).await?);
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
    /// Rounds in which not exactly one request created the charge (the
    /// others must all be replays of it).
    pub not_created_once: u64,
}

/// Rounds of BURST requests with one fresh key, one per connection, released
/// together by a barrier; the next round starts when all have answered.
/// The width is the burst's, so the scenario is reported once, not per
/// client count.
pub async fn bursts(api: &Api, plan: &Plan, service_pid: u32) -> Result<(Sample, BurstCounts)> {
    let mut connections = connect_many(api.addr, BURST).await?;
    let measured_from = Instant::now() + plan.warmup;
    let until = measured_from + plan.measure;
    let mut cpu_clock = None;
    let mut tally = Tally::new()?;
    let mut counts = BurstCounts {
        rounds: 0,
        not_created_once: 0,
    };
    let mut window: Option<(Instant, Instant)> = None;
    let mut round = 0u64;
    while Instant::now() < until {
        round += 1;
        let key = format!("burst-{round}");
        let requests = (0..BURST)
            .map(|_| api.charge(&key))
            .collect::<Result<Vec<_>>>()?;
        let barrier = Barrier::new(BURST);
        let started = Instant::now();
        let sends = connections.iter_mut().zip(requests).map(|(http, request)| {
            let barrier = &barrier;
            async move {
                barrier.wait().await;
                http.send(request).await
            }
        });
        let answers: Vec<Answer> = join_all(sends).await.into_iter().collect::<Result<_>>()?;
        if started < measured_from {
            continue;
        }
        if cpu_clock.is_none() {
            cpu_clock = Some(CpuClock::read(service_pid)?);
        }
        let finished = Instant::now();
        window = Some((window.map_or(started, |(first, _)| first), finished));
        counts.rounds += 1;
        let created = answers
            .iter()
            .filter(|answer| answer.is_success() && !answer.replayed)
            .count();
        if created != 1 {
            counts.not_created_once += 1;
        }
        for answer in &answers {
            tally.record(answer);
        }
    }
    let seconds = window.map_or(0.0, |(first, last)| (last - first).as_secs_f64());
    let cpu = match cpu_clock {
        Some(start) => Some(CpuShare::between(&start, &CpuClock::read(service_pid)?)),
        None => None,
    };
    Ok((
        Sample {
            tally,
            seconds,
            cpu,
        },
        counts,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(round: usize) -> Plan {
        Plan {
            pool_size: 100,
            round,
            ..Plan::new(true)
        }
    }

    #[test]
    fn keys_are_fresh_pooled_or_mixed_and_the_same_every_run() {
        let mut new = Keys::new(Workload::New, 32, 3, &plan(0));
        assert_eq!(new.next_key(), "new-32-3-0-1");
        assert_eq!(new.next_key(), "new-32-3-0-2");

        let mut replay = Keys::new(Workload::Replay, 32, 3, &plan(0));
        for _ in 0..100 {
            let key = replay.next_key();
            let index: usize = key.strip_prefix(POOL_KEY_PREFIX).unwrap().parse().unwrap();
            assert!(index < 100);
        }

        let draw = |round| {
            let mut mix = Keys::new(Workload::Mix, 1, 0, &plan(round));
            (0..1000).map(|_| mix.next_key()).collect::<Vec<_>>()
        };
        let keys = draw(0);
        assert_eq!(keys, draw(0));
        let fresh = keys.iter().filter(|k| k.starts_with("mix-")).count();
        assert!((850..950).contains(&fresh), "{fresh} of 1000 new");
    }

    #[test]
    fn a_later_round_sends_none_of_an_earlier_rounds_new_keys() {
        let draw = |workload, round| {
            let mut keys = Keys::new(workload, 1, 0, &plan(round));
            (0..1000).map(|_| keys.next_key()).collect::<Vec<_>>()
        };
        for workload in [Workload::New, Workload::Mix] {
            let first = draw(workload, 0);
            let fresh = |key: &&String| !key.starts_with(POOL_KEY_PREFIX);
            for round in 1..5 {
                let later = draw(workload, round);
                assert!(
                    later.iter().filter(fresh).all(|key| !first.contains(key)),
                    "round {round} of {workload:?} repeats a new key of round 0"
                );
            }
        }
        // Replays draw other pool keys each round, from the same pool.
        assert_ne!(draw(Workload::Replay, 0), draw(Workload::Replay, 1));
    }
}
