//! The bench database, the floor's table, each run's quiet start and WAL.

use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use chargeonce_testkit::{redact, TestDatabase};
use tokio_postgres::{Client, NoTls};

use crate::sustain::CpuTimes;
use crate::{say, script};

/// Longest wait for the service's outbox to empty before a run.
const SETTLE_LIMIT: Duration = Duration::from_secs(180);

pub async fn connect(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("cannot connect to {}", redact(url)))?;
    tokio::spawn(connection);
    Ok(client)
}

pub struct BenchDatabase {
    database: TestDatabase,
    pub url: String,
    pub client: Client,
    /// To the admin database (CHECKPOINT).
    pub admin: Client,
    /// pg_walinspect is there: full-page images are counted.
    walinspect: bool,
    warned: Cell<bool>,
}

impl BenchDatabase {
    pub async fn create(admin_url: &str) -> Result<Self> {
        let admin = connect(admin_url).await?;
        let database = TestDatabase::empty_on(admin_url).await;
        say(format!("created the database {}", database.name));
        let client = connect(&database.url).await?;
        client
            .batch_execute(
                "CREATE EXTENSION IF NOT EXISTS pg_stat_statements; \
                 SELECT count(*) FROM pg_stat_statements",
            )
            .await
            .context(
                "pg_stat_statements is not usable on this server; it must be in \
                 shared_preload_libraries (scripts/bench's own cluster has it)",
            )?;
        let walinspect =
            client.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect").await.is_ok();
        let warned = Cell::new(false);
        Ok(Self { url: database.url.clone(), database, client, admin, walinspect, warned })
    }

    pub fn close(self) {
        let name = self.database.name.clone();
        drop(self.database);
        say(format!("dropped the database {name}"));
    }

    pub async fn create_floor(&self, pool_size: usize) -> Result<()> {
        let sql = format!("{}{}", script::FLOOR_TABLE, script::floor_rows(pool_size));
        self.client.batch_execute(&sql).await.context("creating the floor's table")
    }

    pub async fn machine(&self) -> Result<String> {
        let sql = "SELECT current_setting('server_version'), \
                   string_agg(name || '=' || current_setting(name), ', ' ORDER BY i) \
              FROM unnest('{fsync,synchronous_commit,shared_buffers,max_connections,\
                   max_wal_size,checkpoint_timeout,wal_compression}'::text[]) \
                   WITH ORDINALITY AS settings(name, i)";
        let row = self.client.query_one(sql, &[]).await.context("the server's settings")?;
        let (postgres, settings): (String, String) = (row.get(0), row.get(1));
        let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = info.lines().find_map(|line| line.strip_prefix("model name"));
        let cpu = model.and_then(|m| m.split_once(':')).map_or("unknown CPU", |m| m.1.trim());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(format!("{cores} cores (nproc), {cpu}; PostgreSQL {postgres} ({settings})"))
    }

    pub async fn wal_mark(&self) -> Result<String> {
        let row = self.client.query_one("SELECT pg_current_wal_flush_lsn()::text", &[]).await;
        Ok(row.context("pg_current_wal_flush_lsn()")?.get(0))
    }

    /// Checkpoints PostgreSQL has started (timed or requested), if it says.
    pub async fn checkpoints(&self) -> Option<i64> {
        let sql = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter";
        self.admin.query_one(sql, &[]).await.ok().map(|row| row.get(0))
    }

    /// Checkpoints started (counted as each begins) and when the last one
    /// ended (the control file's checkpoint time, in seconds since the
    /// epoch), if the server says: together they tell whether one is running
    /// (`sustain::CheckpointWatch`).
    pub async fn checkpoint_progress(&self) -> Option<(i64, i64)> {
        let sql = "SELECT checkpoints_timed + checkpoints_req, \
                          extract(epoch FROM (SELECT checkpoint_time \
                                                FROM pg_control_checkpoint()))::int8 \
                     FROM pg_stat_bgwriter";
        let row = self.admin.query_one(sql, &[]).await.ok()?;
        Some((row.get(0), row.get(1)))
    }

    /// The WAL since `mark`, from LSNs (pg_stat_wal lags behind idle backends).
    pub async fn wal_since(&self, mark: &str, requests: u64) -> Result<Wal> {
        let (lsn, db) = ("$1::text::pg_lsn", &self.client);
        let sql = format!("SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), {lsn})::float8");
        let bytes: f64 = db.query_one(&sql, &[&mark]).await.context("WAL bytes")?.get(0);
        let sql = format!(
            "SELECT sum(fpi_size)::float8, sum(combined_size)::float8 \
               FROM pg_get_wal_stats({lsn}, pg_current_wal_flush_lsn())"
        );
        // Fails once checkpoints removed the segments (long runs).
        let fpi = match self.walinspect && bytes > 0.0 {
            true => db.query_one(&sql, &[&mark]).await.ok().map(|row| (row.get(0), row.get(1))),
            false => None,
        };
        Ok(Wal { bytes, fpi, requests, busy_seconds: None })
    }

    /// Each run starts once every event so far was fanned out, then from a
    /// CHECKPOINT (superuser only, else one warning), so no run pays for the
    /// one before. Where the WAL and the CPUs' times are then.
    pub async fn checkpoint(&self) -> Result<Mark> {
        self.settle().await?;
        if let Err(error) = self.admin.batch_execute("CHECKPOINT").await {
            if !self.warned.replace(true) {
                say(format!(
                    "warning: CHECKPOINT failed ({error}); runs are not aligned on checkpoints"
                ));
            }
        }
        let lsn = self.wal_mark().await?;
        Ok(Mark { lsn, cpu: CpuTimes::read() })
    }

    /// The WAL and the machine's busy CPU time since `mark`, once the outbox
    /// is empty: with the fan-out.
    pub async fn settled_wal_since(&self, mark: &Mark, requests: u64) -> Result<Wal> {
        self.settle().await?;
        let mut wal = self.wal_since(&mark.lsn, requests).await?;
        let now = CpuTimes::read();
        wal.busy_seconds = now.zip(mark.cpu).map(|(now, then)| now.busy_seconds_since(&then));
        Ok(wal)
    }

    async fn settle(&self) -> Result<()> {
        let started = Instant::now();
        let waiting = "SELECT EXISTS (SELECT 1 FROM event_queue)";
        while self.client.query_one(waiting, &[]).await.context("the outbox (event_queue)")?.get(0)
        {
            ensure!(
                started.elapsed() < SETTLE_LIMIT,
                "the service's webhook dispatcher did not empty its outbox within {} s",
                SETTLE_LIMIT.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// Where a phase starts: the WAL's position and the CPUs' times.
pub struct Mark {
    lsn: String,
    cpu: Option<CpuTimes>,
}

/// WAL a phase wrote and the requests or script runs it served, warm-ups
/// included; and the machine's CPU time it took (every process: the
/// service or pgbench, PostgreSQL, the load generator), when measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wal {
    pub bytes: f64,
    /// Bytes of full-page images and of all records.
    pub fpi: Option<(f64, f64)>,
    pub requests: u64,
    pub busy_seconds: Option<f64>,
}

impl Wal {
    pub fn add(&mut self, other: &Wal) {
        self.bytes += other.bytes;
        self.fpi = self.fpi.zip(other.fpi).map(|(a, b)| (a.0 + b.0, a.1 + b.1));
        self.requests += other.requests;
        self.busy_seconds = self.busy_seconds.zip(other.busy_seconds).map(|(a, b)| a + b);
    }

    /// The machine's busy CPU time per request, in µs.
    pub fn busy_us_per_request(&self) -> Option<f64> {
        let seconds = self.busy_seconds.filter(|_| self.requests > 0)?;
        Some(seconds * 1e6 / self.requests as f64)
    }

    pub fn per_request(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.bytes / self.requests as f64)
    }

    pub fn fpi_share(&self) -> Option<f64> {
        self.fpi.filter(|(_, all)| *all > 0.0).map(|(fpi, all)| fpi / all)
    }
}
