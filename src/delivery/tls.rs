//! A receiver's client certificate as the HTTP client takes it: the identity it presents
//! and, when the receiver has CAs of its own, the roots its certificate is verified with
//! (instead of the system's). The API checks both when a client is set
//! ([`check`]), so a certificate the HTTP client cannot use is refused there, not at the
//! first attempt.

use crate::domain::receiver::Tls;

/// The certificate chain and key, as one identity.
pub fn identity(tls: &Tls) -> Result<reqwest::Identity, String> {
    let mut pem = tls.client_cert_pem.clone();
    if !pem.ends_with('\n') {
        pem.push('\n');
    }
    pem.push_str(&tls.client_key_pem);
    reqwest::Identity::from_pem(pem.as_bytes())
        .map_err(|e| format!("tls: the certificate and key cannot be used: {e}"))
}

/// The receiver's own CAs; `None`: the system's roots.
pub fn roots(tls: &Tls) -> Result<Option<Vec<reqwest::Certificate>>, String> {
    let Some(ca) = &tls.ca_pem else {
        return Ok(None);
    };
    reqwest::Certificate::from_pem_bundle(ca.as_bytes())
        .map(Some)
        .map_err(|e| format!("tls.ca_pem: cannot be used: {e}"))
}

/// Whether the HTTP client can take `tls`.
pub fn check(tls: &Tls) -> Result<(), String> {
    identity(tls)?;
    roots(tls)?;
    Ok(())
}
