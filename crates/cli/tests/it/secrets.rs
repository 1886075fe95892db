//! Secrets at rest (issue #51): no secret a client was given is in plain text in the store's
//! files (or its tables, on PostgreSQL) nor in a backup, and `latch rotate-key` moves every
//! secret to a new key while latch delivers under load, losing no delivery.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use crate::utils::receivers::Ca;
use crate::utils::{Process, Receiver, TestServer, database_url, eventually, grows_by, unique};

/// Runs `latch <args>` with `env`; its success and output.
async fn latch(args: &[&str], env: Vec<(&'static str, String)>) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_latch"));
    cmd.args(args).env_remove("LATCH_DATABASE_URL").envs(env);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("latch runs"))
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn holds(bytes: &[u8], text: &str) -> bool {
    bytes.windows(text.len()).any(|w| w == text.as_bytes())
}

/// Every file under `dir` but the key file, as one byte string.
fn files(dir: &Path) -> Vec<u8> {
    let mut all = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() && p.file_name().is_some_and(|n| n != "secret.key") {
            all.extend(std::fs::read(&p).unwrap());
        }
    }
    all
}

/// The PostgreSQL schema a data folder's URL names.
fn schema_of(url: &str) -> String {
    url.rsplit("search_path%3D").next().unwrap().to_string()
}

#[tokio::test]
async fn no_secret_is_in_plain_text_in_the_store_or_a_backup() {
    let tmp = tempfile::tempdir().unwrap();
    let s = TestServer::start_in(tmp.path(), |_| {}).await;
    let r = Receiver::start().await;
    let ca = Ca::new("Clients CA");
    let cert = ca.issue("latch client", &["client.test"]);
    // The key's base64 body, a line of it: what a grep for it would find.
    let key_line = cert.key.lines().nth(1).unwrap().to_string();
    let signing = "whsec_c2VjcmV0LXNpZ25pbmcta2V5LXZhbHVl";
    let secrets = [
        signing.to_string(),
        "header-secret-value".to_string(),
        "bearer-secret-token".to_string(),
        "oauth-client-secret".to_string(),
        "broker-password-value".to_string(),
        key_line.clone(),
    ];
    let mut ids = Vec::new();
    for body in [
        json!({"url": r.url, "secret": signing, "headers": {"X-Api-Key": secrets[1]},
            "auth": {"type": "bearer", "token": secrets[2]},
            "tls": {"client_cert_pem": cert.cert, "client_key_pem": cert.key}}),
        json!({"url": r.url, "auth": {"type": "oauth2_client_credentials",
            "token_url": "http://127.0.0.1:9/token", "client_id": "visible-client-id",
            "client_secret": secrets[3]}}),
        json!({"url": format!("amqp://guest:{}@127.0.0.1:5672?exchange=x", secrets[4])}),
    ] {
        let mut body = body;
        body["name"] = json!("sealed");
        let (st, c) = s.post("/v1/clients", body).await;
        assert_eq!(st, StatusCode::CREATED, "{c}");
        ids.push(c["id"].as_str().unwrap().to_string());
    }
    // A rotation keeps the old signing secret beside the new one.
    let (st, rotated) = s
        .post(&format!("/v1/clients/{}/secret/rotate", ids[0]), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{rotated}");
    let new_signing = rotated["secret"].as_str().unwrap().to_string();
    let (_, broker) = s.get(&format!("/v1/clients/{}", ids[2])).await;
    assert!(
        broker["url"].as_str().unwrap().contains(&secrets[4]),
        "an admin reads the broker password back, as before"
    );

    let mut checked = secrets.to_vec();
    checked.push(new_signing);
    match database_url(tmp.path()).await {
        None => {
            let backup = tmp.path().join("backup-copy.db");
            let (ok, out) = latch(
                &["backup", "--to", backup.to_str().unwrap()],
                vec![("LATCH_DATA_DIR", tmp.path().display().to_string())],
            )
            .await;
            assert!(ok, "{out}");
            let (store, copy) = (files(tmp.path()), std::fs::read(&backup).unwrap());
            for (what, bytes) in [("the data folder", &store), ("the backup", &copy)] {
                assert!(holds(bytes, "visible-client-id"), "{what} is what we think");
                for secret in &checked {
                    assert!(!holds(bytes, secret), "{secret} in plain text in {what}");
                }
            }
            let mode = {
                use std::os::unix::fs::PermissionsExt;
                std::fs::metadata(tmp.path().join("secret.key"))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777
            };
            assert_eq!(mode, 0o600, "the key file is its owner's alone");
        }
        Some(url) => {
            let base = url.split('?').next().unwrap().to_string();
            let schema = schema_of(&url);
            let out = tokio::task::spawn_blocking(move || {
                std::process::Command::new("pg_dump")
                    .args(["--schema", &schema, &base])
                    .output()
                    .expect("pg_dump runs")
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                holds(&out.stdout, "visible-client-id"),
                "the dump is what we think"
            );
            for secret in &checked {
                assert!(
                    !holds(&out.stdout, secret),
                    "{secret} in plain text in the dump"
                );
            }
        }
    }
    s.stop().await;
}

/// Which of the request's signatures (`v1,<b64> …`) verify with `secret`.
fn signed_by(secret: &str, got: &crate::utils::Received) -> bool {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let h = &got.headers;
    let id = h["webhook-id"].to_str().unwrap();
    let ts = h["webhook-timestamp"].to_str().unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&got.raw);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    h["webhook-signature"]
        .to_str()
        .unwrap()
        .split(' ')
        .any(|s| s == expected)
}

async fn call(
    http: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> Value {
    let r = http
        .request(method, format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

/// `latch serve` delivering to clients with headers and Basic auth while readings keep
/// coming, and `latch rotate-key` run meanwhile: every notification is delivered,
/// signed with its client's secret and carrying its headers, none fails; afterwards every
/// secret is sealed under the last key. On SQLite the key file gets the new keys; on
/// PostgreSQL (`TEST_STORE=postgres`) the nodes are given the new key first
/// (`LATCH_SECRET_KEY=new,old`), as the book's Secrets at rest says.
#[tokio::test]
async fn key_rotation_under_load_loses_no_delivery() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let url = database_url(&dir).await;
    let keys: Vec<String> = (1..=2u8).map(|i| STANDARD.encode([i; 32])).collect();
    let mut env = vec![("LATCH_DATA_DIR", dir.display().to_string())];
    if let Some(u) = &url {
        env.push(("LATCH_DATABASE_URL", u.clone()));
    }
    let http = reqwest::Client::new();
    let r = Receiver::start().await;

    // PostgreSQL: the store's key is recorded by a first start with the first key alone.
    let keyed = |given: &[&String]| -> Vec<(&'static str, String)> {
        match url {
            Some(_) => vec![(
                "LATCH_SECRET_KEY",
                given
                    .iter()
                    .map(|k| k.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            )],
            None => vec![],
        }
    };
    let start = |given: Vec<(&'static str, String)>| Process::start_env(&dir, url.clone(), &given);
    let p = start(keyed(&[&keys[0]]));
    p.ready(&http).await;
    let mut clients = Vec::new();
    let mut sensors = Vec::new();
    for i in 0..4 {
        let c = call(
            &http,
            &p.base,
            reqwest::Method::POST,
            "/v1/clients",
            json!({
                "name": format!("c{i}"), "url": r.url,
                "headers": {"X-Client": format!("c{i}")},
                "auth": {"type": "basic", "username": format!("u{i}"), "password": format!("p{i}")}
            }),
        )
        .await;
        let id = c["id"].as_str().unwrap().to_string();
        for _ in 0..5 {
            let sensor = unique("rk");
            call(
                &http,
                &p.base,
                reqwest::Method::POST,
                "/v1/sensors",
                json!({"id": sensor, "address": "here"}),
            )
            .await;
            let link = http
                .put(format!("{}/v1/clients/{id}/sensors/{sensor}", p.base))
                .send()
                .await
                .unwrap();
            assert!(link.status().is_success());
            sensors.push(sensor);
        }
        clients.push((
            id,
            c["secret"].as_str().unwrap().to_string(),
            format!("c{i}"),
        ));
    }
    let p = match url {
        // Every node restarted with the next key first, before it becomes the store's.
        Some(_) => {
            assert!(p.terminate().await);
            let p = start(keyed(&[&keys[1], &keys[0]]));
            p.ready(&http).await;
            p
        }
        None => p,
    };

    // Readings flow all along: each round flips every sensor.
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, done, base, http, sensors) = (
            stop.clone(),
            done.clone(),
            p.base.clone(),
            http.clone(),
            sensors.clone(),
        );
        tokio::spawn(async move {
            let mut rounds = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let data = rounds % 2;
                let readings: Vec<Value> = sensors
                    .iter()
                    .map(|s| json!({"sensor_id": s, "data": data}))
                    .collect();
                let a = http
                    .post(format!("{base}/v1/readings"))
                    .json(&readings)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(a.status(), StatusCode::ACCEPTED);
                rounds += 1;
                done.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            rounds
        })
    };
    // SQLite: two rotations, each adding a key to the file; PostgreSQL: one, to the key
    // the node was restarted with.
    let mut to = String::new();
    let rotations = if url.is_some() { 1 } else { 2 };
    for _ in 0..rotations {
        grows_by(&done, 3, &load, "three more rounds of load").await;
        let mut cli = env.clone();
        cli.extend(keyed(&[&keys[1], &keys[0]]));
        let (ok, out) = latch(&["rotate-key"], cli).await;
        assert!(ok, "{out}");
        assert!(out.contains("sealed 4 clients"), "{out}");
        to = out
            .split("under key ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .to_string();
    }
    grows_by(&done, 3, &load, "three more rounds of load").await;
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();

    // Every notification delivered (none failed, none left), each request signed with its
    // client's secret and carrying its client's headers and credentials.
    let get = |path: &'static str| call(&http, &p.base, reqwest::Method::GET, path, Value::Null);
    eventually(60, "every notification delivered", || async {
        let pending = get("/v1/notifications?status=pending&limit=1").await;
        pending["items"]
            .as_array()
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    let failed = get("/v1/notifications?status=failed&limit=10").await;
    assert_eq!(failed["items"], json!([]), "no delivery lost");
    let got = r.received();
    assert!(got.len() >= 40, "{} requests", got.len());
    for g in &got {
        let tag = g.headers["x-client"].to_str().unwrap();
        let (_, secret, _) = clients.iter().find(|(_, _, t)| t == tag).unwrap();
        assert!(
            signed_by(secret, g),
            "a request of {tag} signed with its secret"
        );
        let basic = STANDARD.encode(format!(
            "{}:{}",
            tag.replace('c', "u"),
            tag.replace('c', "p")
        ));
        assert_eq!(
            g.headers["authorization"],
            format!("Basic {basic}").as_str()
        );
    }
    // A client made after the rotation is sealed under the new key like the others.
    call(
        &http,
        &p.base,
        reqwest::Method::POST,
        "/v1/clients",
        json!({"name": "late", "url": r.url, "headers": {"X-Client": "late"}}),
    )
    .await;
    assert!(p.terminate().await);
    let stored: Vec<String> = match &url {
        None => {
            let db = rusqlite::Connection::open(dir.join("latch.db")).unwrap();
            let mut q = db
                .prepare("SELECT secret FROM clients UNION ALL SELECT headers FROM clients")
                .unwrap();
            q.query_map([], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect()
        }
        Some(u) => {
            let (c, conn) = tokio_postgres::connect(u, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            c.query(
                "SELECT secret FROM clients UNION ALL SELECT headers FROM clients",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
        }
    };
    assert_eq!(stored.len(), 10);
    for v in stored {
        assert!(
            v.contains(&format!("enc:{to}:")),
            "sealed under the new key: {v}"
        );
    }
}
