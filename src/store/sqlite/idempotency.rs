//! Idempotency keys: the rule is [`crate::store::idempotency::take_step`]; the applied
//! positions are written by the group commit (`commit.rs`).

use async_trait::async_trait;
use rusqlite::params;

use super::SqliteStore;
use crate::domain::Millis;
use crate::store::idempotency::{applied_positions, take_step};
use crate::store::{Error, Idempotency, KeyRow, Result, Taken};

/// At open: a key held by a request of the process before (one process has the data
/// folder at a time, so it stopped) is free for its repeat at once, not after the hold.
pub(super) fn release_all(c: &rusqlite::Connection) -> rusqlite::Result<()> {
    c.execute(
        "UPDATE idempotency_keys SET taken_at = 0 WHERE taken_at != 0",
        [],
    )?;
    Ok(())
}

#[async_trait]
impl Idempotency for SqliteStore {
    async fn take_key(
        &self,
        key: String,
        fingerprint: String,
        now: Millis,
        stale_before: Millis,
    ) -> Result<Taken> {
        self.write(move |c| {
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO idempotency_keys (key, fingerprint, created_at, taken_at) \
                 VALUES (?1, ?2, ?3, 0) ON CONFLICT DO NOTHING",
                params![key, fingerprint, now],
            )?;
            let row = tx.query_row(
                "SELECT fingerprint, taken_at, status, body FROM idempotency_keys WHERE key = ?1",
                [&key],
                |r| {
                    let status: Option<u16> = r.get(2)?;
                    let body: Option<String> = r.get(3)?;
                    Ok(KeyRow {
                        fingerprint: r.get(0)?,
                        taken_at: r.get(1)?,
                        answer: status.zip(body),
                    })
                },
            )?;
            if let Some(found) = take_step(&row, &fingerprint, stale_before) {
                return Ok(found);
            }
            tx.execute(
                "UPDATE idempotency_keys SET taken_at = ?2 WHERE key = ?1",
                params![key, now],
            )?;
            let texts = tx
                .prepare_cached("SELECT positions FROM idempotency_applied WHERE key = ?1")?
                .query_map([&key], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let applied =
                applied_positions(texts.iter().map(String::as_str)).map_err(Error::Backend)?;
            tx.commit()?;
            Ok(Taken::Fresh { applied })
        })
        .await
    }

    async fn answer_key(&self, key: String, answer: Option<(u16, String)>) -> Result<()> {
        self.write(move |c| {
            let (status, body) = answer.unzip();
            c.execute(
                "UPDATE idempotency_keys SET taken_at = 0, status = ?2, body = ?3 WHERE key = ?1",
                params![key, status, body],
            )?;
            Ok(())
        })
        .await
    }

    async fn forget_keys(&self, before: Millis) -> Result<u64> {
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                "DELETE FROM idempotency_keys WHERE created_at < ?1",
                [before],
            )?;
            tx.execute(
                "DELETE FROM idempotency_applied WHERE applied_at < ?1",
                [before],
            )?;
            tx.commit()?;
            Ok(n as u64)
        })
        .await
    }
}
