//! Real child processes (the service, psp-sim) for tests and tools. A
//! process listens on port 0 and announces the port it bound in a log line
//! (`… listening … port=N`); picking a free port first and passing it on
//! races with other tests, which may take the port in between.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a process may take to announce its port and become ready.
const START_LIMIT: Duration = Duration::from_secs(20);

/// A child process, killed when dropped. Its stderr is read to the end (so
/// the pipe never fills), kept in `log`, and shown with `TEST_LOG` set.
pub struct Spawned {
    pub child: Child,
    pub port: u16,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    log: Arc<Mutex<Vec<String>>>,
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
    pub async fn start(mut command: Command, ready_path: &str) -> Self {
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
        let started = Instant::now();
        let port = loop {
            if let Ok(port) = port_rx.try_recv() {
                break port;
            }
            if let Some(status) = child.try_wait().expect("try_wait") {
                let log = log.lock().unwrap_or_else(|p| p.into_inner()).join("\n");
                panic!("{command:?} exited before listening: {status}\n{log}");
            }
            assert!(
                started.elapsed() < START_LIMIT,
                "{command:?} never said which port it listens on"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let spawned = Self {
            child,
            port,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        spawned.wait_ready(ready_path).await;
        spawned
    }

    async fn wait_ready(&self, path: &str) {
        let started = Instant::now();
        let address = format!("127.0.0.1:{}", self.port);
        loop {
            if http_get_status(&address, path).await == Some(200) {
                return;
            }
            assert!(
                started.elapsed() < START_LIMIT,
                "{}{path} never became ready",
                self.url
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log lines written so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
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

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
}
