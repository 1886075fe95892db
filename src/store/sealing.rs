//! Clients' secrets sealed on their way into the store and opened on their way out
//! ([`crate::secrets`]): the signing secret and the one a rotation replaced, a broker URL's
//! password (kept apart from the URL, in `url_password`), header values, the auth secret
//! and the TLS key. Every backend writes and reads these through this module, so the rule
//! is one: nothing above the store ever sees a sealed value, and no row holds a plain one.
//!
//! Each value is sealed for its client and its field ([`field`]): the associated data
//! binds both, so one moved to another row or another column does not open. Values sealed
//! before fields were bound still open, and are resealed bound by a rotation ([`reseal`]).
//!
//! The key new values are sealed under is the store's (`secret_key`), read in each write's
//! transaction, so a write that races `latch rotate-key` is sealed under the new key or
//! resealed by it ([`rotate`]).

use serde::de::DeserializeOwned;

use super::{Error, Result, Secrets};
use crate::domain::receiver::{Auth, Receiver, Tls};
use crate::domain::{Client, Sendable, destination};
use crate::secrets::{self, Keyring, Source, is_bound, sealed_under};

/// A client's columns that hold secrets, as stored.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct SealedCols {
    pub url: String,
    pub url_password: Option<String>,
    pub secret: String,
    pub previous_secret: Option<String>,
    /// JSON `[[name, sealed value], …]`; `None` without headers.
    pub headers: Option<String>,
    /// JSON [`Auth`] with its secret sealed.
    pub auth: Option<String>,
    /// JSON [`Tls`] with its key sealed.
    pub tls: Option<String>,
}

fn sealing(id: &str, e: secrets::Error) -> Error {
    Error::Backend(format!("client {id}: {e}"))
}

/// The field names sealed values are bound to. Both signing secrets share one: a rotation
/// moves the current one into `previous_secret` in the store itself, and either is a
/// signing secret. A header is bound to its name, an auth secret to the kind of auth.
pub(crate) mod field {
    use crate::domain::receiver::Auth;

    pub const SIGNING: &str = "signing";
    pub const URL_PASSWORD: &str = "url_password";
    pub const TLS_KEY: &str = "tls_key";

    /// Header names are case-insensitive: `X-Api-Key` and `x-api-key` are one.
    pub fn header(name: &str) -> String {
        format!("header:{}", name.to_ascii_lowercase())
    }

    pub fn auth(a: &Auth) -> &'static str {
        match a {
            Auth::Bearer { .. } => "auth:bearer",
            Auth::Basic { .. } => "auth:basic",
            Auth::OAuth2 { .. } => "auth:oauth2",
        }
    }
}

fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).expect("receiver settings serialize")
}

/// `c`'s secrets sealed under key `kid`, with its id as associated data.
pub(crate) fn seal(keys: &Keyring, kid: &str, c: &Client) -> Result<SealedCols> {
    seal_parts(
        keys,
        kid,
        &c.id,
        &c.url,
        &c.secret,
        c.previous_secret.as_deref(),
        &c.receiver,
    )
    .map_err(|e| sealing(&c.id, e))
}

fn seal_parts(
    keys: &Keyring,
    kid: &str,
    id: &str,
    url: &str,
    secret: &str,
    previous_secret: Option<&str>,
    r: &Receiver,
) -> Result<SealedCols, secrets::Error> {
    let s = |f: &str, v: &str| keys.seal(kid, id, f, v);
    let (url, password) = destination::split_password(url);
    let headers = r
        .headers
        .iter()
        .map(|(n, v)| Ok((n.clone(), s(&field::header(n), v)?)))
        .collect::<Result<Vec<_>, secrets::Error>>()?;
    let auth = match &r.auth {
        Some(a) => {
            let (mut a, f) = (a.clone(), field::auth(a));
            for v in a.secrets_mut() {
                *v = s(f, v)?;
            }
            Some(json(&a))
        }
        None => None,
    };
    let tls = match &r.tls {
        Some(t) => Some(json(&Tls {
            client_key_pem: s(field::TLS_KEY, &t.client_key_pem)?,
            ..t.clone()
        })),
        None => None,
    };
    Ok(SealedCols {
        url,
        url_password: password.map(|p| s(field::URL_PASSWORD, &p)).transpose()?,
        secret: s(field::SIGNING, secret)?,
        previous_secret: previous_secret.map(|p| s(field::SIGNING, p)).transpose()?,
        headers: (!headers.is_empty()).then(|| json(&headers)),
        auth,
        tls,
    })
}

/// Reads a JSON column of receiver settings; the store wrote it, so a failure is damage.
pub(crate) fn parse_column<T: DeserializeOwned>(text: Option<String>) -> Result<Option<T>, String> {
    text.map(|t| serde_json::from_str(&t).map_err(|e| format!("a stored receiver setting: {e}")))
        .transpose()
}

/// The receiver settings of the three JSON columns (values still sealed).
pub(crate) fn receiver(
    headers: Option<String>,
    auth: Option<String>,
    tls: Option<String>,
) -> Result<Receiver, String> {
    Ok(Receiver {
        headers: parse_column::<Vec<(String, String)>>(headers)?.unwrap_or_default(),
        auth: parse_column::<Auth>(auth)?,
        tls: parse_column::<Tls>(tls)?,
    })
}

/// The URL a row maps to: with its sealed password back in it, opened by [`open_client`]
/// or [`open_sendable`] like every other sealed value.
pub(crate) fn url_column(url: String, password: Option<String>) -> String {
    match password {
        Some(p) => destination::join_password(&url, &p),
        None => url,
    }
}

/// Opens every sealed value of a client read from the store.
pub(crate) fn open_client(keys: &Keyring, c: &mut Client) -> Result<()> {
    open_parts(
        keys,
        &c.id,
        &mut c.url,
        &mut c.secret,
        &mut c.previous_secret,
        &mut c.receiver,
    )
    .map_err(|e| sealing(&c.id, e))
}

/// Opens every sealed value of a claimed notification's client. One that does not open
/// (damaged, or under a key this node lacks) fails its attempt with the reason
/// ([`Sendable::unopened`]) rather than the claim of every head with it.
pub(crate) fn open_sendable(keys: &Keyring, s: &mut Sendable) {
    let id = s.notification.client_id.clone();
    if let Err(e) = open_parts(
        keys,
        &id,
        &mut s.url,
        &mut s.secret,
        &mut s.previous_secret,
        &mut s.receiver,
    ) {
        tracing::warn!(client_id = %id, error = %e, "A client's secrets could not be opened.");
        s.unopened = Some(e.to_string());
    }
}

/// [`open_sendable`] for each notification a claim leased.
pub(crate) fn open_claims(keys: &Keyring, claims: &mut [crate::domain::Claim]) {
    for c in claims {
        if let crate::domain::Claim::Send(s) = c {
            open_sendable(keys, s);
        }
    }
}

fn open_parts(
    keys: &Keyring,
    id: &str,
    url: &mut String,
    secret: &mut String,
    previous: &mut Option<String>,
    r: &mut Receiver,
) -> Result<(), secrets::Error> {
    *secret = keys.open(id, field::SIGNING, secret)?;
    if let Some(p) = previous {
        *p = keys.open(id, field::SIGNING, p)?;
    }
    if let (bare, Some(password)) = destination::split_password(url)
        && sealed_under(&password).is_some()
    {
        let password = keys.open(id, field::URL_PASSWORD, &password)?;
        *url = destination::join_password(&bare, &password);
    }
    for (n, v) in &mut r.headers {
        *v = keys.open(id, &field::header(n), v)?;
    }
    if let Some(a) = &mut r.auth {
        let f = field::auth(a);
        for v in a.secrets_mut() {
            *v = keys.open(id, f, v)?;
        }
    }
    if let Some(t) = &mut r.tls {
        t.client_key_pem = keys.open(id, field::TLS_KEY, &t.client_key_pem)?;
    }
    Ok(())
}

/// `cols` of client `id` sealed anew under `kid` when any value is not sealed under it, bound
/// to its field (a plain one from before secrets were sealed, a broker password still in
/// its URL, one under an older key, or one bound to its client only); `None` when all are.
pub(crate) fn reseal(
    keys: &Keyring,
    kid: &str,
    id: &str,
    cols: &SealedCols,
) -> Result<Option<SealedCols>, secrets::Error> {
    let (values, r) = stored_values(cols).map_err(secrets::Error::Corrupt)?;
    let password_in_url = destination::split_password(&cols.url).1.is_some();
    if !password_in_url
        && values
            .iter()
            .all(|v| sealed_under(v) == Some(kid) && is_bound(v))
    {
        return Ok(None);
    }
    let mut url = url_column(cols.url.clone(), cols.url_password.clone());
    let mut secret = cols.secret.clone();
    let mut previous = cols.previous_secret.clone();
    let mut r = r;
    open_parts(keys, id, &mut url, &mut secret, &mut previous, &mut r)?;
    seal_parts(keys, kid, id, &url, &secret, previous.as_deref(), &r).map(Some)
}

/// Every secret value of `cols` as stored (sealed or not), and the receiver settings they
/// came from.
fn stored_values(cols: &SealedCols) -> Result<(Vec<String>, Receiver), String> {
    let r = receiver(cols.headers.clone(), cols.auth.clone(), cols.tls.clone())?;
    let mut values: Vec<String> = vec![cols.secret.clone()];
    values.extend(cols.previous_secret.clone());
    values.extend(cols.url_password.clone());
    values.extend(r.headers.iter().map(|(_, v)| v.clone()));
    if let Some(mut a) = r.auth.clone() {
        values.extend(a.secrets_mut().into_iter().map(|v| v.clone()));
    }
    values.extend(r.tls.as_ref().map(|t| t.client_key_pem.clone()));
    Ok((values, r))
}

/// The ids of the keys `cols`' values are sealed under (a plain value names none).
pub(crate) fn key_ids(cols: &SealedCols) -> Result<Vec<String>, String> {
    let (values, _) = stored_values(cols)?;
    Ok(values
        .iter()
        .filter_map(|v| sealed_under(v).map(str::to_string))
        .collect())
}

/// What [`rotate`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotated {
    /// The key secrets were sealed under before (`None`: the store had none).
    pub from: Option<String>,
    pub to: String,
    /// Clients whose secrets were sealed anew.
    pub resealed: u64,
}

/// Gets `keys` ready for the store and records the key the store seals under, when it had
/// none; then seals whatever is not sealed under it yet (rows written before secrets were
/// sealed, or a rotation cut short). At every start, before anything reads a client.
pub async fn prepare(store: &dyn Secrets, keys: &Keyring) -> anyhow::Result<u64> {
    let recorded = store.sealing_key().await?;
    let current = keys.prepare(recorded.as_deref())?;
    if recorded.is_none() {
        // Another node may have recorded its own key meanwhile: that one stands, and this
        // node must hold it.
        let stands = store.first_sealing_key(current.clone()).await?;
        if stands != current {
            keys.prepare(Some(&stands))?;
        }
    }
    let resealed = store.reseal().await?;
    keys.refuse_unbound();
    Ok(resealed)
}

/// `latch rotate-key`: a new key for the store, every secret sealed anew under it. With
/// a key file, the new key is added to the file (a running latch reads it again when it
/// meets the new id) and, once everything is resealed, keys older than the one it
/// replaced are dropped from it. With `LATCH_SECRET_KEY`, the first key given becomes the
/// store's: every node must hold it before this runs.
pub async fn rotate(store: &dyn Secrets, keys: &Keyring) -> anyhow::Result<Rotated> {
    let recorded = store.sealing_key().await?;
    let from = match &recorded {
        Some(id) => Some(keys.prepare(Some(id))?),
        None => {
            prepare(store, keys).await?;
            store.sealing_key().await?
        }
    };
    let to = match keys.source() {
        Source::File(_) => keys.add_key_to_file()?,
        Source::Given(_) | Source::GivenFile(_) => keys
            .ids()
            .first()
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("{} holds no key", keys.source().describe()))?,
    };
    store.set_sealing_key(to.clone()).await?;
    let resealed = store.reseal().await?;
    // Checked before the drop: a key some row is still sealed under (a write that raced
    // something this rotation did not see) and the store's current one stay in the file.
    let mut keep: Vec<String> = std::iter::once(to.clone()).chain(from.clone()).collect();
    keep.extend(store.keys_in_use().await?);
    keep.extend(store.sealing_key().await?);
    keys.keep_in_file(&keep)?;
    Ok(Rotated { from, to, resealed })
}

#[cfg(test)]
mod tests {
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
                receiver: receiver(cols.headers.clone(), cols.auth.clone(), cols.tls.clone())
                    .unwrap(),
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
                rotate(self.inner, self.other)
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
        let r = rotate(&interleaved, &mine).await.unwrap();
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
}
