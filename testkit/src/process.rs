//! Real child processes (the service, psp-sim) for tests and tools. A
//! process listens on port 0 and announces the port it bound in a log line
//! (`… listening … port=N`); picking a free port first and passing it on
//! races with other tests, which may take the port in between.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a process may take to announce its port and become ready.
const START_LIMIT: Duration = Duration::from_secs(20);

/// A child process, killed when dropped. Its stderr is its log: read to the
/// end (so the pipe never fills), kept in memory and shown with `TEST_LOG`
/// set; or, with [`SpawnOptions::log_file`], written straight to a file.
pub struct Spawned {
    pub child: Child,
    pub port: u16,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    log: Log,
}

/// Where a process's log goes.
enum Log {
    Memory(Arc<Mutex<Vec<String>>>),
    /// Appended to this file; this process's lines start at `from`.
    File {
        path: PathBuf,
        from: u64,
    },
}

/// How [`Spawned::start_with`] starts a process.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// Append the process's stderr to this file instead of keeping it in
    /// memory: for a process that logs a lot for a long time (a service
    /// under load), whose log would grow without bound in the parent, and
    /// whose lines should cost the parent nothing. One process at a time
    /// per file: the port is looked for in the lines written since the
    /// spawn.
    pub log_file: Option<PathBuf>,
    /// How often to look for the announced port and ask the ready path;
    /// short when the time to become ready is what is measured.
    pub poll: Duration,
}

impl Default for SpawnOptions {
    fn default() -> Self {
        Self {
            log_file: None,
            poll: Duration::from_millis(10),
        }
    }
}

/// The port in a `… listening … port=N` log line, text or JSON.
pub fn announced_port(line: &str) -> Option<u16> {
    if !line.contains(" listening") {
        return None;
    }
    line.split(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}')
        .find_map(|field| {
            field
                .strip_prefix("port=")
                .or_else(|| field.strip_prefix("\"port\":"))
        })
        .and_then(|port| port.trim_matches('"').parse().ok())
        .filter(|&port| port != 0)
}

impl Spawned {
    /// Starts `command` (which must listen on port 0 and log its port),
    /// then waits until `ready_path` answers 200.
    pub async fn start(command: Command, ready_path: &str) -> Self {
        Self::start_with(command, ready_path, SpawnOptions::default()).await
    }

    /// [`Spawned::start`] with a log file or another poll interval.
    pub async fn start_with(command: Command, ready_path: &str, options: SpawnOptions) -> Self {
        Self::try_start_with(command, ready_path, options)
            .await
            .unwrap_or_else(|message| panic!("{message}"))
    }

    /// [`Spawned::start_with`] for a caller that expects a start to fail at
    /// times (a tool restarting a service while its database is down): the
    /// reason, with the process's log, instead of a panic.
    pub async fn try_start_with(
        mut command: Command,
        ready_path: &str,
        options: SpawnOptions,
    ) -> Result<Self, String> {
        let (mut child, log, port_rx) = match &options.log_file {
            None => spawn_logging_to_memory(&mut command),
            Some(path) => spawn_logging_to_file(&mut command, path),
        };
        let started = Instant::now();
        let port = loop {
            let announced = match &port_rx {
                Some(port_rx) => port_rx.try_recv().ok(),
                None => log.lines().iter().find_map(|line| announced_port(line)),
            };
            if let Some(port) = announced {
                break port;
            }
            if let Some(status) = child.try_wait().expect("try_wait") {
                let log = log.lines().join("\n");
                return Err(format!(
                    "{command:?} exited before listening: {status}\n{log}"
                ));
            }
            if started.elapsed() >= START_LIMIT {
                // Not left running: a `Child` is not killed when dropped.
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{command:?} never said which port it listens on"));
            }
            tokio::time::sleep(options.poll).await;
        };
        let spawned = Self {
            child,
            port,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        // On failure `spawned` is dropped, which kills the process.
        spawned.wait_ready(ready_path, options.poll).await?;
        Ok(spawned)
    }

    async fn wait_ready(&self, path: &str, poll: Duration) -> Result<(), String> {
        let started = Instant::now();
        let address = format!("127.0.0.1:{}", self.port);
        loop {
            if http_get_status(&address, path).await == Some(200) {
                return Ok(());
            }
            if started.elapsed() >= START_LIMIT {
                return Err(format!("{}{path} never became ready", self.url));
            }
            tokio::time::sleep(poll).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log lines written so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lines()
    }

    /// The first log line for which `wanted` holds, waiting for it up to
    /// `limit`; panics with the whole log if none comes.
    pub async fn wait_for_line(&self, limit: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let started = std::time::Instant::now();
        loop {
            let log = self.log();
            if let Some(line) = log.iter().find(|line| wanted(line)) {
                return line.clone();
            }
            assert!(
                started.elapsed() < limit,
                "no such line within {limit:?}: {log:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends `signal` (e.g. `Signal::SIGTERM`, `Signal::SIGKILL`).
    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits i32"));
        kill(pid, signal).unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
    }

    /// Waits for the process to exit by itself, at most `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if started.elapsed() > limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Spawns with stderr piped to a thread that keeps (and with `TEST_LOG`
/// shows) every line and sends the announced port.
fn spawn_logging_to_memory(
    command: &mut Command,
) -> (Child, Log, Option<std::sync::mpsc::Receiver<u16>>) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let stderr = child.stderr.take().expect("piped stderr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let lines = log.clone();
    std::thread::spawn(move || {
        let show = std::env::var_os("TEST_LOG").is_some();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if show {
                eprintln!("{line}");
            }
            if let Some(port) = announced_port(&line) {
                let _ = port_tx.send(port);
            }
            lines.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    (child, Log::Memory(log), Some(port_rx))
}

/// Spawns with stderr appended to `path` directly: no thread of ours reads
/// it, so a process that logs every request costs its parent nothing.
fn spawn_logging_to_file(
    command: &mut Command,
    path: &std::path::Path,
) -> (Child, Log, Option<std::sync::mpsc::Receiver<u16>>) {
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let from = file
        .metadata()
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
        .len();
    let child = command
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    let log = Log::File {
        path: path.to_owned(),
        from,
    };
    (child, log, None)
}

impl Log {
    fn lines(&self) -> Vec<String> {
        match self {
            Self::Memory(lines) => lines.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            Self::File { path, from } => {
                let mut text = String::new();
                // A log that cannot be read shows as empty; the caller's
                // message still names the process.
                let _ = File::open(path).and_then(|mut file| {
                    file.seek(SeekFrom::Start(*from))?;
                    file.read_to_string(&mut text)
                });
                text.lines().map(str::to_owned).collect()
            }
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's memory in bytes from `/proc/<pid>/status` (`pid` may be
/// `self`): `field` `VmHWM:` for the most it has had resident, `VmRSS:` for
/// now.
pub fn memory_bytes(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix(field))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// The status of `GET path` on `address`, or `None` if there is no answer.
/// Hand-written over a TCP stream so the kit needs no HTTP client: it asks
/// one question, with `Connection: close`, and reads the status line.
async fn http_get_status(address: &str, path: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_read_from_text_and_json_lines() {
        assert_eq!(
            announced_port(
                "INFO chargeonce::startup: chargeonce listening address=127.0.0.1:0 port=4321"
            ),
            Some(4321)
        );
        assert_eq!(
            announced_port(r#"{"fields":{"message":"psp-sim listening","port":555}}"#),
            Some(555)
        );
        assert_eq!(announced_port("listening port=0"), None);
        assert_eq!(announced_port("something else port=80"), None);
    }

    #[test]
    fn this_process_has_resident_memory() {
        let now = memory_bytes("self", "VmRSS:").unwrap();
        assert!(now > 0 && memory_bytes("self", "VmHWM:").unwrap() >= now);
        assert_eq!(memory_bytes("self", "NoSuch:"), None);
    }
}
