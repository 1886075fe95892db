//! Subscribers that record what a broker destination got: an MQTT 5 client (user
//! properties included) and a consumer of a RabbitMQ queue of its own. Every message a
//! test takes is a notification held to the event catalog ([`latch_testkit::assert_body`]),
//! and so is any left untaken when the subscription is dropped.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use serde_json::Value;
use tokio::sync::mpsc;

use super::{service_missing, unique};

pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// One message as a subscriber got it.
#[derive(Debug, Clone)]
pub struct Got {
    /// The MQTT topic or the AMQP routing key.
    pub topic: String,
    pub body: Value,
    pub raw: Vec<u8>,
    /// MQTT user properties or AMQP headers.
    pub headers: HashMap<String, String>,
    /// AMQP: `message_id` and `delivery_mode`.
    pub message_id: Option<String>,
    pub delivery_mode: Option<u8>,
}

pub struct Subscription {
    rx: mpsc::UnboundedReceiver<Got>,
    _task: tokio::task::JoinHandle<()>,
}

impl Subscription {
    /// The next `n` messages, in the order they came.
    pub async fn take(&mut self, n: usize) -> Vec<Got> {
        let mut out = Vec::new();
        while out.len() < n {
            let got = tokio::time::timeout(Duration::from_secs(30), self.rx.recv())
                .await
                .unwrap_or_else(|_| panic!("{} of {n} messages came: {out:?}", out.len()))
                .expect("the subscriber runs");
            latch_testkit::assert_body(&got.raw);
            out.push(got);
        }
        out
    }

    /// Everything received so far.
    pub fn drain(&mut self) -> Vec<Got> {
        let mut out = Vec::new();
        while let Ok(g) = self.rx.try_recv() {
            latch_testkit::assert_body(&g.raw);
            out.push(g);
        }
        out
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.drain();
        }
    }
}

/// How an MQTT subscriber connects.
#[derive(Default)]
pub struct Session<'a> {
    /// A session that outlives its connection, so a broker restart loses nothing queued
    /// for it.
    pub persistent: bool,
    pub login: Option<(&'a str, &'a str)>,
}

/// An MQTT 5 subscriber of `filter` at QoS 1 on the broker at `port`, subscribed when this
/// returns; it reconnects by itself. `None` (outside CI): no broker.
pub async fn mqtt_subscriber(
    port: u16,
    filter: &str,
    session: Session<'_>,
) -> Option<Subscription> {
    let mut o = MqttOptions::new(unique("sub"), "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(5));
    if let Some((user, pass)) = session.login {
        o.set_credentials(user, pass);
    }
    let persistent = session.persistent;
    if persistent {
        o.set_clean_start(false)
            .set_session_expiry_interval(Some(3600));
    }
    let (client, mut events) = AsyncClient::new(o, 100);
    client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    let subscribed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::SubAck(_))) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    })
    .await;
    match subscribed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return service_missing("Mosquitto", e).then_some(()).and(None),
        Err(_) => {
            return service_missing("Mosquitto", "no SUBACK")
                .then_some(())
                .and(None);
        }
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let _client = client;
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    let headers = p
                        .properties
                        .map(|pr| pr.user_properties.into_iter().collect())
                        .unwrap_or_default();
                    let _ = tx.send(Got {
                        topic: String::from_utf8_lossy(&p.topic).into_owned(),
                        body: serde_json::from_slice(&p.payload).unwrap_or(Value::Null),
                        raw: p.payload.to_vec(),
                        headers,
                        message_id: None,
                        delivery_mode: None,
                    });
                }
                Ok(_) => {}
                // The broker went away (a restart): poll again, which reconnects.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    });
    Some(Subscription { rx, _task: task })
}

/// A queue of its own on the shared RabbitMQ, bound to `exchange` with `key`, consumed.
pub async fn amqp_subscriber(exchange: &str, key: &str) -> Option<Subscription> {
    let conn = match lapin::Connection::connect(AMQP_URL, Default::default()).await {
        Ok(c) => c,
        Err(e) => return service_missing("RabbitMQ", e).then_some(()).and(None),
    };
    let ch = conn.create_channel().await.unwrap();
    let queue = unique("latch.test.");
    ch.queue_declare(
        queue.as_str().into(),
        QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        queue.as_str().into(),
        exchange.into(),
        key.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            unique("c").into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let _conn = conn;
        while let Some(Ok(d)) = consumer.next().await {
            let headers = d
                .properties
                .headers()
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| {
                    let v = match v {
                        AMQPValue::LongString(s) => s.to_string(),
                        other => format!("{other:?}"),
                    };
                    (k.to_string(), v)
                })
                .collect();
            let _ = tx.send(Got {
                topic: d.routing_key.to_string(),
                body: serde_json::from_slice(&d.data).unwrap_or(Value::Null),
                raw: d.data.clone(),
                headers,
                message_id: d.properties.message_id().as_ref().map(|m| m.to_string()),
                delivery_mode: *d.properties.delivery_mode(),
            });
            let _ = d.ack(BasicAckOptions::default()).await;
        }
    });
    Some(Subscription { rx, _task: task })
}
