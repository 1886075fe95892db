//! Idempotency keys: the rule is [`crate::store::idempotency::take_step`]; the applied
//! positions are written by the group commit (`commit.rs`).

use async_trait::async_trait;

use super::PgStore;
use super::db::Sql;
use crate::domain::Millis;
use crate::store::idempotency::{applied_positions, take_step};
use crate::store::{Error, Idempotency, KeyRow, Result, Taken};

#[async_trait]
impl Idempotency for PgStore {
    async fn take_key(
        &self,
        key: String,
        fingerprint: String,
        now: Millis,
        stale_before: Millis,
    ) -> Result<Taken> {
        let mut c = self.db.get("take_key").await?;
        let tx = c.transaction().await?;
        // A row to lock first, released (`taken_at` 0) when the key is new: two requests
        // with one key meet on it.
        tx.execute(
            "INSERT INTO idempotency_keys (key, fingerprint, created_at, taken_at) \
             VALUES ($1, $2, $3, 0) ON CONFLICT DO NOTHING",
            &[&key, &fingerprint, &now],
        )
        .await?;
        let r = tx
            .query_one(
                "SELECT fingerprint, taken_at, status, body FROM idempotency_keys \
                 WHERE key = $1 FOR UPDATE",
                &[&key],
            )
            .await?;
        let status: Option<i32> = r.get(2);
        let body: Option<String> = r.get(3);
        let row = KeyRow {
            fingerprint: r.get(0),
            taken_at: r.get(1),
            answer: status.map(|s| s as u16).zip(body),
        };
        if let Some(found) = take_step(&row, &fingerprint, stale_before) {
            return Ok(found);
        }
        tx.execute(
            "UPDATE idempotency_keys SET taken_at = $2 WHERE key = $1",
            &[&key, &now],
        )
        .await?;
        let texts: Vec<String> = tx
            .query(
                "SELECT positions FROM idempotency_applied WHERE key = $1",
                &[&key],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let applied =
            applied_positions(texts.iter().map(String::as_str)).map_err(Error::Backend)?;
        tx.commit().await?;
        Ok(Taken::Fresh { applied })
    }

    async fn answer_key(&self, key: String, answer: Option<(u16, String)>) -> Result<()> {
        let c = self.db.get("answer_key").await?;
        let (status, body) = answer.unzip();
        let status = status.map(i32::from);
        c.execute(
            "UPDATE idempotency_keys SET taken_at = 0, status = $2, body = $3 WHERE key = $1",
            &[&key, &status, &body],
        )
        .await?;
        Ok(())
    }

    async fn forget_keys(&self, before: Millis) -> Result<u64> {
        let c = self.db.get("forget_keys").await?;
        let n = c
            .execute(
                "DELETE FROM idempotency_keys WHERE created_at < $1",
                &[&before],
            )
            .await?;
        c.execute(
            "DELETE FROM idempotency_applied WHERE applied_at < $1",
            &[&before],
        )
        .await?;
        Ok(n)
    }
}
