//! A TCP proxy that fails the way networks do, after crates.io's
//! `ChaosProxy`: it forwards, or *stalls* (keeps every socket open and
//! forwards nothing: a partition as a client meets it, with no error), or
//! *cuts* (closes every connection and refuses new ones: a crash or a
//! firewall reset). Independently it can *lose replies*: the request reaches
//! the server, the server's answer is dropped with the connection, so the
//! work is done and the client sees an error.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Decides from a request's bytes whether the answer to it is lost.
type Picker = Box<dyn FnMut(&[u8]) -> bool + Send>;

pub struct Proxy {
    pub port: u16,
    state: watch::Sender<State>,
    task: tokio::task::JoinHandle<()>,
    lost: Arc<Mutex<u64>>,
    picker: Arc<Mutex<Option<Picker>>>,
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
        let picker = Arc::new(Mutex::new(None));
        let loss = Loss {
            rng: Arc::new(Mutex::new(StdRng::seed_from_u64(seed))),
            lost: lost.clone(),
            picker: picker.clone(),
        };
        let task = tokio::spawn(accept_loop(listener, target, watcher, loss));
        Self {
            port,
            state,
            task,
            lost,
            picker,
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

    /// From now on, drop the answer to each request for which `pick`, shown
    /// the request's bytes as they arrive, returns true (on top of any
    /// random loss): a test chooses exactly which requests lose their answer.
    pub fn lose_replies_to(&self, pick: impl FnMut(&[u8]) -> bool + Send + 'static) {
        *lock(&self.picker) = Some(Box::new(pick));
    }

    /// How many answers were dropped so far.
    pub fn replies_lost(&self) -> u64 {
        *lock(&self.lost)
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
    loss: Loss,
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
                let loss = loss.clone();
                connections.spawn(async move {
                    let Ok(outbound) = TcpStream::connect(target).await else { return };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (client_read, client_write) = inbound.into_split();
                    let (server_read, server_write) = outbound.into_split();
                    let turn = Arc::new(Turn::default());
                    tokio::select! {
                        () = pump(client_read, server_write, state.clone(), &loss, &turn, Side::Client) => {}
                        () = pump(server_read, client_write, state, &loss, &turn, Side::Server) => {}
                    }
                });
                // Reap finished connections so the set does not grow.
                while connections.try_join_next().is_some() {}
            }
        }
    }
}

/// What decides whether an answer is lost, shared by all connections.
#[derive(Clone)]
struct Loss {
    rng: Arc<Mutex<StdRng>>,
    lost: Arc<Mutex<u64>>,
    picker: Arc<Mutex<Option<Picker>>>,
}

/// One connection's request/answer turn.
#[derive(Default)]
struct Turn {
    /// The client sent bytes since the last answer began: the next bytes
    /// from the server start an answer, which draws once whether it is lost,
    /// however many chunks it comes in.
    asked: AtomicBool,
    /// The picker chose the request's answer to be lost.
    doomed: AtomicBool,
}

/// The direction a pump copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Server,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// Copies one direction. While stalled it reads nothing (so bytes pile up in
/// the kernel buffers and the peer eventually blocks); cut ends it. On the
/// server's side, the first chunk of each answer draws once whether the
/// answer is dropped together with the connection.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut state: watch::Receiver<State>,
    loss: &Loss,
    turn: &Turn,
    side: Side,
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
        match side {
            // Raised before the bytes go out: no answer can come earlier.
            Side::Client => {
                turn.asked.store(true, Ordering::SeqCst);
                if lock(&loss.picker)
                    .as_mut()
                    .is_some_and(|pick| pick(&buffer[..n]))
                {
                    turn.doomed.store(true, Ordering::SeqCst);
                }
            }
            Side::Server if turn.asked.swap(false, Ordering::SeqCst) => {
                let doomed = turn.doomed.swap(false, Ordering::SeqCst);
                let roll: f64 = lock(&loss.rng).gen();
                if doomed || roll < current.reply_loss {
                    *lock(&loss.lost) += 1;
                    return;
                }
            }
            Side::Server => {}
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}
