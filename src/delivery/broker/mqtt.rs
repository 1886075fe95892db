//! MQTT destinations: each notification is published at QoS 1, and the attempt succeeds
//! when the broker's PUBACK says so (reason `success`, or `no matching subscribers`: the
//! broker took it, and nobody subscribes). A PUBACK with a failure reason, a refused
//! CONNACK or a lost connection fails it.
//!
//! latch connects as an MQTT 5 client, so the Standard Webhooks headers travel as user
//! properties (`webhook-id`, `webhook-timestamp`, `webhook-signature`) beside the payload,
//! which is exactly the body a webhook gets (`content-type: application/json`, payload
//! format UTF-8). A broker that speaks only MQTT 3.1.1 refuses the connection; there is no
//! 3.1.1 fallback with the headers inside the payload.
//!
//! Each connection has a fresh client id and a clean start: a session resumed after a
//! reconnect would resend what the lost connection left unacknowledged behind newer
//! notifications; instead those attempts fail and their lanes retry them in order.
//!
//! rumqttc numbers publishes itself; it takes requests in the order sent and announces
//! each one's packet id as it goes out (`Outgoing::Publish`), so a publish's waiter is
//! queued under the same lock as its request, and the event loop's task pairs them in
//! order, then the PUBACK with its waiter by packet id.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::Outgoing;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, PubAck, PubAckReason, PublishProperties};
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions};
use tokio::sync::oneshot;

use super::url::{Broker, Template, broker_of, check_template, placeholder};
use super::{Failure, Lost, Message, Protocol, words};
use crate::domain::destination::{Shape, host, port, userinfo};

/// Publishes queued in the client beyond the broker's receive window (the dispatcher's
/// concurrency bounds what any one link is asked for).
const QUEUE: usize = 1024;
const KEEP_ALIVE: Duration = Duration::from_secs(30);

pub(super) struct Mqtt;

/// An MQTT URL: `mqtt://[user[:password]@]host[:port]/topic`, the topic with no
/// wildcard and not starting with `$`, placeholders allowed.
const URL: &str = concat!(
    "[mM][qQ][tT][tT]://",
    userinfo!(),
    host!(),
    port!(),
    "/(?:[A-Za-z0-9._~!&'()*,;=:@/-]|",
    placeholder!(),
    ")(?:[A-Za-z0-9._~!$&'()*,;=:@/-]|",
    placeholder!(),
    ")*",
);
const FORM: &str =
    "mqtt://[user[:password]@]host[:port]/topic, where the topic may hold {sensor_id} and {type}";
static SHAPE: Shape =
    Shape::new(|| regex::Regex::new(&format!("^(?:{URL})$")).expect("a valid pattern"));

/// A publish's answer.
type Answer = Result<(), Failure>;

/// Waiters of publishes in flight: sent in order, not yet numbered; then by packet id.
#[derive(Default)]
struct Acks {
    queued: VecDeque<oneshot::Sender<Answer>>,
    sent: HashMap<u16, oneshot::Sender<Answer>>,
}

#[derive(Clone)]
pub(super) struct Conn {
    client: AsyncClient,
    acks: Arc<Mutex<Acks>>,
    lost: Arc<Lost>,
}

impl Protocol for Mqtt {
    const SCHEME: &'static str = "mqtt";
    const DEFAULT_PORT: u16 = 1883;
    const URL: &'static str = URL;
    const FORM: &'static str = FORM;
    const EXAMPLE: &'static str = "mqtt://host/topic";
    /// The topic, published to at QoS 1.
    type Target = Template;
    type Conn = Conn;

    fn shape() -> &'static Shape {
        &SHAPE
    }

    fn parse(rest: &str) -> Result<(Broker, Template), String> {
        if rest.contains(['?', '#']) {
            return Err(
                "an mqtt url takes no query or fragment: mqtt://[user:password@]host[:port]/topic \
                 (`#` and `+` are wildcards, which cannot be published to)"
                    .into(),
            );
        }
        let Some((authority, topic)) = rest.split_once('/') else {
            return Err(format!("an mqtt url names the topic to publish to: {FORM}"));
        };
        let broker = broker_of(Self::SCHEME, Self::DEFAULT_PORT, authority, String::new())?;
        if topic.is_empty() {
            return Err(format!("the topic is empty: {FORM}"));
        }
        if topic.contains('+') {
            return Err(
                "the topic must not hold `+`: it is an MQTT wildcard, which cannot be published to"
                    .into(),
            );
        }
        if topic.starts_with('$') {
            return Err(
                "topics starting with `$` are the broker's own ($SYS …): pick another".into(),
            );
        }
        check_template("topic", topic, "._~!$&'()*,;=:@/-")?;
        Ok((broker, Template(topic.to_string())))
    }

    async fn publish(
        conn: &Conn,
        topic: &Template,
        sensor: &str,
        kind: &str,
        msg: Message,
        deadline: tokio::time::Instant,
    ) -> Result<(), Failure> {
        publish(conn, topic.fill(sensor, kind), msg, deadline).await
    }

    async fn connect(
        broker: &Broker,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Conn, Failure> {
        let ulid = ulid::Ulid::new().to_string();
        // 22 characters: within the 23 every broker must take.
        let id = format!("latch{}", &ulid[10..].to_ascii_lowercase());
        let mut o = MqttOptions::new(id, addr.ip().to_string(), addr.port());
        o.set_clean_start(true)
            .set_keep_alive(KEEP_ALIVE)
            .set_connection_timeout(timeout.as_secs().max(1));
        if let Some(user) = &broker.username {
            o.set_credentials(user.clone(), broker.password.clone().unwrap_or_default());
        }
        let (client, mut events) = AsyncClient::new(o, QUEUE);
        match tokio::time::timeout(timeout, events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => {}
            Ok(Ok(other)) => {
                return Err(Failure::Connection(format!(
                    "the broker answered the CONNECT with {other:?}"
                )));
            }
            Ok(Err(e)) => return Err(failure(e)),
            Err(_) => return Err(Failure::Timeout("the broker's CONNACK")),
        }
        let conn = Conn {
            client,
            acks: Arc::default(),
            lost: Lost::new(),
        };
        tokio::spawn(poll(events, conn.acks.clone(), conn.lost.clone()));
        Ok(conn)
    }

    async fn lost(conn: &Conn) -> Failure {
        conn.lost.wait().await
    }

    async fn close(conn: Conn) {
        // A DISCONNECT first, so the broker sees a clean end; the event loop ends once it
        // has gone out (or soon anyway).
        let _ = conn.client.try_disconnect();
        let _ = tokio::time::timeout(Duration::from_secs(1), conn.lost.wait()).await;
        conn.lost
            .report(Failure::Connection("closed by latch".into()));
    }
}

/// Publishes one message to `topic` and waits for its PUBACK until `deadline`.
async fn publish(
    conn: &Conn,
    topic: String,
    msg: Message,
    deadline: tokio::time::Instant,
) -> Result<(), Failure> {
    let props = PublishProperties {
        payload_format_indicator: Some(1),
        content_type: Some("application/json".into()),
        user_properties: vec![
            ("webhook-id".into(), msg.id),
            ("webhook-timestamp".into(), msg.timestamp.to_string()),
            ("webhook-signature".into(), msg.signature),
        ],
        ..Default::default()
    };
    let (tx, rx) = oneshot::channel();
    {
        let mut acks = conn.acks.lock().unwrap_or_else(|e| e.into_inner());
        if conn.lost.is_lost() {
            return Err(conn.lost.why());
        }
        // The waiter joins the queue under the lock its packet id is paired under.
        conn.client
            .try_publish_with_properties(topic, QoS::AtLeastOnce, false, msg.body, props)
            .map_err(|_| Failure::Connection("the connection's queue is full".into()))?;
        acks.queued.push_back(tx);
    }
    match tokio::time::timeout_at(deadline, rx).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(conn.lost.why()),
        Err(_) => Err(Failure::Timeout("the broker's PUBACK")),
    }
}

/// Drives one connection's event loop: pairs publishes with their PUBACKs until the
/// connection ends, then fails whatever still waits. Never reconnects: rumqttc would
/// resend the unacknowledged publishes on a new connection, which the link does not want.
async fn poll(mut events: EventLoop, acks: Arc<Mutex<Acks>>, lost: Arc<Lost>) {
    loop {
        let event = tokio::select! {
            biased;
            _ = lost.token.cancelled() => break,
            e = events.poll() => e,
        };
        match event {
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                let mut a = acks.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(tx) = a.queued.pop_front() {
                    a.sent.insert(pkid, tx);
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                let tx = acks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .sent
                    .remove(&ack.pkid);
                if let Some(tx) = tx {
                    let _ = tx.send(answer(&ack));
                }
            }
            Ok(Event::Incoming(Packet::Disconnect(d))) => {
                let why = words(&format!("{:?}", d.reason_code));
                lost.report(Failure::Connection(format!(
                    "the broker disconnected ({why})"
                )));
                break;
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                lost.report(Failure::Connection("closed by latch".into()));
                break;
            }
            Ok(_) => {}
            Err(e) => {
                lost.report(failure(e));
                break;
            }
        }
    }
    let why = lost.why();
    let mut guard = acks.lock().unwrap_or_else(|e| e.into_inner());
    let a = &mut *guard;
    for tx in a.queued.drain(..).chain(a.sent.drain().map(|(_, tx)| tx)) {
        let _ = tx.send(Err(why.clone()));
    }
}

/// What a PUBACK says of the attempt.
fn answer(ack: &PubAck) -> Answer {
    match ack.reason {
        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => Ok(()),
        reason => {
            let detail = ack
                .properties
                .as_ref()
                .and_then(|p| p.reason_string.as_deref())
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            Err(Failure::Refused(format!(
                "PUBACK {}{detail}",
                words(&format!("{reason:?}"))
            )))
        }
    }
}

fn failure(e: ConnectionError) -> Failure {
    match e {
        ConnectionError::ConnectionRefused(code) => {
            Failure::Refused(format!("CONNACK {}", words(&format!("{code:?}"))))
        }
        ConnectionError::Timeout(_) => Failure::Timeout("the broker's CONNACK"),
        ConnectionError::Io(e) => Failure::Connection(e.to_string()),
        e => Failure::Connection(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::v5::mqttbytes::v5::PubAckProperties;

    fn ack(reason: PubAckReason, why: Option<&str>) -> PubAck {
        PubAck {
            pkid: 1,
            reason,
            properties: why.map(|w| PubAckProperties {
                reason_string: Some(w.into()),
                user_properties: vec![],
            }),
        }
    }

    /// Taken by the broker counts, subscribers or not; a failure reason is a refusal in
    /// the broker's words.
    #[test]
    fn a_pubacks_reason_decides_the_attempt() {
        assert!(answer(&ack(PubAckReason::Success, None)).is_ok());
        assert!(answer(&ack(PubAckReason::NoMatchingSubscribers, None)).is_ok());
        let refused = answer(&ack(PubAckReason::NotAuthorized, Some("acl"))).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "refused by the broker: PUBACK not authorized: acl"
        );
        assert!(answer(&ack(PubAckReason::QuotaExceeded, None)).is_err());
    }
}
