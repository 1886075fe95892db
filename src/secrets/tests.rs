//! The keyring's tests: sealing bound to client and field, keys, key files.

use super::*;

#[test]
fn sealed_values_open_for_their_client_and_field_only() {
    let ring = Keyring::with_keys(&[[7u8; KEY_LEN]]);
    let id = ring.ids()[0].clone();
    assert_eq!(id.len(), 8);
    let sealed = ring.seal(&id, "client-a", "f", "whsec_secret").unwrap();
    assert!(sealed.starts_with(&format!("enc:{id}:")), "{sealed}");
    assert!(!sealed.contains("whsec_secret"));
    assert_ne!(
        ring.seal(&id, "client-a", "f", "whsec_secret").unwrap(),
        sealed
    );
    assert_eq!(ring.open("client-a", "f", &sealed).unwrap(), "whsec_secret");
    assert!(matches!(
        ring.open("client-b", "f", &sealed),
        Err(Error::Corrupt(_))
    ));
    assert_eq!(
        ring.open("client-a", "f", "whsec_plain").unwrap(),
        "whsec_plain"
    );
    assert!(
        ring.open("client-a", "g", &sealed).is_err(),
        "another field"
    );
    let unbound = ring.seal_for_client(&id, "client-a", "v");
    assert_eq!(ring.open("client-a", "g", &unbound).unwrap(), "v");
    ring.refuse_unbound();
    assert!(ring.open("client-a", "f", "whsec_plain").is_err());
    assert!(ring.open("client-a", "g", &unbound).is_err());
    assert_eq!(ring.open("client-a", "f", &sealed).unwrap(), "whsec_secret");
    let mut damaged = sealed.clone();
    damaged.pop();
    damaged.push(if sealed.ends_with('A') { 'B' } else { 'A' });
    assert!(ring.open("client-a", "f", &damaged).is_err());
}

#[test]
fn a_value_under_a_key_not_held_names_the_key() {
    let a = Keyring::with_keys(&[[1u8; KEY_LEN]]);
    let b = Keyring::with_keys(&[[2u8; KEY_LEN]]);
    let sealed = a.seal(&a.ids()[0], "c", "f", "x").unwrap();
    let e = b.open("c", "f", &sealed).unwrap_err().to_string();
    assert!(
        e.contains(&a.ids()[0]) && e.contains("LATCH_SECRET_KEY"),
        "{e}"
    );
}

#[test]
fn given_keys_parse_and_never_show() {
    let k = STANDARD.encode([9u8; KEY_LEN]);
    let keys = SecretKeys::parse(&format!(" {k} , {} ", STANDARD.encode([8u8; 32]))).unwrap();
    assert_eq!(keys.0.len(), 2);
    assert!(!format!("{keys:?}").contains(&k));
    assert!(SecretKeys::parse("").is_err());
    let e = SecretKeys::parse(&STANDARD.encode([1u8; 16])).unwrap_err();
    assert!(e.contains("16 bytes") && e.contains("openssl"), "{e}");
    assert!(
        SecretKeys::parse("not base64!")
            .unwrap_err()
            .contains("base64")
    );
}

#[test]
fn the_key_file_is_made_once_owner_only_and_grows_on_rotation() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(KEY_FILE);
    let ring = Keyring::new(Source::File(path.clone()));
    let first = ring.prepare(None).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let sealed = ring.seal(&first, "c", "f", "v").unwrap();
    // Made once: a second start reads the same key.
    let again = Keyring::new(Source::File(path.clone()));
    assert_eq!(again.prepare(Some(&first)).unwrap(), first);
    // A rotation adds a key; a running keyring finds it by reading the file again.
    let rotated = Keyring::new(Source::File(path.clone()));
    rotated.prepare(Some(&first)).unwrap();
    let second = rotated.add_key_to_file().unwrap();
    assert_ne!(second, first);
    let resealed = rotated.seal(&second, "c", "f", "v").unwrap();
    assert_eq!(again.open("c", "f", &resealed).unwrap(), "v");
    assert_eq!(again.open("c", "f", &sealed).unwrap(), "v");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    rotated.keep_in_file(std::slice::from_ref(&second)).unwrap();
    let fresh = Keyring::new(Source::File(path.clone()));
    assert!(fresh.prepare(Some(&first)).is_err());
    assert_eq!(fresh.prepare(Some(&second)).unwrap(), second);
}

#[test]
fn a_store_with_a_key_but_no_key_file_is_refused_not_given_a_new_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(KEY_FILE);
    let ring = Keyring::new(Source::File(path.clone()));
    let e = ring.prepare(Some("0badc0de")).unwrap_err().to_string();
    assert!(
        e.contains("0badc0de") && e.contains("restore the key file"),
        "{e}"
    );
    assert!(!path.exists(), "no key is made for a store that has one");
}

#[test]
fn a_given_key_file_is_read_again_for_a_new_key_and_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("latch.key");
    let (a, b) = ([1u8; KEY_LEN], [2u8; KEY_LEN]);
    std::fs::write(&path, format!("  {}\n", STANDARD.encode(a))).unwrap();
    let ring = Keyring::new(Source::GivenFile(path.clone()));
    let first = ring.prepare(None).unwrap();
    assert_eq!(first, key_id(&a));
    // The operator puts a new key first (a rotation): a value under it opens.
    std::fs::write(
        &path,
        format!("{},{}", STANDARD.encode(b), STANDARD.encode(a)),
    )
    .unwrap();
    let other = Keyring::with_keys(&[b]);
    let sealed = other.seal(&key_id(&b), "c", "f", "v").unwrap();
    assert_eq!(ring.open("c", "f", &sealed).unwrap(), "v");
    let before = std::fs::read(&path).unwrap();
    let e = ring.add_key_to_file().unwrap_err().to_string();
    assert!(e.contains("LATCH_SECRET_KEY_FILE"), "{e}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "latch never writes it"
    );
    let e = Keyring::new(Source::GivenFile(path.clone()))
        .prepare(Some("0badc0de"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("0badc0de") && e.contains("LATCH_SECRET_KEY_FILE"),
        "{e}"
    );
}

/// Issue #69: the key file is rewritten through a file of this write's own. Before, a
/// fixed `secret.key.new` was removed and remade by each writer, so a second rotation
/// took the first one's file from under it.
#[test]
fn a_key_file_write_leaves_other_writers_files_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(KEY_FILE);
    let ring = Keyring::new(Source::File(path.clone()));
    ring.prepare(None).unwrap();
    let theirs = path.with_extension("key.new");
    std::fs::write(&theirs, "another rotation's file in progress").unwrap();
    ring.add_key_to_file().unwrap();
    assert_eq!(
        std::fs::read_to_string(&theirs).unwrap(),
        "another rotation's file in progress"
    );
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["secret.key", "secret.key.new"],
        "no file of its own left"
    );
    assert_eq!(ring.ids().len(), 2);
}

/// A key file rewritten (a rotation) by root keeps its owner and group (the service's).
#[test]
fn a_rewritten_key_file_keeps_its_owner_and_group() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(KEY_FILE);
    write_key_file(&path, &[[1u8; KEY_LEN]]).unwrap();
    let m = std::fs::metadata(&path).unwrap();
    let owner = if m.uid() == 0 {
        (65534, 65534)
    } else {
        (m.uid(), m.gid())
    };
    std::os::unix::fs::chown(&path, Some(owner.0), Some(owner.1)).unwrap();
    write_key_file(&path, &[[2u8; KEY_LEN], [1u8; KEY_LEN]]).unwrap();
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!((m.uid(), m.gid()), owner);
    assert_eq!(m.permissions().mode() & 0o777, 0o600);
}
