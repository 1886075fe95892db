//! Notifications to broker destinations, against the real brokers: published to an MQTT
//! topic (QoS 1, headers as MQTT 5 user properties) or an AMQP exchange (persistent,
//! mandatory, confirmed, headers and `message_id`), with the outbox's guarantees: order
//! under retries, nothing lost across a broker restart, the broker's refusals recorded as
//! the attempts' errors, a down broker holding up no webhook, credentials never shown to
//! a `read` token. The restart and the refused login use a private Mosquitto
//! (`utils::mosquitto`): a test never stops the shared broker, and a private RabbitMQ
//! takes an Erlang node, a cookie and seconds to boot for what a private Mosquitto shows
//! as well (the link's reconnect is the same code for both protocols).

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::utils::mosquitto::Mosquitto;
use crate::utils::subscriber::{AMQP_URL, Got, Session, amqp_subscriber, mqtt_subscriber};
use crate::utils::{Receiver, TestServer, eventually, unique};

const MQTT_PORT: u16 = 1883;

/// A client for `url` linked to a new sensor; (client id, secret, sensor id).
async fn linked(s: &TestServer, url: &str) -> (String, String, String) {
    let sensor = unique("s");
    s.sensor(&sensor).await;
    let (st, body) = s
        .post("/v1/clients", json!({"name": "broker", "url": url}))
        .await;
    assert_eq!(st, 201, "{body}");
    let client = body["id"].as_str().unwrap().to_string();
    s.link(&client, &sensor).await;
    (client, body["secret"].as_str().unwrap().to_string(), sensor)
}

/// The Standard Webhooks headers of `got` verify with `secret` and name its body's id.
fn signed(got: &Got, secret: &str) {
    let id = &got.headers["webhook-id"];
    assert_eq!(id, got.body["id"].as_str().unwrap(), "{got:?}");
    let ts: i64 = got.headers["webhook-timestamp"].parse().unwrap();
    let key = latch::domain::client::secret_key(secret).unwrap();
    let expected = latch::delivery::signing::sign(&key, id, ts, &got.raw);
    assert_eq!(got.headers["webhook-signature"], expected, "{got:?}");
}

/// The notifications of `client`, oldest first.
async fn notifications(s: &TestServer, client: &str) -> Vec<Value> {
    s.notifications(&format!("client_id={client}")).await
}

/// One notification with its attempts.
async fn notification(s: &TestServer, id: &str) -> Value {
    let (st, body) = s.get(&format!("/v1/notifications/{id}")).await;
    assert_eq!(st, 200, "{body}");
    body
}

#[tokio::test]
async fn mqtt_destinations_get_each_change_signed_in_user_properties() {
    let prefix = unique("latch-test/");
    let Some(mut sub) =
        mqtt_subscriber(MQTT_PORT, &format!("{prefix}/#"), Session::default()).await
    else {
        return;
    };
    let s = TestServer::start().await;
    let url = format!("mqtt://127.0.0.1:{MQTT_PORT}/{prefix}/{{sensor_id}}/{{type}}");
    let (client, secret, sensor) = linked(&s, &url).await;
    s.readings(json!([{"sensor_id": sensor, "data": 1}])).await;
    let first = sub.take(1).await.remove(0);
    s.readings(json!([{"sensor_id": sensor, "data": 0}])).await;
    let second = sub.take(1).await.remove(0);
    for (got, data) in [(&first, 1), (&second, 0)] {
        assert_eq!(got.topic, format!("{prefix}/{sensor}/sensor.state_changed"));
        assert_eq!(got.body["type"], "sensor.state_changed");
        assert_eq!(got.body["sensor"]["id"], sensor.as_str());
        assert_eq!(got.body["data"], data);
        signed(got, &secret);
    }
    // Recorded as delivered, the attempt without an HTTP status or an error.
    let id = first.body["id"].as_str().unwrap();
    let n = eventually(10, "the delivery recorded", || async {
        let n = notification(&s, id).await;
        (n["status"] == "delivered").then_some(n)
    })
    .await;
    let attempt = &n["attempts"][0];
    assert_eq!(
        (&attempt["status_code"], &attempt["error"]),
        (&Value::Null, &Value::Null),
        "{n}"
    );
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    assert!(c["health"]["last_success_at"].is_string(), "{c}");
    s.stop().await;
}

#[tokio::test]
async fn amqp_destinations_get_persistent_messages_with_headers_and_message_id() {
    let key = unique("latch.test.");
    let Some(mut sub) = amqp_subscriber("amq.topic", &format!("{key}.#")).await else {
        return;
    };
    let s = TestServer::start().await;
    let url = format!("{AMQP_URL}?exchange=amq.topic&routing_key={key}.{{sensor_id}}.{{type}}");
    let (_, secret, sensor) = linked(&s, &url).await;
    s.readings(json!([{"sensor_id": sensor, "data": 1}])).await;
    let got = sub.take(1).await.remove(0);
    assert_eq!(got.topic, format!("{key}.{sensor}.sensor.state_changed"));
    assert_eq!(got.body["data"], 1);
    assert_eq!(got.message_id.as_deref(), got.body["id"].as_str());
    assert_eq!(got.delivery_mode, Some(2), "persistent");
    signed(&got, &secret);
    s.stop().await;
}

/// A mandatory publish nothing is bound for comes back: the attempt fails with the
/// broker's return and is retried, and what queues behind it waits. The sensor (silent for
/// its 1 s heartbeat) goes lost and comes back meanwhile: lost and restored notifications
/// are never superseded (the first state is, by the newest), so once a queue is bound the
/// lane's lost, restored and newest state arrive in that order.
#[tokio::test]
async fn an_unroutable_amqp_publish_fails_and_order_holds_under_retries() {
    let key = unique("latch.unrouted.");
    // RabbitMQ is there (else SKIPPED, or a failure in CI), so a return is its answer.
    if amqp_subscriber("amq.direct", &unique("probe"))
        .await
        .is_none()
    {
        return;
    }
    // Retries enough that none runs out of attempts while the test waits.
    let s = TestServer::start_with(|c| c.retry_max_attempts = 1000).await;
    let sensor = unique("u");
    let (st, body) = s
        .post(
            "/v1/sensors",
            json!({"id": sensor, "address": "a", "heartbeat_timeout_s": 1}),
        )
        .await;
    assert_eq!(st, 201, "{body}");
    let client = s
        .client(&format!("{AMQP_URL}?exchange=amq.direct&routing_key={key}"))
        .await;
    s.link(&client, &sensor).await;
    s.readings(json!([{"sensor_id": sensor, "data": 1}])).await;
    let head = eventually(20, "a returned attempt", || async {
        let n = notifications(&s, &client).await.into_iter().next()?;
        let n = notification(&s, n["id"].as_str()?).await;
        n["attempts"][0]["error"].is_string().then_some(n)
    })
    .await;
    let error = head["attempts"][0]["error"].as_str().unwrap();
    assert!(
        error.starts_with("refused by the broker: returned 312 NO_ROUTE"),
        "{error}"
    );
    assert_eq!(head["status"], "pending", "retried: {head}");
    // Lost after a second of silence; its notification waits behind the failing head.
    let lost = eventually(20, "a connection_lost notification", || async {
        let ns = notifications(&s, &client).await;
        ns.into_iter()
            .find(|n| n["type"] == "sensor.connection_lost")
    })
    .await;
    s.readings(json!([{"sensor_id": sensor, "data": 0}])).await;
    let Some(mut sub) = amqp_subscriber("amq.direct", &key).await else {
        return;
    };
    let got = sub.take(3).await;
    let kinds: Vec<&str> = got
        .iter()
        .map(|g| g.body["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "sensor.connection_lost",
            "sensor.connection_restored",
            "sensor.state_changed"
        ]
    );
    assert_eq!(got[0].body["id"], lost["id"]);
    assert_eq!(got[2].body["data"], 0);
    let head = notification(&s, head["id"].as_str().unwrap()).await;
    assert_eq!(head["status"], "superseded", "by the newest state: {head}");
    let metrics = s
        .http
        .get(format!("{}/metrics", s.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("latch_delivery_attempts_total{outcome=\"broker_refused\"}"),
        "the returns are counted as refusals"
    );
    s.stop().await;
}

/// The broker restarts while changes stream in: attempts in flight fail and are retried,
/// the link reconnects, and every sensor's subscriber sees its changes in order, the last
/// one included; nothing is left pending or failed.
#[tokio::test]
async fn a_broker_restart_mid_stream_loses_nothing_and_keeps_order() {
    let Some(mut broker) = Mosquitto::start(&[]).await else {
        return;
    };
    let port = broker.port;
    let mut sub = mqtt_subscriber(
        port,
        "restart/#",
        Session {
            persistent: true,
            ..Session::default()
        },
    )
    .await
    .expect("the private broker takes a subscriber");
    let s = TestServer::start().await;
    let url = format!("mqtt://127.0.0.1:{port}/restart/{{sensor_id}}");
    let sensors: Vec<String> = (0..8).map(|_| unique("r")).collect();
    let client = s.client(&url).await;
    for id in &sensors {
        s.sensor(id).await;
        s.link(&client, id).await;
    }
    let rounds = 12;
    for round in 0..rounds {
        let batch: Vec<Value> = sensors
            .iter()
            .map(|id| json!({"sensor_id": id, "data": (round % 2) as u8}))
            .collect();
        s.readings(Value::Array(batch)).await;
        if round == rounds / 2 {
            broker.restart().await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let ns = eventually(60, "every notification ended", || async {
        let ns = notifications(&s, &client).await;
        ns.iter().all(|n| n["status"] != "pending").then_some(ns)
    })
    .await;
    assert!(
        ns.iter()
            .all(|n| n["status"] == "delivered" || n["status"] == "superseded"),
        "{ns:?}"
    );
    let delivered: Vec<&str> = ns
        .iter()
        .filter(|n| n["status"] == "delivered")
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    // Every delivered one reaches the subscriber (the broker kept its session's queue
    // across the restart), each sensor's in the order they occurred.
    let mut seen: HashMap<String, Value> = HashMap::new();
    let mut order: HashMap<String, Vec<(String, Value)>> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while delivered.iter().any(|id| !seen.contains_key(*id)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "lost: {:?}\n{}",
            delivered
                .iter()
                .filter(|id| !seen.contains_key(**id))
                .collect::<Vec<_>>(),
            broker.log()
        );
        for g in sub.drain() {
            let id = g.body["id"].as_str().unwrap().to_string();
            let sensor = g.body["sensor"]["id"].as_str().unwrap().to_string();
            order.entry(sensor).or_default().push((
                g.body["occurred_at"].as_str().unwrap().to_string(),
                g.body["data"].clone(),
            ));
            seen.insert(id, g.body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for id in &sensors {
        let got = &order[id];
        assert!(
            got.windows(2).all(|w| w[0].0 <= w[1].0),
            "{id} got an older change after a newer one: {got:?}"
        );
        assert_eq!(
            got.last().unwrap().1,
            json!(((rounds - 1) % 2) as u8),
            "{id}: {got:?}"
        );
    }
    s.stop().await;
}

/// A login the broker refuses fails each attempt with its CONNACK, never showing the
/// password; the right one (the URL is read at each attempt) delivers what waited.
#[tokio::test]
async fn a_refused_mqtt_login_fails_attempts_until_the_url_is_fixed() {
    let Some(broker) = Mosquitto::start(&[("acme", "right-pw")]).await else {
        return;
    };
    let port = broker.port;
    let s = TestServer::start().await;
    let wrong = format!("mqtt://acme:wrong-pw@127.0.0.1:{port}/login/{{sensor_id}}");
    let (client, _, sensor) = linked(&s, &wrong).await;
    s.readings(json!([{"sensor_id": sensor, "data": 1}])).await;
    let error = eventually(20, "a refused attempt", || async {
        let n = notifications(&s, &client).await.into_iter().next()?;
        let n = notification(&s, n["id"].as_str()?).await;
        n["attempts"][0]["error"].as_str().map(str::to_string)
    })
    .await;
    assert!(
        error.starts_with("refused by the broker: CONNACK"),
        "{error}"
    );
    assert!(!error.contains("wrong-pw"), "{error}");
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    assert!(
        !c["health"]["last_error"].to_string().contains("wrong-pw"),
        "{c}"
    );

    let login = Session {
        login: Some(("acme", "right-pw")),
        ..Session::default()
    };
    let mut sub = mqtt_subscriber(port, "login/#", login)
        .await
        .expect("the private broker takes its user");
    let right = format!("mqtt://acme:right-pw@127.0.0.1:{port}/login/{{sensor_id}}");
    let (st, body) = s
        .put(
            &format!("/v1/clients/{client}"),
            json!({"name": "broker", "url": right}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    let got = sub.take(1).await.remove(0);
    assert_eq!(got.body["data"], 1);
    assert!(!broker.log().is_empty());
    s.stop().await;
}

/// A broker that does not answer fails its own clients' attempts at once; a webhook of
/// the same sensor is delivered meanwhile.
#[tokio::test]
async fn a_down_broker_holds_up_no_webhook() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = TestServer::start().await;
    let (broker_client, _, sensor) =
        linked(&s, &format!("mqtt://127.0.0.1:{closed}/down/{{sensor_id}}")).await;
    let receiver = Receiver::start().await;
    let hook = s.client(&receiver.url).await;
    s.link(&hook, &sensor).await;
    s.readings(json!([{"sensor_id": sensor, "data": 1}])).await;
    eventually(10, "the webhook delivered", || async {
        (receiver.ok() == 1).then_some(())
    })
    .await;
    let error = eventually(10, "the broker's attempt failed", || async {
        let n = notifications(&s, &broker_client).await.into_iter().next()?;
        let n = notification(&s, n["id"].as_str()?).await;
        n["attempts"][0]["error"].as_str().map(str::to_string)
    })
    .await;
    assert!(error.starts_with("connection failed"), "{error}");
    s.stop().await;
}

/// Broker URLs are checked on create and replace: what cannot work is 422 with the
/// reason; a broker inside the network is refused by the SSRF guard like a webhook.
#[tokio::test]
async fn broker_urls_are_validated_and_guarded() {
    let s = TestServer::start().await;
    for (url, why) in [
        ("mqtts://broker.example.com/a", "TLS"),
        ("mqtt://broker.example.com/doors/#", "wildcard"),
        (
            "mqtt://broker.example.com/doors/{sensor}",
            "unknown placeholder {sensor}",
        ),
        (
            "amqp://broker.example.com?exchange=x&queue=y",
            "unknown parameter",
        ),
        ("amqp://broker.example.com/vhost", "names the exchange"),
    ] {
        let (st, body) = s
            .post("/v1/clients", json!({"name": "b", "url": url}))
            .await;
        assert_eq!(st, 422, "{url}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{url}: {message}");
    }
    let guarded = TestServer::start_with(|c| c.delivery_allow_nets.clear()).await;
    for url in ["mqtt://u:p@127.0.0.1/a", "amqp://10.0.0.5/%2f?exchange=x"] {
        let (st, body) = guarded
            .post("/v1/clients", json!({"name": "b", "url": url}))
            .await;
        assert_eq!(st, 422, "{url}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("url is not allowed"), "{url}: {message}");
    }
    guarded.stop().await;
    s.stop().await;
}

/// The password in a broker URL is a secret: an admin reads it, a `read` token sees `***`.
#[tokio::test]
async fn a_read_token_never_sees_a_brokers_password() {
    let admin = unique("admin");
    let s = TestServer::start_with(|c| c.api_token = Some(admin.clone())).await;
    let url = "mqtt://acme:s3cret@broker.example.com/doors/{sensor_id}";
    let (client, _, sensor) = linked(&s, url).await;
    let (st, body) = s
        .post("/v1/tokens", json!({"name": "dash", "scopes": ["read"]}))
        .await;
    assert_eq!(st, 201, "{body}");
    let read = body["token"].as_str().unwrap().to_string();
    let (_, mine) = s.get(&format!("/v1/clients/{client}")).await;
    assert_eq!(mine["url"], url, "the admin reads it whole");
    let masked = "mqtt://acme:***@broker.example.com/doors/{sensor_id}";
    for path in [
        format!("/v1/clients/{client}"),
        "/v1/clients".to_string(),
        format!("/v1/sensors/{sensor}/clients"),
    ] {
        let r = s
            .http
            .get(format!("{}{path}", s.base))
            .bearer_auth(&read)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let text = r.text().await.unwrap();
        assert!(!text.contains("s3cret"), "{path}: {text}");
        assert!(text.contains(masked), "{path}: {text}");
    }
    s.stop().await;
}
