//! AMQP destinations (RabbitMQ): each notification is published persistent (delivery mode
//! 2) and mandatory on a channel in confirm mode. The attempt succeeds on the broker's ack;
//! a nack, a return (no queue bound for the routing key: RabbitMQ returns a mandatory
//! message it cannot route, then acks it) or a timeout fails it.
//!
//! The body is the webhook's; the Standard Webhooks headers travel as message headers, and
//! `webhook-id` is also the `message_id` property (with `content_type`, `timestamp` and
//! `app_id` = `latch`).
//!
//! One connection per broker and vhost, one channel per exchange on it: a channel error
//! (publishing to an exchange that does not exist closes the channel) then fails only that
//! exchange's attempts, not every client's on the same broker; the channel is opened again
//! at the next attempt.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};

use super::url::{Broker, Template, broker_of, check_template, placeholder};
use super::{Failure, Lost, Message, Protocol};
use crate::domain::destination::{Shape, decode, host, pct, port, userinfo};

/// AMQP short strings (exchange names, routing keys) are at most this many bytes.
const SHORT_MAX: usize = 255;

pub(super) struct Amqp;

/// An exchange name as AMQP 0-9-1 defines it.
macro_rules! exchange {
    () => {
        "[A-Za-z0-9._:-]{1,255}"
    };
}
macro_rules! key_char {
    () => {
        concat!("(?:[A-Za-z0-9._~:*/-]|", placeholder!(), ")")
    };
}
/// An AMQP URL: `amqp://[user[:password]@]host[:port][/vhost]?exchange=NAME[&routing_key=KEY]`
/// (the two parameters in either order), the default exchange only with a key.
const URL: &str = concat!(
    "[aA][mM][qQ][pP]://",
    userinfo!(),
    host!(),
    port!(),
    "(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|",
    pct!(),
    ")+)?\\?(?:exchange=",
    exchange!(),
    "(?:&routing_key=",
    key_char!(),
    "*)?|routing_key=",
    key_char!(),
    "*&exchange=",
    exchange!(),
    "|exchange=&routing_key=",
    key_char!(),
    "+|routing_key=",
    key_char!(),
    "+&exchange=)",
);
const FORM: &str = "amqp://[user[:password]@]host[:port][/vhost]?exchange=NAME[&routing_key=KEY], where the key may hold {sensor_id} and {type}";
static SHAPE: Shape =
    Shape::new(|| regex::Regex::new(&format!("^(?:{URL})$")).expect("a valid pattern"));

/// Where an AMQP notification goes: the exchange (`""`: the default exchange, which
/// routes to the queue the routing key names) and the routing key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Target {
    pub exchange: String,
    pub routing_key: Template,
}

#[derive(Clone)]
pub(super) struct Conn {
    conn: Arc<Connection>,
    /// One channel in confirm mode per exchange, opened on first use.
    channels: Arc<tokio::sync::Mutex<HashMap<String, Channel>>>,
    lost: Arc<Lost>,
}

impl Protocol for Amqp {
    const SCHEME: &'static str = "amqp";
    const DEFAULT_PORT: u16 = 5672;
    const URL: &'static str = URL;
    const FORM: &'static str = FORM;
    const EXAMPLE: &'static str = "amqp://host/vhost?exchange=NAME";
    type Target = Target;
    type Conn = Conn;

    fn shape() -> &'static Shape {
        &SHAPE
    }

    fn parse(rest: &str) -> Result<(Broker, Target), String> {
        if rest.contains('#') {
            return Err("an amqp url takes no fragment (`#`)".into());
        }
        let (before, query) = match rest.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (rest, None),
        };
        let (authority, vhost) = match before.split_once('/') {
            Some((a, v)) => (a, Some(v)),
            None => (before, None),
        };
        let vhost = match vhost {
            None => "/".to_string(),
            Some("") => {
                return Err(
                    "the vhost is empty: leave the path out (or write /%2f) for the default \
                            vhost `/`"
                        .into(),
                );
            }
            Some(v) => decode("vhost", v, "._~!$&'()*+,;=:@-")?,
        };
        let broker = broker_of(Self::SCHEME, Self::DEFAULT_PORT, authority, vhost)?;
        let Some(query) = query else {
            return Err(format!("an amqp url names the exchange: {}", FORM));
        };
        let (mut exchange, mut key) = (None, None);
        for pair in query.split('&') {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match name {
                "exchange" => &mut exchange,
                "routing_key" => &mut key,
                _ => {
                    return Err(format!(
                        "unknown parameter {name:?} in the amqp url: it takes exchange and routing_key"
                    ));
                }
            };
            if slot.replace(value).is_some() {
                return Err(format!("{name} is given twice in the amqp url"));
            }
        }
        let Some(exchange) = exchange else {
            return Err(format!("an amqp url names the exchange: {}", FORM));
        };
        let key = key.unwrap_or("");
        if exchange.len() > 255
            || !exchange
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
        {
            return Err("the exchange name may hold letters, digits and `._:-`, up to 255".into());
        }
        if exchange.is_empty() && key.is_empty() {
            return Err(
                "the default exchange (exchange=) routes by queue name: give the queue as \
                        routing_key"
                    .into(),
            );
        }
        check_template("routing_key", key, "._~:*/-")?;
        Ok((
            broker,
            Target {
                exchange: exchange.to_string(),
                routing_key: Template(key.to_string()),
            },
        ))
    }

    async fn publish(
        conn: &Conn,
        t: &Target,
        sensor: &str,
        kind: &str,
        msg: Message,
        deadline: tokio::time::Instant,
    ) -> Result<(), Failure> {
        publish(
            conn,
            &t.exchange,
            t.routing_key.fill(sensor, kind),
            msg,
            deadline,
        )
        .await
    }

    async fn connect(
        broker: &Broker,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Conn, Failure> {
        let uri = AMQPUri {
            scheme: AMQPScheme::AMQP,
            authority: AMQPAuthority {
                userinfo: AMQPUserInfo {
                    username: broker.username.clone().unwrap_or_else(|| "guest".into()),
                    password: broker.password.clone().unwrap_or_else(|| "guest".into()),
                },
                host: addr.ip().to_string(),
                port: addr.port(),
            },
            vhost: broker.vhost.clone(),
            query: AMQPQueryString {
                connection_timeout: Some(timeout.as_millis() as u64),
                ..Default::default()
            },
        };
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from("latch notifications"));
        let conn = match tokio::time::timeout(timeout, Connection::connect_uri(uri, props)).await {
            Ok(Ok(c)) => Arc::new(c),
            Ok(Err(e)) => return Err(failure(&e)),
            Err(_) => return Err(Failure::Timeout("the broker to open the connection")),
        };
        let lost = Lost::new();
        tokio::spawn(watch(conn.clone(), lost.clone()));
        Ok(Conn {
            conn,
            channels: Arc::default(),
            lost,
        })
    }

    async fn lost(conn: &Conn) -> Failure {
        conn.lost.wait().await
    }

    async fn close(conn: Conn) {
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            conn.conn.close(200, ShortString::from("latch closing")),
        )
        .await;
        conn.lost
            .report(Failure::Connection("closed by latch".into()));
    }
}

/// Reports the connection lost once it is no longer connected. Its error events also
/// tell of closed channels, which leave the connection up: the status decides.
async fn watch(conn: Arc<Connection>, lost: Arc<Lost>) {
    let mut events = conn.events_listener();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            biased;
            _ = lost.token.cancelled() => return,
            e = events.next() => match e {
                Some(lapin::Event::Error(e)) if !conn.status().connected() => {
                    lost.report(failure(&e));
                    return;
                }
                Some(_) => {}
                None => break,
            },
            _ = tick.tick() => if !conn.status().connected() { break },
        }
    }
    lost.report(Failure::Connection(
        "the broker closed the connection".into(),
    ));
}

/// Publishes one message and waits for the broker's confirm until `deadline`.
async fn publish(
    conn: &Conn,
    exchange: &str,
    routing_key: String,
    msg: Message,
    deadline: tokio::time::Instant,
) -> Result<(), Failure> {
    if routing_key.len() > SHORT_MAX {
        return Err(Failure::Unusable(format!(
            "the routing key is {} bytes long, more than AMQP's {SHORT_MAX}",
            routing_key.len()
        )));
    }
    let channel = tokio::time::timeout_at(deadline, channel(conn, exchange))
        .await
        .map_err(|_| Failure::Timeout("the broker to open a channel"))??;
    let header = |v: String| AMQPValue::LongString(LongString::from(v));
    let mut headers = FieldTable::default();
    headers.insert(ShortString::from("webhook-id"), header(msg.id.clone()));
    headers.insert(
        ShortString::from("webhook-timestamp"),
        header(msg.timestamp.to_string()),
    );
    headers.insert(
        ShortString::from("webhook-signature"),
        header(msg.signature),
    );
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type(ShortString::from("application/json"))
        .with_message_id(ShortString::from(msg.id))
        .with_timestamp(msg.timestamp.max(0) as u64)
        .with_app_id(ShortString::from("latch"))
        .with_headers(headers);
    let mandatory = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    // Bounded too: a broker short of memory blocks publishers (connection.blocked).
    let confirm = tokio::time::timeout_at(
        deadline,
        channel.basic_publish(
            ShortString::from(exchange),
            ShortString::from(routing_key.as_str()),
            mandatory,
            &msg.body,
            props,
        ),
    )
    .await
    .map_err(|_| Failure::Timeout("the broker to take the message"))?
    .map_err(|e| failure(&e))?;
    let confirmation = tokio::time::timeout_at(deadline, confirm)
        .await
        .map_err(|_| Failure::Timeout("the broker's confirm"))?
        .map_err(|e| failure(&e))?;
    match confirmation {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(ret)) | Confirmation::Nack(Some(ret)) => {
            Err(Failure::Refused(format!(
                "returned {} {} (exchange {exchange:?}, routing key {routing_key:?})",
                ret.reply_code, ret.reply_text
            )))
        }
        Confirmation::Nack(None) => Err(Failure::Refused("nack".into())),
        Confirmation::NotRequested => Err(Failure::Connection(
            "the channel is not in confirm mode".into(),
        )),
    }
}

/// The exchange's channel, opened (in confirm mode) when it has none or it was closed.
async fn channel(conn: &Conn, exchange: &str) -> Result<Channel, Failure> {
    let mut channels = conn.channels.lock().await;
    if let Some(ch) = channels.get(exchange)
        && ch.status().connected()
    {
        return Ok(ch.clone());
    }
    if conn.lost.is_lost() {
        return Err(conn.lost.why());
    }
    let ch = conn.conn.create_channel().await.map_err(|e| failure(&e))?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| failure(&e))?;
    channels.insert(exchange.to_string(), ch.clone());
    Ok(ch)
}

/// An error from lapin as an attempt's failure: what the broker said (a channel or
/// connection closed with a reply code) is a refusal, the rest a connection failure.
fn failure(e: &lapin::Error) -> Failure {
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => {
            Failure::Refused(format!("{} {}", amqp.get_id(), amqp.get_message()))
        }
        _ => Failure::Connection(e.to_string()),
    }
}
