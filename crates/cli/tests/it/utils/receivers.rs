//! Receivers that ask more than a signature, started by the tests on loopback: an HTTPS
//! receiver that demands a client certificate, a token endpoint with the receiver its
//! tokens open, and an HTTP CONNECT proxy that counts what passes through it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use latch_testkit::{Keep, Receiver, Violations, Watch};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A certificate and its key, as PEM.
#[derive(Clone)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A CA that issues certificates.
pub struct Ca {
    pub pem: String,
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = p.self_signed(&key).unwrap();
        Self {
            pem: cert.pem(),
            cert,
            key,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) named `cn`.
    pub fn issue(&self, cn: &str, names: &[&str]) -> Pem {
        let key = rcgen::KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut p = rcgen::CertificateParams::new(names).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

fn certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .unwrap()
}

fn key(pem: &str) -> rustls::pki_types::PrivateKeyDer<'static> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap()
}

/// Accepts TLS connections whose client presents a certificate the clients' CA issued;
/// the others fail their handshake and are counted.
struct TlsListener {
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    refused: Arc<AtomicUsize>,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            let handshake = self.acceptor.accept(tcp);
            match tokio::time::timeout(Duration::from_secs(5), handshake).await {
                Ok(Ok(tls)) => return (tls, addr),
                _ => {
                    self.refused.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// An HTTPS receiver on 127.0.0.1 that demands a client certificate issued by its
/// clients' CA.
pub struct MtlsReceiver {
    pub receiver: Receiver,
    /// The CA its own certificate is issued by (what a client verifies it with).
    pub server_ca: String,
    /// Handshakes it refused (no certificate, or one it does not trust).
    pub refused: Arc<AtomicUsize>,
}

impl MtlsReceiver {
    pub async fn start(clients_ca: &Ca) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let server_ca = Ca::new("Receiver CA");
        let own = server_ca.issue("receiver", &["127.0.0.1"]);
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(&clients_ca.pem) {
            roots.add(c).unwrap();
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .unwrap();
        let config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs(&own.cert), key(&own.key))
            .unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}/hook", tcp.local_addr().unwrap());
        let refused = Arc::default();
        let listener = TlsListener {
            tcp,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
            refused: Arc::clone(&refused),
        };
        Self {
            receiver: Receiver::start_on(listener, url, Keep::Everything),
            server_ca: server_ca.pem,
            refused,
        }
    }
}

/// What the token endpoint and its receiver keep.
#[derive(Default)]
struct Tokens {
    /// Issued tokens and when each expires.
    issued: HashMap<String, Instant>,
    revoked: HashSet<String>,
    fetches: usize,
    /// Requests the receiver refused with 401, and those it took (their tokens).
    refused: usize,
    taken: Vec<String>,
    /// Lifetime of the next tokens, in seconds.
    lifetime_s: u64,
    /// How long a token request takes to answer.
    delay: Duration,
    /// Bodies the receiver got that break their schema.
    violations: Violations,
}

/// A token endpoint (`/token`, client credentials for `latch` / `s3cret`) and a receiver
/// (`/hook`) that takes only its live tokens, on one loopback server.
#[derive(Clone)]
pub struct OAuth {
    pub token_url: String,
    pub hook_url: String,
    state: Arc<Mutex<Tokens>>,
    /// Fails the test on the last handle's drop if a body broke its schema.
    _watch: Arc<Watch>,
}

pub const OAUTH_CLIENT: &str = "latch";
pub const OAUTH_SECRET: &str = "s3cret";

impl OAuth {
    pub async fn start(lifetime_s: u64) -> Self {
        let state = Arc::new(Mutex::new(Tokens {
            lifetime_s,
            ..Tokens::default()
        }));
        let app = axum::Router::new()
            .route("/token", axum::routing::post(issue))
            .route("/hook", axum::routing::post(take))
            .with_state(state.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let watch = Arc::new(Watch(state.lock().unwrap().violations.clone()));
        Self {
            token_url: format!("{base}/token"),
            hook_url: format!("{base}/hook"),
            state,
            _watch: watch,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Tokens) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// Token requests answered so far.
    pub fn fetches(&self) -> usize {
        self.with(|t| t.fetches)
    }

    /// Requests the receiver refused for their token.
    pub fn refused(&self) -> usize {
        self.with(|t| t.refused)
    }

    /// The tokens of the requests the receiver took, in order; panics if a body broke
    /// its schema.
    pub fn taken(&self) -> Vec<String> {
        self.with(|t| t.violations.clone()).assert_none();
        self.with(|t| t.taken.clone())
    }

    /// Revokes every token issued so far.
    pub fn revoke_all(&self) {
        self.with(|t| {
            let all: Vec<String> = t.issued.keys().cloned().collect();
            t.revoked.extend(all);
        });
    }

    /// Tokens issued from now on last `secs` seconds.
    pub fn lifetime(&self, secs: u64) {
        self.with(|t| t.lifetime_s = secs);
    }

    pub fn slow_tokens(&self, delay: Duration) {
        self.with(|t| t.delay = delay);
    }
}

async fn issue(
    State(state): State<Arc<Mutex<Tokens>>>,
    headers: HeaderMap,
    body: String,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    use base64::Engine as _;
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{OAUTH_CLIENT}:{OAUTH_SECRET}"))
    );
    let authorized = headers
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == expected.as_bytes());
    if !authorized || !body.contains("grant_type=client_credentials") {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(serde_json::json!({"error": "invalid_client"})),
        )
            .into_response();
    }
    let delay = state.lock().unwrap().delay;
    tokio::time::sleep(delay).await;
    let mut t = state.lock().unwrap();
    t.fetches += 1;
    let token = format!("tok-{}-{}", t.fetches, ulid::Ulid::new());
    let lifetime = t.lifetime_s;
    t.issued.insert(
        token.clone(),
        Instant::now() + Duration::from_secs(lifetime),
    );
    axum::Json(serde_json::json!({
        "access_token": token, "token_type": "Bearer", "expires_in": lifetime
    }))
    .into_response()
}

async fn take(
    State(state): State<Arc<Mutex<Tokens>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> StatusCode {
    let mut t = state.lock().unwrap();
    t.violations.check(&body);
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string();
    let live = t
        .issued
        .get(&token)
        .is_some_and(|until| *until > Instant::now())
        && !t.revoked.contains(&token);
    if !live {
        t.refused += 1;
        return StatusCode::UNAUTHORIZED;
    }
    t.taken.push(token);
    StatusCode::OK
}

/// An HTTP proxy on loopback: `CONNECT host:port` tunnels (https receivers), and a request
/// in absolute form (`POST http://host/path`, http receivers) is passed on. It counts
/// each by where it went.
#[derive(Clone)]
pub struct Proxy {
    pub url: String,
    passed: Arc<Mutex<Vec<String>>>,
}

impl Proxy {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let passed: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = passed.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(relay(conn, seen.clone()));
            }
        });
        Self { url, passed }
    }

    /// What passed so far: `CONNECT host:port` or `FORWARD host:port`, one a connection.
    pub fn passed(&self) -> Vec<String> {
        self.passed.lock().unwrap().clone()
    }
}

/// Reads a request head (up to the blank line).
async fn head(conn: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if conn.read(&mut byte).await.ok()? == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.push(byte[0]);
    }
    Some(buf)
}

async fn relay(mut conn: TcpStream, passed: Arc<Mutex<Vec<String>>>) {
    let Some(head) = head(&mut conn).await else {
        return;
    };
    let text = String::from_utf8_lossy(&head).to_string();
    let line = text.lines().next().unwrap_or_default().to_string();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if method == "CONNECT" {
        passed.lock().unwrap().push(format!("CONNECT {target}"));
        let Ok(mut upstream) = TcpStream::connect(target).await else {
            let _ = conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
            return;
        };
        let _ = conn
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await;
        let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
        return;
    }
    // Absolute form: `POST http://host:port/path HTTP/1.1`; passed on in origin form.
    let Some(rest) = target.strip_prefix("http://") else {
        let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
        return;
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    passed.lock().unwrap().push(format!("FORWARD {authority}"));
    let Ok(mut upstream) = TcpStream::connect(authority).await else {
        let _ = conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n").await;
        return;
    };
    let path = if path.is_empty() { "/" } else { path };
    let rewritten = text.replacen(target, path, 1);
    let _ = upstream.write_all(rewritten.as_bytes()).await;
    // One request a connection: the rest of this one (its body) and the answer pass as
    // they are.
    let _ = tokio::io::copy_bidirectional(&mut conn, &mut upstream).await;
}
