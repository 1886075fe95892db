//! The sealing of clients' secrets: what is sealed, rotations and their locks, both stores.
use super::*;
use crate::domain::receiver::Auth;

fn client() -> Client {
    Client {
        id: "01CLIENT".into(),
        url: "mqtt://user:hunter2@broker/doors".into(),
        secret: "whsec_c2VjcmV0c2VjcmV0c2VjcmV0".into(),
        previous_secret: Some("whsec_b2xkb2xkb2xkb2xkb2xkb2xk".into()),
        receiver: Receiver {
            headers: vec![("X-Api-Key".into(), "header-secret".into())],
            auth: Some(Auth::Basic {
                username: "u".into(),
                password: "basic-secret".into(),
            }),
            tls: None,
        },
        ..Client::default()
    }
}

#[test]
fn sealed_columns_hold_no_secret_and_open_back() {
    let keys = Keyring::with_keys(&[[3u8; 32]]);
    let kid = keys.ids()[0].clone();
    let c = client();
    let cols = seal(&keys, &kid, &c).unwrap();
    let all = format!("{cols:?}");
    for secret in [
        "hunter2",
        "c2VjcmV0",
        "b2xkb2xk",
        "header-secret",
        "basic-secret",
    ] {
        assert!(!all.contains(secret), "{secret} in {all}");
    }
    assert_eq!(cols.url, "mqtt://user@broker/doors");
    assert!(
        all.contains("X-Api-Key") && all.contains(r#"\"username\":\"u\""#),
        "{all}"
    );
    let mut read = Client {
        url: url_column(cols.url.clone(), cols.url_password.clone()),
        secret: cols.secret.clone(),
        previous_secret: cols.previous_secret.clone(),
        receiver: receiver(cols.headers.clone(), cols.auth.clone(), cols.tls.clone()).unwrap(),
        ..c.clone()
    };
    open_client(&keys, &mut read).unwrap();
    assert_eq!(read, c);
    assert_eq!(reseal(&keys, &kid, &c.id, &cols).unwrap(), None);
}

#[test]
fn plain_and_old_values_are_resealed_under_the_current_key() {
    let keys = Keyring::with_keys(&[[4u8; 32], [5u8; 32]]);
    let (new, old) = (keys.ids()[0].clone(), keys.ids()[1].clone());
    let c = client();
    let plain = SealedCols {
        url: c.url.clone(),
        secret: c.secret.clone(),
        ..SealedCols::default()
    };
    let sealed = reseal(&keys, &new, &c.id, &plain).unwrap().unwrap();
    assert_eq!(sealed.url, "mqtt://user@broker/doors");
    assert_eq!(sealed_under(&sealed.secret), Some(new.as_str()));
    let under_old = seal(&keys, &old, &c).unwrap();
    let moved = reseal(&keys, &new, &c.id, &under_old).unwrap().unwrap();
    assert_eq!(
        sealed_under(moved.url_password.as_deref().unwrap()),
        Some(new.as_str())
    );
    assert!(moved.auth.unwrap().contains(&format!("enc:{new}:")));
}

/// Issue #69 item 6: someone who can write the database but holds no key moves a
/// client's sealed signing secret into its basic password, or a header's value under
/// another header's name; latch would send it to the receiver. It no longer opens.
#[test]
fn a_sealed_value_moved_to_another_field_does_not_open() {
    let keys = Keyring::with_keys(&[[6u8; 32]]);
    let kid = keys.ids()[0].clone();
    let c = client();
    let cols = seal(&keys, &kid, &c).unwrap();
    let read = |cols: &SealedCols| {
        let mut read = Client {
            url: url_column(cols.url.clone(), cols.url_password.clone()),
            secret: cols.secret.clone(),
            previous_secret: cols.previous_secret.clone(),
            receiver: receiver(cols.headers.clone(), cols.auth.clone(), cols.tls.clone()).unwrap(),
            ..c.clone()
        };
        open_client(&keys, &mut read).map(|()| read)
    };
    assert_eq!(read(&cols).unwrap(), c);
    let mut auth: Auth = serde_json::from_str(cols.auth.as_deref().unwrap()).unwrap();
    *auth.secrets_mut()[0] = cols.secret.clone();
    let moved = SealedCols {
        auth: Some(json(&auth)),
        ..cols.clone()
    };
    assert!(
        read(&moved).is_err(),
        "the signing secret as a basic password"
    );
    let mut headers: Vec<(String, String)> =
        serde_json::from_str(cols.headers.as_deref().unwrap()).unwrap();
    headers[0].0 = "Authorization".into();
    let renamed = SealedCols {
        headers: Some(json(&headers)),
        ..cols.clone()
    };
    assert!(
        read(&renamed).is_err(),
        "a header's value under another name"
    );
    // The current signing secret becoming the previous one is what a rotation does.
    let rotated = SealedCols {
        previous_secret: Some(cols.secret.clone()),
        ..cols.clone()
    };
    assert_eq!(
        read(&rotated).unwrap().previous_secret,
        Some(c.secret.clone())
    );
}

/// Values sealed before fields were bound (for their client only) still open, and a
/// rotation reseals them bound, under the same key too.
#[test]
fn values_bound_to_their_client_only_open_and_are_resealed_bound() {
    let keys = Keyring::with_keys(&[[8u8; 32]]);
    let kid = keys.ids()[0].clone();
    let c = client();
    let old = SealedCols {
        url: "mqtt://user@broker/doors".into(),
        url_password: Some(keys.seal_for_client(&kid, &c.id, "hunter2")),
        secret: keys.seal_for_client(&kid, &c.id, &c.secret),
        previous_secret: None,
        ..SealedCols::default()
    };
    assert!(!is_bound(&old.secret));
    let mut read = Client {
        url: url_column(old.url.clone(), old.url_password.clone()),
        secret: old.secret.clone(),
        previous_secret: None,
        receiver: Receiver::default(),
        ..c.clone()
    };
    open_client(&keys, &mut read).unwrap();
    assert_eq!(
        (read.url.as_str(), &read.secret),
        (c.url.as_str(), &c.secret)
    );
    let resealed = reseal(&keys, &kid, &c.id, &old).unwrap().expect("resealed");
    assert!(is_bound(&resealed.secret) && is_bound(resealed.url_password.as_deref().unwrap()));
    assert_eq!(reseal(&keys, &kid, &c.id, &resealed).unwrap(), None);
}

/// Once a start has sealed every value bound to its field, a plain value (or one bound
/// to its client only) can only be the work of someone who wrote the database without
/// the key: it is refused, not sent.
#[tokio::test]
async fn once_resealed_a_plain_or_unbound_value_is_refused() {
    use crate::store::Registry;
    let dir = tempfile::tempdir().unwrap();
    let source = Source::File(dir.path().join(crate::secrets::KEY_FILE));
    let open = || {
        crate::store::sqlite::SqliteStore::open_keyed(
            dir.path(),
            crate::store::sqlite::Synchronous::Normal,
            source.clone(),
        )
        .unwrap()
    };
    let store = open();
    store.create_client(client()).await.unwrap();
    let db = rusqlite::Connection::open(dir.path().join("latch.db")).unwrap();
    // A broker password, in its column or back in the URL, plain: refused as well.
    let (url, sealed): (String, String) = db
        .query_row("SELECT url, url_password FROM clients", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    db.execute("UPDATE clients SET url_password = 'plain-pw'", [])
        .unwrap();
    assert!(store.get_client("01CLIENT".into()).await.is_err());
    db.execute(
        "UPDATE clients SET url = 'mqtt://user:plain-pw@broker/doors', url_password = NULL",
        [],
    )
    .unwrap();
    assert!(store.get_client("01CLIENT".into()).await.is_err());
    db.execute(
        "UPDATE clients SET url = ?1, url_password = ?2",
        [&url, &sealed],
    )
    .unwrap();
    assert!(store.get_client("01CLIENT".into()).await.is_ok());
    let auth: String = db
        .query_row("SELECT auth FROM clients", [], |r| r.get(0))
        .unwrap();
    let mut plain: Auth = serde_json::from_str(&auth).unwrap();
    *plain.secrets_mut()[0] = "written-without-the-key".into();
    db.execute("UPDATE clients SET auth = ?1", [json(&plain)])
        .unwrap();
    assert!(store.get_client("01CLIENT".into()).await.is_err());
    // A value written plain before the start is sealed by it, as before.
    drop(store);
    let store = open();
    let read = store.get_client("01CLIENT".into()).await.unwrap().unwrap();
    let mut auth = read.receiver.auth.unwrap();
    assert_eq!(*auth.secrets_mut()[0], "written-without-the-key");
}

/// A store whose resealing first lets another whole rotation run: what a second
/// `latch rotate-key` started meanwhile did before rotations took a lock.
struct Interleaved<'a> {
    inner: &'a dyn Secrets,
    other: &'a Keyring,
    ran: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl Secrets for Interleaved<'_> {
    async fn sealing_key(&self) -> Result<Option<String>> {
        self.inner.sealing_key().await
    }
    async fn set_sealing_key(&self, id: String) -> Result<()> {
        self.inner.set_sealing_key(id).await
    }
    async fn first_sealing_key(&self, id: String) -> Result<String> {
        self.inner.first_sealing_key(id).await
    }
    async fn keys_in_use(&self) -> Result<Vec<String>> {
        self.inner.keys_in_use().await
    }
    async fn reseal(&self) -> Result<u64> {
        if !self.ran.swap(true, std::sync::atomic::Ordering::SeqCst) {
            rotate(self.inner, self.other, std::time::Duration::ZERO)
                .await
                .map_err(|e| Error::Backend(e.to_string()))?;
        }
        self.inner.reseal().await
    }
}

/// Issue #69: a rotation drops no key the store still seals under. Before, the first
/// rotation's clean-up kept only its own two keys and dropped the one the second had
/// made current: every secret was then sealed under a key no file held.
#[tokio::test]
async fn a_rotation_never_drops_the_key_in_use() {
    use crate::store::Registry;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(crate::secrets::KEY_FILE);
    let store = crate::store::sqlite::SqliteStore::open_keyed(
        dir.path(),
        crate::store::sqlite::Synchronous::Normal,
        Source::File(path.clone()),
    )
    .unwrap();
    store.create_client(client()).await.unwrap();
    let mine = Keyring::new(Source::File(path.clone()));
    let other = Keyring::new(Source::File(path.clone()));
    let interleaved = Interleaved {
        inner: &store,
        other: &other,
        ran: false.into(),
    };
    let r = rotate(&interleaved, &mine, std::time::Duration::ZERO)
        .await
        .unwrap();
    let current = store.sealing_key().await.unwrap().unwrap();
    assert_ne!(current, r.to, "the other rotation made its key current");
    let fresh = Keyring::new(Source::File(path));
    for id in std::iter::once(current).chain(store.keys_in_use().await.unwrap()) {
        fresh
            .prepare(Some(&id))
            .unwrap_or_else(|e| panic!("key {id} dropped while in use: {e}"));
    }
    let read = store.get_client("01CLIENT".into()).await.unwrap().unwrap();
    assert_eq!(
        (read.secret, read.receiver, read.url),
        (client().secret, client().receiver, client().url)
    );
}

/// Issue #69: one `latch rotate-key` at a time; the second is refused and touches
/// nothing, the embedded store's by a lock beside its key file.
#[tokio::test]
async fn a_second_rotation_is_refused_while_one_runs_sqlite() {
    use crate::store::Registry;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(crate::secrets::KEY_FILE);
    let store = crate::store::sqlite::SqliteStore::open_keyed(
        dir.path(),
        crate::store::sqlite::Synchronous::Normal,
        Source::File(path.clone()),
    )
    .unwrap();
    store.create_client(client()).await.unwrap();
    let config = crate::config::Config::for_data_dir(dir.path());
    let held = crate::store::sqlite::rotation_lock(dir.path()).unwrap();
    let before = std::fs::read(&path).unwrap();
    let e = crate::store::rotate_key(&config)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("another latch rotate-key is running"), "{e}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "the key file untouched"
    );
    drop(held);
    let r = crate::store::rotate_key(&config).await.unwrap();
    assert_eq!(r.resealed, 1);
}

/// As above, on PostgreSQL by an advisory lock of the schema.
#[tokio::test]
async fn a_second_rotation_is_refused_while_one_runs_postgres() {
    let Some(schema) = crate::store::postgres::tests::fresh_schema().await else {
        return;
    };
    let url = crate::store::postgres::tests::schema_url(
        &crate::store::postgres::tests::base_url(),
        &schema,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::config::Config::for_data_dir(dir.path());
    config.database_url = Some(url.clone());
    config.secret_key = Some(crate::secrets::SecretKeys(vec![[9u8; 32]]));
    drop(crate::store::connect_cluster(&config).await.unwrap());
    let other = crate::store::postgres::PgStore::connect(&url, config.database_timeout)
        .await
        .unwrap();
    let held = other.rotation_lock().await.unwrap();
    let e = crate::store::rotate_key(&config)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("another latch rotate-key is running"), "{e}");
    drop(held);
    crate::store::rotate_key(&config).await.unwrap();
}

/// Issue #69 item 9: a rotation to a key that a live node has not reported holding is
/// refused, and changes nothing; once the node holds it (restarted with the new key
/// first), the rotation goes through.
#[tokio::test]
async fn a_rotation_waits_for_every_live_node_to_hold_the_new_key() {
    use crate::secrets::SecretKeys;
    let Some(schema) = crate::store::postgres::tests::fresh_schema().await else {
        return;
    };
    let url = crate::store::postgres::tests::schema_url(
        &crate::store::postgres::tests::base_url(),
        &schema,
    );
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::config::Config::for_data_dir(dir.path());
    config.database_url = Some(url);
    config.secret_key = Some(SecretKeys(vec![[9u8; 32]]));
    // Each node in a data folder of its own, as on its own host.
    let node = |mut config: crate::config::Config| async move {
        let own = tempfile::tempdir().unwrap();
        config.data_dir = own.path().to_path_buf();
        let opened = crate::store::connect_cluster(&config).await.unwrap();
        let cluster = opened.cluster.expect("PostgreSQL is shared");
        cluster
            .heartbeat("n1", "http://n1.test/", config.lease())
            .await
            .unwrap();
        opened.store
    };
    let store = node(config.clone()).await;
    store.create_client(client()).await.unwrap();
    let before = store.sealing_key().await.unwrap();

    config.secret_key = Some(SecretKeys(vec![[10u8; 32], [9u8; 32]]));
    let e = crate::store::rotate_key(&config)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("n1 (http://n1.test/)"), "{e}");
    assert!(e.contains("nothing was changed"), "{e}");
    assert_eq!(store.sealing_key().await.unwrap(), before, "not rotated");

    node(config.clone()).await;
    let r = crate::store::rotate_key(&config).await.unwrap();
    assert_eq!(r.resealed, 1);
    assert_ne!(store.sealing_key().await.unwrap(), before);
}

/// Issue #69 item 9: after `latch rotate-key` on the embedded store (with latch running),
/// no byte of the database or its log holds a value sealed under the retired key.
#[tokio::test]
async fn a_rotation_leaves_no_value_under_the_old_key_in_the_files() {
    use crate::store::Registry;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(crate::secrets::KEY_FILE);
    let store = crate::store::sqlite::SqliteStore::open_keyed(
        dir.path(),
        crate::store::sqlite::Synchronous::Normal,
        Source::File(path),
    )
    .unwrap();
    store.create_client(client()).await.unwrap();
    let db = dir.path().join("latch.db");
    let raw = |column: &str| -> String {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.query_row(&format!("SELECT {column} FROM clients"), [], |r| r.get(0))
            .unwrap()
    };
    let old = [raw("secret")];
    // The value in the database file itself, not only in the log.
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let config = crate::config::Config::for_data_dir(dir.path());
    crate::store::rotate_key(&config).await.unwrap();
    assert_ne!(raw("secret"), old[0], "resealed");
    let mut bytes = std::fs::read(&db).unwrap();
    if let Ok(log) = std::fs::read(dir.path().join("latch.db-wal")) {
        bytes.extend(log);
    }
    for value in &old {
        // The sealed text past its key id: what the old key opens.
        let tail = value.rsplit(':').next().unwrap().as_bytes();
        assert!(
            !bytes.windows(tail.len()).any(|w| w == tail),
            "a value sealed under the retired key is still in the files"
        );
    }
    drop(store);
}
