//! PostgreSQL restarting under load: latch refuses readings while the database is away
//! (503, `/readyz` not ready), reconnects by itself, and every reading it accepted is in
//! the history afterwards, once.
//!
//! The database is a private server this test starts on a free port and restarts; a test
//! binary of its own, so the integration suite's two passes do not run it twice.

#[allow(dead_code)]
#[path = "it/utils/mod.rs"]
mod utils;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use latch_bench::postgres_server::LocalPostgres;
use serde_json::json;

use utils::{TestServer, eventually, grows_by, service_missing};

#[tokio::test]
async fn postgres_restart_during_ingest_loses_no_accepted_reading() {
    let (dir, pg_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut pg = match LocalPostgres::start(pg_dir.path()).await {
        Ok(pg) => pg,
        Err(e) => {
            service_missing("PostgreSQL (initdb)", e);
            return;
        }
    };
    let url = pg.url();
    let s = Arc::new(TestServer::start_in(dir.path(), move |c| c.database_url = Some(url)).await);
    let ids: Vec<String> = (0..20).map(|i| format!("pgr{i}")).collect();
    for id in &ids {
        s.sensor(id).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (s, stop, taken, ids) = (s.clone(), stop.clone(), taken.clone(), ids.clone());
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
                        taken.fetch_add(1, Ordering::Relaxed);
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

    // Readings flow before the restart and again after it, however slow the machine.
    grows_by(&taken, 50, &writer, "readings accepted before the restart").await;
    pg.restart().await.expect("the private PostgreSQL restarts");
    // Ingest comes back by itself.
    eventually(30, "latch ready again", || async {
        let r = s.http.get(format!("{}/readyz", s.base)).send().await.ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    grows_by(&taken, 50, &writer, "readings accepted after the restart").await;
    stop.store(true, Ordering::Relaxed);
    let (accepted, refused) = writer.await.unwrap();
    let saw_unready = watcher.await.unwrap();

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
