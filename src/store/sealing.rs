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
    // Plain too: a password written into the URL before secrets were sealed opens as it
    // is until the store is resealed, and is refused after, as every plain value is.
    if let (bare, Some(password)) = destination::split_password(url) {
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
pub async fn rotate(
    store: &dyn Secrets,
    keys: &Keyring,
    live_within: std::time::Duration,
) -> anyhow::Result<Rotated> {
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
    // A live node that cannot open `to` would fail every delivery once its clients are
    // resealed: refused before anything changes.
    let lacking = store.nodes_without_key(&to, live_within).await?;
    if !lacking.is_empty() {
        anyhow::bail!(
            "refused: {} running and {} not report key {to}; give every node the new key \
             first (LATCH_SECRET_KEY=new,old with a rolling restart, or the new key first in \
             each node's LATCH_SECRET_KEY_FILE), wait for their next heartbeat, then run \
             latch rotate-key again; nothing was changed",
            lacking.join(", "),
            if lacking.len() == 1 { "does" } else { "do" }
        );
    }
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
mod tests;
