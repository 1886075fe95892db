//! Node-to-node trust: every request between cluster nodes carries a secret, always.
//!
//! The secret is `cluster_secret` when it is configured; otherwise one made once by the
//! first node that needs it and kept in the database the nodes share, so a cluster set up
//! with nothing but `database_url` is authenticated too, and no setting of the API's
//! tokens can leave these endpoints open or make every peer refuse every other.
//!
//! What still cannot work is nodes holding different secrets (one configured, one not, or
//! two values): each would refuse the other's forwards. So each node records a fingerprint
//! of its secret beside its registration, and a node that finds a live node with another
//! fingerprint refuses to start, naming the fix.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rand::RngCore;
use sha2::{Digest, Sha256};

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
    let others = store
        .secret_disagreements(node, &fingerprint(secret), live_within)
        .await?;
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

/// A short, one-way name of a secret, to compare nodes' secrets without storing them.
/// Whoever reads it can read the database, and with it the shared secret, anyway.
pub fn fingerprint(secret: &str) -> String {
    let digest = Sha256::new()
        .chain_update(b"latch cluster secret\0")
        .chain_update(secret.as_bytes())
        .finalize();
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
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
        assert_eq!(fingerprint("a"), fingerprint("a"));
        assert_ne!(fingerprint("a"), fingerprint("b"));
        assert_eq!(fingerprint("a").len(), 24);
        assert_ne!(generate(), generate());
        assert!(admits("s3cret", Some("s3cret")));
        assert!(!admits("s3cret", Some("s3cre")));
        assert!(!admits("s3cret", None));
    }
}
