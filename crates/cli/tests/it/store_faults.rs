//! PostgreSQL that stops answering: latch answers 503 (readings and `/readyz`) within its
//! `database_timeout` instead of hanging, and takes readings again once the database
//! answers, having lost none it accepted.
//!
//! The fault is a loopback TCP proxy between latch and the real PostgreSQL that can be
//! frozen: it keeps every socket open but stops passing bytes on, which is what a hung host
//! or a silently dropping network looks like to a client (no reset, no refusal).
//!
//! A commit whose outcome latch cannot see (its `COMMIT` held on the way, or the server's
//! answer to it) is decided only once its transaction has ended: a sender that does what a
//! 503 says (send again) gets each reading applied once.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::utils::proxy::{Proxy, Target};
use crate::utils::{Receiver, TestServer, eventually, service_missing, unique};

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
pub(crate) async fn postgres(dir: &std::path::Path) -> Option<(String, String)> {
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

/// A latch on PostgreSQL through a proxy that interferes with `target` (1 s
/// `database_timeout`), with a sensor linked to a receiver and its first reading applied.
async fn through(
    target: Target,
    dir: &std::path::Path,
) -> Option<(TestServer, Proxy, String, Receiver)> {
    let (url, upstream) = postgres(dir).await?;
    let proxy = Proxy::start(upstream.clone(), target).await;
    let proxied = url.replacen(&upstream, &proxy.addr, 1);
    let s = TestServer::start_in(dir, move |c| {
        c.database_url = Some(proxied);
        c.database_timeout = Duration::from_secs(1);
    })
    .await;
    let r = Receiver::start().await;
    let id = unique("dz");
    s.sensor(&id).await;
    let client = s.client(&r.url).await;
    s.link(&client, &id).await;
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    // Its webhook delivered and recorded: no other transaction writes the sensor's rows.
    r.wait_for(1, 30).await;
    eventually(30, "the first webhook recorded", || async {
        let done = s
            .notifications(&format!("sensor_id={id}&status=delivered"))
            .await;
        (!done.is_empty()).then_some(())
    })
    .await;
    Some((s, proxy, id, r))
}

/// Posts one reading (no `ts`: applied twice, it would be a change twice) while the proxy
/// interferes with the commit, lets the proxy go once latch has answered, and then does
/// what the answer says: on 503, send again until 202. The first answer's status.
async fn post_in_doubt(s: &TestServer, proxy: &Proxy, id: &str) -> u16 {
    // The group commit of this reading: the sensor id is among its parameters.
    proxy.arm_for(id);
    let (http, url) = (s.http.clone(), format!("{}/v1/readings", s.base));
    let reading = json!({"sensor_id": id, "data": 0});
    let body = reading.clone();
    let first = tokio::spawn(async move {
        let r = http.post(url).json(&body).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    proxy.hit(1).await;
    let (status, body) = tokio::time::timeout(HUNG, first)
        .await
        .expect("an answer while the commit's outcome is unknown")
        .unwrap();
    proxy.release();
    assert!(status == 202 || status == 503, "{status} {body}");
    if status == 503 {
        eventually(30, "the reading sent again is accepted", || async {
            let (st, _) = s.post("/v1/readings", reading.clone()).await;
            (st == StatusCode::ACCEPTED).then_some(())
        })
        .await;
    }
    status
}

/// The reading applied once: two readings in history, two state changes, two webhooks.
async fn applied_once(s: &TestServer, id: &str, r: &Receiver) {
    r.wait_for(2, 30).await;
    assert_eq!(s.reading_count(id).await, 2, "each reading once in history");
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events?limit=100")).await;
    let changes = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "sensor.state_changed")
        .count();
    assert_eq!(changes, 2, "one state change per reading: {events}");
    assert_eq!(s.notifications(&format!("sensor_id={id}")).await.len(), 2);
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(sensor["status"]["data"], 0, "{sensor}");
}

/// Its `COMMIT` never reaches the server (the network holds it): the transaction stays
/// open there, invisible, holding the sensor's rows. latch waits for it to end rather
/// than judge it at once, ends it (rolling it back) when it would not end by itself, and
/// only then answers 503; what the sender sends again applies once, and the `COMMIT` that
/// arrives afterwards commits nothing.
#[tokio::test]
async fn a_commit_that_never_reached_the_server_is_rolled_back_before_latch_answers() {
    let dir = tempfile::tempdir().unwrap();
    let Some((s, proxy, id, r)) = through(Target::PgCommit, dir.path()).await else {
        return;
    };
    assert_eq!(post_in_doubt(&s, &proxy, &id).await, 503);
    applied_once(&s, &id, &r).await;
    s.stop().await;
}

/// The server committed, and its answer is held: latch learns from the server that the
/// transaction committed and answers 202; nothing is sent again.
#[tokio::test]
async fn a_commit_whose_answer_was_lost_is_found_committed() {
    let dir = tempfile::tempdir().unwrap();
    let Some((s, proxy, id, r)) = through(Target::PgCommitAnswer, dir.path()).await else {
        return;
    };
    assert_eq!(post_in_doubt(&s, &proxy, &id).await, 202);
    applied_once(&s, &id, &r).await;
    s.stop().await;
}
