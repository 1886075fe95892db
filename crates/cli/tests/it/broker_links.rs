//! Our broker link is not the sensors' silence (issue #36): while latch's connection to
//! the broker a sensor was last heard through is down, the sensor is not declared lost;
//! once it is back, its deadline is `max(last_seen, reconnected_at) + timeout`. Sensors
//! heard over HTTP go lost on time meanwhile. Each test runs a broker of its own (started
//! on a free port, killed for longer than the timeout) and latch on a manual clock.
//!
//! One engine shard: a sensor heard over HTTP and one heard through the broker, both past
//! their deadlines, are then in the same expiry round, so once the first is declared lost
//! the second would have been too, were it going to be.

use std::future::Future;
use std::time::Duration;

use axum::http::StatusCode;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::config::Config;
use latch::domain::time::now_ms;

use crate::utils::brokers::{Mosquitto, Rabbit};
use crate::utils::{Receiver, TestServer, eventually, service_missing, unique};

const TIMEOUT_MS: i64 = 2_000;

fn ms(v: &Value) -> i64 {
    latch::domain::time::parse(v.as_str().unwrap()).unwrap()
}

async fn ready(s: &TestServer) -> bool {
    s.get("/readyz").await.0 == StatusCode::OK
}

async fn sensor_status(s: &TestServer, id: &str) -> Value {
    s.get(&format!("/v1/sensors/{id}")).await.1["status"].clone()
}

async fn lost_of(r: &Receiver, id: &str) -> Option<Value> {
    r.received()
        .into_iter()
        .map(|g| g.body)
        .find(|b| b["sensor"]["id"] == id && b["type"] == "sensor.connection_lost")
}

/// A private broker a test takes away and brings back.
trait Outage {
    fn stop(&mut self);
    async fn resume(&mut self) -> Result<(), String>;
}

impl Outage for Mosquitto {
    fn stop(&mut self) {
        Mosquitto::stop(self)
    }
    async fn resume(&mut self) -> Result<(), String> {
        Mosquitto::resume(self).await
    }
}

impl Outage for Rabbit {
    fn stop(&mut self) {
        Rabbit::stop(self)
    }
    async fn resume(&mut self) -> Result<(), String> {
        Rabbit::resume(self).await
    }
}

/// What each broker test does once its broker and latch run: `publish` sends a reading
/// for a sensor through `broker`, which is then killed, and brought back after five
/// timeouts of the sensors' silence.
async fn the_broker_outage_is_not_the_sensors_silence<P, PF>(
    s: &TestServer,
    clock: &Clock,
    source: &str,
    publish: P,
    broker: &mut impl Outage,
) where
    P: Fn(String) -> PF,
    PF: Future<Output = ()>,
{
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let (via_broker, via_http) = (unique("bl"), unique("bh"));
    for id in [&via_broker, &via_http] {
        s.sensor(id).await;
        s.link(&client, id).await;
    }
    eventually(30, "the broker source up", || async {
        ready(s).await.then_some(())
    })
    .await;
    let t0 = clock.now();
    publish(via_broker.clone()).await;
    eventually(15, "the reading through the broker", || async {
        let st = sensor_status(s, &via_broker).await;
        (st["last_source"] == source).then_some(())
    })
    .await;
    s.readings(json!({"sensor_id": via_http, "data": 1})).await;
    assert_eq!(sensor_status(s, &via_http).await["last_source"], "http");

    broker.stop();
    eventually(30, "latch to notice the broker is gone", || async {
        (!ready(s).await).then_some(())
    })
    .await;
    // Five timeouts of silence while the link is down.
    clock.set(t0 + 5 * TIMEOUT_MS);
    let lost = eventually(15, "the HTTP sensor lost", || lost_of(&r, &via_http)).await;
    assert_eq!(
        ms(&lost["occurred_at"]),
        t0 + TIMEOUT_MS,
        "HTTP sensors go on time"
    );
    assert_eq!(sensor_status(s, &via_broker).await["connection"], "online");
    assert!(
        lost_of(&r, &via_broker).await.is_none(),
        "held while the link is down"
    );

    broker.resume().await.unwrap();
    eventually(60, "latch reconnected", || async {
        ready(s).await.then_some(())
    })
    .await;
    let reconnected_at = t0 + 5 * TIMEOUT_MS;
    clock.set(reconnected_at + TIMEOUT_MS);
    let lost = eventually(15, "the broker's sensor lost", || lost_of(&r, &via_broker)).await;
    assert_eq!(
        ms(&lost["occurred_at"]),
        reconnected_at + TIMEOUT_MS,
        "max(last_seen, reconnected_at) + timeout"
    );
    assert_eq!(ms(&lost["last_seen_at"]), t0);
}

fn tweak(c: &mut Config) {
    c.heartbeat_timeout = Duration::from_millis(TIMEOUT_MS as u64);
    c.engine_shards = 1;
}

#[tokio::test]
async fn mqtt_sensors_are_not_lost_while_the_broker_link_is_down() {
    let mut broker = match Mosquitto::start().await {
        Ok(b) => b,
        Err(e) => {
            service_missing("mosquitto (binary)", e);
            return;
        }
    };
    let prefix = unique("bl");
    let (url, topic) = (broker.url(&unique("latch")), format!("{prefix}/+/state"));
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(
        tmp.path(),
        move |c| {
            tweak(c);
            c.mqtt_url = Some(url);
            c.mqtt_topic = topic;
        },
        clock.clone(),
    )
    .await;
    let port = broker.port;
    let publish = |id: String| {
        let topic = format!("{prefix}/{id}/state");
        async move {
            let (client, mut events) =
                AsyncClient::new(MqttOptions::new(unique("pub"), "127.0.0.1", port), 10);
            client
                .publish(topic, QoS::AtLeastOnce, false, b"1".to_vec())
                .await
                .unwrap();
            tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    if let Event::Incoming(Packet::PubAck(_)) = events.poll().await.unwrap() {
                        break;
                    }
                }
            })
            .await
            .expect("a PUBACK");
        }
    };
    the_broker_outage_is_not_the_sensors_silence(&s, &clock, "mqtt", publish, &mut broker).await;
    s.stop().await;
}

#[tokio::test]
async fn amqp_sensors_are_not_lost_while_the_broker_link_is_down() {
    let mut broker = match Rabbit::start().await {
        Ok(b) => b,
        Err(e) => {
            service_missing("rabbitmq-server (binary)", e);
            return;
        }
    };
    let queue = unique("bl");
    let (url, q) = (broker.url(), queue.clone());
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(
        tmp.path(),
        move |c| {
            tweak(c);
            c.amqp_url = Some(url);
            c.amqp_queue = q;
        },
        clock.clone(),
    )
    .await;
    let url = broker.url();
    let publish = |id: String| {
        let (url, queue) = (url.clone(), queue.clone());
        async move {
            let conn = Connection::connect(&url, ConnectionProperties::default())
                .await
                .unwrap();
            let ch = conn.create_channel().await.unwrap();
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .unwrap();
            let durable = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(queue.as_str().into(), durable, FieldTable::default())
                .await
                .unwrap();
            let body = json!({"sensor_id": id, "data": 1}).to_string();
            // With an id: a broker killed before it wrote latch's ack down redelivers the
            // message, and latch knows it for the one it applied.
            let props = BasicProperties::default()
                .with_delivery_mode(2)
                .with_message_id(unique("m").into());
            let confirm = ch
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    props,
                )
                .await
                .unwrap()
                .await
                .unwrap();
            assert!(!confirm.is_nack());
            let _ = conn.close(200, "done".into()).await;
        }
    };
    the_broker_outage_is_not_the_sensors_silence(&s, &clock, "amqp", publish, &mut broker).await;
    s.stop().await;
}
