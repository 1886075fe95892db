//! What sending to receivers keeps between attempts: client URLs as parsed, an HTTP client
//! per client certificate (a TLS identity is a property of a client's connections, so a
//! receiver that wants one gets a pool of its own), and OAuth2 tokens ([`super::auth`]).
//! Every HTTP client is built by [`http_client`]: no redirects, names resolved through the
//! SSRF guard, the egress proxy when one is set.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::auth::Tokens;
use super::guard::{self, Guard};
use crate::domain::receiver::Tls;

/// Most client URLs kept; past it, the cache starts over.
const URLS_MAX: usize = 10_000;
/// Most HTTP clients with a certificate kept; past it, the cache starts over (each holds
/// a connection pool, so the bound is lower).
const TLS_CLIENTS_MAX: usize = 1_000;

/// An HTTP client for webhooks (and token requests): `tls` presents a client certificate
/// and, with its own CAs, verifies the receiver with those instead of the system's roots.
pub fn http_client(
    guard: &Arc<Guard>,
    pool_per_host: usize,
    tls: Option<&Tls>,
) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        // A redirect is never followed: a 303 would turn the POST into a GET, and any
        // redirect would carry the signed headers to a host the client never gave us.
        // A 3xx is a failed attempt with its status recorded, like any other non-2xx.
        .redirect(reqwest::redirect::Policy::none())
        // Every name is resolved through the SSRF guard, at connect time, so what a
        // name resolves to when the client was created does not matter (DNS
        // rebinding); IP literals never reach a resolver, and the sender checks them.
        .dns_resolver(Arc::new(guard::GuardedResolver::new(guard.clone())))
        .pool_max_idle_per_host(pool_per_host)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true);
    b = match guard.proxy().and_then(guard::Proxy::reqwest) {
        // Through the proxy the guard judges each receiver's name before the request
        // (`Guard::judge_name`); the proxy's own name resolves unguarded.
        Some(p) => b.proxy(p),
        // No proxy from HTTP_PROXY and the like: through one, the address judged would
        // be the proxy's, and the proxy would resolve the webhook's name unguarded.
        None => b.no_proxy(),
    };
    if let Some(tls) = tls {
        b = b.identity(super::tls::identity(tls)?);
        if let Some(roots) = super::tls::roots(tls)? {
            b = b.tls_built_in_root_certs(false);
            for r in roots {
                b = b.add_root_certificate(r);
            }
        }
    }
    b.build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// The state attempts share; one per dispatcher.
pub struct Receivers {
    /// For receivers without a certificate.
    http: reqwest::Client,
    guard: Arc<Guard>,
    pool_per_host: usize,
    urls: Mutex<HashMap<String, reqwest::Url>>,
    /// By a hash of the certificate, key and CAs, each with what it was built from.
    tls: Mutex<HashMap<u64, Vec<(Tls, reqwest::Client)>>>,
    hasher: foldhash::fast::RandomState,
    pub(super) tokens: Tokens,
}

impl Receivers {
    pub fn new(http: reqwest::Client, guard: Arc<Guard>, pool_per_host: usize) -> Self {
        Self {
            http,
            guard,
            pool_per_host,
            urls: Mutex::default(),
            tls: Mutex::default(),
            hasher: Default::default(),
            tokens: Tokens::default(),
        }
    }

    /// A client URL as parsed, so a URL is parsed once rather than on every attempt: the
    /// parse, with its host's IDNA mapping, was ~8 % of a webhook's instructions
    /// (BENCHMARKS.md, tenth pass).
    pub(super) fn parse(&self, url: &str) -> Result<reqwest::Url, String> {
        let mut known = self.urls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = known.get(url) {
            return Ok(u.clone());
        }
        let parsed = reqwest::Url::parse(url).map_err(|e| e.to_string())?;
        if known.len() >= URLS_MAX {
            known.clear();
        }
        known.insert(url.to_owned(), parsed.clone());
        Ok(parsed)
    }

    /// The HTTP client without a certificate (token requests go out on it too).
    pub(super) fn plain(&self) -> &reqwest::Client {
        &self.http
    }

    /// The HTTP client a receiver with `tls` is sent to with: built once per certificate.
    pub(super) fn http_for(&self, tls: Option<&Tls>) -> Result<reqwest::Client, String> {
        let Some(tls) = tls else {
            return Ok(self.http.clone());
        };
        let key = self
            .hasher
            .hash_one((&tls.client_cert_pem, &tls.client_key_pem, &tls.ca_pem));
        let same = |t: &Tls| {
            t.client_cert_pem == tls.client_cert_pem
                && t.client_key_pem == tls.client_key_pem
                && t.ca_pem == tls.ca_pem
        };
        {
            let known = self.tls.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, c)) = known
                .get(&key)
                .and_then(|v| v.iter().find(|(t, _)| same(t)))
            {
                return Ok(c.clone());
            }
        }
        let client = http_client(&self.guard, self.pool_per_host, Some(tls))?;
        let mut known = self.tls.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= TLS_CLIENTS_MAX {
            known.clear();
        }
        known
            .entry(key)
            .or_default()
            .push((tls.clone(), client.clone()));
        Ok(client)
    }
}
