//! A broker's redelivery after a failed commit applies nothing twice. A commit fails in the
//! middle of a pipelined stream of ts-less readings (which a second application would
//! turn into new state changes and webhooks): the readings that committed behind the
//! failure are not applied again when the broker delivers them again, and every sensor
//! ends with each reading once in its history and one `state_changed` per change. The same
//! holds when the connection is cut between a commit and the broker's receipt of its
//! acknowledgement.

use lapin::BasicProperties;
use lapin::options::BasicPublishOptions;
use serde_json::json;

use crate::utils::brokers::Rabbit;
use crate::utils::fault::CommitFault;
use crate::utils::proxy::{Proxy, Target};
use crate::utils::{Receiver, TestServer, eventually, unique};

/// Readings of each healthy sensor, alternating 1, 0, … (each one a change), `rounds` of
/// them, in rounds over the sensors. Two parts: the first half of the rounds, then the
/// reading whose commit fails followed by the rest.
fn stream(ok: &[String], rounds: usize, failing: &str) -> [Vec<(String, u8)>; 2] {
    let mut parts = [Vec::new(), Vec::new()];
    for r in 0..rounds {
        let part = &mut parts[usize::from(r >= rounds / 2)];
        if r == rounds / 2 {
            part.push((failing.to_string(), 1));
        }
        for id in ok {
            part.push((id.clone(), if r % 2 == 0 { 1 } else { 0 }));
        }
    }
    parts
}

/// Waits until the first part of the stream is applied: the failure then comes at the
/// head of a stream arriving as fast as the broker sends it, with later batches in the
/// engine behind it.
async fn first_part_applied(s: &TestServer, ok: &[String], rounds: usize) {
    for id in ok {
        eventually(30, "the first part applied", || async move {
            (s.reading_count(id).await >= rounds / 2).then_some(())
        })
        .await;
    }
}

/// Registers the sensors and links a client to them all, then makes every commit with
/// a reading of a sensor whose id starts with `fx` fail.
async fn prepared(s: &TestServer, ids: &[String]) -> CommitFault {
    let client = s.client("https://example.com/hook").await;
    for id in ids {
        s.sensor(id).await;
        s.link(&client, id).await;
    }
    let fault = CommitFault::new(&s.dir);
    fault.fail("fx").await;
    fault
}

/// Commits that failed in this process so far (every latch in it: the metrics recorder is
/// the process's), read without a server to ask.
fn commit_failures() -> f64 {
    latch::telemetry::metrics_handle()
        .render()
        .lines()
        .filter(|l| l.starts_with("latch_commit_failures_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until commits have failed twice since `before` — the stream was delivered again
/// at least once behind the failure — and heals the store. (Other tests' failures count
/// too: that can only shorten the wait, never fail the test.)
async fn heal_after_failures(before: f64, fault: &CommitFault) {
    eventually(30, "commits failing, and tried again", || async {
        (commit_failures() >= before + 2.0).then_some(())
    })
    .await;
    fault.heal().await;
}

/// Waits for every reading to be applied, then checks each was applied once.
async fn applied_once(s: &TestServer, ok: &[String], rounds: usize, failing: &str) {
    let expected: Vec<(String, usize)> = ok
        .iter()
        .map(|id| (id.clone(), rounds))
        .chain([(failing.to_string(), 1)])
        .collect();
    for (id, n) in &expected {
        eventually(60, "every reading applied", || async move {
            (s.reading_count(id).await >= *n).then_some(())
        })
        .await;
    }
    for (id, n) in expected {
        assert_eq!(
            s.reading_count(&id).await,
            n,
            "{id}: each reading applied once"
        );
        let (_, events) = s.get(&format!("/v1/sensors/{id}/events?limit=1000")).await;
        let changes = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "sensor.state_changed")
            .count();
        assert_eq!(changes, n, "{id}: one state change per reading, none again");
        let notes = s.notifications(&format!("sensor_id={id}")).await;
        assert_eq!(notes.len(), n, "{id}: one webhook per change");
    }
}

#[tokio::test]
async fn amqp_readings_committed_behind_a_failed_commit_are_not_applied_again() {
    let Some((_conn, ch)) = crate::amqp::broker().await else {
        return;
    };
    let queue = unique("q");
    let ok: Vec<String> = (0..40).map(|_| unique("ok")).collect();
    let failing = unique("fx");
    let all: Vec<String> = ok.iter().cloned().chain([failing.clone()]).collect();
    let s = crate::amqp::start(&queue).await;
    let fault = prepared(&s, &all).await;

    // 2,401 messages; the second part (from the failing reading on) published as fast as
    // the broker confirms, so latch takes it in batches of what has arrived, several in
    // the engine at once. Half carry a message_id.
    let rounds = 60;
    let [first, second] = stream(&ok, rounds, &failing);
    let mut n = 0;
    let mut body = |(id, d): (String, u8)| {
        n += 1;
        let message_id = (n % 2 == 0).then(|| format!("m{n}"));
        (json!({"sensor_id": id, "data": d}).to_string(), message_id)
    };
    for (b, message_id) in first.into_iter().map(&mut body) {
        crate::amqp::publish(&ch, &queue, b.as_bytes(), message_id.as_deref()).await;
    }
    first_part_applied(&s, &ok, rounds).await;
    let before = commit_failures();
    let mut confirms = Vec::new();
    for (b, message_id) in second.into_iter().map(&mut body) {
        let mut props = BasicProperties::default().with_delivery_mode(2);
        if let Some(id) = message_id {
            props = props.with_message_id(id.into());
        }
        let publish = ch.basic_publish(
            "".into(),
            queue.as_str().into(),
            BasicPublishOptions::default(),
            b.as_bytes(),
            props,
        );
        confirms.push(publish.await.unwrap());
    }
    for c in confirms {
        assert!(!c.await.unwrap().is_nack());
    }
    heal_after_failures(before, &fault).await;
    applied_once(&s, &ok, rounds, &failing).await;
    eventually(20, "queue drained", || async {
        (crate::amqp::declare(&ch, &queue).await == 0).then_some(())
    })
    .await;
    assert_eq!(crate::amqp::declare(&ch, &format!("{queue}.dlq")).await, 0);
    s.stop().await;
}

#[tokio::test]
async fn mqtt_readings_committed_behind_a_failed_commit_are_not_applied_again() {
    if !crate::mqtt::broker_up().await {
        return;
    }
    let prefix = unique("t");
    let ok: Vec<String> = (0..20).map(|_| unique("ok")).collect();
    let failing = unique("fx");
    let all: Vec<String> = ok.iter().cloned().chain([failing.clone()]).collect();
    let s = crate::mqtt::start_in(None, &prefix, &unique("latch")).await;
    let fault = prepared(&s, &all).await;

    // The second part (from the failing reading on) published as fast as the broker
    // acknowledges: latch takes it in batches of what has arrived, several in the engine
    // at once.
    let rounds = 40;
    let topic =
        |(id, d): (String, u8)| (format!("{prefix}/{id}/state"), d.to_string().into_bytes());
    let [first, second] = stream(&ok, rounds, &failing);
    let first: Vec<_> = first.into_iter().map(topic).collect();
    assert!(crate::mqtt::publish(&first).await);
    first_part_applied(&s, &ok, rounds).await;
    let before = commit_failures();
    let second: Vec<_> = second.into_iter().map(topic).collect();
    assert!(crate::mqtt::publish(&second).await);
    heal_after_failures(before, &fault).await;
    applied_once(&s, &ok, rounds, &failing).await;
    s.stop().await;
}

/// The cluster's exchange ingest remembers, per partition queue and across connections,
/// the message ids it applied: a connection cut after a batch committed and before
/// RabbitMQ took its acknowledgement has RabbitMQ redeliver them to the next connection,
/// which acknowledges them without applying them again — no second state change, history
/// row or webhook. (Always PostgreSQL: it runs once, in the first pass.)
#[tokio::test]
async fn exchange_messages_whose_ack_was_cut_off_are_not_applied_again() {
    if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
        return;
    }
    // A broker of its own: the consistent-hash exchange is a plugin, which the shared
    // broker need not have.
    let rabbit = match Rabbit::start_with(&["rabbitmq_consistent_hash_exchange"]).await {
        Ok(r) => r,
        Err(e) => {
            crate::utils::service_missing("a private RabbitMQ", e);
            return;
        }
    };
    let conn = lapin::Connection::connect(&rabbit.url(), Default::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let database = match crate::utils::postgres_url(dir.path()).await {
        Ok(u) => u,
        Err(e) => {
            crate::utils::service_missing("PostgreSQL", e);
            return;
        }
    };
    let upstream = format!("127.0.0.1:{}", rabbit.port);
    let proxy = Proxy::start(upstream.clone(), Target::AmqpAck).await;
    let amqp = rabbit.url().replacen(&upstream, &proxy.addr, 1);
    let exchange = unique("cx");
    let (x, plain) = (exchange.clone(), format!("{exchange}-plain"));
    let s = TestServer::start_in(dir.path(), move |c| {
        c.database_url = Some(database);
        c.amqp_url = Some(amqp);
        c.amqp_queue = plain;
        c.amqp_exchange = x;
        c.cluster_partitions = Some(4);
    })
    .await;
    let receiver = Receiver::start().await;
    let id = unique("cx");
    s.sensor(&id).await;
    let client = s.client(&receiver.url).await;
    s.link(&client, &id).await;

    // A (1) and B (0), no `ts`: applied again, each would be a change again.
    proxy.arm();
    for (m, data) in [("a", 1), ("b", 0)] {
        let body = json!({"sensor_id": id, "data": data}).to_string();
        exchange_publish(&ch, &exchange, &id, &body, &format!("{m}-{id}")).await;
    }
    proxy.hit(1).await;
    // Behind whatever RabbitMQ requeues: once C (found by its `ts`) is applied, the
    // redelivery was judged.
    let c_ts = latch::domain::time::format(latch::domain::time::now_ms() + 1000);
    let body = json!({"sensor_id": id, "data": 1, "ts": c_ts}).to_string();
    exchange_publish(&ch, &exchange, &id, &body, &format!("c-{id}")).await;
    eventually(60, "C applied after the reconnect", || async {
        let (_, h) = s
            .get(&format!("/v1/sensors/{id}/readings?limit=1000"))
            .await;
        h["items"]
            .as_array()?
            .iter()
            .any(|r| r["ts"].as_str() == Some(c_ts.as_str()))
            .then_some(())
    })
    .await;
    assert_eq!(s.reading_count(&id).await, 3, "A, B and C, each once");
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events?limit=1000")).await;
    let changes = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "sensor.state_changed")
        .count();
    assert_eq!(changes, 3, "one state change per message: {events}");
    assert_eq!(
        s.notifications(&format!("sensor_id={id}")).await.len(),
        3,
        "one webhook per change"
    );
    s.stop().await;
}

/// Publishes `body` to the consistent-hash `exchange` with the sensor id as routing key and
/// `message_id`, waiting for the broker's confirm.
async fn exchange_publish(
    ch: &lapin::Channel,
    exchange: &str,
    sensor: &str,
    body: &str,
    message_id: &str,
) {
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(message_id.into());
    let confirm = ch
        .basic_publish(
            exchange.into(),
            sensor.into(),
            BasicPublishOptions::default(),
            body.as_bytes(),
            props,
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(!confirm.is_nack(), "the broker took the reading");
}
