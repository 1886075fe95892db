//! Node-to-node requests (`/internal/v1/…`): always authenticated, and the readings they
//! carry judged exactly as `POST /v1/readings` judges readings.

use std::time::Duration;

use latch::clock::Clock;
use latch_testkit::Server;
use serde_json::{Value, json};

use crate::nodes::shared_database;
use crate::utils::{TestServer, fast_config, unique};

const SECRET_HEADER: &str = "x-latch-cluster-secret";
/// 9999-12-31T23:59:59Z in milliseconds.
const YEAR_9999: i64 = 253_402_300_799_000;

/// POSTs `body` to a node's forwarded-readings endpoint as `content_type`.
async fn forward(
    s: &TestServer,
    secret: Option<&str>,
    content_type: &str,
    body: &Value,
) -> (u16, Value) {
    let mut req = s
        .http
        .post(format!("{}/internal/v1/readings", s.base))
        .header("content-type", content_type)
        .body(body.to_string());
    if let Some(v) = secret {
        req = req.header(SECRET_HEADER, v);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn node_to_node_endpoints_want_the_cluster_secret() {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir.path()).await else {
        return;
    };
    let s = TestServer::start_in(dir.path(), move |c| {
        c.database_url = Some(url);
        c.cluster_secret = Some("node-secret-1".into());
    })
    .await;
    let id = unique("ns");
    s.sensor(&id).await;
    let body = json!({"batches": [{"readings": [{"sensor_id": id, "data": true, "ts": null}]}]});
    let json = "application/json";
    assert_eq!(forward(&s, None, json, &body).await.0, 401);
    assert_eq!(forward(&s, Some("guess"), json, &body).await.0, 401);
    let (status, answer) = forward(&s, Some("node-secret-1"), json, &body).await;
    assert_eq!(status, 200);
    assert_eq!(
        answer,
        json!({"verdicts": [[null]]}),
        "accepted, as the owner"
    );
    assert_eq!(s.reading_count(&id).await, 1);
    s.stop().await;
}

/// What the issue found: one `text/plain` POST (which any web page may send cross-site)
/// with year-9999 times froze a sensor. Such a request is refused; a JSON one is judged
/// reading by reading as the public API would, stamped with the owner's clock.
#[tokio::test]
async fn forwarded_readings_are_judged_like_the_public_apis() {
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir.path()).await else {
        return;
    };
    let secret = "node-secret-2";
    let s = TestServer::start_in(dir.path(), move |c| {
        c.database_url = Some(url);
        c.cluster_secret = Some(secret.into());
    })
    .await;
    let id = unique("nt");
    s.sensor(&id).await;
    let status = || async {
        let (code, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
        assert_eq!(code, 200, "{sensor}");
        sensor["status"].clone()
    };
    let before = status().await;
    // The old wire format's receive time, and the device time, both in year 9999.
    let frozen = json!({"batches": [{"received_at": YEAR_9999,
        "readings": [{"sensor_id": id, "data": true, "ts": YEAR_9999}]}]});

    let (code, body) = forward(&s, Some(secret), "text/plain", &frozen).await;
    assert_eq!(code, 415, "{body}");
    assert_eq!(body["error"]["code"], "unsupported_media_type");
    assert_eq!(status().await, before, "nothing applied");

    let (code, body) = forward(&s, Some(secret), "application/json", &frozen).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["verdicts"][0][0]["code"], "ts_in_future", "{body}");
    assert_eq!(status().await, before, "nothing applied");
    assert_eq!(s.reading_count(&id).await, 0);

    // No device time: applied, seen at the owner's time, not the sender's.
    let stamped = json!({"batches": [{"received_at": YEAR_9999,
        "readings": [{"sensor_id": id, "data": true, "ts": null}]}]});
    let (code, body) = forward(&s, Some(secret), "application/json", &stamped).await;
    assert_eq!((code, &body), (200, &json!({"verdicts": [[null]]})));
    let seen = status().await;
    assert_eq!(seen["data"], 1);
    let last_seen = seen["last_seen_at"].as_str().unwrap().to_string();
    assert!(
        last_seen.as_str() < "3000",
        "stamped by the owner: {last_seen}"
    );

    // The next genuine reading changes the state, as it would have without the requests.
    s.readings(json!([{"sensor_id": id, "data": 0}])).await;
    assert_eq!(status().await["data"], 0);
    s.stop().await;
}

/// The quick start on PostgreSQL: a database URL and nothing else, no cluster secret, no
/// API token. Node-to-node requests are authenticated all the same (by a secret the nodes
/// keep in the database), and two such nodes still forward to each other.
#[tokio::test]
async fn a_quick_start_node_refuses_unauthenticated_node_to_node_requests() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir_a.path()).await else {
        return;
    };
    let u = url.clone();
    let a = TestServer::start_in(dir_a.path(), move |c| c.database_url = Some(u)).await;
    let id = unique("nq");
    a.sensor(&id).await;
    let body = json!({"batches": [{"readings": [{"sensor_id": id, "data": true, "ts": null}]}]});
    let (code, answer) = forward(&a, None, "application/json", &body).await;
    assert_eq!(code, 401, "{answer}");
    let follow = a
        .http
        .post(format!("{}/internal/v1/follow", a.base))
        .send()
        .await
        .unwrap();
    assert_eq!(follow.status(), 401);
    assert_eq!(a.reading_count(&id).await, 0);

    // A second node set up the same way serves half the partitions: readings through it
    // reach A's half, so the nodes agree on the secret without being told it.
    let b = TestServer::start_in(dir_b.path(), move |c| c.database_url = Some(url)).await;
    let ids: Vec<String> = (0..16).map(|_| unique("nq")).collect();
    for id in &ids {
        a.sensor(id).await;
    }
    let batch: Vec<Value> = ids
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    crate::utils::eventually(20, "both nodes serve a share", || async {
        let (_, c) = a.get("/v1/cluster").await;
        let nodes = c["nodes"].as_array()?.clone();
        (nodes.len() == 2 && nodes.iter().all(|n| n["partitions"].as_u64() > Some(0))).then_some(())
    })
    .await;
    for s in [&a, &b] {
        crate::utils::eventually(10, "every reading accepted", || async {
            let (_, body) = s.post("/v1/readings", Value::Array(batch.clone())).await;
            (body["accepted"] == ids.len()).then_some(())
        })
        .await;
    }
    a.stop().await;
    b.stop().await;
}

/// Nodes that would refuse each other's requests: a node whose secret differs from a live
/// node's does not start, and says what to set.
#[tokio::test]
async fn a_node_with_another_secret_than_the_live_nodes_is_refused_at_start() {
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir_a.path()).await else {
        return;
    };
    let u = url.clone();
    let a = TestServer::start_in(dir_a.path(), move |c| {
        c.database_url = Some(u);
        c.cluster_secret = Some("one-secret".into());
    })
    .await;
    // The second node has no secret set (it would use the database's).
    let mut config = fast_config(dir_b.path());
    config.database_url = Some(url.clone());
    config.secret_key = Some(latch::secrets::SecretKeys(vec![
        crate::utils::TEST_SECRET_KEY,
    ]));
    let err = Server::start_on(config, Duration::from_secs(10), Clock::wall())
        .await
        .err()
        .expect("refused at start");
    let text = format!("{err:#}");
    assert!(text.contains("LATCH_CLUSTER_SECRET"), "{text}");
    assert!(text.contains("this node has none set"), "{text}");
    let (_, cluster) = a.get("/v1/cluster").await;
    assert_eq!(cluster["nodes"].as_array().unwrap().len(), 1, "{cluster}");
    // With the same secret it starts.
    let b = TestServer::start_in(dir_b.path(), move |c| {
        c.database_url = Some(url);
        c.cluster_secret = Some("one-secret".into());
    })
    .await;
    b.stop().await;
    a.stop().await;
}

/// Someone guessing the cluster secret: a wrong secret is refused before the body is read
/// (a request announcing 16 MiB gets its 401 having sent a few bytes of it), and after the
/// allowed failures from an address every node-to-node request from it is 429, the right
/// secret too, while the nodes' own requests from elsewhere still pass.
#[tokio::test]
async fn a_wrong_cluster_secret_is_refused_unread_and_throttled() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir.path()).await else {
        return;
    };
    let secret = "node-secret-3";
    let s = TestServer::start_in(dir.path(), move |c| {
        c.database_url = Some(url);
        c.cluster_secret = Some(secret.into());
        // No refill within the test: exactly two failures are answered 401.
        c.auth_failure_limit = latch::config::RateLimit::parse("1/m burst 2").ok();
    })
    .await;
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /internal/v1/readings HTTP/1.1\r\nhost: {addr}\r\n{SECRET_HEADER}: guess\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{{\"batches\": [",
        16 << 20
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = [0u8; 12];
    // The rest of the body never comes: only an answer that did not wait for it arrives.
    tokio::time::timeout(Duration::from_secs(30), conn.read_exact(&mut answer))
        .await
        .expect("answered without the body")
        .unwrap();
    assert_eq!(
        &answer,
        b"HTTP/1.1 401",
        "{}",
        String::from_utf8_lossy(&answer)
    );

    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 6]))
        .build()
        .unwrap();
    let stream = |http: &reqwest::Client, secret: &str| {
        http.get(format!("{}/internal/v1/rates", s.base))
            .header(SECRET_HEADER, secret)
            .send()
    };
    assert_eq!(stream(&s.http, "guess-2").await.unwrap().status(), 401);
    let throttled = stream(&s.http, "guess-3").await.unwrap();
    assert_eq!(throttled.status(), 429);
    assert!(throttled.headers().get("retry-after").is_some());
    let body: Value = throttled.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert_eq!(stream(&s.http, secret).await.unwrap().status(), 429);
    assert_eq!(stream(&other, secret).await.unwrap().status(), 200);
    s.stop().await;
}

/// What a database dump shows of a configured cluster secret: no value one could check a
/// guess against without a salt, or look up in a table made once for every database (the
/// SHA-256 fingerprint older versions kept is forgotten by the next node to start), and
/// two nodes with the same secret record different values yet agree.
#[tokio::test]
async fn a_dump_holds_no_unsalted_fingerprint_of_the_cluster_secret() {
    use sha2::{Digest, Sha256};
    let dir_a = tempfile::tempdir().unwrap();
    let dir_b = tempfile::tempdir().unwrap();
    let Some(url) = shared_database(dir_a.path()).await else {
        return;
    };
    let secret = "change-me";
    let config = |url: String| {
        move |c: &mut latch::config::Config| {
            c.database_url = Some(url);
            c.cluster_secret = Some(secret.into());
        }
    };
    let a = TestServer::start_in(dir_a.path(), config(url.clone())).await;
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let unsalted: String = Sha256::new()
        .chain_update(b"latch cluster secret\0")
        .chain_update(secret.as_bytes())
        .finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let recorded = || async {
        let rows = db
            .query(
                "SELECT secret_fingerprint FROM latch_nodes ORDER BY id",
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| r.get::<_, Option<String>>(0))
            .collect::<Vec<_>>()
    };
    let first = recorded().await;
    assert_eq!(first.len(), 1);
    let fa = first[0].clone().expect("recorded");
    assert!(!fa.contains(&unsalted), "{fa}");
    // An older node's record, as that version wrote it, in a row of its own.
    db.execute(
        "INSERT INTO latch_nodes (id, address, heartbeat_at, secret_fingerprint) \
         VALUES ('old-node', '', now() - interval '1 minute', $1)",
        &[&unsalted],
    )
    .await
    .unwrap();
    let b = TestServer::start_in(dir_b.path(), config(url.clone())).await;
    let after = recorded().await;
    assert!(
        after.iter().flatten().all(|f| !f.contains(&unsalted)),
        "the old fingerprint is forgotten: {after:?}"
    );
    let kept: Vec<&String> = after.iter().flatten().collect();
    assert_eq!(kept.len(), 2, "{after:?}");
    assert_ne!(kept[0], kept[1], "salted: the same secret, two values");
    b.stop().await;
    a.stop().await;
}
