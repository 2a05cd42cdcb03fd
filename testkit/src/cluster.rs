//! A private PostgreSQL *primary* with a *streaming-replication standby*,
//! for failover tests: each on a free port of 127.0.0.1, in a temporary
//! folder, stopped and removed when the [`Cluster`] is dropped.
//!
//! Replication is **synchronous**: the primary runs with
//! `synchronous_standby_names = 'standby'` and `synchronous_commit = on`, so
//! a commit is acknowledged only once the standby has the WAL. Whatever a
//! client was told is committed survives a crash of the primary followed by
//! a promotion of the standby; that is the property failover tests lean on.
//! The standby itself runs with `synchronous_standby_names = ''`: once
//! promoted it is a primary *without* a standby (as after a real failover,
//! until a new standby joins), and its commits must not wait for one.
//!
//! ```no_run
//! # async fn example() {
//! use chargeonce_testkit::Cluster;
//! let cluster = Cluster::start().await;
//! cluster.primary().create_database("app").await;
//! let url = cluster.url("app", "target_session_attrs=read-write");
//! // … start the code under test with `url`, put load on it …
//! cluster.primary().stop_immediate().await; // a crash: no checkpoint, no goodbye
//! cluster.standby().promote().await; // the standby becomes the primary
//! # }
//! ```
//!
//! How it runs:
//!
//! - The server programs are found like `scripts/lib/postgres.sh` finds
//!   them: `PG_BIN_DIR` if set, else the folder `initdb` on `PATH` is in
//!   (or links into) if `pg_ctl` and `pg_basebackup` are beside it, else
//!   the newest `/usr/lib/postgresql/<version>/bin`.
//! - PostgreSQL refuses to run as root; as root, every program runs as the
//!   `postgres` system user, and the folder is given to it. The folder is
//!   made under `CHARGEONCE_CLUSTER_DIR` if set, else the system's temporary
//!   folder (`/tmp`), which that user must be able to reach.
//! - Trust authentication, TCP on 127.0.0.1 only, no Unix socket, superuser
//!   `postgres`. `fsync = off`: a crashed PostgreSQL loses nothing (the data
//!   is in the operating system's cache), only a crash of the machine would,
//!   and tests do not survive that anyway.
//! - A port is found by binding a random one below Linux's ephemeral range
//!   and letting it go ([`free_port`]); if another process takes it before
//!   PostgreSQL does, start-up is tried again on another.
//! - A test process that dies without dropping its clusters leaves servers
//!   running; the next [`Cluster::start`] stops and removes clusters whose
//!   owning process is gone.
//!
//! Every method that runs a program does so on a blocking thread, so
//! calling it from a test that has load running on the same runtime does
//! not stall that load. Failures panic with the server's log attached.

use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

/// The standby's name: its `application_name` when it connects to the
/// primary, and the primary's `synchronous_standby_names`.
pub const STANDBY_NAME: &str = "standby";

/// Prefix of the folders clusters live in (for the sweep of leftovers).
const FOLDER_PREFIX: &str = "chargeonce-cluster-";

/// How long a server may take to start, to stream, or to promote.
const LIMIT: Duration = Duration::from_secs(60);

/// Start-up attempts when the chosen port was taken in the meantime.
const PORT_ATTEMPTS: usize = 5;

/// The server programs and who runs them.
#[derive(Debug)]
struct Programs {
    bin: PathBuf,
    /// uid and gid of the `postgres` system user when we are root.
    owner: Option<(u32, u32)>,
}

impl Programs {
    fn find() -> Self {
        let bin = find_bin_dir().unwrap_or_else(|| {
            panic!(
                "no PostgreSQL server programs (initdb, pg_ctl): set PG_BIN_DIR or install PostgreSQL"
            )
        });
        let owner = nix::unistd::geteuid().is_root().then(|| {
            let user = nix::unistd::User::from_name("postgres")
                .ok()
                .flatten()
                .expect("running as root, PostgreSQL needs the `postgres` system user to run as");
            (user.uid.as_raw(), user.gid.as_raw())
        });
        Self { bin, owner }
    }

    /// `program` from the server's folder, as the cluster's owner, with no
    /// environment but a plain `PATH` (so no `PGPORT`, `PGDATA`, … leaks in).
    fn command(&self, program: &str, cwd: &Path) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("LC_ALL", "C")
            .current_dir(cwd);
        if let Some((uid, gid)) = self.owner {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Runs `command` to its end; its output if it failed.
    fn run(&self, mut command: Command) -> Result<(), String> {
        let output = command
            .output()
            .map_err(|e| format!("cannot run {command:?}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{command:?}: {}\n{}{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    }

    /// Gives `path` to the cluster's owner (when we are root).
    fn hand_over(&self, path: &Path) {
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {}: {e}", path.display()));
        }
    }
}

fn find_bin_dir() -> Option<PathBuf> {
    let usable = |dir: &Path| {
        ["initdb", "pg_ctl", "pg_basebackup"]
            .iter()
            .all(|program| dir.join(program).is_file())
    };
    if let Some(dir) = std::env::var_os("PG_BIN_DIR").map(PathBuf::from) {
        return usable(&dir).then_some(dir);
    }
    // `initdb` on PATH may be a link (/usr/local/bin/initdb ->
    // /usr/lib/postgresql/15/bin/initdb): its server folder is where the
    // link leads.
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let found = on_path
        .iter()
        .filter_map(|dir| std::fs::canonicalize(dir.join("initdb")).ok())
        .filter_map(|initdb| initdb.parent().map(Path::to_path_buf))
        .find(|dir| usable(dir));
    if found.is_some() {
        return found;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| usable(dir))
        .collect();
    versions.sort();
    versions.pop().map(|(_, dir)| dir)
}

/// A port of 127.0.0.1 that was free a moment ago, in 26000-32767: below
/// Linux's ephemeral range (32768-60999), where any connection's local end
/// can hold a port that a server restarted on it wants back; above the
/// scripts' fixed ports (25429-25442).
pub fn free_port() -> u16 {
    let mut rng = rand::thread_rng();
    (0..1000)
        .map(|_| rand::Rng::gen_range(&mut rng, 26_000..32_768))
        .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free port of 127.0.0.1 in 26000-32767")
}

/// One server of the cluster. Its role is the one it was started with:
/// after [`Node::promote`], `cluster.standby()` is the primary.
#[derive(Debug)]
pub struct Node {
    name: &'static str,
    port: u16,
    data: PathBuf,
    log: PathBuf,
    programs: Arc<Programs>,
}

impl Node {
    /// `primary` or `standby`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:<port>`, e.g. for a proxy to forward to.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// The server's log so far (empty if there is none yet).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `lines` lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A connection as `postgres` to `database` on this server; its driving
    /// task is spawned.
    pub async fn connect(&self, database: &str) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&self.url(database), NoTls)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "connect to the {} on port {}: {e}: {:?}",
                    self.name,
                    self.port,
                    e.as_db_error().map(|db| db.message())
                )
            });
        tokio::spawn(connection);
        client
    }

    /// Creates a database (on the primary; the standby gets it by
    /// replication).
    pub async fn create_database(&self, name: &str) {
        self.connect("postgres")
            .await
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on the {}: {e}", self.name));
    }

    /// Whether the server is a standby (in recovery); `None` if it does not
    /// answer.
    pub async fn in_recovery(&self) -> Option<bool> {
        let url = self.url("postgres");
        let connect = tokio_postgres::connect(&url, NoTls);
        let (client, connection) = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .ok()?
            .ok()?;
        tokio::spawn(connection);
        let row = client
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .ok()?;
        Some(row.get(0))
    }

    /// Stops the server in *immediate* mode (`pg_ctl -m immediate stop`):
    /// every process quits at once, without a checkpoint and without
    /// finishing transactions, as in a crash. Clients see their connections
    /// closed; the port refuses new ones.
    pub async fn stop_immediate(&self) {
        self.pg_ctl(&["-m", "immediate", "-w", "stop"]).await;
    }

    /// Stops the server in *fast* mode: transactions are rolled back,
    /// clients disconnected with an error, a checkpoint is written.
    pub async fn stop_fast(&self) {
        self.pg_ctl(&["-m", "fast", "-w", "stop"]).await;
    }

    /// Promotes a standby to a primary (`pg_ctl promote`) and waits until it
    /// accepts writes.
    pub async fn promote(&self) {
        self.pg_ctl(&["-w", "-t", "60", "promote"]).await;
    }

    async fn pg_ctl(&self, args: &[&str]) {
        let mut command = self.programs.command("pg_ctl", &self.data);
        command.arg("-D").arg(&self.data).args(args);
        let programs = self.programs.clone();
        let result = tokio::task::spawn_blocking(move || programs.run(command))
            .await
            .expect("pg_ctl thread");
        if let Err(error) = result {
            panic!("{error}\n{} log:\n{}", self.name, self.log_tail(30));
        }
    }

    /// Starts the server on its port, or on another free one if that was
    /// taken meanwhile (blocking).
    fn start_blocking(&mut self) {
        let mut last_error = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut command = self.programs.command("pg_ctl", &self.data);
            command
                .arg("-D")
                .arg(&self.data)
                .arg("-l")
                .arg(&self.log)
                .args(["-w", "-t", "60", "-o"])
                .arg(format!("-p {}", self.port))
                .arg("start");
            match self.programs.run(command) {
                Ok(()) => return,
                Err(error) => {
                    last_error = error;
                    if !self.log().contains("could not bind") {
                        break;
                    }
                    self.port = free_port();
                }
            }
        }
        panic!(
            "cannot start the {}: {last_error}\nlog:\n{}",
            self.name,
            self.log_tail(30)
        );
    }

    /// Stops the server in immediate mode if it runs; errors are ignored
    /// (used on drop and for leftovers).
    fn stop_quietly(programs: &Programs, data: &Path) {
        if data.join("postmaster.pid").exists() {
            let mut command = programs.command("pg_ctl", data);
            command
                .arg("-D")
                .arg(data)
                .args(["-m", "immediate", "-w", "-t", "20", "stop"]);
            let _ = programs.run(command);
        }
    }
}

/// A primary and its synchronous standby; see the module documentation.
/// Dropping it stops both (immediately) and removes their folder.
pub struct Cluster {
    root: PathBuf,
    primary: Node,
    standby: Node,
}

impl Cluster {
    /// Creates and starts the primary, clones it into the standby with
    /// `pg_basebackup`, starts the standby and waits until the primary
    /// reports it as its synchronous standby, streaming.
    pub async fn start() -> Self {
        let cluster = tokio::task::spawn_blocking(Self::start_blocking)
            .await
            .expect("cluster start-up thread");
        cluster.wait_for_sync_standby().await;
        cluster
    }

    fn start_blocking() -> Self {
        let (programs, root) = make_root();
        let primary_port = free_port();
        let standby_port = loop {
            let port = free_port();
            if port != primary_port {
                break port;
            }
        };
        let node = |name: &'static str, port: u16| Node {
            name,
            port,
            data: root.join(name),
            log: root.join(format!("{name}.log")),
            programs: programs.clone(),
        };
        // From here on, a panic drops the cluster, which stops what started.
        let mut cluster = Self {
            primary: node("primary", primary_port),
            standby: node("standby", standby_port),
            root,
        };
        cluster.init_primary();
        cluster.primary.start_blocking();
        cluster.clone_standby();
        cluster.standby.start_blocking();
        cluster
    }

    fn init_primary(&self) {
        init_node(&self.root, &self.primary);
        let settings = format!(
            "wal_level = replica\n\
             max_wal_senders = 4\n\
             synchronous_commit = on\n\
             synchronous_standby_names = '{STANDBY_NAME}'\n"
        );
        append(&self.primary.data.join("postgresql.conf"), &settings);
    }

    /// The standby: a base backup of the running primary, then the settings
    /// that make it follow the primary (`standby.signal`,
    /// `primary_conninfo`).
    fn clone_standby(&self) {
        let programs = &self.standby.programs;
        let mut backup = programs.command("pg_basebackup", &self.root);
        backup
            .args(["-h", "127.0.0.1", "-p", &self.primary.port.to_string()])
            .args(["-U", "postgres", "-D"])
            .arg(&self.standby.data)
            .args(["-X", "stream", "-c", "fast", "--no-sync"]);
        programs
            .run(backup)
            .unwrap_or_else(|e| panic!("{e}\nprimary log:\n{}", self.primary.log_tail(30)));
        // Later lines win over the primary's copied settings.
        let settings = format!(
            "\n# chargeonce_testkit::cluster: the standby\n\
             synchronous_standby_names = ''\n\
             primary_conninfo = 'host=127.0.0.1 port={} user=postgres application_name={STANDBY_NAME}'\n",
            self.primary.port
        );
        append(&self.standby.data.join("postgresql.conf"), &settings);
        let signal = self.standby.data.join("standby.signal");
        std::fs::write(&signal, "").expect("write standby.signal");
        programs.hand_over(&signal);
    }

    /// Waits until the primary streams to the standby synchronously.
    pub async fn wait_for_sync_standby(&self) {
        let client = self.primary.connect("postgres").await;
        let started = Instant::now();
        loop {
            let state = client
                .query_opt(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
                    &[&STANDBY_NAME],
                )
                .await
                .expect("read pg_stat_replication")
                .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)));
            if state
                .as_ref()
                .is_some_and(|(state, sync)| state == "streaming" && sync == "sync")
            {
                return;
            }
            assert!(
                started.elapsed() < LIMIT,
                "the standby never became a synchronous standby ({state:?})\nstandby log:\n{}",
                self.standby.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the standby has *applied* everything the primary wrote
    /// so far. (A synchronous commit waits only until the standby has the
    /// WAL on disk; what it shows to its readers may lag a moment behind.)
    pub async fn wait_for_replay(&self) {
        let lsn: String = self
            .primary
            .connect("postgres")
            .await
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .expect("read the primary's WAL position")
            .get(0);
        let standby = self.standby.connect("postgres").await;
        let started = Instant::now();
        loop {
            let replayed: bool = standby
                .query_one(
                    "SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn",
                    &[&lsn],
                )
                .await
                .expect("read the standby's replay position")
                .get(0);
            if replayed {
                return;
            }
            assert!(
                started.elapsed() < LIMIT,
                "the standby never replayed {lsn}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The server started as the primary.
    pub fn primary(&self) -> &Node {
        &self.primary
    }

    /// The server started as the standby.
    pub fn standby(&self) -> &Node {
        &self.standby
    }

    /// One URL naming both servers, primary first, in the multi-host form
    /// libpq and tokio-postgres read
    /// (`postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/<database>?<params>`);
    /// `params` may be empty.
    pub fn url(&self, database: &str, params: &str) -> String {
        let mut url = format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{database}",
            self.primary.port, self.standby.port
        );
        if !params.is_empty() {
            let _ = write!(url, "?{params}");
        }
        url
    }

    /// The folder both servers live in.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in [&self.standby, &self.primary] {
            Node::stop_quietly(&node.programs, &node.data);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A folder for a cluster, under `CHARGEONCE_CLUSTER_DIR` or the temporary
/// folder, owned by the server's user; leftovers of dead processes swept.
fn make_root() -> (Arc<Programs>, PathBuf) {
    let programs = Arc::new(Programs::find());
    let parent = std::env::var_os("CHARGEONCE_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    sweep_leftovers(&programs, &parent);
    let root = parent.join(format!(
        "{FOLDER_PREFIX}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("create {}: {e}", root.display()));
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
        .expect("chmod the cluster folder");
    std::fs::write(root.join("owner.pid"), std::process::id().to_string())
        .expect("write owner.pid");
    programs.hand_over(&root);
    (programs, root)
}

/// `initdb` of `node` and the settings every server here shares.
fn init_node(root: &Path, node: &Node) {
    let programs = &node.programs;
    let mut initdb = programs.command("initdb", root);
    initdb
        .arg("-D")
        .arg(&node.data)
        .args(["-U", "postgres", "--auth=trust", "--encoding=UTF8"])
        .args(["--locale=C", "--no-sync", "--no-instructions"]);
    programs.run(initdb).unwrap_or_else(|e| panic!("{e}"));
    // initdb's pg_hba.conf trusts 127.0.0.1 for databases and for
    // replication alike. authentication_timeout: a connection that arrives
    // while the server stops is served by a process the postmaster does not
    // signal; it waits that long for the client's first packet, and an
    // immediate stop waits for it (the default 60 s made `pg_ctl stop` time
    // out when a stalled client had just connected).
    append(
        &node.data.join("postgresql.conf"),
        "\n# chargeonce_testkit::cluster\n\
         listen_addresses = '127.0.0.1'\n\
         unix_socket_directories = ''\n\
         fsync = off\n\
         shared_buffers = '32MB'\n\
         max_connections = 200\n\
         authentication_timeout = '5s'\n",
    );
}

/// A single private PostgreSQL server without a standby (the chaos run's):
/// on a free port of 127.0.0.1, in a temporary folder like a [`Cluster`]'s,
/// with the same settings but no replication. It can be crashed and
/// started again on the same port. Dropping it stops it and removes the
/// folder.
pub struct Server {
    root: PathBuf,
    node: Node,
}

impl Server {
    /// Creates and starts the server.
    pub async fn start() -> Self {
        Self::start_with("").await
    }

    /// Creates and starts the server with `settings` (lines of
    /// `postgresql.conf`) added to the usual ones.
    pub async fn start_with(settings: &str) -> Self {
        let settings = settings.to_owned();
        tokio::task::spawn_blocking(move || {
            let (programs, root) = make_root();
            let mut server = Self {
                node: Node {
                    name: "primary",
                    port: free_port(),
                    data: root.join("primary"),
                    log: root.join("primary.log"),
                    programs,
                },
                root,
            };
            init_node(&server.root, &server.node);
            append(&server.node.data.join("postgresql.conf"), &settings);
            server.node.start_blocking();
            server
        })
        .await
        .expect("server start-up thread")
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// `pg_ctl -m immediate stop` (a crash: no checkpoint, every backend
    /// gone at once), then a start on the same port with crash recovery.
    /// Returns how long the server was away. Panics if the port was taken
    /// in between (the server would have moved, and proxies pointing at it
    /// would be wrong).
    pub async fn restart_immediate(&mut self) -> Duration {
        let started = Instant::now();
        self.node.stop_immediate().await;
        self.start_again().await;
        started.elapsed()
    }

    /// Starts the stopped server again on its port (with crash recovery
    /// after an immediate stop). Panics if the port was taken meanwhile.
    pub async fn start_again(&mut self) {
        let port = self.node.port;
        let mut node = Node {
            name: self.node.name,
            port,
            data: self.node.data.clone(),
            log: self.node.log.clone(),
            programs: self.node.programs.clone(),
        };
        let node = tokio::task::spawn_blocking(move || {
            node.start_blocking();
            node
        })
        .await
        .expect("server start-up thread");
        assert_eq!(
            node.port, port,
            "the server's port was taken while it was down"
        );
        self.node = node;
    }

    /// The folder the server lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        Node::stop_quietly(&self.node.programs, &self.node.data);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn append(file: &Path, text: &str) {
    use std::io::Write;
    let mut opened = std::fs::OpenOptions::new()
        .append(true)
        .open(file)
        .unwrap_or_else(|e| panic!("open {}: {e}", file.display()));
    opened
        .write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
}

/// Stops and removes the clusters of test processes that died without
/// dropping them (their `owner.pid` names no live process).
fn sweep_leftovers(programs: &Programs, parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let is_ours = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with(FOLDER_PREFIX));
        if !is_ours {
            continue;
        }
        let root = entry.path();
        let owner = std::fs::read_to_string(root.join("owner.pid"))
            .ok()
            .and_then(|pid| pid.trim().parse::<u32>().ok());
        let leftover = match owner {
            Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
            // Being made by another process right now, unless it is old.
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|modified| modified.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(3600)),
        };
        if !leftover {
            continue;
        }
        for node in ["standby", "primary"] {
            Node::stop_quietly(programs, &root.join(node));
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
