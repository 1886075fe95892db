//! The key clients' secrets are sealed under, and sealing them anew
//! ([`crate::store::sealing`]). A write that seals reads the key `FOR SHARE` in its
//! transaction, so switching keys waits for the writes in flight, and every write after it
//! sees the new key: the resealing that follows the switch misses none.

use async_trait::async_trait;

use super::PgStore;
use super::db::{Db, Sql};
use crate::secrets::Keyring;
use crate::store::sealing::{self, SealedCols};
use crate::store::{Error, Result, Secrets};

/// Clients resealed in one transaction.
const PAGE: i64 = 100;

/// The key a write seals under, read in its transaction (`FOR SHARE`).
pub(super) async fn current(tx: &impl Sql) -> Result<String> {
    let row = tx
        .query_opt("SELECT current FROM secret_key WHERE id = 1 FOR SHARE", &[])
        .await?;
    row.map(|r| r.get(0))
        .ok_or_else(|| Error::Backend("the store has no secret key recorded".into()))
}

async fn sealing_key(db: &Db) -> Result<Option<String>> {
    let c = db.get("sealing_key").await?;
    Ok(
        c.query_opt("SELECT current FROM secret_key WHERE id = 1", &[])
            .await?
            .map(|r| r.get(0)),
    )
}

async fn set_sealing_key(db: &Db, id: String) -> Result<()> {
    let c = db.get("set_sealing_key").await?;
    c.execute(
        "INSERT INTO secret_key (id, current, since) VALUES (1, $1, $2) \
         ON CONFLICT (id) DO UPDATE SET current = excluded.current, since = excluded.since",
        &[&id, &crate::domain::time::now_ms()],
    )
    .await?;
    Ok(())
}

async fn first_sealing_key(db: &Db, id: String) -> Result<String> {
    let c = db.get("first_sealing_key").await?;
    c.execute(
        "INSERT INTO secret_key (id, current, since) VALUES (1, $1, $2) \
         ON CONFLICT (id) DO NOTHING",
        &[&id, &crate::domain::time::now_ms()],
    )
    .await?;
    sealing_key(db)
        .await?
        .ok_or_else(|| Error::Backend("the store has no secret key recorded".into()))
}

async fn reseal(db: &Db, keys: &Keyring) -> Result<u64> {
    let mut after = String::new();
    let mut changed = 0;
    loop {
        let mut c = db.get("reseal").await?;
        let tx = c.transaction().await?;
        let kid = current(&tx).await?;
        let rows = tx
            .query(
                "SELECT id, url, url_password, secret, previous_secret, headers, auth, tls \
                 FROM clients WHERE id > $1 ORDER BY id LIMIT $2 FOR UPDATE",
                &[&after, &PAGE],
            )
            .await?;
        let Some(last) = rows.last() else {
            return Ok(changed);
        };
        after = last.get(0);
        for r in &rows {
            let id: String = r.get(0);
            let cols = SealedCols {
                url: r.get(1),
                url_password: r.get(2),
                secret: r.get(3),
                previous_secret: r.get(4),
                headers: r.get(5),
                auth: r.get(6),
                tls: r.get(7),
            };
            let fresh = sealing::reseal(keys, &kid, &id, &cols)
                .map_err(|e| Error::Backend(format!("client {id}: {e}")))?;
            if let Some(s) = fresh {
                tx.execute(
                    "UPDATE clients SET url = $2, url_password = $3, secret = $4, \
                     previous_secret = $5, headers = $6, auth = $7, tls = $8 WHERE id = $1",
                    &[
                        &id,
                        &s.url,
                        &s.url_password,
                        &s.secret,
                        &s.previous_secret,
                        &s.headers,
                        &s.auth,
                        &s.tls,
                    ],
                )
                .await?;
                changed += 1;
            }
        }
        tx.commit().await?;
    }
}

#[async_trait]
impl Secrets for PgStore {
    async fn sealing_key(&self) -> Result<Option<String>> {
        sealing_key(&self.db).await
    }

    async fn set_sealing_key(&self, id: String) -> Result<()> {
        set_sealing_key(&self.db, id).await
    }

    async fn first_sealing_key(&self, id: String) -> Result<String> {
        first_sealing_key(&self.db, id).await
    }

    async fn reseal(&self) -> Result<u64> {
        reseal(&self.db, &self.keys).await
    }
}
