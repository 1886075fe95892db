//! RabbitMQ ingest against the real broker: readings become notifications as over HTTP,
//! bad messages are dead-lettered with reasons, nothing is lost across latch restarts or a
//! connection closed by the broker. Each test uses its own queue.

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::{Value, json};

use crate::utils::fault::{CommitFault, counter};
use crate::utils::{Receiver, TestServer, eventually, service_missing, unique};

pub(crate) fn url() -> String {
    std::env::var("TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A confirming channel to the test broker, or `None` (outside CI) when there is none.
pub(crate) async fn broker() -> Option<(Connection, Channel)> {
    let conn = match Connection::connect(&url(), ConnectionProperties::default()).await {
        Ok(c) => c,
        Err(e) => {
            service_missing("RabbitMQ", e);
            return None;
        }
    };
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    Some((conn, ch))
}

pub(crate) async fn declare(ch: &Channel, queue: &str) -> u32 {
    ch.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap()
    .message_count()
}

/// Publishes a body to `queue`, waiting for the broker's confirm.
pub(crate) async fn publish(ch: &Channel, queue: &str, body: &[u8], message_id: Option<&str>) {
    let mut props = BasicProperties::default().with_delivery_mode(2);
    if let Some(id) = message_id {
        props = props.with_message_id(id.into());
    }
    let confirm = ch
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            body,
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!confirm.is_nack());
}

pub(crate) async fn start(queue: &str) -> TestServer {
    let (url, queue) = (url(), queue.to_string());
    TestServer::start_with(move |c| {
        c.amqp_url = Some(url);
        c.amqp_queue = queue;
    })
    .await
}

#[tokio::test]
async fn amqp_readings_notify_like_http() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let s = start(&queue).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("am");
    s.sensor(&id).await;
    s.link(&client, &id).await;
    let send = |d: u8| json!({"sensor_id": id, "data": d}).to_string();
    publish(&ch, &queue, send(1).as_bytes(), None).await;
    publish(&ch, &queue, send(1).as_bytes(), None).await;
    // Waited for, so the next change does not supersede this one before it is sent.
    r.wait_for(1, 10).await;
    publish(&ch, &queue, send(0).as_bytes(), None).await;
    let got = r.wait_for(2, 10).await;
    let data: Vec<Value> = got.iter().map(|g| g.body["data"].clone()).collect();
    assert_eq!(
        data,
        vec![json!(1), json!(0)],
        "one notification per change"
    );
    assert_eq!(s.reading_count(&id).await, 3, "every reading kept");
    s.stop().await;
    assert_eq!(declare(&ch, &queue).await, 0, "every message acknowledged");
}

#[tokio::test]
async fn bad_messages_are_dead_lettered_with_reasons() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let s = start(&queue).await;
    let id = unique("am");
    s.sensor(&id).await;
    let bodies = [
        b"not json".to_vec(),
        json!({"sensor_id": "bad id!", "data": 1})
            .to_string()
            .into_bytes(),
        json!({"sensor_id": id, "data": 2}).to_string().into_bytes(),
        json!({"sensor_id": unique("nobody"), "data": 1})
            .to_string()
            .into_bytes(),
        json!({"sensor_id": id, "data": 1}).to_string().into_bytes(),
    ];
    for b in &bodies {
        publish(&ch, &queue, b, None).await;
    }
    let dlq = format!("{queue}.dlq");
    eventually(10, "four dead letters", || async {
        (declare(&ch, &dlq).await == 4).then_some(())
    })
    .await;
    let mut reasons = Vec::new();
    for _ in 0..4 {
        let m = ch
            .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
            .expect("a dead letter");
        let headers = m.properties.headers().clone().unwrap_or_default();
        let reason = match headers.inner().get("x-latch-reason") {
            Some(AMQPValue::LongString(s)) => s.to_string(),
            other => panic!("no reason header: {other:?}"),
        };
        assert!(
            headers.inner().contains_key("x-latch-error"),
            "a readable error too"
        );
        reasons.push((reason, m.data.clone()));
    }
    let codes: Vec<&str> = reasons.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        codes,
        vec![
            "malformed_json",
            "invalid_sensor_id",
            "invalid_data",
            "unknown_sensor"
        ]
    );
    assert_eq!(reasons[0].1, bodies[0], "the original body is kept");
    // It may be in a later batch than the bad ones, so committed after they were moved.
    let (server, id) = (&s, id.as_str());
    eventually(10, "the good one applied", || async move {
        (server.reading_count(id).await >= 1).then_some(())
    })
    .await;
    assert_eq!(s.reading_count(id).await, 1, "the good one applied once");
    s.stop().await;
    assert_eq!(declare(&ch, &queue).await, 0, "the main queue ends empty");
}

#[tokio::test]
async fn messages_waiting_while_latch_is_down_apply_once() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let s = start(&queue).await;
    let ids: Vec<String> = (0..20).map(|_| unique("am")).collect();
    for id in &ids {
        s.sensor(id).await;
    }
    let dir = s.dir.clone();
    let keep = s.stop().await;
    for id in &ids {
        for d in [1, 0] {
            publish(
                &ch,
                &queue,
                json!({"sensor_id": id, "data": d}).to_string().as_bytes(),
                None,
            )
            .await;
        }
    }
    assert_eq!(declare(&ch, &queue).await, 40, "waiting in the queue");
    let (url, q) = (url(), queue.clone());
    let s = TestServer::start_in(&dir, move |c| {
        c.amqp_url = Some(url);
        c.amqp_queue = q;
    })
    .await;
    for id in &ids {
        let s = &s;
        eventually(10, "both readings applied", || async move {
            (s.reading_count(id).await == 2).then_some(())
        })
        .await;
        let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
        assert_eq!(body["status"]["data"], 0, "applied in order");
    }
    s.stop().await;
    drop(keep);
    assert_eq!(declare(&ch, &queue).await, 0);
}

#[tokio::test]
async fn broker_closing_the_connection_loses_nothing() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let s = start(&queue).await;
    let ids: Vec<String> = (0..300).map(|_| unique("am")).collect();
    for id in &ids {
        s.sensor(id).await;
    }
    // Half before the broker drops latch's connection, half after.
    for id in &ids[..150] {
        let body = json!({"sensor_id": id, "data": 1}).to_string();
        publish(&ch, &queue, body.as_bytes(), Some(id)).await;
    }
    let out = tokio::process::Command::new("rabbitmqctl")
        .args([
            "-q",
            "list_connections",
            "--no-table-headers",
            "pid",
            "client_properties",
        ])
        .output()
        .await
        .expect("rabbitmqctl runs");
    let listing = String::from_utf8_lossy(&out.stdout);
    let pid = listing
        .lines()
        .find(|l| l.contains(&format!("latch {queue}")))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("latch's connection not listed:\n{listing}"))
        .to_string();
    let closed = tokio::process::Command::new("rabbitmqctl")
        .args(["close_connection", &pid, "test closes latch's connection"])
        .output()
        .await
        .unwrap();
    assert!(closed.status.success(), "{closed:?}");
    for id in &ids[150..] {
        let body = json!({"sensor_id": id, "data": 1}).to_string();
        publish(&ch, &queue, body.as_bytes(), Some(id)).await;
    }
    for id in &ids {
        let s = &s;
        eventually(20, "reading applied", || async move {
            (s.reading_count(id).await >= 1).then_some(())
        })
        .await;
    }
    eventually(10, "queue drained", || async {
        (declare(&ch, &queue).await == 0).then_some(())
    })
    .await;
    let (_, metrics) = s.get("/metrics").await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("latch_source_reconnects_total{source=\"amqp\"}"),
        "the reconnect is counted"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_huge_bad_message_is_dead_lettered_and_the_rest_applies() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let server = start(&queue).await;
    let s = &server;
    let id = unique("am");
    s.sensor(&id).await;
    // The rejection quotes `data`: 200 KB of it, more than one AMQP frame holds.
    let huge = json!({"sensor_id": id, "data": "x".repeat(200_000)})
        .to_string()
        .into_bytes();
    publish(&ch, &queue, &huge, None).await;
    for d in [1, 0] {
        let body = json!({"sensor_id": id, "data": d}).to_string();
        publish(&ch, &queue, body.as_bytes(), None).await;
    }
    let id = id.as_str();
    eventually(20, "the good readings applied", || async move {
        let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
        (s.reading_count(id).await == 2 && body["status"]["data"] == 0).then_some(())
    })
    .await;
    let dlq = format!("{queue}.dlq");
    let m = ch
        .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the huge message dead-lettered");
    assert_eq!(m.data, huge, "the original body is kept");
    let headers = m.properties.headers().clone().unwrap_or_default();
    match headers.inner().get("x-latch-reason") {
        Some(AMQPValue::LongString(r)) => assert_eq!(r.to_string(), "invalid_data"),
        other => panic!("no reason header: {other:?}"),
    }
    match headers.inner().get("x-latch-error") {
        Some(AMQPValue::LongString(e)) => {
            let e = e.to_string();
            assert!(e.len() <= 1024, "bounded: {} bytes", e.len());
            assert!(e.starts_with("data must be 0 or 1"), "{e}");
        }
        other => panic!("no error header: {other:?}"),
    }
    assert_eq!(declare(&ch, &dlq).await, 0, "dead-lettered once");
    server.stop().await;
}

#[tokio::test]
async fn dedup_uses_the_amqp_message_id_only() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let server = start(&queue).await;
    let s = &server;
    let (a, c) = (unique("am"), unique("am"));
    for id in [&a, &c] {
        s.sensor(id).await;
    }
    // The same body twice without a message_id: bodies are not compared, so both apply.
    // (A body cannot carry an id of its own: a field beyond the reading's refuses it, see
    // unknown_fields.rs.)
    let body = json!({"sensor_id": a, "data": 1}).to_string();
    for n in [1, 2] {
        publish(&ch, &queue, body.as_bytes(), None).await;
        let a = a.as_str();
        eventually(10, "each reading applied", || async move {
            (s.reading_count(a).await == n).then_some(())
        })
        .await;
    }
    // One message published twice with the same message_id applies once, whether the
    // copies arrive together or one after the other was applied.
    let mid = unique("m");
    let one = json!({"sensor_id": c, "data": 1}).to_string();
    publish(&ch, &queue, one.as_bytes(), Some(&mid)).await;
    publish(&ch, &queue, one.as_bytes(), Some(&mid)).await;
    let c = c.as_str();
    eventually(10, "the first copy applied", || async move {
        (s.reading_count(c).await >= 1).then_some(())
    })
    .await;
    publish(&ch, &queue, one.as_bytes(), Some(&mid)).await;
    // A later reading of the same sensor: once it is applied, every copy before it was
    // handled (one sensor's readings apply in order).
    let after = json!({"sensor_id": c, "data": 0}).to_string();
    publish(&ch, &queue, after.as_bytes(), Some(&unique("m"))).await;
    eventually(10, "the later reading applied", || async move {
        let (_, body) = s.get(&format!("/v1/sensors/{c}")).await;
        (body["status"]["data"] == 0).then_some(())
    })
    .await;
    assert_eq!(s.reading_count(c).await, 2, "the copies applied once");
    let (_, metrics) = s.get("/metrics").await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("latch_amqp_duplicates_total"),
        "duplicates counted"
    );
    server.stop().await;
}

#[tokio::test]
async fn readings_whose_commit_failed_are_redelivered_never_dead_lettered() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let server = start(&queue).await;
    let s = &server;
    // Commits fail only for the "fx" sensors: with shards, a batch may then commit in
    // part, and the rest must come again in order.
    let failing: Vec<String> = (0..5).map(|_| unique("fx")).collect();
    let fine: Vec<String> = (0..5).map(|_| unique("ok")).collect();
    for id in failing.iter().chain(&fine) {
        s.sensor(id).await;
    }
    let fault = CommitFault::new(&s.dir);
    let failures = counter(s, "latch_commit_failures_total").await;
    fault.fail("fx").await;
    for d in [1, 0] {
        for id in failing.iter().chain(&fine) {
            let body = json!({"sensor_id": id, "data": d}).to_string();
            publish(&ch, &queue, body.as_bytes(), None).await;
        }
    }
    eventually(20, "commits failing, and tried again", || async move {
        (counter(s, "latch_commit_failures_total").await >= failures + 2.0).then_some(())
    })
    .await;
    for id in &failing {
        assert_eq!(
            s.reading_count(id).await,
            0,
            "nothing of {id} committed yet"
        );
    }
    fault.heal().await;
    for id in failing.iter().chain(&fine) {
        eventually(30, "both readings applied, in order", || async move {
            let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
            (s.reading_count(id).await >= 2 && body["status"]["data"] == 0).then_some(())
        })
        .await;
    }
    eventually(20, "queue drained", || async {
        (declare(&ch, &queue).await == 0).then_some(())
    })
    .await;
    let dlq = format!("{queue}.dlq");
    assert_eq!(
        declare(&ch, &dlq).await,
        0,
        "a store failure is no dead letter"
    );
    server.stop().await;
}

/// In a cluster one node consumes the plain queue — the one holding partition 0 — and
/// hands the readings of other nodes' partitions to them: every message applied once, in
/// one place. (The exchange beside it is every node's: `amqp_cluster.rs`.)
#[tokio::test]
async fn a_cluster_consumes_the_queue_on_one_node_and_applies_every_reading_once() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("lq");
    declare(&ch, &queue).await;
    let exchange = unique("lqx");
    let env = [
        ("LATCH_AMQP_URL", url()),
        ("LATCH_AMQP_QUEUE", queue.clone()),
        ("LATCH_AMQP_EXCHANGE", exchange.clone()),
    ];
    let Some(c) = crate::utils::cluster::Cluster::start_env(2, &env).await else {
        return;
    };
    let r = Receiver::start().await;
    let (_, sensors) = c.fleet("aq", 24, &r.url, json!({})).await;
    for id in &sensors {
        let body = json!({"sensor_id": id, "data": 1}).to_string();
        publish(&ch, &queue, body.as_bytes(), None).await;
    }
    r.wait_for(sensors.len(), 30).await;
    let live = c.live();
    for id in &sensors {
        let readings = c.get(&live[1], &format!("/v1/sensors/{id}/readings")).await;
        assert_eq!(
            readings["items"].as_array().unwrap().len(),
            1,
            "{id}: applied once: {readings}"
        );
    }
    let mut up = Vec::new();
    for base in &live {
        up.push(
            c.node_metric(base, "latch_source_up{source=\"amqp\"}")
                .await,
        );
    }
    up.sort_by(f64::total_cmp);
    assert_eq!(up, vec![0.0, 1.0], "one node consumes the plain queue");
    assert!(
        c.metric("latch_cluster_forwarded_readings_total").await > 0.0,
        "the other node's sensors were handed to it"
    );
    assert_eq!(r.received().len(), sensors.len(), "one notification each");
    drop(c);
    crate::amqp_cluster::clean_up(&ch, &exchange).await;
}
