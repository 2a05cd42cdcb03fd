//! Opening a connection when `database.url` names several hosts (a primary
//! and its standbys, tried in turn until one gives a read-write session).
//!
//! tokio-postgres tries the hosts one after the other itself, but bounds
//! only each TCP connect by `connect_timeout`: a host that accepts the
//! connection and then never answers (a hung server, a partition behind a
//! proxy) keeps the attempt on that host for good. With the pool's bound on
//! the whole attempt, the next host was never tried, and a failover never
//! reached the new primary. Here each host gets `connect_timeout` for all of
//! it (TCP, start-up, authentication, the `target_session_attrs` check), then
//! the next one is tried; the caller bounds the whole attempt by
//! [`Connector::bound`], one `connect_timeout` per host.
//!
//! The host that took the last connection is tried first next time, by
//! every pool of the process (the HTTP workers' and the background one):
//! once one of them has found the new primary, the others do not spend a
//! `connect_timeout` on the old one first, and `/readyz`, bounded by a
//! second, does not keep failing on a pool that has no connection yet.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::Connect;
use futures_util::future::BoxFuture;
use rand::seq::SliceRandom;
use tokio_postgres::config::{Host, LoadBalanceHosts, TargetSessionAttrs};
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Config, Connection, NoTls, Socket};

/// For each list of hosts (`host:port,host:port`), the index of the host
/// that took the last connection.
static LAST_USED: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());

/// Connects to the first host of a configuration that takes us.
#[derive(Debug, Clone)]
pub struct Connector {
    /// One configuration per host, in the order of the URL.
    hosts: Vec<Config>,
    /// The hosts, for `LAST_USED`.
    key: String,
    per_host: Duration,
    shuffle: bool,
}

impl Connector {
    pub fn new(config: &Config, per_host: Duration) -> Self {
        let count = config.get_hosts().len().max(config.get_hostaddrs().len());
        let hosts = if count > 1 {
            (0..count).map(|index| one_host(config, index)).collect()
        } else {
            vec![config.clone()]
        };
        let key = hosts.iter().map(describe).collect::<Vec<_>>().join(",");
        Self {
            hosts,
            key,
            per_host,
            shuffle: config.get_load_balance_hosts() == LoadBalanceHosts::Random,
        }
    }

    /// How long a whole attempt may take: `per_host` for each host.
    pub fn bound(&self) -> Duration {
        self.per_host
            .saturating_mul(u32::try_from(self.hosts.len()).unwrap_or(u32::MAX))
    }

    /// The order to try the hosts in: the one used last, then the others
    /// in the order of the URL (or all shuffled, with
    /// `load_balance_hosts=random`).
    fn order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.hosts.len()).collect();
        if self.shuffle {
            order.shuffle(&mut rand::thread_rng());
        } else if let Some(&last) = self.last_used().get(&self.key) {
            if let Some(position) = order.iter().position(|&index| index == last) {
                order.remove(position);
                order.insert(0, last);
            }
        }
        order
    }

    fn last_used(&self) -> std::sync::MutexGuard<'static, BTreeMap<String, usize>> {
        LAST_USED.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection to the first host that takes it. Every host but the
    /// last one tried gets `per_host`; the last has no bound here, so its
    /// own error (refused, read-only, …) is the one returned, and the
    /// caller's bound ([`Connector::bound`]) ends a wait for a host that
    /// hangs.
    pub async fn connect(
        &self,
    ) -> Result<(Client, Connection<Socket, NoTlsStream>), tokio_postgres::Error> {
        let order = self.order();
        let Some((&last, others)) = order.split_last() else {
            // No host at all: tokio-postgres says so.
            return Config::new().connect(NoTls).await;
        };
        for &index in others {
            let config = &self.hosts[index];
            match tokio::time::timeout(self.per_host, config.connect(NoTls)).await {
                Ok(Ok(connected)) => {
                    self.used(index);
                    return Ok(connected);
                }
                Ok(Err(error)) => {
                    tracing::debug!(host = %describe(config), %error, "cannot use this database host; trying the next");
                }
                Err(_) => {
                    tracing::debug!(host = %describe(config), "database host did not answer in time; trying the next");
                }
            }
        }
        let connected = self.hosts[last].connect(NoTls).await?;
        self.used(last);
        Ok(connected)
    }

    fn used(&self, index: usize) {
        if self.hosts.len() > 1 {
            self.last_used().insert(self.key.clone(), index);
        }
    }
}

impl Connect for Connector {
    fn connect(
        &self,
        _: &Config,
    ) -> BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>> {
        Box::pin(async move {
            let (client, connection) = Connector::connect(self).await?;
            let task = tokio::spawn(async move {
                if let Err(error) = connection.await {
                    // As deadpool's own connector says it.
                    tracing::warn!(target: "deadpool.postgres", "Connection error: {error}");
                }
            });
            Ok((client, task))
        })
    }
}

/// chargeonce writes on every request, so when the URL names several hosts
/// (a primary and its standbys) a session is of use only on the one that
/// takes writes. tokio-postgres, like libpq, defaults to
/// `target_session_attrs=any`: the first host that answers, which may be a
/// standby (after a failover, the old primary's host often comes back as
/// one). So with several hosts, `any`, given or not, is taken as
/// `read-write`.
pub fn prefer_read_write(config: &mut Config) {
    let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
    if hosts > 1 && config.get_target_session_attrs() == TargetSessionAttrs::Any {
        config.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
}

/// `host:port` of a one-host configuration, for log lines.
fn describe(config: &Config) -> String {
    let host = match config.get_hostaddrs().first() {
        Some(address) => address.to_string(),
        None => match config.get_hosts().first() {
            Some(Host::Tcp(name)) => name.clone(),
            Some(Host::Unix(path)) => path.display().to_string(),
            None => String::new(),
        },
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// The configuration for host number `index` alone: every setting of
/// `config`, that host (and its `hostaddr` and port, if given), and no load
/// balancing (the `Connector` orders the hosts).
fn one_host(config: &Config, index: usize) -> Config {
    let mut one = Config::new();
    if let Some(user) = config.get_user() {
        one.user(user);
    }
    if let Some(password) = config.get_password() {
        one.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        one.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        one.options(options);
    }
    if let Some(name) = config.get_application_name() {
        one.application_name(name);
    }
    one.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation());
    match config.get_hosts().get(index) {
        Some(Host::Tcp(host)) => {
            one.host(host);
        }
        Some(Host::Unix(path)) => {
            one.host_path(path);
        }
        None => {}
    }
    if let Some(address) = config.get_hostaddrs().get(index) {
        one.hostaddr(*address);
    }
    let ports = config.get_ports();
    if let Some(port) = ports.get(index).or(ports.first()) {
        one.port(*port);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        one.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        one.tcp_user_timeout(*timeout);
    }
    one.keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle());
    if let Some(interval) = config.get_keepalives_interval() {
        one.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        one.keepalives_retries(retries);
    }
    one.target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding());
    one
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS: &str = "options=-c%20work_mem%3D8MB&application_name=app&sslmode=disable\
        &connect_timeout=7&tcp_user_timeout=9&keepalives=1&keepalives_idle=11\
        &keepalives_interval=13&keepalives_retries=4&target_session_attrs=read-write\
        &channel_binding=disable";

    fn parse(url: &str) -> Config {
        url.parse().unwrap()
    }

    #[test]
    fn each_host_keeps_every_other_setting() {
        let both = parse(&format!(
            "postgres://u:secret@one:5433,two:5434/db?{PARAMS}"
        ));
        let connector = Connector::new(&both, Duration::from_secs(1));
        assert_eq!(connector.hosts.len(), 2);
        for (config, url) in connector.hosts.iter().zip([
            format!("postgres://u:secret@one:5433/db?{PARAMS}"),
            format!("postgres://u:secret@two:5434/db?{PARAMS}"),
        ]) {
            let expected = parse(&url);
            // Debug shows every setting but the password and the TLS
            // negotiation; those are compared on their own.
            assert_eq!(format!("{config:?}"), format!("{expected:?}"));
            assert_eq!(config.get_password(), Some(&b"secret"[..]));
            assert_eq!(config.get_ssl_negotiation(), expected.get_ssl_negotiation());
        }
        assert_eq!(connector.bound(), Duration::from_secs(2));
    }

    #[test]
    fn one_port_serves_every_host_and_hostaddrs_pair_with_hosts() {
        let config = parse("host=a,b hostaddr=127.0.0.1,127.0.0.2 port=6000 user=u");
        let connector = Connector::new(&config, Duration::from_millis(500));
        let described: Vec<String> = connector.hosts.iter().map(describe).collect();
        assert_eq!(described, ["127.0.0.1:6000", "127.0.0.2:6000"]);
        assert_eq!(connector.hosts[1].get_hosts(), &[Host::Tcp("b".to_owned())]);
    }

    #[test]
    fn the_host_used_last_is_tried_first_then_the_others_in_order() {
        let config = parse("postgres://u@first:1,second:2,third:3/db");
        let connector = Connector::new(&config, Duration::from_secs(1));
        assert_eq!(connector.order(), [0, 1, 2]);
        connector.used(2);
        assert_eq!(connector.order(), [2, 0, 1]);
        // Every pool of the process shares what was learnt.
        let other_pool = Connector::new(&config, Duration::from_secs(1));
        assert_eq!(other_pool.order(), [2, 0, 1]);
        connector.used(0);
        assert_eq!(other_pool.order(), [0, 1, 2]);
        // Another list of hosts is another entry.
        let elsewhere = Connector::new(
            &parse("postgres://u@first:1,second:2/db"),
            Duration::from_secs(1),
        );
        assert_eq!(elsewhere.order(), [0, 1]);
    }

    #[test]
    fn several_hosts_mean_a_read_write_session_unless_read_only_is_asked() {
        let attrs = |url: &str| {
            let mut config = parse(url);
            prefer_read_write(&mut config);
            config.get_target_session_attrs()
        };
        assert_eq!(attrs("postgres://u@a,b/db"), TargetSessionAttrs::ReadWrite);
        assert_eq!(
            attrs("postgres://u@a,b/db?target_session_attrs=any"),
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(
            attrs("postgres://u@a,b/db?target_session_attrs=read-only"),
            TargetSessionAttrs::ReadOnly
        );
        assert_eq!(attrs("postgres://u@a/db"), TargetSessionAttrs::Any);
    }

    #[test]
    fn a_single_host_is_left_as_it_is() {
        let config = parse("postgres://u@h:1/db?target_session_attrs=any");
        let connector = Connector::new(&config, Duration::from_secs(1));
        assert_eq!(format!("{:?}", connector.hosts), format!("{:?}", [config]));
        assert_eq!(connector.bound(), Duration::from_secs(1));
    }
}
