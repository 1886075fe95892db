//! Checks of a client's receiver settings (headers, auth, TLS) and of its secrets sealed
//! at rest: what goes in comes back out, to the API and to a claim, and a rotation of the
//! key loses none of it.

use super::*;
use crate::domain::receiver::{Auth, Receiver, Tls};

fn receiver() -> Receiver {
    Receiver {
        headers: vec![
            ("X-Api-Key".into(), "key-value-1".into()),
            ("Authorization-Extra".into(), "two words".into()),
        ],
        auth: Some(Auth::OAuth2 {
            token_url: "https://idp.example/token".into(),
            client_id: "latch".into(),
            client_secret: "client-secret-1".into(),
            scope: Some("hooks".into()),
            audience: None,
        }),
        tls: Some(Tls {
            client_cert_pem: "-----BEGIN CERTIFICATE-----\ncert\n-----END CERTIFICATE-----\n"
                .into(),
            client_key_pem: "-----BEGIN PRIVATE KEY-----\nkey\n-----END PRIVATE KEY-----\n".into(),
            ca_pem: None,
            subject: "CN=latch".into(),
            not_after: 4_000_000_000_000,
            ca_subject: None,
        }),
    }
}

/// A client with every kind of secret: its signing secret, a broker password, header
/// values, an auth secret and a TLS key.
fn full(id: &str) -> Client {
    Client {
        receiver: receiver(),
        ..client(
            id,
            "mqtt://user:broker-pass@broker.example/doors/{sensor_id}",
        )
    }
}

/// The notification `id`'s claim, leased to `n`.
async fn claimed(s: &dyn Store, id: &str) -> Box<Sendable> {
    let now = now_ms();
    match s
        .claim(vec![id.to_string()], "n".into(), now, now + 60_000, None)
        .await
        .unwrap()
        .pop()
    {
        Some(Claim::Send(x)) => x,
        other => panic!("expected a send, got {other:?}"),
    }
}

pub(super) async fn receiver_settings_round_trip_and_claims_read_them(s: &Subject) {
    let c = full("rx-a");
    s.create_client(c.clone()).await.unwrap();
    assert_eq!(s.get_client("rx-a".into()).await.unwrap(), Some(c.clone()));
    let listed = s.list_clients(page(10), None).await.unwrap();
    assert_eq!(listed.items, vec![c.clone()]);
    s.create_sensor(sensor("rx1")).await.unwrap();
    s.link("rx-a".into(), sid("rx1"), 1).await.unwrap();
    assert_eq!(
        s.list_sensor_clients(sid("rx1"), page(10))
            .await
            .unwrap()
            .items,
        vec![c.clone()]
    );
    let n = s.commit(change("rx1", true, None, 1), 1).await.unwrap();
    let x = claimed(&**s, &n[0].id).await;
    assert_eq!(x.url, c.url, "the broker password is back in the URL");
    assert_eq!(x.secret, c.secret);
    assert_eq!(x.receiver, c.receiver);
    assert_eq!(x.unopened, None);

    // Replaced: new settings, none of the old left; a rotation keeps them.
    let replaced = Client {
        url: "https://hooks.example/in".into(),
        receiver: Receiver {
            headers: vec![("X-Other".into(), "v2".into())],
            auth: Some(Auth::Basic {
                username: "u".into(),
                password: "p2".into(),
            }),
            tls: None,
        },
        ..c.clone()
    };
    assert!(s.replace_client(replaced.clone()).await.unwrap());
    let rotated = s
        .rotate_secret(
            "rx-a".into(),
            "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
            5,
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.receiver, replaced.receiver);
    assert_eq!(rotated.previous_secret.as_deref(), Some(c.secret.as_str()));
    assert_eq!(rotated.url, replaced.url);
    let none = Client {
        receiver: Receiver::default(),
        ..rotated.clone()
    };
    assert!(s.replace_client(none.clone()).await.unwrap());
    assert_eq!(s.get_client("rx-a".into()).await.unwrap(), Some(none));
}

pub(super) async fn secrets_are_sealed_under_the_stores_key(s: &Subject) {
    let key = s
        .sealing_key()
        .await
        .unwrap()
        .expect("a key is recorded at start");
    s.create_client(full("rx-b")).await.unwrap();
    s.rotate_secret(
        "rx-b".into(),
        "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
        5,
    )
    .await
    .unwrap();
    assert_eq!(
        s.reseal().await.unwrap(),
        0,
        "every value is sealed already"
    );
    assert_eq!(s.sealing_key().await.unwrap(), Some(key));
}

/// `latch rotate-key` on the store in `dir` (its key file), with a claim before and after:
/// every secret is sealed anew and reads the same.
#[cfg(test)]
async fn rotation_reseals_and_reads_go_on(f: &Fresh) {
    let s = &*f.store;
    s.create_client(full("rk-a")).await.unwrap();
    s.create_client(client("rk-b", "http://b/")).await.unwrap();
    s.create_sensor(sensor("rk1")).await.unwrap();
    s.link("rk-a".into(), sid("rk1"), 1).await.unwrap();
    let n = s.commit(change("rk1", true, None, 1), 1).await.unwrap();
    let before = s.sealing_key().await.unwrap().unwrap();
    // Another process's keyring over the same key file, as `latch rotate-key` has.
    let keys = crate::secrets::Keyring::new(crate::secrets::Source::File(
        f._dir.path().join(crate::secrets::KEY_FILE),
    ));
    let r = crate::store::rotate_secret_key(s, &keys, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(r.from.as_deref(), Some(before.as_str()));
    assert_ne!(r.to, before);
    assert_eq!(r.resealed, 2);
    assert_eq!(s.sealing_key().await.unwrap(), Some(r.to.clone()));
    assert_eq!(s.keys_in_use().await.unwrap(), vec![r.to.clone()]);
    // The running store meets the new key in the file.
    assert_eq!(
        s.get_client("rk-a".into()).await.unwrap(),
        Some(full("rk-a"))
    );
    let x = claimed(s, &n[0].id).await;
    assert_eq!((x.receiver.clone(), x.unopened.clone()), (receiver(), None));
    s.create_client(client("rk-c", "http://c/")).await.unwrap();
    assert_eq!(s.reseal().await.unwrap(), 0);
    // Twice: the first key leaves the file, the one just replaced stays.
    let again = crate::store::rotate_secret_key(s, &keys, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(again.from.as_deref(), Some(r.to.as_str()));
    let held = crate::secrets::Keyring::new(crate::secrets::Source::File(
        f._dir.path().join(crate::secrets::KEY_FILE),
    ));
    held.prepare(Some(&again.to)).unwrap();
    assert_eq!(held.ids(), vec![again.to.clone(), r.to.clone()]);
    assert_eq!(
        s.get_client("rk-a".into()).await.unwrap(),
        Some(full("rk-a"))
    );
}

#[tokio::test]
async fn sqlite_rotation_reseals_and_reads_go_on() {
    if let Some(f) = super::fresh_sqlite().await {
        rotation_reseals_and_reads_go_on(&f).await;
    }
}

#[tokio::test]
async fn postgres_rotation_reseals_and_reads_go_on() {
    if let Some(f) = super::fresh_postgres().await {
        rotation_reseals_and_reads_go_on(&f).await;
    }
}
