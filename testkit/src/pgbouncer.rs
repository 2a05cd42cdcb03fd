//! A PgBouncer in transaction pooling mode in front of the test PostgreSQL,
//! on a free port, for running the API suite the way many deployments run
//! the service. Needs Debian's `pgbouncer` package.
//!
//! PgBouncer refuses to run as root, so as root it runs as the `postgres`
//! user. It is started through a small shell watchdog that stops it when
//! the test process is gone, since a process-wide instance is never dropped.
//!
//! The user it is started for is also its admin (`admin_users`), so a test
//! can read the admin console (`SHOW CLIENTS` on the `pgbouncer` database):
//! through PgBouncer, PostgreSQL's backends are PgBouncer's, and only there
//! are the service's own connections seen.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PgBouncer {
    pub port: u16,
    /// The user it lets in, and its admin.
    user: String,
    dir: PathBuf,
    _child: Child,
}

/// The user PgBouncer runs as when we are root.
const RUN_AS: &str = "postgres";

impl PgBouncer {
    /// Starts PgBouncer forwarding every database to the server of
    /// `server_url`, with trust authentication for `user`, its admin too.
    pub fn start(server_url: &str, user: &str) -> Self {
        let server = url::Url::parse(server_url).expect("a URL");
        let host = server.host_str().unwrap_or("127.0.0.1").to_owned();
        let server_port = server.port().unwrap_or(5432);
        // PGBOUNCER_PATH, else Debian's package (as scripts/lib/prereqs.sh looks).
        let chosen = std::env::var("PGBOUNCER_PATH").ok();
        let binary = chosen
            .iter()
            .map(String::as_str)
            .chain(["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"])
            .find(|path| std::path::Path::new(path).exists())
            .unwrap_or_else(|| panic!("PgBouncer is not installed: apt-get install -y pgbouncer"));
        let dir = std::env::temp_dir().join(format!(
            "chargeonce-pgbouncer-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        ));
        std::fs::create_dir_all(&dir).expect("pgbouncer folder");
        let port = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("address").port()
        };
        let config = format!(
            "[databases]\n\
             * = host={host} port={server_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {users}\n\
             admin_users = {user}\n\
             pool_mode = transaction\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             max_client_conn = 5000\n\
             default_pool_size = 40\n\
             logfile = {log}\n",
            users = dir.join("users.txt").display(),
            log = dir.join("pgbouncer.log").display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), config).expect("pgbouncer.ini");
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n")).expect("users");
        let root = nix_is_root();
        if root {
            let status = Command::new("chown")
                .args(["-R", RUN_AS])
                .arg(&dir)
                .status()
                .expect("chown");
            assert!(status.success(), "chown the pgbouncer folder");
        }
        // Stops PgBouncer once the test process (argument 2) is gone.
        let watchdog = "\"$1\" \"$2\" & child=$!; \
                        while [ -d /proc/\"$3\" ] && kill -0 \"$child\" 2>/dev/null; do sleep 1; done; \
                        kill \"$child\" 2>/dev/null";
        let mut command = if root {
            let mut command = Command::new("runuser");
            command.args(["-u", RUN_AS, "--", "sh", "-c", watchdog, "sh"]);
            command
        } else {
            let mut command = Command::new("sh");
            command.args(["-c", watchdog, "sh"]);
            command
        };
        let child = command
            .arg(binary)
            .arg(dir.join("pgbouncer.ini"))
            .arg(std::process::id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "PgBouncer did not start; see {}",
                dir.join("pgbouncer.log").display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            port,
            user: user.to_owned(),
            dir,
            _child: child,
        }
    }

    /// Where it listens, for a fault proxy put in front of it.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// A connection to the admin console (the `pgbouncer` database), which
    /// takes simple queries only (`SHOW …`).
    pub async fn admin(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::Config::new()
            .host("127.0.0.1")
            .port(self.port)
            .user(&self.user)
            .dbname("pgbouncer")
            .connect(tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("PgBouncer's admin console: {e}"));
        tokio::spawn(connection);
        client
    }

    /// How many client connections named `application_name` are open to
    /// `database` now (`SHOW CLIENTS` on the admin console `admin`), waiting
    /// for a server connection or not.
    pub async fn clients(
        admin: &tokio_postgres::Client,
        database: &str,
        application_name: &str,
    ) -> usize {
        admin
            .simple_query("SHOW CLIENTS")
            .await
            .expect("SHOW CLIENTS")
            .iter()
            .filter(|message| match message {
                tokio_postgres::SimpleQueryMessage::Row(row) => {
                    row.get("database") == Some(database)
                        && row.get("application_name") == Some(application_name)
                }
                _ => false,
            })
            .count()
    }

    /// `url` (a database on the server) through this PgBouncer.
    pub fn url_for(&self, database_url: &str) -> String {
        let mut url = url::Url::parse(database_url).expect("a URL");
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(self.port)).expect("port");
        url.to_string()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("pgbouncer.log")
    }
}

fn nix_is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
