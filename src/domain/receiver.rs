//! What a receiver may need beyond a signature: headers of its own on every request,
//! authentication (a static token, a user and password, or an OAuth2 token fetched with
//! client credentials), and a client certificate for mutual TLS with, optionally, the CA it
//! is to be verified with. Each is checked here when it is set, so a bad one is refused at
//! once rather than failing the first attempt. Their secret parts (header values, tokens,
//! passwords, client secrets, the private key) are sealed at rest by the store and never
//! shown back.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};

use super::time::Millis;

/// Most headers a client may set.
pub const HEADERS_MAX: usize = 32;
/// Longest header name.
pub const HEADER_NAME_MAX: usize = 64;
/// Longest header value, and longest bearer token.
pub const HEADER_VALUE_MAX: usize = 4096;
/// What a header value reads back as (and, sent back on replace, keeps the value).
pub const REDACTED: &str = "[redacted]";
/// Longest user name, OAuth2 client id, or scope.
pub const AUTH_NAME_MAX: usize = 256;
/// Longest password or client secret.
pub const AUTH_SECRET_MAX: usize = 1024;
/// Longest token URL or audience.
pub const AUTH_URL_MAX: usize = 2048;
/// Longest PEM text of a certificate chain, a key, or a CA bundle.
pub const PEM_MAX: usize = 65_536;

/// Header names latch sets itself or that belong to the connection, never a client's: the
/// request's framing and host, its signature headers (`webhook-*`), its user agent, and the
/// hop-by-hop headers.
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "user-agent",
];
/// Header names starting with this are latch's signature headers.
pub const RESERVED_PREFIX: &str = "webhook-";

/// A client's receiver settings. `Debug` shows no secret (header values, the auth
/// secret, the key), so a log line or a failed assertion cannot leak one.
#[derive(Clone, PartialEq, Default)]
pub struct Receiver {
    /// Sent on every request, in this order (names that differ only in case are one
    /// header with several values).
    pub headers: Vec<(String, String)>,
    pub auth: Option<Auth>,
    pub tls: Option<Tls>,
}

impl Receiver {
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty() && self.auth.is_none() && self.tls.is_none()
    }
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .headers
            .iter()
            .map(|(n, v)| format!("{n}: {REDACTED} ({} chars)", v.len()))
            .collect();
        f.debug_struct("Receiver")
            .field("headers", &names)
            .field("auth", &self.auth)
            .field("tls", &self.tls)
            .finish()
    }
}

/// How latch authenticates to a receiver.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Auth {
    /// `Authorization: Bearer <token>`.
    Bearer { token: String },
    /// `Authorization: Basic …`.
    Basic { username: String, password: String },
    /// A token from `token_url` (client credentials grant, the client authenticated with
    /// HTTP Basic), sent as a bearer token.
    #[serde(rename = "oauth2_client_credentials")]
    OAuth2 {
        token_url: String,
        client_id: String,
        client_secret: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scope: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        audience: Option<String>,
    },
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Bearer { .. } => f.write_str("Bearer { token: [redacted] }"),
            Auth::Basic { username, .. } => f
                .debug_struct("Basic")
                .field("username", username)
                .field("password", &REDACTED)
                .finish(),
            Auth::OAuth2 {
                token_url,
                client_id,
                scope,
                audience,
                ..
            } => f
                .debug_struct("OAuth2")
                .field("token_url", token_url)
                .field("client_id", client_id)
                .field("client_secret", &REDACTED)
                .field("scope", scope)
                .field("audience", audience)
                .finish(),
        }
    }
}

impl Auth {
    /// The `type` it is written with.
    pub fn kind(&self) -> &'static str {
        match self {
            Auth::Bearer { .. } => "bearer",
            Auth::Basic { .. } => "basic",
            Auth::OAuth2 { .. } => "oauth2_client_credentials",
        }
    }

    /// Its secret parts, to seal or open in place.
    pub fn secrets_mut(&mut self) -> Vec<&mut String> {
        match self {
            Auth::Bearer { token } => vec![token],
            Auth::Basic { password, .. } => vec![password],
            Auth::OAuth2 { client_secret, .. } => vec![client_secret],
        }
    }
}

/// A client certificate for mutual TLS, as given, with what is shown of it.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Tls {
    /// The certificate chain, the client's own certificate first.
    pub client_cert_pem: String,
    /// Its private key (PKCS #8, PKCS #1 or SEC1).
    pub client_key_pem: String,
    /// The CAs the receiver's certificate is verified with instead of the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
    /// The certificate's subject (RFC 4514).
    pub subject: String,
    /// When the certificate expires.
    pub not_after: Millis,
    /// The first CA's subject, when `ca_pem` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_subject: Option<String>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("subject", &self.subject)
            .field("not_after", &self.not_after)
            .field("ca_subject", &self.ca_subject)
            .field("client_key_pem", &REDACTED)
            .finish_non_exhaustive()
    }
}

/// Whether PEM text has a private key block (`PRIVATE KEY`, `RSA PRIVATE KEY`, `EC PRIVATE
/// KEY`, `ENCRYPTED PRIVATE KEY`, …).
fn holds_private_key(pem: &str) -> bool {
    pem.lines().any(|l| {
        l.trim()
            .strip_prefix("-----BEGIN ")
            .is_some_and(|label| label.contains("PRIVATE KEY"))
    })
}

/// A URL's origin, the part that says which server gets a request: scheme, host and port
/// (the scheme's own when none is written), as `scheme://host:port`; no user or password.
/// `None` for text that is not a URL with a host.
pub fn origin(url: &str) -> Option<String> {
    let u = reqwest::Url::parse(url).ok()?;
    let host = u.host_str()?.to_ascii_lowercase();
    Some(match u.port_or_known_default() {
        Some(port) => format!("{}://{host}:{port}", u.scheme()),
        None => format!("{}://{host}", u.scheme()),
    })
}

/// Checks a client's headers: at most [`HEADERS_MAX`], each a valid name that is not
/// reserved (nor `authorization` when `auth` is set), with a value a request can carry
/// exactly as given. Names that differ only in case are one header with several values,
/// as HTTP has it.
pub fn validate_headers(headers: &[(String, String)], has_auth: bool) -> Result<(), String> {
    if headers.len() > HEADERS_MAX {
        return Err(format!(
            "headers: at most {HEADERS_MAX}, got {}",
            headers.len()
        ));
    }
    for (name, value) in headers {
        validate_header_name(name)?;
        if has_auth && name.eq_ignore_ascii_case("authorization") {
            return Err(
                "headers.authorization: auth sets the Authorization header; use one or the other"
                    .into(),
            );
        }
        validate_header_value(name, value)?;
    }
    Ok(())
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c)
}

fn validate_header_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > HEADER_NAME_MAX || !name.chars().all(is_token_char) {
        return Err(format!(
            "headers: {name:?} is not a header name (1 to {HEADER_NAME_MAX} of A-Z a-z 0-9 \
             and !#$%&'*+-.^_`|~)"
        ));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with(RESERVED_PREFIX) {
        return Err(format!(
            "headers.{name}: latch sets this header itself (reserved: {}, {RESERVED_PREFIX}*)",
            RESERVED_HEADERS.join(", ")
        ));
    }
    Ok(())
}

/// Printable ASCII, spaces and tabs only between words: what is sent is what arrives (a
/// receiver trims the ends of a header value).
fn is_header_text(value: &str) -> bool {
    value
        .chars()
        .all(|c| c == ' ' || c == '\t' || c.is_ascii_graphic())
        && !value.starts_with([' ', '\t'])
        && !value.ends_with([' ', '\t'])
}

fn validate_header_value(name: &str, value: &str) -> Result<(), String> {
    if value.len() > HEADER_VALUE_MAX {
        return Err(format!(
            "headers.{name}: the value is longer than {HEADER_VALUE_MAX} characters"
        ));
    }
    if !is_header_text(value) {
        return Err(format!(
            "headers.{name}: a value is printable ASCII, with spaces or tabs only between words"
        ));
    }
    Ok(())
}

/// Text with no control characters, within `max` characters.
fn plain_text(field: &str, value: &str, min: usize, max: usize) -> Result<(), String> {
    let n = value.chars().count();
    if n < min || n > max {
        return Err(format!("{field}: {min} to {max} characters, got {n}"));
    }
    if value.chars().any(char::is_control) {
        return Err(format!("{field}: no control characters"));
    }
    Ok(())
}

/// Checks a client's authentication (its `token_url` is vetted by the SSRF guard too, by
/// the caller).
pub fn validate_auth(auth: &Auth) -> Result<(), String> {
    match auth {
        Auth::Bearer { token } => {
            if token.is_empty()
                || token.len() > HEADER_VALUE_MAX
                || !token.chars().all(|c| c.is_ascii_graphic())
            {
                return Err(format!(
                    "auth.token: 1 to {HEADER_VALUE_MAX} printable ASCII characters, no spaces"
                ));
            }
        }
        Auth::Basic { username, password } => {
            plain_text("auth.username", username, 1, AUTH_NAME_MAX)?;
            if username.contains(':') {
                return Err("auth.username: Basic authentication allows no \":\" in it".into());
            }
            plain_text("auth.password", password, 0, AUTH_SECRET_MAX)?;
        }
        Auth::OAuth2 {
            token_url,
            client_id,
            client_secret,
            scope,
            audience,
        } => {
            validate_token_url(token_url)?;
            plain_text("auth.client_id", client_id, 1, AUTH_NAME_MAX)?;
            plain_text("auth.client_secret", client_secret, 1, AUTH_SECRET_MAX)?;
            if let Some(s) = scope {
                plain_text("auth.scope", s, 1, AUTH_NAME_MAX)?;
            }
            if let Some(a) = audience {
                plain_text("auth.audience", a, 1, AUTH_URL_MAX)?;
            }
        }
    }
    Ok(())
}

/// A webhook-shaped URL ([`super::destination::HTTP_PATTERN`]).
fn validate_token_url(url: &str) -> Result<(), String> {
    super::destination::validate_http_url(url).map_err(|e| format!("auth.token_url: {e}"))
}

/// Reads a client certificate: the chain and key parse, the key is the certificate's, the
/// certificate has not expired at `now`, and `ca_pem` (if any) holds CA certificates a
/// verifier can use. Answers it with its subject and expiry.
pub fn parse_tls(
    client_cert_pem: &str,
    client_key_pem: &str,
    ca_pem: Option<&str>,
    now: Millis,
) -> Result<Tls, String> {
    for (field, text) in [
        ("tls.client_cert_pem", client_cert_pem),
        ("tls.client_key_pem", client_key_pem),
        ("tls.ca_pem", ca_pem.unwrap_or("")),
    ] {
        if text.len() > PEM_MAX {
            return Err(format!("{field}: at most {PEM_MAX} characters"));
        }
    }
    // Those two are stored as given, not sealed, and partly read back: a key pasted into
    // one of them would sit there in plain text.
    for (field, text) in [
        ("tls.client_cert_pem", client_cert_pem),
        ("tls.ca_pem", ca_pem.unwrap_or("")),
    ] {
        if holds_private_key(text) {
            return Err(format!(
                "{field}: holds a private key (a PRIVATE KEY block); give certificates only, \
                 and the client's key in tls.client_key_pem, which is kept sealed"
            ));
        }
    }
    let chain = certificates("tls.client_cert_pem", client_cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(client_key_pem.as_bytes()).map_err(|_| {
        "tls.client_key_pem: no private key in it (PEM: PRIVATE KEY, RSA PRIVATE KEY or \
         EC PRIVATE KEY)"
            .to_string()
    })?;
    let (subject, not_after) = inspect("tls.client_cert_pem", &chain[0])?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            "tls.client_key_pem: the key is not the certificate's".to_string()
        }
        e => format!("tls.client_key_pem: the key cannot be used: {e}"),
    })?;
    if not_after <= now {
        return Err(format!(
            "tls.client_cert_pem: the certificate expired at {}",
            super::time::format(not_after)
        ));
    }
    let ca_subject = match ca_pem {
        Some(pem) => {
            let cas = certificates("tls.ca_pem", pem)?;
            let mut roots = rustls::RootCertStore::empty();
            for (i, ca) in cas.iter().enumerate() {
                roots.add(ca.clone()).map_err(|e| {
                    format!(
                        "tls.ca_pem: certificate {} cannot be a trust anchor: {e}",
                        i + 1
                    )
                })?;
            }
            Some(inspect("tls.ca_pem", &cas[0])?.0)
        }
        None => None,
    };
    Ok(Tls {
        client_cert_pem: client_cert_pem.to_string(),
        client_key_pem: client_key_pem.to_string(),
        ca_pem: ca_pem.map(str::to_string),
        subject,
        not_after,
        ca_subject,
    })
}

/// The certificates of a PEM text; at least one.
fn certificates(field: &str, pem: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| format!("{field}: not PEM certificates"))?;
    if certs.is_empty() {
        return Err(format!(
            "{field}: no certificate in it (PEM: -----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(certs)
}

/// A certificate's subject and expiry.
fn inspect(field: &str, der: &CertificateDer<'_>) -> Result<(String, Millis), String> {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(der.as_ref())
        .map_err(|_| format!("{field}: the certificate does not parse"))?;
    let tbs = &cert.tbs_certificate;
    let not_after = tbs.validity.not_after.to_unix_duration().as_millis() as Millis;
    Ok((tbs.subject.to_string(), not_after))
}

#[cfg(test)]
#[path = "receiver/tests.rs"]
mod tests;
