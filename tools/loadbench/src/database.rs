//! The bench database: a fresh, empty database made by the test kit on the
//! server the benchmark is given (dropped at the end, a crashed run's
//! leftovers swept by the kit), with pg_stat_statements, the service's
//! schema (migrated by the binary itself) and the floor's table. Also what
//! the report says about the server, and the quiet start of each run.

use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};
use chargeonce_testkit::{redact, TestDatabase};
use tokio_postgres::{Client, NoTls};

use crate::{say, script};

pub async fn connect(url: &str) -> Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("cannot connect to {}", redact(url)))?;
    // A lost connection shows in the next query's error.
    tokio::spawn(connection);
    Ok(client)
}

pub struct BenchDatabase {
    /// Dropped with this value.
    database: TestDatabase,
    pub url: String,
    /// A connection to the bench database.
    pub client: Client,
    /// A connection to the server's admin database (CHECKPOINT).
    pub admin: Client,
}

/// Where the numbers were taken.
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub postgres: String,
    pub settings: String,
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
        Ok(Self { url: database.url.clone(), database, client, admin })
    }

    /// Drops the database (its connections are ended first).
    pub fn close(self) {
        let name = self.database.name.clone();
        drop(self.database);
        say(format!("dropped the database {name}"));
    }

    /// The floor's table, with `pool_size` rows for its lookups.
    pub async fn create_floor(&self, pool_size: usize) -> Result<()> {
        let sql = format!("{}{}", script::FLOOR_TABLE, script::floor_rows(pool_size));
        self.client.batch_execute(&sql).await.context("creating the floor's table")
    }

    pub async fn machine(&self) -> Result<Machine> {
        let mut settings = Vec::new();
        for name in
            ["server_version", "fsync", "synchronous_commit", "shared_buffers", "max_connections"]
        {
            let row = self.client.query_one(&format!("SHOW {name}"), &[]).await.context("SHOW")?;
            settings.push(format!("{name}={}", row.get::<_, String>(0)));
        }
        let postgres = settings.remove(0).replace("server_version=", "");
        Ok(Machine {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu: crate::cpu::cpu_model(),
            postgres,
            settings: settings.join(", "),
        })
    }
}

/// Longest wait for the service's outbox to empty before a run.
const SETTLE_LIMIT: Duration = Duration::from_secs(180);

/// Before each measured run: the service's webhook dispatcher has fanned out
/// every event written so far, then a CHECKPOINT, so that no run pays for
/// the previous one's leftovers (the own-SQL pgbench writes the service's
/// events too, and the service fans them out; the floor's pgbench would
/// share the machine with the dispatcher). The CHECKPOINT needs superuser
/// (or pg_checkpoint); without it the runs go on unaligned, with one warning.
pub struct Checkpointer<'a> {
    database: &'a BenchDatabase,
    warned: Cell<bool>,
    /// The longest wait for the outbox so far.
    pub longest_settle: Cell<Duration>,
}

impl<'a> Checkpointer<'a> {
    pub fn new(database: &'a BenchDatabase) -> Self {
        Self { database, warned: Cell::new(false), longest_settle: Cell::new(Duration::ZERO) }
    }

    /// Waits for the outbox to empty, then checkpoints.
    pub async fn run(&self) -> Result<()> {
        let started = Instant::now();
        let waiting = "SELECT EXISTS (SELECT 1 FROM event_queue)";
        while self
            .database
            .client
            .query_one(waiting, &[])
            .await
            .context("the outbox (event_queue)")?
            .get(0)
        {
            ensure!(
                started.elapsed() < SETTLE_LIMIT,
                "the service's webhook dispatcher did not empty its outbox within {} s",
                SETTLE_LIMIT.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.longest_settle.set(self.longest_settle.get().max(started.elapsed()));
        if let Err(error) = self.database.admin.batch_execute("CHECKPOINT").await {
            if !self.warned.replace(true) {
                say(format!(
                    "warning: CHECKPOINT failed ({error}); runs are not aligned on checkpoints"
                ));
            }
        }
        Ok(())
    }
}
