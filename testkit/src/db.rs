//! Test databases. Following crates.io's test-database crate: the schema is
//! migrated once per run into a template database, and every test gets its
//! own copy (`CREATE DATABASE … TEMPLATE`, a file copy, much cheaper than
//! running the migrations again), dropped when the value is.
//!
//! The template's name carries a digest of the migration files, so a changed
//! migration gets a new template; runs in parallel (several test binaries, or
//! several clones on one server) build it once under an advisory lock.
//!
//! On a Citus coordinator (`scripts/citus up`: the admin database has the
//! `citus` extension and the workers registered) there is no template: a
//! Citus database cannot be one, its maintenance daemon stays connected to
//! it. Each test database is made the way Citus makes any database (its
//! metadata is per database): created on the coordinator and on every
//! worker, with the extension in each and the workers registered, then
//! migrated, which distributes the tables (`chargeonce::db::citus`).

use std::future::Future;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;
use tokio_postgres::{Client, NoTls};

/// Where test databases are made: `TEST_DATABASE_URL`, else the machine's
/// PostgreSQL on 127.0.0.1:5432 as `postgres`. Any database of the server
/// will do; it is only used to create and drop others.
pub fn admin_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .ok()
        .filter(|url| !url.is_empty())
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database replaced; the query string is kept.
pub fn with_database(database_url: &str, database: &str) -> String {
    let mut url = url::Url::parse(database_url)
        .unwrap_or_else(|e| panic!("not a URL ({e}): {}", redact(database_url)));
    url.set_path(&format!("/{database}"));
    url.to_string()
}

/// `url` with its password, if any, replaced by `***`, for printing.
pub fn redact(database_url: &str) -> String {
    match url::Url::parse(database_url) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        Ok(url) => url.to_string(),
        Err(_) => "[unparsable database URL]".to_owned(),
    }
}

/// The TCP address of the PostgreSQL server `database_url` names, for
/// proxies to forward to.
pub fn server_address(database_url: &str) -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let config: tokio_postgres::Config = database_url.parse().expect("a PostgreSQL URL");
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => panic!("tests through a proxy need PostgreSQL over TCP, not a socket"),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    (host.as_str(), port)
        .to_socket_addrs()
        .expect("resolve the PostgreSQL host")
        .find(|address| address.is_ipv4())
        .expect("an IPv4 address for the PostgreSQL host")
}

/// A connection to `url`, its driving task spawned.
pub async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot connect to the test PostgreSQL at {} (set TEST_DATABASE_URL): {e}",
                redact(url)
            )
        });
    tokio::spawn(connection);
    client
}

const TEST_PREFIX: &str = "chargeonce_test_";
const TEMPLATE_PREFIX: &str = "chargeonce_tmpl_";
/// Databases of crashed runs are dropped once they are this old.
const STALE_AFTER_SECS: u64 = 2 * 3600;
/// Serialises template builds across processes ("tmpl").
const TEMPLATE_LOCK: i64 = 0x746d_706c;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A database of its own for one test, dropped with the value.
pub struct TestDatabase {
    pub name: String,
    pub url: String,
    /// The server's admin URL it was made with, and is dropped with.
    admin: String,
    /// On Citus, the workers' admin URLs: the database is on each of them
    /// too, and dropped there after the coordinator's.
    workers: Vec<String>,
}

impl TestDatabase {
    /// An empty database (no schema), for tests of migrating itself.
    pub async fn empty() -> Self {
        Self::empty_on(&admin_url()).await
    }

    /// An empty database on the server of `admin_url` rather than
    /// [`admin_url()`]'s, for tools that are told which server to use.
    pub async fn empty_on(admin_url: &str) -> Self {
        Self::create(admin_url, None).await
    }

    /// A database with the schema of `migrations_dir`, cloned from a template
    /// that `migrate(url)` builds once per run; on Citus, made empty and
    /// migrated by `migrate(url)` itself.
    pub async fn migrated<F, Fut>(migrations_dir: &Path, migrate: F) -> Self
    where
        F: FnOnce(String) -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        static WORKERS: OnceCell<Vec<String>> = OnceCell::const_new();
        let admin_url = admin_url();
        let workers = WORKERS.get_or_init(|| citus_workers(&admin_url)).await;
        if !workers.is_empty() {
            let database = Self::create_on_citus(&admin_url, workers.clone()).await;
            migrate(database.url.clone())
                .await
                .unwrap_or_else(|e| panic!("migrating {} on Citus: {e}", database.name));
            return database;
        }
        static TEMPLATE: OnceCell<String> = OnceCell::const_new();
        let template = TEMPLATE
            .get_or_init(|| build_template(migrations_dir, migrate))
            .await;
        Self::create(&admin_url, Some(template)).await
    }

    async fn create(admin_url: &str, template: Option<&str>) -> Self {
        if template.is_none() {
            let workers = citus_workers(admin_url).await;
            if !workers.is_empty() {
                return Self::create_on_citus(admin_url, workers).await;
            }
        }
        let admin = connect(admin_url).await;
        sweep_once(&admin).await;
        let name = new_name();
        let sql = match template {
            Some(template) => format!("CREATE DATABASE {name} TEMPLATE {template}"),
            None => format!("CREATE DATABASE {name}"),
        };
        admin
            .batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let url = with_database(admin_url, &name);
        Self {
            name,
            url,
            admin: admin_url.to_owned(),
            workers: Vec::new(),
        }
    }

    /// An empty Citus database: created on the coordinator and every
    /// worker at once, the extension in each, the nodes registered at the
    /// coordinator as they are in the admin database.
    async fn create_on_citus(admin_url: &str, workers: Vec<String>) -> Self {
        let nodes: Vec<String> = std::iter::once(admin_url.to_owned())
            .chain(workers.iter().cloned())
            .collect();
        sweep_once(&connect(admin_url).await).await;
        static SWEPT_WORKERS: OnceCell<()> = OnceCell::const_new();
        SWEPT_WORKERS
            .get_or_init(|| async {
                for worker in &workers {
                    sweep(&connect(worker).await).await;
                }
            })
            .await;
        let name = new_name();
        // The nodes' logs name the database of each line: this says which
        // test it was (shown for a failing test).
        eprintln!("test database on Citus: {name}");
        let url = with_database(admin_url, &name);
        // From here on a panic leaves nothing behind: the value drops the
        // database wherever it was created.
        let database = Self {
            name,
            url,
            admin: admin_url.to_owned(),
            workers,
        };
        let name = &database.name;
        on_every_node(&nodes, None, &format!("CREATE DATABASE {name}")).await;
        on_every_node(&nodes, Some(name), "CREATE EXTENSION citus").await;
        let admin = connect(admin_url).await;
        let registered: Vec<(i32, String, i32)> = admin
            .query(
                "SELECT groupid, nodename::text, nodeport FROM pg_dist_node \
                  WHERE noderole = 'primary' ORDER BY groupid, nodeid",
                &[],
            )
            .await
            .expect("the Citus nodes of the admin database")
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect();
        let coordinator = connect(&database.url).await;
        // Few shards per table: placing a table costs a table per shard on
        // the workers, for every test. Four still spread over both workers.
        coordinator
            .batch_execute(&format!(
                "ALTER DATABASE {name} SET citus.shard_count = {TEST_SHARD_COUNT}"
            ))
            .await
            .expect("set the shard count");
        // Registering a node syncs metadata to the workers, which updates
        // catalogs shared by every database of a node (the roles): two
        // databases registering at once fail with "tuple concurrently
        // updated". One at a time, across test processes: the lock is taken
        // in the admin database, which they all use.
        admin
            .execute("SELECT pg_advisory_lock($1)", &[&CITUS_REGISTER_LOCK])
            .await
            .expect("Citus registration lock");
        for (group, host, port) in registered {
            let sql = if group == 0 {
                "SELECT citus_set_coordinator_host($1, $2)"
            } else {
                "SELECT citus_add_node($1, $2)"
            };
            coordinator
                .query_one(sql, &[&host, &port])
                .await
                .unwrap_or_else(|e| panic!("{sql} ({host}:{port}) in {name}: {e:?}"));
        }
        admin
            .execute("SELECT pg_advisory_unlock($1)", &[&CITUS_REGISTER_LOCK])
            .await
            .expect("Citus registration unlock");
        database
    }

    pub async fn client(&self) -> Client {
        connect(&self.url).await
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        drop_database_on(&self.admin, &self.name);
        for worker in &self.workers {
            drop_database_on(worker, &self.name);
        }
    }
}

fn new_name() -> String {
    format!(
        "{TEST_PREFIX}{}_{}",
        unix_now(),
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    )
}

/// Serialises the registration of Citus nodes across processes ("citu").
const CITUS_REGISTER_LOCK: i64 = 0x6369_7475;

/// Shards per distributed table in a test database on Citus.
const TEST_SHARD_COUNT: u32 = 4;

/// The admin URLs of the Citus workers registered in the database
/// `admin_url` names (the same user and database on each worker's host and
/// port); none for a plain PostgreSQL, or a Citus database without
/// workers.
/// Whether the tests' server ([`admin_url()`]) is a Citus coordinator with
/// workers (the Citus pass of `scripts/dev test`). Asked once per run.
pub async fn on_citus() -> bool {
    static CITUS: OnceCell<bool> = OnceCell::const_new();
    *CITUS
        .get_or_init(|| async { !citus_workers(&admin_url()).await.is_empty() })
        .await
}

pub async fn citus_workers(admin_url: &str) -> Vec<String> {
    let admin = connect(admin_url).await;
    let citus: bool = admin
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')",
            &[],
        )
        .await
        .expect("look for the citus extension")
        .get(0);
    if !citus {
        return Vec::new();
    }
    admin
        .query(
            "SELECT nodename::text, nodeport FROM pg_dist_node \
              WHERE groupid <> 0 AND noderole = 'primary' ORDER BY nodeid",
            &[],
        )
        .await
        .expect("list the Citus workers")
        .iter()
        .map(|row| {
            let (host, port): (String, i32) = (row.get(0), row.get(1));
            let mut url = url::Url::parse(admin_url).expect("the admin URL");
            url.set_host(Some(&host)).expect("a worker's host");
            url.set_port(u16::try_from(port).ok())
                .expect("a worker's port");
            url.to_string()
        })
        .collect()
}

/// Runs `sql` on every node at once, in `database` (`None`: the node's
/// admin database); panics with the first error.
async fn on_every_node(nodes: &[String], database: Option<&str>, sql: &str) {
    let tasks: Vec<_> = nodes
        .iter()
        .map(|node| {
            let url = database.map_or_else(|| node.clone(), |name| with_database(node, name));
            let sql = sql.to_owned();
            tokio::spawn(async move {
                let result = connect(&url).await.batch_execute(&sql).await;
                result.map_err(|e| format!("{sql} on {}: {e}", redact(&url)))
            })
        })
        .collect();
    for task in tasks {
        task.await
            .expect("a node's task")
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// A digest of the migration files' names and contents.
fn migrations_digest(dir: &Path) -> String {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    files.sort();
    let mut hasher = Sha256::new();
    for file in files {
        hasher.update(file.file_name().unwrap().to_string_lossy().as_bytes());
        hasher.update(std::fs::read(&file).expect("read migration"));
    }
    hex::encode(hasher.finalize())[..12].to_owned()
}

/// Creates and migrates the template unless a complete one exists. A
/// template is complete once it is marked `IS_TEMPLATE`; a half-built one
/// (its builder died) is dropped and built again.
async fn build_template<F, Fut>(migrations_dir: &Path, migrate: F) -> String
where
    F: FnOnce(String) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let name = format!("{TEMPLATE_PREFIX}{}", migrations_digest(migrations_dir));
    let admin = connect(&admin_url()).await;
    admin
        .execute("SELECT pg_advisory_lock($1)", &[&TEMPLATE_LOCK])
        .await
        .expect("template lock");
    let complete: Option<bool> = admin
        .query_opt(
            "SELECT datistemplate FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .expect("look for the template")
        .map(|row| row.get(0));
    if complete != Some(true) {
        if complete.is_some() {
            admin
                .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                .await
                .expect("drop a half-built template");
        }
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the template");
        migrate(with_database(&admin_url(), &name))
            .await
            .unwrap_or_else(|e| panic!("migrating the template database {name}: {e}"));
        admin
            .batch_execute(&format!("ALTER DATABASE {name} WITH IS_TEMPLATE true"))
            .await
            .expect("mark the template complete");
    }
    admin
        .execute("SELECT pg_advisory_unlock($1)", &[&TEMPLATE_LOCK])
        .await
        .expect("template unlock");
    name
}

/// Drops, once per process, test databases that crashed runs left behind
/// (on the first server a database is made on).
async fn sweep_once(admin: &Client) {
    static SWEPT: OnceCell<()> = OnceCell::const_new();
    SWEPT.get_or_init(|| sweep(admin)).await;
}

/// Drops the test databases on the server of `admin` that are older than
/// [`STALE_AFTER_SECS`].
async fn sweep(admin: &Client) {
    let rows = admin
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE 'chargeonce\\_test\\_%'",
            &[],
        )
        .await
        .expect("list test databases");
    let now = unix_now();
    for row in rows {
        let name: String = row.get(0);
        let created: u64 = name[TEST_PREFIX.len()..]
            .split('_')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if now.saturating_sub(created) > STALE_AFTER_SECS {
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        }
    }
}

/// Drops a database from a thread of its own, so it works from `Drop` inside
/// or outside a runtime.
pub fn drop_database(name: &str) {
    drop_database_on(&admin_url(), name);
}

/// [`drop_database`] on the server of `admin_url`.
pub fn drop_database_on(admin_url: &str, name: &str) {
    let name = name.to_owned();
    let admin_url = admin_url.to_owned();
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let admin = connect(&admin_url).await;
            let _ = admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .await;
        });
    })
    .join();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_rewritten_and_redacted_by_a_url_parser() {
        assert_eq!(
            with_database("postgres://u:p@h:5/one?sslmode=disable", "two"),
            "postgres://u:p@h:5/two?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h", "x"), "postgres://h/x");
        assert_eq!(redact("postgres://u:secret@h/d"), "postgres://u:***@h/d");
        assert_eq!(redact("postgres://u@h/d"), "postgres://u@h/d");
    }
}
