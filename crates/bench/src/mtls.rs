//! An HTTPS receiver on 127.0.0.1 that demands a client certificate, for `latch bench
//! deliver --auth mtls`: its own CA and certificate, and the certificate latch presents,
//! all made for the run.
//!
//! Its TLS runs in this process, so its side of each handshake and of each record's
//! decryption is counted in the bench's CPU with latch's, as the plain receivers' HTTP
//! parsing is.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};

use super::{Keep, Receiver};

/// A CA that issues certificates.
struct Ca {
    pem: String,
    cert: rcgen::Certificate,
    key: rcgen::KeyPair,
}

impl Ca {
    fn new(name: &str) -> anyhow::Result<Self> {
        let key = rcgen::KeyPair::generate()?;
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new())?;
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name.push(rcgen::DnType::CommonName, name);
        let cert = p.self_signed(&key)?;
        Ok(Self {
            pem: cert.pem(),
            cert,
            key,
        })
    }

    /// A certificate and its key (PEM) for `names` (DNS names or IP addresses), named `cn`.
    fn issue(&self, cn: &str, names: &[&str]) -> anyhow::Result<(String, String)> {
        let key = rcgen::KeyPair::generate()?;
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut p = rcgen::CertificateParams::new(names)?;
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = p.signed_by(&key, &self.cert, &self.key)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn certs(pem: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    Ok(CertificateDer::pem_slice_iter(pem.as_bytes()).collect::<Result<_, _>>()?)
}

/// Accepts the TLS connections whose client presents a certificate the clients' CA
/// issued; a failed handshake is dropped and the next connection taken.
struct TlsListener {
    tcp: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let handshake = self.acceptor.accept(tcp);
            if let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The receiver, and the receiver settings of a client that reaches it: its client
/// certificate, and the receiver's CA to verify the receiver with.
pub async fn receiver() -> anyhow::Result<(Receiver, latch::domain::receiver::Tls)> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_ca = Ca::new("latch bench receiver CA")?;
    let (server_cert, server_key) = server_ca.issue("receiver", &["127.0.0.1"])?;
    let clients_ca = Ca::new("latch bench clients CA")?;
    let (client_cert, client_key) = clients_ca.issue("latch bench", &[])?;

    let mut roots = rustls::RootCertStore::empty();
    for c in certs(&clients_ca.pem)? {
        roots.add(c)?;
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let key = {
        use rustls::pki_types::pem::PemObject;
        PrivateKeyDer::from_pem_slice(server_key.as_bytes())?
    };
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(&server_cert)?, key)?;
    let tcp = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("https://{}/hook", tcp.local_addr()?);
    let listener = TlsListener {
        tcp,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    let tls = latch::domain::receiver::parse_tls(
        &client_cert,
        &client_key,
        Some(&server_ca.pem),
        latch::domain::time::now_ms(),
    )
    .map_err(|e| anyhow::anyhow!("the bench's client certificate: {e}"))?;
    Ok((Receiver::start_on(listener, url, Keep::Stats), tls))
}
