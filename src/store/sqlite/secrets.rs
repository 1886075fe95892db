//! The key clients' secrets are sealed under, and sealing them anew ([`crate::store::sealing`]):
//! on the writer of a running store, or on a connection of its own for `latch rotate-key`,
//! which runs beside a latch serving the folder (SQLite's lock takes their write
//! transactions in turn, so each client is read and resealed in one of them).

use std::path::Path;
use std::sync::Mutex;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::SqliteStore;
use crate::secrets::Keyring;
use crate::store::sealing::{self, SealedCols};
use crate::store::{Error, Result, Secrets};

/// Clients resealed in one write transaction.
const PAGE: i64 = 100;

/// The key new secrets are sealed under; `None` before the store's first keyed start.
pub(super) fn sealing_key(c: &Connection) -> Result<Option<String>> {
    Ok(
        c.query_row("SELECT current FROM secret_key WHERE id = 1", [], |r| {
            r.get(0)
        })
        .optional()?,
    )
}

/// [`sealing_key`] for a write that seals: a store opened by latch always has one.
pub(super) fn current(c: &Connection) -> Result<String> {
    sealing_key(c)?.ok_or_else(|| Error::Backend("the store has no secret key recorded".into()))
}

/// When a key was recorded: SQLite's own time, a stamp for people (nothing decides by it).
const SINCE: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Records `id` unless a key is recorded; the key recorded after.
pub(super) fn first_sealing_key(c: &Connection, id: &str) -> Result<String> {
    c.execute(
        &format!(
            "INSERT INTO secret_key (id, current, since) VALUES (1, ?1, {SINCE}) \
             ON CONFLICT (id) DO NOTHING"
        ),
        params![id],
    )?;
    current(c)
}

/// Reseals every client whose secrets are not all sealed under the current key, a page at
/// a time; answers how many changed.
pub(super) fn reseal(c: &mut Connection, keys: &Keyring) -> Result<u64> {
    let mut after = String::new();
    let mut changed = 0;
    loop {
        let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let kid = current(&tx)?;
        let rows = tx
            .prepare_cached(
                "SELECT id, url, url_password, secret, previous_secret, headers, auth, tls \
                 FROM clients WHERE id > ?1 ORDER BY id LIMIT ?2",
            )?
            .query_map(params![after, PAGE], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    SealedCols {
                        url: r.get(1)?,
                        url_password: r.get(2)?,
                        secret: r.get(3)?,
                        previous_secret: r.get(4)?,
                        headers: r.get(5)?,
                        auth: r.get(6)?,
                        tls: r.get(7)?,
                    },
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let Some((last, _)) = rows.last() else {
            return Ok(changed);
        };
        after = last.clone();
        for (id, cols) in &rows {
            let fresh = sealing::reseal(keys, &kid, id, cols)
                .map_err(|e| Error::Backend(format!("client {id}: {e}")))?;
            if let Some(s) = fresh {
                tx.execute(
                    "UPDATE clients SET url = ?2, url_password = ?3, secret = ?4, \
                     previous_secret = ?5, headers = ?6, auth = ?7, tls = ?8 WHERE id = ?1",
                    params![
                        id,
                        s.url,
                        s.url_password,
                        s.secret,
                        s.previous_secret,
                        s.headers,
                        s.auth,
                        s.tls
                    ],
                )?;
                changed += 1;
            }
        }
        tx.commit()?;
    }
}

/// `latch rotate-key`'s hold on the data folder: a lock on `secret.key.lock` beside the key
/// file (not on the key file itself, which a rotation replaces by renaming a new one over
/// it), held until dropped. `Err` when another rotation holds it.
pub fn rotation_lock(dir: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(format!("{}.lock", crate::secrets::KEY_FILE));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?;
    if f.try_lock().is_err() {
        anyhow::bail!(
            "another latch rotate-key is running on {}: one rotation at a time",
            dir.display()
        );
    }
    Ok(f)
}

/// The data folder's database on a connection of its own, for `latch rotate-key` while a
/// latch may be serving it (the running latch migrated it; one that is not is migrated
/// here, as its start would).
pub struct Offline {
    conn: Mutex<Connection>,
    keys: std::sync::Arc<Keyring>,
}

impl Offline {
    pub fn open(dir: &Path, keys: std::sync::Arc<Keyring>) -> anyhow::Result<Self> {
        let path = dir.join("latch.db");
        anyhow::ensure!(
            path.exists(),
            "data_dir: no latch database in {}",
            dir.display()
        );
        let mut conn = Connection::open(&path)?;
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        super::migrate(&mut conn)?;
        // What a rotation overwrites or frees (cells, overflow pages of a long value) is
        // zeroed, so no page keeps a value sealed under the key it retires.
        conn.pragma_update(None, "secure_delete", "ON")?;
        Ok(Self {
            conn: Mutex::new(conn),
            keys,
        })
    }

    /// Copies the write-ahead log into the database and empties it, so the old page images
    /// it holds (values under the retired key) leave the files; tried for a few seconds
    /// while the running latch's readers hold it. Whether it was emptied.
    pub fn scrub_log(&self) -> Result<bool> {
        for _ in 0..50 {
            let busy: i64 = self
                .with(|c| Ok(c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?))?;
            if busy == 0 {
                return Ok(true);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(false)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c)
    }
}

/// Where the embedded store's [`Secrets`] run: a running store's reader and writer, or the
/// connection of its own that `latch rotate-key` opens ([`Offline`]). Both implement the
/// trait through this one implementation.
#[async_trait]
trait OnConnection: Send + Sync {
    /// The keys clients' secrets are sealed with.
    fn keyring(&self) -> std::sync::Arc<Keyring>;

    /// A read.
    async fn reading<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static;

    /// A write, at the store's durability.
    async fn writing<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static;
}

#[async_trait]
impl OnConnection for SqliteStore {
    fn keyring(&self) -> std::sync::Arc<Keyring> {
        self.keys()
    }

    async fn reading<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.read(f).await
    }

    async fn writing<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        self.write(f).await
    }
}

#[async_trait]
impl OnConnection for Offline {
    fn keyring(&self) -> std::sync::Arc<Keyring> {
        self.keys.clone()
    }

    async fn reading<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        self.with(|c| f(c))
    }

    async fn writing<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        self.with(f)
    }
}

/// The helpers these call are shared with the store's opening, which readies its keys on
/// the writer before there is a store (`prepare_keys`).
#[async_trait]
impl<S: OnConnection> Secrets for S {
    async fn sealing_key(&self) -> Result<Option<String>> {
        self.reading(sealing_key).await
    }

    async fn set_sealing_key(&self, id: String) -> Result<()> {
        self.writing(move |c| {
            c.execute(
                &format!(
                    "INSERT INTO secret_key (id, current, since) VALUES (1, ?1, {SINCE}) \
                     ON CONFLICT (id) DO UPDATE SET current = excluded.current, since = excluded.since"
                ),
                params![id],
            )?;
            Ok(())
        })
        .await
    }

    async fn first_sealing_key(&self, id: String) -> Result<String> {
        self.writing(move |c| first_sealing_key(c, &id)).await
    }

    async fn keys_in_use(&self) -> Result<Vec<String>> {
        self.reading(|c| {
            let mut ids = std::collections::BTreeSet::new();
            let mut stmt = c.prepare(
                "SELECT url, url_password, secret, previous_secret, headers, auth, tls \
                 FROM clients",
            )?;
            let mut rows = stmt.query([])?;
            while let Some(r) = rows.next()? {
                let cols = SealedCols {
                    url: r.get(0)?,
                    url_password: r.get(1)?,
                    secret: r.get(2)?,
                    previous_secret: r.get(3)?,
                    headers: r.get(4)?,
                    auth: r.get(5)?,
                    tls: r.get(6)?,
                };
                ids.extend(sealing::key_ids(&cols).map_err(Error::Backend)?);
            }
            Ok(ids.into_iter().collect())
        })
        .await
    }

    async fn reseal(&self) -> Result<u64> {
        let keys = self.keyring();
        self.writing(move |c| reseal(c, &keys)).await
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MIGRATIONS, Synchronous};
    use super::*;
    use crate::domain::Client;
    use crate::domain::receiver::{Auth, Receiver};
    use crate::store::Registry;

    /// Every file of the data folder but the key, as one byte string.
    fn folder_bytes(dir: &Path) -> Vec<u8> {
        let mut all = Vec::new();
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.file_name().is_some_and(|n| n != crate::secrets::KEY_FILE) && p.is_file() {
                all.extend(std::fs::read(&p).unwrap());
            }
        }
        all
    }

    fn holds(bytes: &[u8], text: &str) -> bool {
        bytes.windows(text.len()).any(|w| w == text.as_bytes())
    }

    #[tokio::test]
    async fn no_secret_reaches_the_files_in_plain_text() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path(), Synchronous::Full).unwrap();
        let secrets = [
            "whsec_c2lnbmluZy1zZWNyZXQtdmFsdWU=",
            "broker-password-value",
            "header-value-secret",
            "basic-password-secret",
        ];
        store
            .create_client(Client {
                id: "c1".into(),
                name: "c".into(),
                url: format!("amqp://guest:{}@127.0.0.1/?exchange=x", secrets[1]),
                secret: secrets[0].into(),
                receiver: Receiver {
                    headers: vec![("X-Key".into(), secrets[2].into())],
                    auth: Some(Auth::Basic {
                        username: "user-name-shown".into(),
                        password: secrets[3].into(),
                    }),
                    tls: None,
                },
                ..Client::default()
            })
            .await
            .unwrap();
        let read = store.get_client("c1".into()).await.unwrap().unwrap();
        assert_eq!(read.secret, secrets[0]);
        let bytes = folder_bytes(dir.path());
        assert!(
            holds(&bytes, "user-name-shown"),
            "the test looks at the right files"
        );
        for s in secrets {
            assert!(!holds(&bytes, s), "{s} in plain text");
        }
    }

    /// A folder an earlier latch wrote: its plain signing secrets and broker password are
    /// sealed at the first start, and read back the same.
    #[tokio::test]
    async fn plain_rows_of_an_earlier_version_are_sealed_at_start() {
        let dir = tempfile::tempdir().unwrap();
        {
            let c = Connection::open(dir.path().join("latch.db")).unwrap();
            for sql in &MIGRATIONS[..12] {
                c.execute_batch(sql).unwrap();
            }
            c.pragma_update(None, "user_version", 12).unwrap();
            c.execute_batch(
                "INSERT INTO clients (id, name, url, secret, created_at, previous_secret) VALUES \
                 ('c1', 'c', 'mqtt://u:plain-broker-pw@b/t', 'whsec_cGxhaW4tc2lnbmluZy1rZXk=', 1, \
                  'whsec_b2xkLXBsYWluLWtleS12YWx1ZQ==')",
            )
            .unwrap();
        }
        let store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
        let c = store.get_client("c1".into()).await.unwrap().unwrap();
        assert_eq!(c.url, "mqtt://u:plain-broker-pw@b/t");
        assert_eq!(c.secret, "whsec_cGxhaW4tc2lnbmluZy1rZXk=");
        let raw: (String, String, Option<String>, String) = store
            .read(|c| {
                Ok(c.query_row(
                    "SELECT url, secret, previous_secret, url_password FROM clients",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )?)
            })
            .await
            .unwrap();
        assert_eq!(raw.0, "mqtt://u@b/t");
        for v in [Some(raw.1), raw.2, Some(raw.3)] {
            assert!(v.unwrap().starts_with(crate::secrets::SEALED_PREFIX));
        }
        assert_eq!(store.reseal().await.unwrap(), 0);
    }

    /// A store whose key file is gone is refused with what to do, not given a new key.
    #[tokio::test]
    async fn a_folder_without_its_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(SqliteStore::open(dir.path(), Synchronous::Normal).unwrap());
        std::fs::remove_file(dir.path().join(crate::secrets::KEY_FILE)).unwrap();
        let e = SqliteStore::open(dir.path(), Synchronous::Normal)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("restore the key file"), "{e}");
        assert!(!dir.path().join(crate::secrets::KEY_FILE).exists());
    }
}
