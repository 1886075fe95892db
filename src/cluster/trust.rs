//! Node-to-node trust: every request between cluster nodes carries a secret, always.
//!
//! The secret is `cluster_secret` when it is configured; otherwise one made once by the
//! first node that needs it and kept in the database the nodes share, so a cluster set up
//! with nothing but `database_url` is authenticated too, and no setting of the API's
//! tokens can leave these endpoints open or make every peer refuse every other.
//!
//! What still cannot work is nodes holding different secrets (one configured, one not, or
//! two values): each would refuse the other's forwards. So each node records a fingerprint
//! of its secret beside its registration, and a node that finds a live node whose
//! fingerprint its own secret does not match refuses to start, naming the fix.
//!
//! A fingerprint is salted — a random salt of its own and HMAC-SHA256 keyed by it — so a
//! dump of the database gives nothing to look a configured secret up in, and each guess
//! at it costs a hash per node row. Older versions kept an unsalted SHA-256; the first
//! node of this version to start forgets those.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::store::ClusterStore;

/// Nodes whose secret differs from this node's: the cluster could not work.
#[derive(Debug, thiserror::Error)]
#[error(
    "live cluster node(s) {nodes} authenticate with another cluster secret, so they and \
     this node would refuse each other's requests: set the same LATCH_CLUSTER_SECRET \
     (cluster_secret) on every node, or leave it unset on every node to use the one kept in \
     the database{hint}"
)]
pub struct Mismatch {
    nodes: String,
    hint: &'static str,
}

/// The secret this node authenticates with and expects: `configured`, else the database's.
pub async fn secret(
    store: &dyn ClusterStore,
    configured: Option<&str>,
) -> crate::store::Result<String> {
    match configured {
        Some(s) => Ok(s.to_string()),
        None => store.shared_secret(&generate()).await,
    }
}

/// Records this node's fingerprint and refuses a cluster whose live nodes use another
/// secret. Called once the node is registered, so of two nodes starting at once with
/// different secrets, the later to look sees the other.
pub async fn agree(
    store: &dyn ClusterStore,
    node: &str,
    secret: &str,
    configured: bool,
    live_within: std::time::Duration,
) -> Result<(), super::Error> {
    let others: Vec<String> = store
        .secret_fingerprints(node, &fingerprint(secret), FORM, live_within)
        .await?
        .into_iter()
        .filter(|(_, theirs)| !matches(secret, theirs))
        .map(|(id, _)| id)
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(Mismatch {
        nodes: others.join(", "),
        hint: if configured {
            ""
        } else {
            " (this node has none set)"
        },
    }
    .into())
}

/// 32 random bytes, base64url: as strong as an API token.
fn generate() -> String {
    let mut key = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut key);
    URL_SAFE_NO_PAD.encode(key)
}

/// How this version's fingerprints begin; a recorded one in another form is forgotten.
const FORM: &str = "hmac-sha256$";

/// A one-way name of a secret, under a fresh random salt, to compare nodes' secrets
/// without storing them: `hmac-sha256$<salt>$<tag>`, in hex.
pub fn fingerprint(secret: &str) -> String {
    let mut salt = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut salt);
    salted(&salt, secret)
}

/// Whether `fingerprint` (another node's) was made of `secret`.
pub fn matches(secret: &str, fingerprint: &str) -> bool {
    let salt = fingerprint
        .strip_prefix(FORM)
        .and_then(|rest| rest.split_once('$'))
        .and_then(|(salt, _)| hex::decode(salt).ok());
    salt.is_some_and(|salt| {
        crate::domain::token::constant_time_eq(&salted(&salt, secret), fingerprint)
    })
}

fn salted(salt: &[u8], secret: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(salt).expect("HMAC takes a key of any length");
    mac.update(b"latch cluster secret\0");
    mac.update(secret.as_bytes());
    let tag = mac.finalize().into_bytes();
    format!("{FORM}{}${}", hex::encode(salt), hex::encode(&tag[..16]))
}

/// Whether `given` is `secret`, in time independent of where they differ.
pub fn admits(secret: &str, given: Option<&str>) -> bool {
    given.is_some_and(|g| crate::domain::token::constant_time_eq(g, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_tell_secrets_apart_and_admits_wants_the_secret() {
        let a = fingerprint("a");
        assert_ne!(a, fingerprint("a"), "salted anew each time");
        assert!(matches("a", &a));
        assert!(matches("a", &fingerprint("a")));
        assert!(!matches("b", &a));
        assert!(
            !matches("a", "9daa0c5e22c704c0e9542e9d"),
            "an older form matches nothing"
        );
        assert!(!matches("a", "hmac-sha256$zz$00"));
        assert_ne!(generate(), generate());
        assert!(admits("s3cret", Some("s3cret")));
        assert!(!admits("s3cret", Some("s3cre")));
        assert!(!admits("s3cret", None));
    }
}
