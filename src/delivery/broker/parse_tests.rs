//! Each sink reads its URLs: the broker, the login and where in the broker.

use super::amqp::Amqp;
use super::mqtt::Mqtt;
use super::*;

/// A URL the API takes, as the MQTT sink reads it.
fn mqtt(url: &str) -> MqttUrl {
    crate::delivery::destination::validate_url(url).expect(url);
    let (broker, topic) = Mqtt::parse(url.split_once("://").unwrap().1).expect(url);
    MqttUrl { broker, topic }
}

fn amqp(url: &str) -> AmqpUrl {
    crate::delivery::destination::validate_url(url).expect(url);
    let (broker, t) = Amqp::parse(url.split_once("://").unwrap().1).expect(url);
    AmqpUrl {
        broker,
        exchange: t.exchange,
        routing_key: t.routing_key,
    }
}

struct MqttUrl {
    broker: Broker,
    topic: Template,
}

struct AmqpUrl {
    broker: Broker,
    exchange: String,
    routing_key: Template,
}

#[test]
fn mqtt_urls_name_the_broker_login_and_topic() {
    let t = mqtt("mqtt://acme:s%3Acret@Broker.Example.com:1884/doors/{sensor_id}/{type}");
    assert_eq!(t.broker.scheme, "mqtt");
    assert_eq!(t.broker.host, "broker.example.com");
    assert_eq!(t.broker.port, 1884);
    assert_eq!(t.broker.username.as_deref(), Some("acme"));
    assert_eq!(t.broker.password.as_deref(), Some("s:cret"));
    assert_eq!(t.topic.0, "doors/{sensor_id}/{type}");
    assert_eq!(
        t.topic.fill("xa7v9Dfadr7H", "sensor.state_changed"),
        "doors/xa7v9Dfadr7H/sensor.state_changed"
    );
    let plain = mqtt("MQTT://10.0.0.1/a");
    assert_eq!((plain.broker.port, plain.broker.username), (1883, None));
    assert_eq!(mqtt("mqtt://u@h/a").broker.password, None);
    assert_eq!(
        mqtt("mqtt://h//leading/empty/level").topic.0,
        "/leading/empty/level"
    );
}

#[test]
fn amqp_urls_name_the_broker_vhost_exchange_and_key() {
    let t = amqp("amqp://guest:guest@rabbit:5673/%2f?exchange=latch&routing_key=s.{sensor_id}");
    assert_eq!(t.broker.scheme, "amqp");
    assert_eq!((t.broker.host.as_str(), t.broker.port), ("rabbit", 5673));
    assert_eq!(t.broker.vhost, "/");
    assert_eq!(t.exchange, "latch");
    assert_eq!(t.routing_key.fill("s1", "x"), "s.s1");
    let d = amqp("amqp://h?exchange=amq.topic");
    assert_eq!((d.broker.vhost.as_str(), d.broker.port), ("/", 5672));
    assert_eq!(d.routing_key.0, "");
    let q = amqp("amqp://h/prod?routing_key=door-events&exchange=");
    assert_eq!((q.broker.vhost.as_str(), q.exchange.as_str()), ("prod", ""));
    assert_eq!(q.routing_key.0, "door-events");
}

#[test]
fn one_broker_is_one_key_whatever_the_case_of_its_name() {
    let a = mqtt("mqtt://u:p@HOST/a/{sensor_id}").broker;
    let b = mqtt("mqtt://u:p@host:1883/b").broker;
    assert_eq!(a, b);
    assert_ne!(a, mqtt("mqtt://u:q@host/b").broker, "another login");
    assert_ne!(
        amqp("amqp://h/a?exchange=x").broker,
        amqp("amqp://h/b?exchange=x").broker,
        "another vhost"
    );
}

#[test]
fn a_brokers_password_is_never_shown() {
    let b = mqtt("mqtt://acme:s3cret@h/a").broker;
    assert!(!format!("{b:?} {b}").contains("s3cret"), "{b:?}");
}
