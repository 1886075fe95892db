//! API tokens: who may call the API, and for what. A token's secret is shown once, when it
//! is made; only its SHA-256 is kept, so a copy of the database opens nothing.
//!
//! The secret is 32 random bytes, so a hash without salt or stretching is enough: there is
//! no dictionary to try against it, unlike a password.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::time::Millis;

/// Prefix of every token latch makes, so a leaked one is recognisable (secret scanners).
pub const TOKEN_PREFIX: &str = "latch_";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Everything, tokens included (what `LATCH_API_TOKEN` is).
    Admin,
    /// `POST /v1/readings` only: for devices and gateways.
    Ingest,
    /// Every `GET` but the token list: dashboards.
    Read,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Admin, Scope::Ingest, Scope::Read];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Admin => "admin",
            Scope::Ingest => "ingest",
            Scope::Read => "read",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// A stored token: never its secret, only the secret's hash.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiToken {
    /// Generated ULID, what the API lists and deletes by.
    pub id: String,
    pub name: String,
    /// Sorted, without repeats.
    pub scopes: Vec<Scope>,
    /// [`hash`] of the secret.
    pub hash: String,
    pub created_at: Millis,
}

/// Scopes as stored: comma-separated names.
pub fn scopes_to_text(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// The stored form back; `Err` names an unknown scope (a row no latch wrote).
pub fn scopes_from_text(text: &str) -> Result<Vec<Scope>, String> {
    let mut scopes = text
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| Scope::parse(s).ok_or_else(|| format!("unknown token scope {s:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    scopes.sort();
    scopes.dedup();
    Ok(scopes)
}

/// A new secret: the prefix and 32 random bytes, base64url.
pub fn generate_secret() -> String {
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(key))
}

/// What is stored of a secret: its SHA-256, hex.
pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Compares secrets without an early exit, so the time taken tells nothing of them.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_fresh_and_only_their_hash_is_kept() {
        let a = generate_secret();
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(a.len(), TOKEN_PREFIX.len() + 43);
        assert_ne!(generate_secret(), a);
        assert_eq!(hash(&a), hash(&a));
        assert_eq!(hash(&a).len(), 64);
        assert!(!hash(&a).contains(&a[TOKEN_PREFIX.len()..]));
    }

    #[test]
    fn scopes_round_trip_sorted() {
        let s = scopes_from_text("read,admin,read").unwrap();
        assert_eq!(s, vec![Scope::Admin, Scope::Read]);
        assert_eq!(scopes_to_text(&s), "admin,read");
        assert!(scopes_from_text("root").is_err());
    }
}
