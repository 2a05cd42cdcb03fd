//! Which addresses webhooks may go to. Merchants choose endpoint URLs, so
//! without a rule a merchant could make the service send requests into its
//! own network: to a database's HTTP port, an admin interface on loopback,
//! the cloud metadata service (169.254.169.254). With
//! `webhooks.allow_private_targets = false` (production), a host that is or
//! resolves to a loopback, private (RFC 1918, fc00::/7), link-local
//! (169.254/16, fe80::/10) or unspecified address (0.0.0.0/8, `::`; also as
//! an IPv4-mapped IPv6 address) is refused:
//!
//! - when an endpoint is created (`TargetPolicy::check`: a 400 naming `url`);
//! - at every delivery attempt, because DNS answers can change after the
//!   check. The sender's HTTP client resolves through `PublicOnlyResolver`,
//!   which fails the connection if any address of the host is private, so
//!   the address checked is the address connected to (no second lookup an
//!   attacker's DNS could answer differently). A URL whose host is an IP
//!   literal is never resolved; `TargetPolicy::check_literal` covers it.
//!
//! Refusing a host when *any* of its addresses is private, rather than
//! skipping those addresses, keeps the rule simple: such a host is
//! misconfigured or hostile either way.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use url::{Host, Url};

/// Longest wait for DNS when an endpoint is created.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetRefused {
    #[error(
        "{host} is or resolves to {ip}, a loopback, private, link-local or unspecified \
         address; webhooks are not sent to those (webhooks.allow_private_targets)"
    )]
    Private { host: String, ip: IpAddr },
    #[error("the host {host} cannot be resolved: {reason}")]
    Unresolvable { host: String, reason: String },
}

/// Whether webhooks may go to private addresses (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct TargetPolicy {
    allow_private: bool,
}

impl TargetPolicy {
    pub fn new(allow_private: bool) -> Self {
        Self { allow_private }
    }

    pub fn allows_private(&self) -> bool {
        self.allow_private
    }

    /// The check when an endpoint is created: the host's addresses, as DNS
    /// gives them now, must all be public. Nothing to check (and no lookup)
    /// when private targets are allowed.
    pub async fn check(&self, url: &Url) -> Result<(), TargetRefused> {
        if self.allow_private {
            return Ok(());
        }
        match url.host() {
            Some(Host::Domain(domain)) => {
                let port = url.port_or_known_default().unwrap_or(443);
                resolve_public(domain, port).await.map(drop)
            }
            _ => self.check_literal(url),
        }
    }

    /// The check of a URL whose host is an IP literal, which is connected to
    /// without resolving. Host names pass here; `PublicOnlyResolver` checks
    /// them when they are resolved.
    pub fn check_literal(&self, url: &Url) -> Result<(), TargetRefused> {
        let ip = match url.host() {
            _ if self.allow_private => return Ok(()),
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
            _ => return Ok(()),
        };
        if is_private(ip) {
            return Err(TargetRefused::Private {
                host: url.host_str().unwrap_or_default().to_owned(),
                ip,
            });
        }
        Ok(())
    }
}

/// Whether `ip` is one of the addresses webhooks must not reach when
/// private targets are not allowed.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_private_v4(ip),
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            // ::ffff:127.0.0.1 reaches 127.0.0.1.
            Some(v4) => is_private_v4(v4),
            None => is_private_v6(ip),
        },
    }
}

fn is_private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    ip.is_loopback()           // 127.0.0.0/8
        || ip.is_private()     // 10/8, 172.16/12, 192.168/16
        || ip.is_link_local()  // 169.254/16, cloud metadata among them
        // 0.0.0.0/8, "this network": Linux connects 0.0.0.0 to the local host.
        || a == 0
        // 100.64/10, shared address space (carrier NAT; Alibaba Cloud's
        // metadata service is 100.100.100.200).
        || (a == 100 && b & 0xc0 == 64)
        || (a == 192 && b == 0 && c == 0) // 192.0.0.0/24, protocol assignments
        || (a == 198 && b & 0xfe == 18)   // 198.18/15, benchmarking
        || a >= 224 // multicast, reserved, broadcast
}

fn is_private_v6(ip: Ipv6Addr) -> bool {
    let segments = ip.segments();
    let first = segments[0];
    // An IPv4 address inside an IPv6 one reaches that IPv4 address:
    // ::a.b.c.d (IPv4-compatible), ::ffff:0:a.b.c.d (IPv4-translated),
    // 64:ff9b::/96 (NAT64), 2002::/16 (6to4). 64:ff9b:1::/48 is NAT64
    // inside one network (RFC 8215), private whatever it embeds.
    let embedded = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        is_private_v4(Ipv4Addr::new(a, b, c, d))
    };
    ip.is_loopback()                  // ::1
        || ip.is_unspecified()        // ::
        || first & 0xfe00 == 0xfc00   // fc00::/7, unique local
        || first & 0xffc0 == 0xfe80   // fe80::/10, link-local
        || first & 0xffc0 == 0xfec0   // fec0::/10, site-local (deprecated)
        || first & 0xff00 == 0xff00   // ff00::/8, multicast
        || (segments[..6] == [0; 6] && embedded(segments[6], segments[7]))
        || (segments[..6] == [0, 0, 0, 0, 0xffff, 0] && embedded(segments[6], segments[7]))
        || (segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && embedded(segments[6], segments[7]))
        || segments[..3] == [0x64, 0xff9b, 1]
        || (first == 0x2002 && embedded(segments[1], segments[2]))
}

/// The addresses of `host`, all public, or why not.
async fn resolve_public(host: &str, port: u16) -> Result<Vec<SocketAddr>, TargetRefused> {
    let unresolvable = |reason: String| TargetRefused::Unresolvable {
        host: host.to_owned(),
        reason,
    };
    let addresses: Vec<SocketAddr> =
        tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)))
            .await
            .map_err(|_| unresolvable(format!("no answer within {LOOKUP_TIMEOUT:?}")))?
            .map_err(|e| unresolvable(e.to_string()))?
            .collect();
    if addresses.is_empty() {
        return Err(unresolvable("no addresses".into()));
    }
    if let Some(private) = addresses.iter().find(|a| is_private(a.ip())) {
        return Err(TargetRefused::Private {
            host: host.to_owned(),
            ip: private.ip(),
        });
    }
    Ok(addresses)
}

/// reqwest's resolver when private targets are not allowed: resolves as the
/// system does, then fails the connection if any address is private.
#[derive(Debug, Clone, Copy, Default)]
pub struct PublicOnlyResolver;

impl reqwest::dns::Resolve for PublicOnlyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // The port is the connector's to set; 0 is a placeholder.
            let addresses = resolve_public(&host, 0).await?;
            let addresses: reqwest::dns::Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an IP address")
    }

    #[test]
    fn private_ranges_are_recognised() {
        for private in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "febf::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "100.64.0.1",
            "100.100.100.200",
            "100.127.255.255",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "fec0::1",
            "ff02::1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:a00:1::",
            "::ffff:0:7f00:1",
            "64:ff9b:1::7f00:1",
            "64:ff9b:1:ffff::808:808",
        ] {
            assert!(is_private(ip(private)), "{private} is private");
        }
        for public in [
            "93.184.216.34",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.0",
            "192.169.0.1",
            "169.255.0.1",
            "1.0.0.0",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "100.63.255.255",
            "100.128.0.0",
            "192.0.1.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "64:ff9b::808:808",
            "2002:808:808::",
            "::ffff:0:808:808",
        ] {
            assert!(!is_private(ip(public)), "{public} is public");
        }
    }

    #[tokio::test]
    async fn literals_and_names_are_checked_unless_private_targets_are_allowed() {
        let strict = TargetPolicy::new(false);
        let url = |text: &str| Url::parse(text).expect("URL");
        for refused in [
            "http://127.0.0.1:8080/hook",
            "http://[::1]/",
            "https://169.254.169.254/latest/meta-data",
            // WHATWG parsing turns other spellings into the address itself.
            "http://0x7f.1/",
            "http://2130706433/",
            "http://localhost:9/",
        ] {
            assert!(
                matches!(
                    strict.check(&url(refused)).await,
                    Err(TargetRefused::Private { .. })
                ),
                "{refused} must be refused"
            );
        }
        assert_eq!(strict.check(&url("https://93.184.216.34/")).await, Ok(()));
        // Host names are left to the resolver at delivery time.
        assert_eq!(strict.check_literal(&url("http://localhost/")), Ok(()));

        let lax = TargetPolicy::new(true);
        assert_eq!(lax.check(&url("http://127.0.0.1/")).await, Ok(()));
        assert_eq!(lax.check_literal(&url("http://[::1]/")), Ok(()));
    }
}
