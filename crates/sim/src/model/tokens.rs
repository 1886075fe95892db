//! API tokens, kept by hash: `tokens.rs` of both backends.

use async_trait::async_trait;

use latch::domain::token::ApiToken;
use latch::store::{Error, Result, Tokens};

use super::node::NodeStore;

#[async_trait]
impl Tokens for NodeStore {
    /// `Conflict` if the id (or, against all odds, the hash) exists.
    async fn create_token(&self, token: ApiToken) -> Result<()> {
        self.audited(
            "create_token",
            Some(token.id.clone()),
            |t, _| {
                if t.tokens.contains_key(&token.id)
                    || t.tokens.values().any(|k| k.hash == token.hash)
                {
                    return Err(Error::Conflict(format!(
                        "token \"{}\" already exists",
                        token.id
                    )));
                }
                t.tokens.insert(token.id.clone(), token);
                Ok(())
            },
            |_, r| Some(r),
        )
        .await
    }

    /// By id: ULIDs, so oldest first.
    async fn list_tokens(&self) -> Result<Vec<ApiToken>> {
        self.run("list_tokens", false, |t, _| {
            Ok(t.tokens.values().cloned().collect())
        })
        .await
    }

    async fn delete_token(&self, id: String) -> Result<bool> {
        self.audited(
            "delete_token",
            None,
            |t, _| Ok(t.tokens.remove(&id).is_some()),
            |ok, r| ok.then_some(r),
        )
        .await
    }
}
