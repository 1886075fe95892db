//! `latch backup` while latch serves under load, `latch restore` into another folder, and
//! latch on the restored folder: every reading acknowledged before the backup began is
//! there, and the notifications pending in it are delivered. The embedded store only
//! (PostgreSQL is backed up with pg_dump).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::utils::{Answer, Receiver, TestServer, eventually, unique};

/// Runs `latch <args>` on the data folder `dir`; its exit success and its output.
async fn latch(dir: &Path, args: &[&str]) -> (bool, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_latch"));
    cmd.args(args)
        .env("LATCH_DATA_DIR", dir)
        .env_remove("LATCH_DATABASE_URL");
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

/// The id of the (first) key in a key file, as latch names it.
fn key_id(file: &Path) -> String {
    use base64::Engine as _;
    let text = std::fs::read_to_string(file).unwrap();
    let line = text.lines().find(|l| !l.starts_with('#')).unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(line.trim())
        .unwrap();
    latch::secrets::key_id(&bytes.try_into().unwrap())
}

/// Every reading time of a sensor's history.
async fn history(s: &TestServer, id: &str) -> BTreeSet<i64> {
    let mut out = BTreeSet::new();
    let mut cursor = String::new();
    loop {
        let (st, body) = s
            .get(&format!("/v1/sensors/{id}/readings?limit=1000{cursor}"))
            .await;
        assert_eq!(st, StatusCode::OK, "{body}");
        for r in body["items"].as_array().unwrap() {
            let ts = r["ts"].as_str().unwrap();
            out.insert(
                chrono::DateTime::parse_from_rfc3339(ts)
                    .unwrap()
                    .timestamp_millis(),
            );
        }
        match body["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => return out,
        }
    }
}

#[tokio::test]
async fn a_backup_under_load_restores_every_acknowledged_reading_and_its_pending_work() {
    if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
        return; // latch backup copies the embedded store; PostgreSQL has pg_dump.
    }
    let hooks = Receiver::start().await;
    // The first webhook is answered 410 Gone: the client is disabled, and what it is owed
    // from then on stays pending, in the store, until it is enabled.
    hooks.script([Answer::status(410)]);
    let s = TestServer::start().await;
    let client = s.client(&hooks.url).await;
    let sensors: Vec<String> = (0..3).map(|_| unique("bk")).collect();
    for id in &sensors {
        s.sensor(id).await;
        s.link(&client, id).await;
    }
    s.readings(json!({"sensor_id": sensors[0], "data": 1}))
        .await;
    eventually(10, "the client disabled by 410", || async {
        let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
        c["disabled_at"].is_string().then_some(())
    })
    .await;

    // Steady ingest, every acknowledged reading noted.
    let acked: Arc<Mutex<Vec<(String, i64)>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (acked, stop, sensors) = (acked.clone(), stop.clone(), sensors.clone());
        let (base, http) = (s.base.clone(), s.http.clone());
        tokio::spawn(async move {
            let start = chrono::Utc::now().timestamp_millis() - 3_600_000;
            let mut n = 0i64;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<(String, i64)> = (0..300)
                    .map(|i| {
                        n += 1;
                        (sensors[i % sensors.len()].clone(), start + n)
                    })
                    .collect();
                let body: Vec<Value> = batch
                    .iter()
                    .map(|(id, ts)| {
                        let at = chrono::DateTime::from_timestamp_millis(*ts).unwrap();
                        json!({"sensor_id": id, "data": (ts / 3) % 2, "ts": at.to_rfc3339()})
                    })
                    .collect();
                let resp = http
                    .post(format!("{base}/v1/readings"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 202);
                let r: Value = resp.json().await.unwrap();
                assert_eq!(r["accepted"], 300, "{r}");
                acked.lock().unwrap().extend(batch);
            }
        })
    };
    eventually(30, "readings under way", || async {
        (acked.lock().unwrap().len() >= 3_000).then_some(())
    })
    .await;

    let backups = tempfile::tempdir().unwrap();
    let file = backups.path().join("latch.backup");
    let before: Vec<(String, i64)> = acked.lock().unwrap().clone();
    let (ok, out) = latch(&s.dir, &["backup", "--to", file.to_str().unwrap()]).await;
    assert!(ok, "latch backup: {out}");
    let during = acked.lock().unwrap().len() - before.len();
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    assert!(during > 0, "ingest went on while the backup ran");

    // Not over a folder a latch serves.
    let (ok, out) = latch(&s.dir, &["restore", "--from", file.to_str().unwrap()]).await;
    assert!(!ok, "restore over a running latch must be refused: {out}");
    assert!(out.contains("in use"), "{out}");

    // The backup holds no key (the book's Backup and restore): restored without it, the store
    // could not start, so the restore is refused, saying which key it needs (#69).
    let key = key_id(&s.dir.join("secret.key"));
    let restored = tempfile::tempdir().unwrap();
    let restore = ["restore", "--from", file.to_str().unwrap()];
    let (ok, out) = latch(restored.path(), &restore).await;
    assert!(
        !ok,
        "a restore without the backup's key must be refused: {out}"
    );
    assert!(
        out.contains(&format!("needs key {key}")) && out.contains("nothing restored"),
        "{out}"
    );
    assert!(
        !restored.path().join("latch.db").exists(),
        "nothing restored"
    );
    std::fs::copy(s.dir.join("secret.key"), restored.path().join("secret.key")).unwrap();
    let (ok, out) = latch(restored.path(), &restore).await;
    assert!(ok, "latch restore: {out}");
    assert!(
        out.contains(&format!("sealed under key {key}, which")) && out.contains("holds"),
        "{out}"
    );
    s.stop().await;

    let r = TestServer::start_in(restored.path(), |_| {}).await;
    for id in &sensors {
        let kept = history(&r, id).await;
        let missing = before
            .iter()
            .filter(|(s, ts)| s == id && !kept.contains(ts))
            .count();
        assert_eq!(
            missing, 0,
            "{id}: acknowledged before the backup, not in it"
        );
    }
    let pending = r
        .notifications(&format!("client_id={client}&status=pending"))
        .await;
    assert!(
        !pending.is_empty(),
        "the backup holds the client's pending work"
    );
    hooks.always(Answer::status(200));
    let (st, body) = r
        .post(&format!("/v1/clients/{client}/enable"), json!({}))
        .await;
    assert!(st.is_success(), "{body}");
    let got = hooks.wait_for(1 + pending.len(), 30).await;
    let sent: BTreeSet<&str> = got
        .iter()
        .filter_map(|g| g.headers.get("webhook-id")?.to_str().ok())
        .collect();
    for n in &pending {
        let id = n["id"].as_str().unwrap();
        assert!(
            sent.contains(id),
            "pending {id} delivered after the restore"
        );
    }
    r.stop().await;
}
