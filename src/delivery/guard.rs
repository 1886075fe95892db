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
//! With an egress proxy (`delivery_proxy`), the proxy resolves a receiver's name and
//! connects, not latch: the sender resolves the name first and goes on only when it
//! resolves, within the attempt's time, and every address it has now is allowed
//! ([`Guard::judge_name`]), so the guard still judges the receiver's address; the proxy's
//! own name resolves unguarded, because the operator named it ([`GuardedResolver`]).
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
        "{host} resolves to {addr}, which is {why}: through the proxy the request could reach \
         it, so it is not sent; LATCH_DELIVERY_ALLOW_NETS can let it through"
    )]
    Proxied {
        host: String,
        addr: IpAddr,
        why: &'static str,
    },
    #[error(
        "{host} does not resolve from latch ({why}): through the proxy it could reach an \
         address latch cannot judge, so it is not sent"
    )]
    Unjudged { host: String, why: String },
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

/// Which destinations webhooks may go to, and the proxy they go through. Cheap to build
/// from the config.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    /// Networks let through even though they are not global.
    allow: Vec<IpNet>,
    https_only: bool,
    proxy: Option<Proxy>,
}

/// The egress proxy webhooks go through (`delivery_proxy`), and the hosts that bypass it.
#[derive(Debug, Clone)]
pub struct Proxy {
    /// `http://[user:password@]host:port` (or `https://`).
    pub url: String,
    /// Its host, which resolves unguarded.
    pub host: String,
    /// `delivery_no_proxy`, in reqwest's `NO_PROXY` syntax.
    pub no_proxy: Option<String>,
}

impl Proxy {
    /// The proxy as the HTTP client takes it; `None` for a URL the settings would have
    /// refused.
    pub fn reqwest(&self) -> Option<reqwest::Proxy> {
        let p = reqwest::Proxy::all(&self.url).ok()?;
        Some(
            p.no_proxy(
                self.no_proxy
                    .as_deref()
                    .and_then(reqwest::NoProxy::from_string),
            ),
        )
    }
}

impl Guard {
    pub fn new(allow: Vec<IpNet>, https_only: bool) -> Self {
        Self {
            allow,
            https_only,
            proxy: None,
        }
    }

    pub fn from_config(c: &crate::config::Config) -> Self {
        let proxy = c.delivery_proxy.as_ref().and_then(|url| {
            let host = reqwest::Url::parse(url).ok()?.host_str()?.to_string();
            Some(Proxy {
                url: url.clone(),
                host: host
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
                no_proxy: c.delivery_no_proxy.clone(),
            })
        });
        Self::new(c.delivery_allow_nets.clone(), c.delivery_https_only).with_proxy(proxy)
    }

    /// Webhooks go through `proxy`.
    pub fn with_proxy(mut self, proxy: Option<Proxy>) -> Self {
        self.proxy = proxy;
        self
    }

    pub fn proxy(&self) -> Option<&Proxy> {
        self.proxy.as_ref()
    }

    /// Before a request goes through the proxy, which resolves `host` itself: every
    /// address `host` resolves to now must be allowed (the proxy may pick any of them).
    /// A name that does not resolve here within `within` (the attempt's time left) is
    /// refused: the proxy may resolve it otherwise (split horizon) to where latch would
    /// not go, and an attempt must not outlive its lease.
    pub async fn judge_name(&self, host: &str, port: u16, within: Duration) -> Result<(), Refusal> {
        if self.allows_everything() || host.parse::<IpAddr>().is_ok() {
            return Ok(()); // a literal was judged by `check_url`
        }
        let unjudged = |why: String| Refusal::Unjudged {
            host: host.to_string(),
            why,
        };
        let addrs: Vec<SocketAddr> =
            match tokio::time::timeout(within, tokio::net::lookup_host((host, port))).await {
                Ok(Ok(addrs)) => addrs.collect(),
                Ok(Err(e)) => return Err(unjudged(e.to_string())),
                Err(_) => return Err(unjudged(format!("no answer within {within:?}"))),
            };
        if addrs.is_empty() {
            return Err(unjudged("no address".to_string()));
        }
        for a in addrs {
            if let Err(Refusal::Address { addr, why }) = self.check_ip(a.ip()) {
                return Err(Refusal::Proxied {
                    host: host.to_string(),
                    addr,
                    why,
                });
            }
        }
        Ok(())
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
            // The proxy's own name: the operator named it, so any address of it is fine.
            if guard.proxy.as_ref().is_some_and(|p| p.host == host) {
                let addrs: reqwest::dns::Addrs = Box::new(addrs.collect::<Vec<_>>().into_iter());
                return Ok(addrs);
            }
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
#[path = "guard/tests.rs"]
mod tests;
