//! The key clients' secrets are sealed under, and sealing them anew
//! ([`crate::store::sealing`]). A write that seals reads the key `FOR SHARE` in its
//! transaction, so switching keys waits for the writes in flight, and every write after it
//! sees the new key: the resealing that follows the switch misses none.

use async_trait::async_trait;

use super::PgStore;
use super::db::Sql;
use crate::store::sealing::{self, SealedCols};
use crate::store::{Error, Result, Secrets};

/// When a key was recorded: the database's time, a stamp for people (nothing decides by
/// it), as the leases' times are.
const SINCE: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

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

/// `latch rotate-key`'s hold on the store ([`PgStore::rotation_lock`]): a session-level
/// advisory lock on a connection of its own, released when that connection closes.
pub struct RotationLock(Option<deadpool_postgres::Object>);

impl Drop for RotationLock {
    fn drop(&mut self) {
        // Out of the pool and closed: the session, and its lock, end with it (a connection
        // given back to the pool would keep the lock for whoever takes it next).
        if let Some(obj) = self.0.take() {
            drop(deadpool_postgres::Object::take(obj));
        }
    }
}

impl PgStore {
    /// The rotation's lock, or a refusal when another `latch rotate-key` holds it.
    pub async fn rotation_lock(&self) -> anyhow::Result<RotationLock> {
        let c = self.db.unbounded().await?;
        let held: bool = c
            .query_one(
                "SELECT pg_try_advisory_lock($1, hashtext(current_schema()))",
                &[&super::ROTATION_LOCK],
            )
            .await?
            .get(0);
        anyhow::ensure!(
            held,
            "another latch rotate-key is running on this database: one rotation at a time"
        );
        Ok(RotationLock(Some(c)))
    }
}

#[async_trait]
impl Secrets for PgStore {
    async fn nodes_without_key(
        &self,
        id: &str,
        live_within: std::time::Duration,
    ) -> Result<Vec<String>> {
        let c = self.db.get("nodes_without_key").await?;
        let rows = c
            .query(
                "SELECT id || ' (' || address || ')' FROM latch_nodes \
                 WHERE heartbeat_at > now() - $2::int8 * interval '1 millisecond' \
                 AND NOT ($1 = ANY(string_to_array(coalesce(key_ids, ''), ','))) \
                 ORDER BY id",
                &[&id, &(live_within.as_millis() as i64)],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn sealing_key(&self) -> Result<Option<String>> {
        let c = self.db.get("sealing_key").await?;
        Ok(
            c.query_opt("SELECT current FROM secret_key WHERE id = 1", &[])
                .await?
                .map(|r| r.get(0)),
        )
    }

    async fn set_sealing_key(&self, id: String) -> Result<()> {
        let c = self.db.get("set_sealing_key").await?;
        c.execute(
            &format!(
                "INSERT INTO secret_key (id, current, since) VALUES (1, $1, {SINCE}) \
                 ON CONFLICT (id) DO UPDATE SET current = excluded.current, since = excluded.since"
            ),
            &[&id],
        )
        .await?;
        Ok(())
    }

    async fn first_sealing_key(&self, id: String) -> Result<String> {
        let c = self.db.get("first_sealing_key").await?;
        c.execute(
            &format!(
                "INSERT INTO secret_key (id, current, since) VALUES (1, $1, {SINCE}) \
                 ON CONFLICT (id) DO NOTHING"
            ),
            &[&id],
        )
        .await?;
        self.sealing_key()
            .await?
            .ok_or_else(|| Error::Backend("the store has no secret key recorded".into()))
    }

    async fn keys_in_use(&self) -> Result<Vec<String>> {
        let c = self
            .db
            .get_for("keys_in_use", super::db::Bound::Bulk)
            .await?;
        let rows = c
            .query(
                "SELECT url, url_password, secret, previous_secret, headers, auth, tls \
                 FROM clients",
                &[],
            )
            .await?;
        let mut ids = std::collections::BTreeSet::new();
        for r in &rows {
            let cols = SealedCols {
                url: r.get(0),
                url_password: r.get(1),
                secret: r.get(2),
                previous_secret: r.get(3),
                headers: r.get(4),
                auth: r.get(5),
                tls: r.get(6),
            };
            ids.extend(sealing::key_ids(&cols).map_err(Error::Backend)?);
        }
        Ok(ids.into_iter().collect())
    }

    async fn reseal(&self) -> Result<u64> {
        let mut after = String::new();
        let mut changed = 0;
        loop {
            let mut c = self.db.get("reseal").await?;
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
                let fresh = sealing::reseal(&self.keys, &kid, &id, &cols)
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::MIGRATIONS;
    use super::super::tests::{schema_at, test_keys};
    use super::*;
    use crate::store::Registry;

    /// A database an earlier latch wrote: its plain signing secrets and broker password
    /// are sealed at the first keyed start, and read back the same.
    #[tokio::test]
    async fn plain_rows_of_an_earlier_version_are_sealed_at_start() {
        let before = MIGRATIONS
            .iter()
            .position(|m| m.contains("CREATE TABLE secret_key"))
            .unwrap();
        let Some((c, url)) = schema_at(before).await else {
            return;
        };
        c.batch_execute(
            "INSERT INTO clients (id, name, url, secret, created_at, previous_secret) VALUES \
             ('c1', 'c', 'mqtt://u:plain-broker-pw@b/t', 'whsec_cGxhaW4tc2lnbmluZy1rZXk=', 1, \
              'whsec_b2xkLXBsYWluLWtleS12YWx1ZQ==')",
        )
        .await
        .unwrap();
        let store = PgStore::connect(&url, Duration::from_secs(5))
            .await
            .unwrap()
            .keyed(test_keys())
            .await
            .unwrap();
        let got = store.get_client("c1".into()).await.unwrap().unwrap();
        assert_eq!(got.url, "mqtt://u:plain-broker-pw@b/t");
        assert_eq!(got.secret, "whsec_cGxhaW4tc2lnbmluZy1rZXk=");
        let raw = c
            .query_one(
                "SELECT url, secret, previous_secret, url_password FROM clients",
                &[],
            )
            .await
            .unwrap();
        assert_eq!(raw.get::<_, String>(0), "mqtt://u@b/t");
        for i in 1..4 {
            let v: String = raw.get(i);
            assert!(v.starts_with(crate::secrets::SEALED_PREFIX), "{v}");
        }
        assert_eq!(store.reseal().await.unwrap(), 0);
        // Another node with another key is refused at start, saying which key it lacks.
        let other = std::sync::Arc::new(crate::secrets::Keyring::with_keys(&[[9u8; 32]]));
        let e = PgStore::connect(&url, Duration::from_secs(5))
            .await
            .unwrap()
            .keyed(other)
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("LATCH_SECRET_KEY does not hold"), "{e}");
    }
}
