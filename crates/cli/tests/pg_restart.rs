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

/// A group commit whose transaction waits for a synchronous standby that never answers has
/// written its commit record: it is committed, though not yet visible. latch answers the
/// reading accepted once its wait for the outcome runs out (twelve `database_timeout`s),
/// rather than "unknown" — which had the committer read the batch back, find nothing (not
/// visible is not absent), refuse the reading, and its client send it again to be applied
/// twice once the standby answered (issue #68).
#[tokio::test]
async fn a_commit_waiting_for_a_silent_standby_is_taken_as_committed_once() {
    let (dir, pg_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let pg = match LocalPostgres::start(pg_dir.path()).await {
        Ok(pg) => pg,
        Err(e) => {
            service_missing("PostgreSQL (initdb)", e);
            return;
        }
    };
    let url = pg.url();
    let s = TestServer::start_in(dir.path(), move |c| {
        c.database_url = Some(url);
        c.database_timeout = Duration::from_secs(1);
    })
    .await;
    s.sensor("sby1").await;
    let (admin, conn) = tokio_postgres::connect(&pg.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let standby = |names: &'static str| {
        let admin = &admin;
        async move {
            // Each its own statement: `ALTER SYSTEM` runs outside a transaction block.
            admin
                .batch_execute(&format!(
                    "ALTER SYSTEM SET synchronous_standby_names = '{names}'"
                ))
                .await
                .unwrap();
            admin
                .batch_execute("SELECT pg_reload_conf()")
                .await
                .unwrap();
            // The reload is a signal each backend takes at its next command: wait until a
            // backend shows the setting, and a moment more for latch's pooled ones (a commit
            // that began before they took it would not wait for the standby; CI saw that
            // once, the reading visible at once).
            for _ in 0..100 {
                let now: String = admin
                    .query_one("SHOW synchronous_standby_names", &[])
                    .await
                    .unwrap()
                    .get(0);
                if now == names {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    standby("ghost").await;
    let resp = s
        .http
        .post(format!("{}/v1/readings", s.base))
        .json(&json!({"sensor_id": "sby1", "data": 1}))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("an answer within a minute");
    let status = resp.status().as_u16();
    let body = resp.text().await.unwrap_or_default();
    let (_, read) = s.get("/v1/sensors/sby1/readings").await;
    let visible = read["items"].as_array().map_or(0, Vec::len);
    standby("").await;
    assert_eq!(status, 202, "committed, so accepted: {body}");
    assert_eq!(
        visible, 0,
        "still waiting for its standby: not cut short (ending its backend would make visible \
         a commit the standby does not have)"
    );
    eventually(
        30,
        "the reading visible once the standby's wait ends",
        || async {
            let (_, body) = s.get("/v1/sensors/sby1/readings").await;
            let n = body["items"].as_array().map_or(0, Vec::len);
            (n == 1).then_some(())
        },
    )
    .await;
    s.stop().await;
}
