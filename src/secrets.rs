//! Secrets at rest: every secret latch keeps for its clients (signing secrets, header values,
//! auth secrets, TLS keys, broker passwords) is stored sealed with XChaCha20-Poly1305, so a
//! copy of the store — a stolen disk, a backup, a `pg_dump` — holds none of them in plain
//! text. The key is given from outside (`LATCH_SECRET_KEY`, or the file
//! `LATCH_SECRET_KEY_FILE` names) or, for the embedded store only, `secret.key` in the data
//! folder, made once (mode 0600) the first time a store has no key recorded.
//!
//! A sealed value names its key by id (`enc:<id>:<base64>`), so several keys can be in use
//! at once: the store records which one seals new values (its *current* key) and `latch
//! rotate-key` moves every value to a new one while latch runs. A running latch that meets
//! an id it does not hold reads its key file again (the rotation added the key there, or
//! the operator did to the file `LATCH_SECRET_KEY_FILE` names); with `LATCH_SECRET_KEY`,
//! every node is given the new key first.
//!
//! Each value is sealed with its client's id as associated data, so a sealed value copied
//! into another client's row does not open there. The store seals and opens; everything
//! above it sees plain values and is careful never to log them.

use std::collections::HashMap;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;
use sha2::{Digest, Sha256};

/// How a sealed value starts; no plain value latch stores does (signing secrets start with
/// `whsec_`, and header values, auth secrets and keys are sealed from the first write).
pub const SEALED_PREFIX: &str = "enc:";

/// The key file's name in the data folder.
pub const KEY_FILE: &str = "secret.key";

/// Bytes of a key.
pub const KEY_LEN: usize = 32;

/// Most opened values kept, so a claim does not decrypt the same secret on every attempt.
const OPENED_MAX: usize = 10_000;

/// Why a secret could not be sealed or opened, or a key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    MissingKey(String),
    #[error("a sealed secret is damaged or was not sealed for this client ({0})")]
    Corrupt(String),
    #[error("{0}")]
    Io(String),
}

/// One key and its id: the first 8 hex digits of its SHA-256, so an id says which key
/// without saying anything of it.
pub struct Key {
    pub id: String,
    cipher: XChaCha20Poly1305,
}

impl Key {
    pub fn new(bytes: &[u8; KEY_LEN]) -> Self {
        Self {
            id: key_id(bytes),
            cipher: XChaCha20Poly1305::new(bytes.into()),
        }
    }
}

/// A key's id: what a sealed value and the store name it by.
pub fn key_id(bytes: &[u8; KEY_LEN]) -> String {
    let digest = Sha256::digest(bytes);
    hex::encode(&digest[..4])
}

/// Keys given in `LATCH_SECRET_KEY`: base64 of 32 bytes each, comma-separated. `Debug`
/// shows only their ids.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretKeys(pub Vec<[u8; KEY_LEN]>);

impl fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<String> = self.0.iter().map(key_id).collect();
        write!(f, "SecretKeys(ids: {ids:?})")
    }
}

impl SecretKeys {
    /// Parses `"<base64>, <base64>"`; the message never quotes the text (it is a key).
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys = Vec::new();
        for (i, part) in text.split(',').map(str::trim).enumerate() {
            if part.is_empty() {
                continue;
            }
            keys.push(parse_key(part).map_err(|e| format!("key {}: {e}", i + 1))?);
        }
        if keys.is_empty() {
            return Err("no key given".into());
        }
        Ok(Self(keys))
    }
}

/// One key written as base64.
fn parse_key(text: &str) -> Result<[u8; KEY_LEN], String> {
    let bytes = STANDARD
        .decode(text.trim())
        .map_err(|_| "not base64 (make one with `openssl rand -base64 32`)".to_string())?;
    bytes.try_into().map_err(|b: Vec<u8>| {
        format!(
            "{} bytes; a key is {KEY_LEN} bytes (make one with `openssl rand -base64 32`)",
            b.len()
        )
    })
}

/// A fresh random key.
pub fn generate_key() -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    rand::thread_rng().fill_bytes(&mut k);
    k
}

/// Where the keys come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// `LATCH_SECRET_KEY`: fixed for the life of the process.
    Given(SecretKeys),
    /// `LATCH_SECRET_KEY_FILE`: the operator's file, read again when a value names a key not
    /// yet known, and never written by latch (it may be a read-only credential).
    GivenFile(PathBuf),
    /// The data folder's key file (embedded store only): made by latch, grown by
    /// `latch rotate-key`, read again when a value names a key not yet known.
    File(PathBuf),
}

impl Source {
    /// Where the keys are, for a person: the setting, or the file.
    pub fn describe(&self) -> String {
        match self {
            Source::Given(_) => "LATCH_SECRET_KEY".into(),
            Source::GivenFile(p) => format!("LATCH_SECRET_KEY_FILE ({})", p.display()),
            Source::File(p) => p.display().to_string(),
        }
    }
}

/// The keys of the file `LATCH_SECRET_KEY_FILE` names: as `LATCH_SECRET_KEY` takes them,
/// comma-separated or one a line, surrounding whitespace and `#` lines ignored (so the data
/// folder's own `secret.key`, moved out of it, serves as it is). Errors never quote it.
pub fn read_given_file(path: &Path) -> Result<SecretKeys, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    let keys: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .collect();
    SecretKeys::parse(&keys.join(",")).map_err(|e| Error::Io(format!("{}: {e}", path.display())))
}

/// The keys a process holds, and the values it opened lately.
pub struct Keyring {
    source: Source,
    keys: RwLock<Vec<std::sync::Arc<Key>>>,
    /// Opened values by sealed text, each with the associated data it opened with (looked
    /// up by the text alone: no key is built for a look-up).
    opened: Mutex<HashMap<String, (String, String)>>,
    /// Set once the store's values were all sealed bound to their fields (at start, by
    /// [`crate::store::sealing`]): from then on a plain or client-only value was written
    /// by someone without the key, and [`Keyring::open`] refuses it.
    all_bound: std::sync::atomic::AtomicBool,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring").field("ids", &self.ids()).finish()
    }
}

impl Keyring {
    /// A keyring over `source`; a key file is read (or made) by [`Keyring::prepare`].
    pub fn new(source: Source) -> Self {
        let keys = match &source {
            Source::Given(k) => {
                k.0.iter()
                    .map(|b| std::sync::Arc::new(Key::new(b)))
                    .collect()
            }
            Source::File(_) | Source::GivenFile(_) => Vec::new(),
        };
        Self {
            source,
            keys: RwLock::new(keys),
            opened: Mutex::new(HashMap::new()),
            all_bound: Default::default(),
        }
    }

    /// A keyring holding exactly `keys` (tests, and tools that were handed keys).
    pub fn with_keys(keys: &[[u8; KEY_LEN]]) -> Self {
        Self::new(Source::Given(SecretKeys(keys.to_vec())))
    }

    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The ids of the keys held, in order.
    pub fn ids(&self) -> Vec<String> {
        self.read_keys().iter().map(|k| k.id.clone()).collect()
    }

    /// The ids of the keys this process can open now: with a key file, as it is now (read
    /// again; as held when it cannot be read). What a node reports for `latch rotate-key`.
    pub fn reachable_ids(&self) -> Vec<String> {
        let _ = self.reload();
        self.ids()
    }

    fn read_keys(&self) -> std::sync::RwLockReadGuard<'_, Vec<std::sync::Arc<Key>>> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Gets ready for a store whose current key is `recorded` (`None`: it has none yet) and
    /// answers the id the store is to seal with. With a key file, the file is read, or made
    /// with one new key when the store has no key recorded and there is no file yet.
    pub fn prepare(&self, recorded: Option<&str>) -> Result<String, Error> {
        match &self.source {
            Source::File(path) => {
                match recorded {
                    None if !path.exists() => make_key_file(path, &generate_key())?,
                    Some(id) if !path.exists() => {
                        return Err(Error::MissingKey(self.missing(id)));
                    }
                    _ => {}
                }
                self.reload()?;
            }
            Source::GivenFile(_) => self.reload()?,
            Source::Given(_) => {}
        }
        match recorded {
            Some(id) => {
                self.key(id)?;
                Ok(id.to_string())
            }
            None => self
                .read_keys()
                .first()
                .map(|k| k.id.clone())
                .ok_or_else(|| Error::MissingKey("the secret key file holds no key".into())),
        }
    }

    /// Reads the key file again (a rotation may have added a key).
    fn reload(&self) -> Result<(), Error> {
        let keys = match &self.source {
            Source::Given(_) => return Ok(()),
            Source::GivenFile(path) => read_given_file(path)?.0,
            Source::File(path) => read_key_file(path)?,
        };
        let mut held = self.keys.write().unwrap_or_else(|p| p.into_inner());
        *held = keys
            .iter()
            .map(|b| std::sync::Arc::new(Key::new(b)))
            .collect();
        Ok(())
    }

    /// The key with this id; the key file is read again once when it is not held.
    fn key(&self, id: &str) -> Result<std::sync::Arc<Key>, Error> {
        if let Some(k) = self.read_keys().iter().find(|k| k.id == id) {
            return Ok(k.clone());
        }
        self.reload()?;
        if let Some(k) = self.read_keys().iter().find(|k| k.id == id) {
            return Ok(k.clone());
        }
        Err(Error::MissingKey(self.missing(id)))
    }

    /// What to do about a key this process lacks.
    fn missing(&self, id: &str) -> String {
        match &self.source {
            Source::Given(_) => format!(
                "the store's secrets are sealed under key {id}, which LATCH_SECRET_KEY does not \
                 hold: give this node every key in use (comma-separated, the newest first)"
            ),
            Source::GivenFile(path) => format!(
                "the store's secrets are sealed under key {id}, which LATCH_SECRET_KEY_FILE ({}) \
                 does not hold: put every key in use in it (comma-separated, the newest first)",
                path.display()
            ),
            Source::File(path) => format!(
                "the store's secrets are sealed under key {id}, which {} does not hold: restore \
                 the key file that belongs to this store (a backup cannot deliver without it), \
                 or set LATCH_SECRET_KEY or LATCH_SECRET_KEY_FILE",
                path.display()
            ),
        }
    }

    /// Seals `plain` under key `id` for the field `field` of the client `client`: both are
    /// the associated data, so the value opens there only — moved by someone who can write
    /// the database into another client's row, or into another field of the same row (the
    /// signing secret into a basic password, sent to the receiver), it does not open.
    pub fn seal(&self, id: &str, client: &str, field: &str, plain: &str) -> Result<String, Error> {
        self.seal_for(id, &bound(client, field), BOUND, plain)
    }

    /// A value sealed as before fields were bound: for its client only.
    #[cfg(test)]
    pub(crate) fn seal_for_client(&self, id: &str, client: &str, plain: &str) -> String {
        self.seal_for(id, client, "", plain).expect("sealed")
    }

    /// Seals `plain` under key `id` with associated data `aad`, its payload led by `marker`.
    fn seal_for(&self, id: &str, aad: &str, marker: &str, plain: &str) -> Result<String, Error> {
        let key = self.key(id)?;
        let mut nonce = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut nonce);
        let sealed = key
            .cipher
            .encrypt(
                XNonce::from_slice(&nonce),
                Payload {
                    msg: plain.as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| Error::Corrupt("sealing failed".into()))?;
        let mut bytes = Vec::with_capacity(24 + sealed.len());
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&sealed);
        Ok(format!(
            "{SEALED_PREFIX}{}:{marker}{}",
            key.id,
            URL_SAFE_NO_PAD.encode(bytes)
        ))
    }

    /// Opens a value sealed for `field` of `client`. A value sealed before fields were
    /// bound (bound to its client only) still opens, until a rotation reseals it; a value
    /// that is not sealed (written before secrets were sealed, and not yet resealed) is
    /// returned as it is.
    /// Once [`Keyring::refuse_unbound`], both of those are refused.
    pub fn open(&self, client: &str, field: &str, value: &str) -> Result<String, Error> {
        let all_bound = self.all_bound.load(std::sync::atomic::Ordering::Relaxed);
        let refused = || {
            Error::Corrupt(format!(
                "{field}: plain or sealed for the client only, where every value is sealed \
                 for its field; written without the key?"
            ))
        };
        let Some((id, _)) = sealed_parts(value) else {
            return if all_bound {
                Err(refused())
            } else {
                Ok(value.to_string())
            };
        };
        let aad = match (is_bound(value), all_bound) {
            (true, _) => bound(client, field),
            (false, false) => client.to_string(),
            (false, true) => return Err(refused()),
        };
        let aad = aad.as_str();
        {
            let opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, plain)) = opened.get(value).filter(|(a, _)| a == aad) {
                return Ok(plain.clone());
            }
        }
        let key = self.key(id)?;
        let plain = open_with(&key, aad, value)?;
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        if opened.len() >= OPENED_MAX {
            opened.clear();
        }
        opened.insert(value.to_string(), (aad.to_string(), plain.clone()));
        Ok(plain)
    }

    /// Records that every value of the store is sealed bound to its field: plain and
    /// client-only values are refused from now on.
    pub fn refuse_unbound(&self) {
        self.all_bound
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds a new key to the key file and answers its id (`latch rotate-key` without
    /// `LATCH_SECRET_KEY`). The keys already there stay, so values sealed under them still
    /// open until they are resealed.
    pub fn add_key_to_file(&self) -> Result<String, Error> {
        let Source::File(path) = &self.source else {
            return Err(Error::MissingKey(format!(
                "the keys are given in {}: put the new key first there on every node, then \
                 run latch rotate-key",
                self.source.describe()
            )));
        };
        let mut keys = read_key_file(path)?;
        let new = generate_key();
        keys.insert(0, new);
        write_key_file(path, &keys)?;
        self.reload()?;
        Ok(key_id(&new))
    }

    /// Drops from the key file every key but `keep` (after a rotation resealed everything
    /// under the new key, the keys before the previous one are no longer needed).
    pub fn keep_in_file(&self, keep: &[String]) -> Result<(), Error> {
        let Source::File(path) = &self.source else {
            return Ok(());
        };
        let keys: Vec<[u8; KEY_LEN]> = read_key_file(path)?
            .into_iter()
            .filter(|k| keep.contains(&key_id(k)))
            .collect();
        write_key_file(path, &keys)?;
        self.reload()
    }
}

/// The key id and payload of a sealed value; `None` when it is not one.
pub fn sealed_parts(value: &str) -> Option<(&str, &str)> {
    value.strip_prefix(SEALED_PREFIX)?.split_once(':')
}

/// Whether `value` is sealed, and under which key.
pub fn sealed_under(value: &str) -> Option<&str> {
    sealed_parts(value).map(|(id, _)| id)
}

/// How a payload sealed with its field in the associated data begins (base64url never
/// holds a `.`, so a value sealed before cannot begin so).
const BOUND: &str = "2.";

/// Whether `value` is sealed bound to its field (not only to its client, as before).
pub fn is_bound(value: &str) -> bool {
    sealed_parts(value).is_some_and(|(_, payload)| payload.starts_with(BOUND))
}

/// The associated data of a value sealed for `field` of `client`. A NUL cannot occur in a
/// client id, so no two (client, field) pairs give the same text.
fn bound(client: &str, field: &str) -> String {
    format!("{client}\0{field}")
}

fn open_with(key: &Key, aad: &str, value: &str) -> Result<String, Error> {
    let (_, payload) = sealed_parts(value).ok_or_else(|| Error::Corrupt("not sealed".into()))?;
    let payload = payload.strip_prefix(BOUND).unwrap_or(payload);
    let bytes = URL_SAFE_NO_PAD
        .decode(payload)
        .map_err(|_| Error::Corrupt("not base64".into()))?;
    if bytes.len() < 24 + 16 {
        return Err(Error::Corrupt("too short".into()));
    }
    let (nonce, sealed) = bytes.split_at(24);
    let plain = key
        .cipher
        .decrypt(
            XNonce::from_slice(nonce),
            Payload {
                msg: sealed,
                aad: aad.as_bytes(),
            },
        )
        .map_err(|_| Error::Corrupt(format!("key {}", key.id)))?;
    String::from_utf8(plain).map_err(|_| Error::Corrupt("not text".into()))
}

/// The keys of a key file: one base64 key a line, `#` comments and blank lines skipped.
fn read_key_file(path: &Path) -> Result<Vec<[u8; KEY_LEN]>, Error> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Io(format!("cannot read {}: {e}", path.display())))?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let key = parse_key(line)
            .map_err(|e| Error::Io(format!("{} line {}: {e}", path.display(), i + 1)))?;
        keys.push(key);
    }
    Ok(keys)
}

const KEY_FILE_HEADER: &str = "# latch's secret keys (base64, newest first). Keep a copy with \
     every backup: a store without its key cannot deliver.\n";

/// Makes the key file with `key`, readable by its owner only; an existing file is never
/// overwritten (two starts at once: the second finds the first's).
///
/// Written whole under another name first, synced, then linked under its own: a power cut
/// while it was made leaves no key file (made again at the next start) or a whole one,
/// never one whose name reached the disk before its bytes (an empty file or a torn one,
/// which refused every later start: "the key file holds no key"; found by the power-cut
/// test, crates/sim).
fn make_key_file(path: &Path, key: &[u8; KEY_LEN]) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |e: std::io::Error| Error::Io(format!("cannot write {}: {e}", path.display()));
    if path.exists() {
        return Ok(());
    }
    let tmp = path.with_extension("key.first");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(format!("{KEY_FILE_HEADER}{}\n", STANDARD.encode(key)).as_bytes())
        .map_err(io)?;
    f.sync_all().map_err(io)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        linked => linked.map_err(io)?,
    }
    sync_dir(path);
    Ok(())
}

/// Replaces the key file with `keys` at once (a new file renamed over it), mode 0600. The
/// new file's name is this write's own (a fixed one was removed and remade by whichever
/// writer came second, under the first's feet), and it goes when the write fails. It
/// keeps the owner and group of the file it replaces: `latch rotate-key` run as root on
/// the packaged service's folder must not leave a key the service cannot read.
fn write_key_file(path: &Path, keys: &[[u8; KEY_LEN]]) -> Result<(), Error> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let io = |e: std::io::Error| Error::Io(format!("cannot write {}: {e}", path.display()));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(KEY_FILE);
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{:016x}",
        std::process::id(),
        rand::random::<u64>()
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    let mut text = KEY_FILE_HEADER.to_string();
    for k in keys {
        text.push_str(&STANDARD.encode(k));
        text.push('\n');
    }
    let owned = |f: &std::fs::File| -> std::io::Result<()> {
        let (Ok(old), new) = (std::fs::metadata(path), f.metadata()?) else {
            return Ok(()); // a first key file: this process's own
        };
        if (old.uid(), old.gid()) == (new.uid(), new.gid()) {
            return Ok(());
        }
        std::os::unix::fs::fchown(f, Some(old.uid()), Some(old.gid()))
    };
    let written = owned(&f)
        .and_then(|_| f.write_all(text.as_bytes()))
        .and_then(|_| f.sync_all())
        .and_then(|_| std::fs::rename(&tmp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(io(e));
    }
    sync_dir(path);
    Ok(())
}

/// Makes a file's creation or rename durable.
fn sync_dir(path: &Path) {
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
}

#[cfg(test)]
mod tests;
