//! PostgreSQL restarting under load: latch refuses readings while the database is away
//! (503, `/readyz` not ready), reconnects by itself, and every reading it accepted is in
//! the history afterwards, once.
//!
//! A test binary of its own: cargo runs test binaries one after another, so restarting the
//! shared PostgreSQL here cannot disturb the other suites' tests.

#[allow(dead_code)]
#[path = "it/utils/mod.rs"]
mod utils;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::json;

use utils::{TestServer, eventually, service_missing};

#[tokio::test]
async fn postgres_restart_during_ingest_loses_no_accepted_reading() {
    let Some(version) = std::fs::read_dir("/etc/postgresql")
        .ok()
        .and_then(|mut d| d.next())
        .and_then(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
    else {
        service_missing("PostgreSQL (pg_ctlcluster)", "no /etc/postgresql");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = match utils::postgres_url(dir.path()).await {
        Ok(u) => u,
        Err(e) => {
            service_missing("PostgreSQL", e);
            return;
        }
    };
    let s = Arc::new(TestServer::start_in(dir.path(), move |c| c.database_url = Some(url)).await);
    let ids: Vec<String> = (0..20).map(|i| format!("pgr{i}")).collect();
    for id in &ids {
        s.sensor(id).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (s, stop, ids) = (s.clone(), stop.clone(), ids.clone());
        tokio::spawn(async move {
            let mut accepted: HashMap<String, usize> = HashMap::new();
            let (mut refused, mut k) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                let id = &ids[k % ids.len()];
                let body = json!({"sensor_id": id, "data": (k / ids.len()) % 2});
                let resp = s
                    .http
                    .post(format!("{}/v1/readings", s.base))
                    .json(&body)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                match resp {
                    Ok(r) if r.status().as_u16() == 202 => {
                        *accepted.entry(id.clone()).or_default() += 1;
                    }
                    _ => refused += 1,
                }
                k += 1;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            (accepted, refused)
        })
    };
    let watcher = {
        let (s, stop) = (s.clone(), stop.clone());
        tokio::spawn(async move {
            let mut saw_unready = false;
            while !stop.load(Ordering::Relaxed) {
                let r = s.http.get(format!("{}/readyz", s.base)).send().await;
                saw_unready |= !r.is_ok_and(|r| r.status().is_success());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            saw_unready
        })
    };

    tokio::time::sleep(Duration::from_millis(700)).await;
    let restarted = tokio::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", "restart"])
        .output()
        .await
        .expect("pg_ctlcluster runs");
    assert!(restarted.status.success(), "{restarted:?}");
    // Ingest comes back by itself.
    eventually(30, "latch ready again", || async {
        let r = s.http.get(format!("{}/readyz", s.base)).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let (accepted, refused) = writer.await.unwrap();
    let saw_unready = watcher.await.unwrap();

    let total: usize = accepted.values().sum();
    assert!(total > 100, "readings flowed before and after: {total}");
    assert!(
        refused > 0 || saw_unready,
        "the restart was noticed (refusals or /readyz)"
    );
    for id in &ids {
        let (_, body) = s
            .get(&format!("/v1/sensors/{id}/readings?limit=1000"))
            .await;
        let kept = body["items"].as_array().map_or(0, Vec::len);
        assert_eq!(
            kept,
            accepted.get(id).copied().unwrap_or(0),
            "{id}: every accepted reading kept, once"
        );
    }
    Arc::into_inner(s).expect("sole owner").stop().await;
}
