//! API tokens over one connection: their hashes, names and scopes.

use async_trait::async_trait;

use super::SqliteStore;
use crate::store::Tokens;
use rusqlite::params;

use super::super::{Error, Result};
use crate::domain::token::{ApiToken, scopes_from_text, scopes_to_text};

#[async_trait]
impl Tokens for SqliteStore {
    /// `Conflict` if the id (or, against all odds, the hash) exists.
    async fn create_token(&self, t: ApiToken) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&t.id));
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "INSERT INTO api_tokens (id, name, scopes, hash, created_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                params![
                    t.id,
                    t.name,
                    scopes_to_text(&t.scopes),
                    t.hash,
                    t.created_at
                ],
            )?;
            if n == 0 {
                return Err(Error::Conflict(format!(
                    "token \"{}\" already exists",
                    t.id
                )));
            }
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn list_tokens(&self) -> Result<Vec<ApiToken>> {
        self.read(move |c| {
            let rows = c
                .prepare_cached(
                    "SELECT id, name, scopes, hash, created_at FROM api_tokens ORDER BY id",
                )?
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter()
                .map(|(id, name, scopes, hash, created_at)| {
                    Ok(ApiToken {
                        id,
                        name,
                        scopes: scopes_from_text(&scopes).map_err(Error::Backend)?,
                        hash,
                        created_at,
                    })
                })
                .collect()
        })
        .await
    }

    async fn delete_token(&self, id: String) -> Result<bool> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute("DELETE FROM api_tokens WHERE id = ?1", [id])?;
            super::audit::audited(tx, n, audit.as_ref())
        })
        .await
    }
}
