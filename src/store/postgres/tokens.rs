//! API tokens: their hashes, names and scopes.

use async_trait::async_trait;

use super::super::{Error, Result};
use super::PgStore;
use super::db::Sql;
use crate::domain::token::{ApiToken, scopes_from_text, scopes_to_text};
use crate::store::Tokens;

#[async_trait]
impl Tokens for PgStore {
    /// `Conflict` if the id (or, against all odds, the hash) exists.
    async fn create_token(&self, t: ApiToken) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&t.id));
        let mut c = self.db.get("create").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                "INSERT INTO api_tokens (id, name, scopes, hash, created_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[
                    &t.id,
                    &t.name,
                    &scopes_to_text(&t.scopes),
                    &t.hash,
                    &t.created_at,
                ],
            )
            .await?;
        if n == 0 {
            return Err(Error::Conflict(format!(
                "token \"{}\" already exists",
                t.id
            )));
        }
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await
    }

    async fn list_tokens(&self) -> Result<Vec<ApiToken>> {
        let c = self.db.get("list").await?;
        c.query(
            "SELECT id, name, scopes, hash, created_at FROM api_tokens ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|r| {
            Ok(ApiToken {
                id: r.get(0),
                name: r.get(1),
                scopes: scopes_from_text(r.get(2)).map_err(Error::Backend)?,
                hash: r.get(3),
                created_at: r.get(4),
            })
        })
        .collect()
    }

    async fn delete_token(&self, id: String) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("delete").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute("DELETE FROM api_tokens WHERE id = $1", &[&id])
            .await?;
        super::audit::audited(tx, n, audit.as_ref()).await
    }
}
