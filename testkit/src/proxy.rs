//! A TCP proxy that fails the way networks do, after crates.io's
//! `ChaosProxy`: it forwards, or *stalls* (keeps every socket open and
//! forwards nothing: a partition as a client meets it, with no error), or
//! *cuts* (closes every connection and refuses new ones: a crash or a
//! firewall reset). Independently it can *lose replies*: the request reaches
//! the server, the server's answer is dropped with the connection, so the
//! work is done and the client sees an error.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    Forward,
    Stall,
    Cut,
}

#[derive(Debug, Clone, Copy)]
struct State {
    mode: ProxyMode,
    /// Chance that an answer from the target is dropped with its connection.
    reply_loss: f64,
}

pub struct Proxy {
    pub port: u16,
    state: watch::Sender<State>,
    task: tokio::task::JoinHandle<()>,
    lost: Arc<Mutex<u64>>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("address"), target, 1).await
    }

    /// Listens on `listen`; `seed` makes reply losses reproducible.
    pub async fn start_on(listen: SocketAddr, target: SocketAddr, seed: u64) -> Self {
        let listener = TcpListener::bind(listen).await.expect("bind proxy");
        let port = listener.local_addr().expect("local address").port();
        let (state, watcher) = watch::channel(State {
            mode: ProxyMode::Forward,
            reply_loss: 0.0,
        });
        let lost = Arc::new(Mutex::new(0));
        let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
        let task = tokio::spawn(accept_loop(listener, target, watcher, rng, lost.clone()));
        Self {
            port,
            state,
            task,
            lost,
        }
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        self.state.send_modify(|state| state.mode = mode);
    }

    pub fn mode(&self) -> ProxyMode {
        self.state.borrow().mode
    }

    /// From now on, drop each answer of the target with probability `p`.
    pub fn set_reply_loss(&self, p: f64) {
        self.state.send_modify(|state| state.reply_loss = p);
    }

    /// How many answers were dropped so far.
    pub fn replies_lost(&self) -> u64 {
        *self.lost.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `url` (a `postgres://` or `http://` URL) with host and port replaced
    /// by this proxy's.
    pub fn url_for(&self, url: &str) -> String {
        let mut parsed = url::Url::parse(url).expect("a URL");
        parsed.set_host(Some("127.0.0.1")).expect("host");
        parsed.set_port(Some(self.port)).expect("port");
        parsed.to_string()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mut watcher: watch::Receiver<State>,
    rng: Arc<Mutex<StdRng>>,
    lost: Arc<Mutex<u64>>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            changed = watcher.changed() => {
                if changed.is_err() {
                    return;
                }
                if watcher.borrow().mode == ProxyMode::Cut {
                    // Dropping the tasks closes both sockets of each.
                    connections.abort_all();
                }
            }
            accepted = listener.accept() => {
                let Ok((inbound, _)) = accepted else { continue };
                if watcher.borrow().mode == ProxyMode::Cut {
                    drop(inbound);
                    continue;
                }
                let state = watcher.clone();
                let rng = rng.clone();
                let lost = lost.clone();
                connections.spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (client_read, client_write) = inbound.into_split();
                    let (server_read, server_write) = outbound.into_split();
                    let no_loss = Arc::new(Mutex::new(StdRng::seed_from_u64(0)));
                    tokio::select! {
                        () = pump(client_read, server_write, state.clone(), no_loss, None) => {}
                        () = pump(server_read, client_write, state, rng, Some(lost)) => {}
                    }
                });
                // Reap finished connections so the set does not grow.
                while connections.try_join_next().is_some() {}
            }
        }
    }
}

/// Copies one direction. While stalled it reads nothing (so bytes pile up in
/// the kernel buffers and the peer eventually blocks); cut ends it. With
/// `lost` set, each chunk may be dropped together with the connection.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    rng: Arc<Mutex<StdRng>>,
    lost: Option<Arc<Mutex<u64>>>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let current = *state.borrow_and_update();
        match current.mode {
            ProxyMode::Cut => return,
            ProxyMode::Stall => {
                if state.changed().await.is_err() {
                    return;
                }
                continue;
            }
            ProxyMode::Forward => {}
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            changed = state.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(lost) = &lost {
            let roll: f64 = rng.lock().unwrap_or_else(|p| p.into_inner()).gen();
            if roll < current.reply_loss {
                *lost.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                return;
            }
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
