//! The SSRF guard: latch POSTs to URLs its users type in, so without a guard anyone who may
//! create a client can make latch probe its own network (a database on 10.0.0.5, the cloud
//! metadata service on 169.254.169.254, an admin port on loopback). By default no webhook
//! goes to an address that is not globally routable; `delivery_allow_nets` lets chosen
//! networks through, and `delivery_https_only` refuses `http://` URLs.
//!
//! The check that counts is on the *resolved address at connect time*: the dispatcher's
//! HTTP client resolves names through [`GuardedResolver`], which drops refused addresses,
//! so a name that resolved to a public address when the client was created and to
//! 127.0.0.1 now (DNS rebinding) still reaches nothing. The HTTP client never calls a
//! resolver for an IP literal, so the sender checks literals itself ([`Guard::check_url`]).
//! The API checks a URL when a client is created or replaced ([`Guard::vet`]), so a user
//! hears why at once instead of finding failed notifications later. Broker destinations
//! (MQTT, AMQP) pass the same rules: a broker link resolves its host through
//! [`Guard::resolve`] and connects to an allowed address itself.
//!
//! The classification ([`non_global`]) is pure and follows the IANA special-purpose
//! address registries.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use ipnet::{IpNet, Ipv6Net};

/// The error an attempt refused by the guard is recorded with (and its metric outcome).
pub use crate::domain::outbox::outcome::NOT_ALLOWED;

/// How long the API waits for a name to resolve when vetting a URL. Past it, or when the
/// name does not resolve, the URL is taken: the connect-time check still guards it.
const VET_RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

/// IPv4 ranges that are not globally routable, most specific first: the first match names
/// the range in messages.
const V4_BLOCKED: &[(&str, &str)] = &[
    ("255.255.255.255/32", "the broadcast address"),
    ("0.0.0.0/8", "an unspecified (\"this network\") address"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a carrier-grade NAT (shared) address"),
    ("127.0.0.0/8", "a loopback address"),
    (
        "169.254.0.0/16",
        "a link-local address (cloud metadata services live here)",
    ),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol assignment"),
    ("192.0.2.0/24", "a documentation address"),
    ("192.88.99.0/24", "a deprecated 6to4 relay address"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", "a documentation address"),
    ("203.0.113.0/24", "a documentation address"),
    ("224.0.0.0/4", "a multicast address"),
    ("240.0.0.0/4", "a reserved address"),
];

/// IPv6 ranges that are not globally routable. The forms that embed an IPv4 address
/// (mapped, compatible, NAT64) are judged by that address instead: see [`embedded_v4`].
const V6_BLOCKED: &[(&str, &str)] = &[
    ("::/128", "the unspecified address"),
    ("::1/128", "a loopback address"),
    ("64:ff9b:1::/48", "a local-use NAT64 address"),
    ("100::/64", "a discard-only address"),
    ("2001:db8::/32", "a documentation address"),
    ("2001::/23", "an IETF protocol assignment"),
    ("2002::/16", "a 6to4 address"),
    ("3fff::/20", "a documentation address"),
    ("5f00::/16", "a segment routing (SRv6) address"),
    ("fc00::/7", "a unique-local address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address"),
    ("ff00::/8", "a multicast address"),
];

static BLOCKED: LazyLock<Vec<(IpNet, &'static str)>> = LazyLock::new(|| {
    V4_BLOCKED
        .iter()
        .chain(V6_BLOCKED)
        .map(|(net, why)| (net.parse().expect("a valid CIDR in the table"), *why))
        .collect()
});

/// The IPv4 address an IPv6 address stands for: IPv4-mapped (`::ffff:a.b.c.d`, which a
/// dual-stack socket connects to over IPv4), IPv4-compatible (`::a.b.c.d`, deprecated) and
/// the well-known NAT64 prefix (`64:ff9b::a.b.c.d`, which a NAT64 gateway forwards there).
pub fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    static NAT64: LazyLock<Ipv6Net> = LazyLock::new(|| "64:ff9b::/96".parse().expect("CIDR"));
    static COMPATIBLE: LazyLock<Ipv6Net> = LazyLock::new(|| "::/96".parse().expect("CIDR"));
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    // `::` and `::1` are themselves, not IPv4 addresses.
    let own = ip.is_unspecified() || ip.is_loopback();
    if NAT64.contains(&ip) || (COMPATIBLE.contains(&ip) && !own) {
        let [.., a, b, c, d] = ip.octets();
        return Some(Ipv4Addr::new(a, b, c, d));
    }
    None
}

/// Why `ip` is not a globally routable address (the range it falls in), or `None` when it
/// is one.
pub fn non_global(ip: IpAddr) -> Option<&'static str> {
    if let IpAddr::V6(v6) = ip
        && let Some(v4) = embedded_v4(v6)
    {
        return non_global(IpAddr::V4(v4));
    }
    BLOCKED
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|(_, why)| *why)
}

/// Why the guard refuses a destination.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{addr} is {why}; webhooks are not sent there unless LATCH_DELIVERY_ALLOW_NETS \
         lets it through"
    )]
    Address { addr: IpAddr, why: &'static str },
    #[error(
        "{host} resolves only to addresses webhooks are not sent to ({addr} is {why}); \
         LATCH_DELIVERY_ALLOW_NETS can let them through"
    )]
    Name {
        host: String,
        addr: IpAddr,
        why: &'static str,
    },
    #[error(
        "url must use https: LATCH_DELIVERY_HTTPS_ONLY is set (broker destinations have no \
         TLS in this build)"
    )]
    NotHttps,
}

/// Why a broker connection has no address to go to.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("cannot resolve {host}: {error}")]
    Lookup { host: String, error: std::io::Error },
}

/// Which destinations webhooks may go to. Cheap to build from the config.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Networks let through even though they are not global.
    allow: Vec<IpNet>,
    https_only: bool,
}

impl Guard {
    pub fn new(allow: Vec<IpNet>, https_only: bool) -> Self {
        Self { allow, https_only }
    }

    pub fn from_config(c: &crate::config::Config) -> Self {
        Self::new(c.delivery_allow_nets.clone(), c.delivery_https_only)
    }

    /// The allow list holds every address (`0.0.0.0/0` and `::/0`): the guard is off.
    fn allows_everything(&self) -> bool {
        let all = |n: &IpNet| n.prefix_len() == 0;
        self.allow
            .iter()
            .any(|n| all(n) && matches!(n, IpNet::V4(_)))
            && self
                .allow
                .iter()
                .any(|n| all(n) && matches!(n, IpNet::V6(_)))
    }

    /// Whether a webhook may go to `ip`: it is global, or the allow list holds it (or the
    /// IPv4 address it stands for).
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), Refusal> {
        let Some(why) = non_global(ip) else {
            return Ok(());
        };
        let v4 = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
            IpAddr::V4(_) => None,
        };
        let allowed = |a: IpAddr| self.allow.iter().any(|net| net.contains(&a));
        if allowed(ip) || v4.is_some_and(allowed) {
            return Ok(());
        }
        Err(Refusal::Address { addr: ip, why })
    }

    /// What can be told from the URL alone: its scheme (`https_only`) and, when its host
    /// is an IP literal, that address. Returns the host name left to resolve, if any.
    pub fn check_url<'u>(&self, url: &'u reqwest::Url) -> Result<Option<&'u str>, Refusal> {
        if self.https_only && url.scheme() != "https" {
            return Err(Refusal::NotHttps);
        }
        let Some(host) = url.host_str() else {
            return Ok(None);
        };
        // The URL parser normalizes literals (`127.1` is `127.0.0.1`) and brackets IPv6.
        match host.trim_start_matches('[').trim_end_matches(']').parse() {
            Ok(ip) => self.check_ip(ip).map(|()| None),
            Err(_) => Ok(Some(host)),
        }
    }

    /// The addresses of `host` a webhook may go to; a refusal naming the first refused one
    /// when none may.
    pub fn filter(
        &self,
        host: &str,
        addrs: impl IntoIterator<Item = SocketAddr>,
    ) -> Result<Vec<SocketAddr>, Refusal> {
        let mut first_refused = None;
        let mut allowed = Vec::new();
        for a in addrs {
            match self.check_ip(a.ip()) {
                Ok(()) => allowed.push(a),
                Err(Refusal::Address { addr, why }) => {
                    first_refused.get_or_insert((addr, why));
                }
                Err(_) => {}
            }
        }
        match (allowed.is_empty(), first_refused) {
            (true, Some((addr, why))) => Err(Refusal::Name {
                host: host.to_string(),
                addr,
                why,
            }),
            _ => Ok(allowed),
        }
    }

    /// The addresses of `host` a connection to `port` may go to, resolved now: a broker
    /// link connects to one of these by address, so the address judged is the address
    /// reached, whatever the name resolves to later (DNS rebinding). The scheme is the
    /// caller's to check ([`Guard::check_url`] at vetting, `https_only` at each attempt).
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, ResolveError> {
        if let Ok(ip) = host.parse::<IpAddr>() {
            self.check_ip(ip)?;
            return Ok(vec![SocketAddr::new(ip, port)]);
        }
        let addrs = tokio::net::lookup_host((host, port))
            .await
            .map_err(|error| ResolveError::Lookup {
                host: host.to_string(),
                error,
            })?;
        Ok(self.filter(host, addrs)?)
    }

    /// `delivery_https_only`: only TLS destinations, so no broker (there is no TLS to
    /// brokers in this build).
    pub fn https_only(&self) -> bool {
        self.https_only
    }

    /// Checks a client's URL when it is created or replaced: scheme, literal address, and
    /// the addresses its name resolves to now. A name that does not resolve (yet) passes;
    /// the connect-time check guards every attempt anyway.
    pub async fn vet(&self, url: &str) -> Result<(), Refusal> {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return Ok(()); // the URL's shape is checked elsewhere
        };
        let Some(host) = self.check_url(&parsed)? else {
            return Ok(());
        };
        if self.allows_everything() {
            return Ok(()); // nothing a lookup finds could be refused
        }
        let lookup = tokio::net::lookup_host((host, 0));
        match tokio::time::timeout(VET_RESOLVE_TIMEOUT, lookup).await {
            Ok(Ok(addrs)) => self.filter(host, addrs).map(drop),
            Ok(Err(_)) | Err(_) => Ok(()),
        }
    }
}

/// The dispatcher's DNS resolver: the system resolver, minus the addresses the guard
/// refuses. A name left with none fails the connection with a [`Refusal`], which the
/// sender finds in the error's causes and records as [`NOT_ALLOWED`].
pub struct GuardedResolver {
    guard: Arc<Guard>,
}

impl GuardedResolver {
    pub fn new(guard: Arc<Guard>) -> Self {
        Self { guard }
    }
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.guard.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let allowed = guard.filter(&host, addrs)?;
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// The guard's refusal among the causes of a failed request, if that is why it failed.
pub fn refusal_in<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e Refusal> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<Refusal>() {
            return Some(r);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn non_global_ipv4_ranges_are_named() {
        for (addr, why) in [
            ("0.0.0.0", "unspecified"),
            ("10.1.2.3", "private"),
            ("100.64.0.1", "carrier-grade NAT"),
            ("100.127.255.254", "carrier-grade NAT"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("169.254.169.254", "link-local"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.0.0.8", "IETF"),
            ("192.0.2.1", "documentation"),
            ("192.168.1.1", "private"),
            ("198.18.0.1", "benchmarking"),
            ("198.19.255.255", "benchmarking"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.9", "documentation"),
            ("224.0.0.251", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
        ] {
            let got = non_global(ip(addr)).unwrap_or_else(|| panic!("{addr} passed"));
            assert!(got.contains(why), "{addr}: {got}");
        }
    }

    #[test]
    fn global_ipv4_addresses_pass() {
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.215.14",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.0.1.1",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
        ] {
            assert_eq!(non_global(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn non_global_ipv6_ranges_are_named() {
        for (addr, why) in [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fc00::1", "unique-local"),
            ("fd12:3456::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001::1", "IETF"),
            ("2002:7f00:1::1", "6to4"),
            ("100::1", "discard"),
            ("64:ff9b:1::1", "NAT64"),
            ("5f00::1", "SRv6"),
        ] {
            let got = non_global(ip(addr)).unwrap_or_else(|| panic!("{addr} passed"));
            assert!(got.contains(why), "{addr}: {got}");
        }
    }

    #[test]
    fn global_ipv6_addresses_pass() {
        for addr in [
            "2606:4700:4700::1111",
            "2a00:1450:4001::200e",
            "2001:4860::1",
        ] {
            assert_eq!(non_global(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn ipv6_forms_of_ipv4_addresses_are_judged_as_that_address() {
        for (addr, why) in [
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:0.0.0.0", "unspecified"),
            ("::127.0.0.1", "loopback"),
            ("::10.0.0.1", "private"),
            ("64:ff9b::127.0.0.1", "loopback"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("64:ff9b::192.168.0.1", "private"),
        ] {
            let got = non_global(ip(addr)).unwrap_or_else(|| panic!("{addr} passed"));
            assert!(got.contains(why), "{addr}: {got}");
        }
        for addr in ["::ffff:8.8.8.8", "64:ff9b::1.1.1.1"] {
            assert_eq!(non_global(ip(addr)), None, "{addr}");
        }
        assert_eq!(
            embedded_v4("::1".parse().unwrap()),
            None,
            "::1 is IPv6 loopback, not 0.0.0.1"
        );
    }

    #[test]
    fn the_allow_list_lets_networks_through() {
        let g = Guard::new(nets(&["127.0.0.0/8", "10.0.0.0/8", "fd00::/8"]), false);
        assert_eq!(g.check_ip(ip("127.0.0.1")), Ok(()));
        assert_eq!(g.check_ip(ip("10.20.30.40")), Ok(()));
        assert_eq!(g.check_ip(ip("fd00::5")), Ok(()));
        assert_eq!(
            g.check_ip(ip("::ffff:127.0.0.1")),
            Ok(()),
            "mapped form too"
        );
        assert_eq!(g.check_ip(ip("8.8.8.8")), Ok(()), "global always passes");
        let refused = g.check_ip(ip("169.254.169.254")).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("169.254.169.254 is a link-local")
        );
        assert!(refused.to_string().contains("LATCH_DELIVERY_ALLOW_NETS"));
        assert!(g.check_ip(ip("192.168.0.1")).is_err());
        assert!(g.check_ip(ip("::1")).is_err());
        assert!(!g.allows_everything());
        let all = Guard::new(nets(&["0.0.0.0/0", "::/0"]), false);
        assert!(all.allows_everything());
        assert_eq!(all.check_ip(ip("::1")), Ok(()));
        assert_eq!(all.check_ip(ip("169.254.169.254")), Ok(()));
    }

    #[test]
    fn the_default_guard_refuses_every_non_global_address() {
        let g = Guard::default();
        for addr in ["127.0.0.1", "::1", "::ffff:127.0.0.1", "169.254.169.254"] {
            assert!(
                matches!(g.check_ip(ip(addr)), Err(Refusal::Address { .. })),
                "{addr}"
            );
        }
    }

    #[test]
    fn urls_are_checked_by_scheme_and_literal_address() {
        let url = |s: &str| reqwest::Url::parse(s).unwrap();
        let g = Guard::default();
        assert_eq!(g.check_url(&url("http://1.1.1.1/h")), Ok(None));
        assert_eq!(
            g.check_url(&url("http://example.com/h")),
            Ok(Some("example.com"))
        );
        assert!(g.check_url(&url("http://127.0.0.1:9/h")).is_err());
        assert!(g.check_url(&url("http://[::1]:9/h")).is_err());
        assert!(g.check_url(&url("http://[::ffff:127.0.0.1]/h")).is_err());
        assert!(g.check_url(&url("http://169.254.169.254/latest")).is_err());

        let https = Guard::new(vec![], true);
        assert_eq!(
            https.check_url(&url("http://example.com/h")),
            Err(Refusal::NotHttps)
        );
        assert_eq!(
            https.check_url(&url("https://example.com/h")),
            Ok(Some("example.com"))
        );
    }

    #[test]
    fn a_name_keeps_only_its_allowed_addresses() {
        let sa = |s: &str| SocketAddr::new(ip(s), 0);
        let g = Guard::default();
        assert_eq!(
            g.filter("h", [sa("127.0.0.1"), sa("1.1.1.1"), sa("::1")]),
            Ok(vec![sa("1.1.1.1")])
        );
        let refused = g.filter("h", [sa("127.0.0.1"), sa("::1")]).unwrap_err();
        assert_eq!(
            refused,
            Refusal::Name {
                host: "h".into(),
                addr: ip("127.0.0.1"),
                why: "a loopback address"
            }
        );
        assert!(refused.to_string().starts_with("h resolves only to"));
        assert_eq!(g.filter("h", []), Ok(vec![]), "nothing to refuse");
    }

    #[tokio::test]
    async fn broker_hosts_resolve_to_allowed_addresses_only() {
        let g = Guard::default();
        assert!(matches!(
            g.resolve("127.0.0.1", 1883).await,
            Err(ResolveError::Refused(Refusal::Address { .. }))
        ));
        assert!(matches!(
            g.resolve("localhost", 1883).await,
            Err(ResolveError::Refused(Refusal::Name { .. }))
        ));
        assert!(matches!(
            g.resolve("no-such-host.invalid", 1883).await,
            Err(ResolveError::Lookup { .. })
        ));
        let open = Guard::new(nets(&["127.0.0.0/8", "::1/128"]), false);
        let addrs = open.resolve("localhost", 5672).await.unwrap();
        assert!(
            !addrs.is_empty() && addrs.iter().all(|a| a.port() == 5672),
            "{addrs:?}"
        );
        assert!(
            g.vet("mqtt://u:p@10.0.0.1/doors/{sensor_id}")
                .await
                .is_err(),
            "a broker URL is vetted like a webhook's"
        );
        assert!(
            Guard::new(vec![], true)
                .vet("amqp://1.1.1.1?exchange=x")
                .await
                .is_err(),
            "https_only refuses brokers"
        );
    }

    #[tokio::test]
    async fn vetting_resolves_names() {
        let g = Guard::default();
        assert!(matches!(
            g.vet("http://localhost:9/h").await,
            Err(Refusal::Name { .. })
        ));
        assert!(g.vet("http://10.0.0.1/h").await.is_err());
        let open = Guard::new(nets(&["127.0.0.0/8", "::1/128"]), false);
        assert_eq!(open.vet("http://localhost:9/h").await, Ok(()));
        assert_eq!(
            g.vet("http://no-such-host.invalid/h").await,
            Ok(()),
            "an unresolvable name is left to the connect-time check"
        );
    }

    #[test]
    fn a_refusal_is_found_among_the_causes() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] Refusal);
        let e = Outer(Refusal::NotHttps);
        assert_eq!(refusal_in(&e), Some(&Refusal::NotHttps));
        let plain = std::io::Error::other("refused");
        assert_eq!(refusal_in(&plain), None);
    }
}
