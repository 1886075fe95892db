//! PostgreSQL that stops answering: latch answers 503 (readings and `/readyz`) within its
//! `database_timeout` instead of hanging, and takes readings again once the database
//! answers, having lost none it accepted.
//!
//! The fault is a loopback TCP proxy between latch and the real PostgreSQL that can be
//! frozen: it keeps every socket open but stops passing bytes on, which is what a hung host
//! or a silently dropping network looks like to a client (no reset, no refusal).

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::utils::{TestServer, eventually, service_missing, unique};

/// Longest a request may take before the test calls it hung (latch's bound here is 1 s).
const HUNG: Duration = Duration::from_secs(30);

/// A TCP proxy to `upstream` on 127.0.0.1 whose forwarding can be frozen and thawed.
struct FreezableProxy {
    addr: String,
    frozen: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezableProxy {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (frozen, _) = watch::channel(false);
        let flag = frozen.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, flag.subscribe()));
                tokio::spawn(pump(sr, cw, flag.subscribe()));
            }
        });
        Self { addr, frozen, task }
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Passes bytes one way; while frozen, holds what it read (nothing is dropped).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The URL of a fresh PostgreSQL schema and the `host:port` it names; `None` when the test
/// does not run here: in the PostgreSQL pass (it always uses PostgreSQL, so it runs once,
/// in the first pass), or without PostgreSQL outside CI.
async fn postgres(dir: &std::path::Path) -> Option<(String, String)> {
    if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
        return None;
    }
    let url = match crate::utils::postgres_url(dir).await {
        Ok(u) => u,
        Err(e) => {
            service_missing("PostgreSQL", e);
            return None;
        }
    };
    let pg: tokio_postgres::Config = url.parse().unwrap();
    let host = match &pg.get_hosts()[0] {
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
        other => panic!("the test database must be reached over TCP, not {other:?}"),
    };
    let upstream = format!("{host}:{}", pg.get_ports().first().copied().unwrap_or(5432));
    assert!(
        url.contains(&upstream),
        "TEST_DATABASE_URL must name host:port explicitly: {url}"
    );
    Some((url, upstream))
}

#[tokio::test]
async fn a_database_that_stops_answering_costs_503_not_a_hang() {
    let dir = tempfile::tempdir().unwrap();
    let Some((url, upstream)) = postgres(dir.path()).await else {
        return;
    };
    let proxy = FreezableProxy::start(upstream.clone()).await;
    let proxied = url.replacen(&upstream, &proxy.addr, 1);
    let s = TestServer::start_in(dir.path(), move |c| {
        c.database_url = Some(proxied);
        c.database_timeout = Duration::from_secs(1);
    })
    .await;
    let id = unique("f");
    s.sensor(&id).await;
    s.readings(json!([{"sensor_id": id, "data": 1, "ts": "2026-11-22T10:00:00Z"}]))
        .await;

    proxy.freeze(true);
    let (status, body) = tokio::time::timeout(
        HUNG,
        s.post(
            "/v1/readings",
            json!([{"sensor_id": id, "data": 0, "ts": "2026-11-22T10:01:00Z"}]),
        ),
    )
    .await
    .expect("POST /v1/readings hung while the database did not answer");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, body) = tokio::time::timeout(HUNG, s.get("/readyz"))
        .await
        .expect("GET /readyz hung while the database did not answer");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");

    proxy.freeze(false);
    eventually(
        30,
        "latch ready again once the database answers",
        || async {
            let (status, _) = s.get("/readyz").await;
            (status == StatusCode::OK).then_some(())
        },
    )
    .await;
    s.readings(json!([{"sensor_id": id, "data": 0, "ts": "2026-11-22T10:02:00Z"}]))
        .await;
    let (status, hist) = s.get(&format!("/v1/sensors/{id}/readings")).await;
    assert_eq!(status, StatusCode::OK, "{hist}");
    let ts: Vec<&str> = hist["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["ts"].as_str())
        .collect();
    for accepted in ["2026-11-22T10:00:00", "2026-11-22T10:02:00"] {
        assert!(
            ts.iter().any(|t| t.starts_with(accepted)),
            "accepted reading {accepted} kept: {hist}"
        );
    }
    s.stop().await;
}
