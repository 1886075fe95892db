//! MQTT ingest against the real broker: bare `0`/`1` payloads on `sensors/{id}/state` and
//! JSON readings become notifications; bad payloads are rejected without stopping the
//! subscription; readings published while latch is stopped arrive when it returns.

use std::time::Duration;

use rumqttc::{AsyncClient, Event, MqttOptions, Outgoing, Packet, QoS};
use serde_json::{Value, json};

use crate::utils::fault::{CommitFault, counter};
use crate::utils::{Receiver, TestServer, eventually, service_missing, unique};

const HOST: &str = "127.0.0.1";
const PORT: u16 = 1883;

/// Publishes each `(topic, payload)` at QoS 1 and waits for every PUBACK; `false` (outside
/// CI) when there is no broker.
pub(crate) async fn publish(messages: &[(String, Vec<u8>)]) -> bool {
    publish_with(messages, false).await
}

/// [`publish`], with the retain flag as given.
async fn publish_with(messages: &[(String, Vec<u8>)], retain: bool) -> bool {
    publish_on(PORT, messages, retain).await
}

/// [`publish`] to the broker on `port` of this host, with the retain flag as given.
pub(crate) async fn publish_on(port: u16, messages: &[(String, Vec<u8>)], retain: bool) -> bool {
    let mut o = MqttOptions::new(unique("pub"), HOST, port);
    o.set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = AsyncClient::new(o, messages.len() + 10);
    for (t, p) in messages {
        client
            .publish(t.clone(), QoS::AtLeastOnce, retain, p.clone())
            .await
            .unwrap();
    }
    let mut acked = 0;
    let done = tokio::time::timeout(Duration::from_secs(10), async {
        while acked < messages.len() {
            match events.poll().await {
                Ok(Event::Incoming(Packet::PubAck(_))) => acked += 1,
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        let _ = client.disconnect().await;
        while let Ok(e) = events.poll().await {
            if matches!(e, Event::Outgoing(Outgoing::Disconnect)) {
                break;
            }
        }
        Ok(())
    })
    .await;
    match done {
        Ok(Ok(())) => true,
        Ok(Err(e)) => !service_missing("Mosquitto", e),
        Err(_) => !service_missing("Mosquitto", "no PUBACK within 10 s"),
    }
}

pub(crate) async fn broker_up() -> bool {
    publish(&[]).await
}

pub(crate) async fn start_in(
    dir: Option<&std::path::Path>,
    prefix: &str,
    client_id: &str,
) -> TestServer {
    let url = format!("mqtt://{HOST}:{PORT}?client_id={client_id}");
    let topic = format!("{prefix}/+/state");
    let tweak = move |c: &mut latch::config::Config| {
        c.mqtt_url = Some(url);
        c.mqtt_topic = topic;
    };
    match dir {
        Some(d) => TestServer::start_in(d, tweak).await,
        None => TestServer::start_with(tweak).await,
    }
}

#[tokio::test]
async fn mqtt_readings_notify_and_bad_payloads_are_rejected() {
    if !broker_up().await {
        return;
    }
    let prefix = unique("t");
    let s = start_in(None, &prefix, &unique("latch")).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("mq");
    s.sensor(&id).await;
    s.link(&client, &id).await;
    let topic = format!("{prefix}/{id}/state");
    let msgs = vec![
        (topic.clone(), b"1".to_vec()),
        (topic.clone(), b"garbage".to_vec()),
        (topic.clone(), b"7".to_vec()),
        (topic.clone(), b"1".to_vec()),
    ];
    assert!(publish(&msgs).await);
    // Waited for, so the next change does not supersede this one before it is sent.
    r.wait_for(1, 10).await;
    let json_reading = json!({"data": 0}).to_string().into_bytes();
    assert!(publish(&[(topic.clone(), json_reading)]).await);
    let got = r.wait_for(2, 10).await;
    let data: Vec<Value> = got.iter().map(|g| g.body["data"].clone()).collect();
    assert_eq!(data, vec![json!(1), json!(0)]);
    assert_eq!(s.reading_count(&id).await, 3, "the three good ones kept");
    let (_, metrics) = s.get("/metrics").await;
    let metrics = metrics.as_str().unwrap();
    for reason in ["malformed_json", "invalid_data"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("latch_readings_rejected_total")
                    && l.contains("source=\"mqtt\"")
                    && l.contains(reason)),
            "{reason} counted"
        );
    }
    // The subscription still runs after the bad ones.
    assert!(publish(&[(topic, b"1".to_vec())]).await);
    r.wait_for(3, 10).await;
    s.stop().await;
}

#[tokio::test]
async fn readings_published_while_latch_is_stopped_arrive_after_start() {
    if !broker_up().await {
        return;
    }
    let prefix = unique("t");
    let client_id = unique("latch");
    let s = start_in(None, &prefix, &client_id).await;
    let ids: Vec<String> = (0..10).map(|_| unique("mq")).collect();
    for id in &ids {
        s.sensor(id).await;
    }
    let dir = s.dir.clone();
    let keep = s.stop().await;
    let msgs: Vec<_> = ids
        .iter()
        .map(|id| (format!("{prefix}/{id}/state"), b"1".to_vec()))
        .collect();
    assert!(publish(&msgs).await);
    let s = start_in(Some(&dir), &prefix, &client_id).await;
    for id in &ids {
        let s = &s;
        eventually(10, "reading from the persistent session", || async move {
            (s.reading_count(id).await == 1).then_some(())
        })
        .await;
    }
    s.stop().await;
    drop(keep);
}

async fn ready(s: &TestServer) -> bool {
    s.get("/readyz").await.0.is_success()
}

#[tokio::test]
async fn readings_whose_commit_failed_are_resent_by_the_broker() {
    if !broker_up().await {
        return;
    }
    let prefix = unique("t");
    let s = start_in(None, &prefix, &unique("latch")).await;
    let ids: Vec<String> = (0..5).map(|_| unique("mq")).collect();
    for id in &ids {
        s.sensor(id).await;
    }
    let fault = CommitFault::new(&s.dir);
    fault.fail("").await;
    let msgs: Vec<_> = ids
        .iter()
        .flat_map(|id| {
            let topic = format!("{prefix}/{id}/state");
            [(topic.clone(), b"1".to_vec()), (topic, b"0".to_vec())]
        })
        .collect();
    assert!(publish(&msgs).await);
    eventually(20, "/readyz 503 while commits fail", || async {
        (!ready(&s).await).then_some(())
    })
    .await;
    // The broker resent them at least once more, and that failed too.
    eventually(30, "a second reconnect for the failed readings", || async {
        (counter(&s, "latch_source_reconnects_total{source=\"mqtt\"}").await >= 2.0).then_some(())
    })
    .await;
    assert!(!ready(&s).await, "still not ready while commits fail");
    for id in &ids {
        assert_eq!(s.reading_count(id).await, 0, "nothing applied yet");
    }
    fault.heal().await;
    for id in &ids {
        let s = &s;
        eventually(30, "both readings applied after recovery", || async move {
            let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
            (s.reading_count(id).await >= 2 && body["status"]["data"] == 0).then_some(())
        })
        .await;
    }
    eventually(20, "/readyz 200 after recovery", || async {
        ready(&s).await.then_some(())
    })
    .await;
    s.stop().await;
}

#[tokio::test]
async fn retained_messages_are_not_readings() {
    if !broker_up().await {
        return;
    }
    let prefix = unique("t");
    let s = start_in(None, &prefix, &unique("latch")).await;
    let id = unique("mq");
    s.sensor(&id).await;
    let dir = s.dir.clone();
    let keep = s.stop().await;
    let topic = format!("{prefix}/{id}/state");
    // The broker's stored value, sent again to every new subscription.
    assert!(publish_with(&[(topic.clone(), b"1".to_vec())], true).await);
    // A new session subscribes, so the broker sends the retained message.
    let server = start_in(Some(&dir), &prefix, &unique("latch")).await;
    assert!(publish(&[(topic.clone(), b"0".to_vec())]).await);
    let (s, id) = (&server, id.as_str());
    eventually(10, "the live reading applied", || async move {
        let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
        (body["status"]["data"] == 0).then_some(())
    })
    .await;
    assert_eq!(s.reading_count(id).await, 1, "only the live reading kept");
    assert!(counter(s, "latch_mqtt_retained_ignored_total").await >= 1.0);
    // Clears the retained message from the broker.
    assert!(publish_with(&[(topic, Vec::new())], true).await);
    server.stop().await;
    drop(keep);
}
