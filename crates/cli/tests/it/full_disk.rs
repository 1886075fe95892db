//! A full disk under the embedded store, for real: latch serves from a small tmpfs that a
//! test fills up. Readings are refused as `storage_full` (not the generic `unavailable`),
//! `/readyz` says why, latch stays up (retention running meanwhile), and once space is
//! freed it takes readings again by itself, having lost none it acknowledged.
//!
//! Mounting needs root (CI runs as root); elsewhere the test says SKIPPED.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::StatusCode;
use latch::clock::Clock;
use serde_json::{Value, json};

use crate::utils::{TestServer, eventually, service_missing, unique};

/// A tmpfs of `mb` MiB mounted on a fresh folder, unmounted when dropped (lazily, so a
/// test that failed with files still open leaves no mount behind).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(mb: u32) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mb}m"), "tmpfs"])
            .arg(dir.path())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the file system of `dir` with a file of zeros until it refuses more.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let small = [0u8; 512];
    while f.write_all(&small).is_ok() {}
    let _ = f.sync_all();
    path
}

/// The value of an unlabelled metric.
async fn metric(s: &TestServer, name: &str) -> Option<f64> {
    let text = s
        .http
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .ok()?;
    let text = text.text().await.ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} "))?.trim().parse().ok())
}

/// Posts readings of `id` numbered from `n`; the readings acknowledged, and whether any
/// was refused as `storage_full`.
async fn post(s: &TestServer, id: &str, start: i64, n: &mut i64) -> (Vec<i64>, bool) {
    let batch: Vec<i64> = (0..200).map(|i| start + *n + i).collect();
    *n += 200;
    let body: Vec<Value> = batch
        .iter()
        .map(|ts| {
            let at = chrono::DateTime::from_timestamp_millis(*ts).unwrap();
            json!({"sensor_id": id, "data": ts % 2, "ts": at.to_rfc3339()})
        })
        .collect();
    let (st, r) = s.post("/v1/readings", Value::Array(body)).await;
    match st {
        StatusCode::ACCEPTED => {
            let refused: Vec<usize> = r["rejected"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| {
                    assert_eq!(x["code"], "storage_full", "{r}");
                    x["index"].as_u64().unwrap() as usize
                })
                .collect();
            let acked = batch
                .iter()
                .enumerate()
                .filter(|(i, _)| !refused.contains(i))
                .map(|(_, ts)| *ts)
                .collect();
            (acked, !refused.is_empty())
        }
        StatusCode::SERVICE_UNAVAILABLE => {
            assert_eq!(r["error"]["code"], "storage_full", "{r}");
            (Vec::new(), true)
        }
        other => panic!("unexpected {other}: {r}"),
    }
}

#[tokio::test]
async fn a_full_disk_refuses_readings_by_name_and_latch_resumes_by_itself() {
    if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
        return; // The embedded store's disk; runs in the SQLite pass.
    }
    let fs = match Tmpfs::mount(24) {
        Ok(fs) => fs,
        Err(e) => {
            service_missing("a tmpfs mount (root)", e);
            return;
        }
    };
    let data = fs.path().join("data");
    let day = 86_400_000;
    let clock = Clock::manual(chrono::Utc::now().timestamp_millis());
    let s = TestServer::start_clocked(
        &data,
        |c| c.retention_readings = Duration::from_secs(86_400),
        clock.clone(),
    )
    .await;
    let (id, old) = (unique("fd"), unique("fdold"));
    s.sensor(&id).await;
    s.sensor(&old).await;
    // Past retention already; deleted by the first round after the disk has room.
    let then = chrono::DateTime::from_timestamp_millis(clock.now() - 3 * day).unwrap();
    s.readings(json!({"sensor_id": old, "data": 1, "ts": then.to_rfc3339()}))
        .await;
    let start = clock.now() - 3_600_000;
    let mut n = 0;
    let mut acked: Vec<i64> = Vec::new();
    let (first, _) = post(&s, &id, start, &mut n).await;
    acked.extend(first);

    let filler = fill(fs.path());
    let mut refused = false;
    for _ in 0..2_000 {
        let (got, full) = post(&s, &id, start, &mut n).await;
        acked.extend(got);
        if full {
            refused = true;
            break;
        }
    }
    assert!(refused, "a full disk must refuse readings");
    let r = s
        .http
        .get(format!("{}/readyz", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let reason = r.text().await.unwrap();
    assert!(reason.contains("storage full"), "{reason}");
    assert_eq!(metric(&s, "latch_storage_full").await, Some(1.0));
    assert_eq!(
        metric(&s, "latch_storage_full_episodes_total").await,
        Some(1.0)
    );

    // Retention's round while the disk is full: it must neither stop latch nor wedge it.
    clock.advance(Duration::from_secs(61));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (st, _) = s.get("/healthz").await;
    assert_eq!(st, StatusCode::OK);

    std::fs::remove_file(&filler).unwrap();
    let mut resumed = false;
    for _ in 0..200 {
        let (got, full) = post(&s, &id, start, &mut n).await;
        resumed = !got.is_empty() && !full;
        acked.extend(got);
        if resumed {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(resumed, "readings accepted again once space is freed");
    eventually(10, "ready again", || async {
        let r = s.http.get(format!("{}/readyz", s.base)).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    assert_eq!(metric(&s, "latch_storage_full").await, Some(0.0));
    assert_eq!(
        metric(&s, "latch_storage_full_episodes_total").await,
        Some(1.0),
        "one episode, however many refusals"
    );

    // Retention goes on where it could not: a round a minute (of the test's clock) until
    // the reading past retention has left the journal for the archive and is deleted.
    eventually(30, "the reading past retention deleted", || async {
        clock.advance(Duration::from_secs(61));
        tokio::time::sleep(Duration::from_millis(300)).await;
        (s.reading_count(&old).await == 0).then_some(())
    })
    .await;

    // Nothing acknowledged is lost.
    let mut kept = 0;
    let mut cursor = String::new();
    loop {
        let (_, body) = s
            .get(&format!("/v1/sensors/{id}/readings?limit=1000{cursor}"))
            .await;
        kept += body["items"].as_array().unwrap().len();
        match body["next_cursor"].as_str() {
            Some(c) => cursor = format!("&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(kept, acked.len(), "every acknowledged reading is kept");
    s.stop().await;
}
