//! `latch bench deliver --to mqtt|amqp`: state changes in, broker messages out, to one
//! destination (one client: an MQTT topic, or an AMQP exchange and routing key).
//!
//! A subscriber on the destination counts what arrives and each message's latency from
//! its `occurred_at`. Delivery's rate is the notifications delivered over the time from
//! the first change sent until the outbox drained. Baseline, in the same run and the same
//! process: a bare publisher to the same destination, as many messages in flight as latch
//! may have towards one client (`delivery_client_concurrency`) — rumqttc at QoS 1
//! counting PUBACKs, or lapin on a confirming channel, persistent and mandatory, each
//! publisher awaiting its confirm — which is what the broker and the client library take
//! at all, without an outbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};

use super::changes::{Args, drain, ended_mark, outbox_counts, send_changes};
use super::{Report, percentile};

/// What the subscriber saw.
#[derive(Default)]
struct Sink {
    received: AtomicU64,
    /// Latencies are kept only while latch delivers (not during the baseline).
    timing: AtomicBool,
    latencies: std::sync::Mutex<Vec<f64>>,
}

impl Sink {
    fn got(&self, body: &[u8]) {
        self.received.fetch_add(1, Ordering::Relaxed);
        if !self.timing.load(Ordering::Relaxed) {
            return;
        }
        let at = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| latch::domain::time::parse(v["occurred_at"].as_str()?));
        if let Some(at) = at {
            let ms = (latch::domain::time::now_ms() - at) as f64;
            self.latencies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ms);
        }
    }
}

/// The destination: latch's client URL and where the bare publisher sends.
enum Dest {
    Mqtt {
        host: String,
        port: u16,
        topic: String,
    },
    Amqp {
        url: String,
        exchange: String,
        key: String,
    },
}

impl Dest {
    fn client_url(&self) -> String {
        match self {
            Dest::Mqtt { host, port, topic } => format!("mqtt://{host}:{port}/{topic}"),
            Dest::Amqp { url, exchange, key } => {
                format!("{url}?exchange={exchange}&routing_key={key}")
            }
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    let u = ulid::Ulid::new().to_string().to_ascii_lowercase();
    let run_id = &u[u.len() - 10..];
    let dest = if args.to == "mqtt" {
        let url = reqwest::Url::parse(&args.mqtt_url)?;
        Dest::Mqtt {
            host: url.host_str().unwrap_or("127.0.0.1").to_string(),
            port: url.port().unwrap_or(1883),
            topic: format!("latch-bench/{run_id}"),
        }
    } else {
        Dest::Amqp {
            url: args.amqp_url.clone(),
            exchange: "amq.direct".into(),
            key: format!("latch.bench.{run_id}"),
        }
    };
    let sink = Arc::new(Sink::default());
    let _subscriber = subscribe(&dest, sink.clone()).await?;

    let (dir, _tmp) = super::data_dir(None)?;
    let client = super::client(&dest.client_url());
    let ids = super::sensor_ids(args.sensors);
    let (mut config, pg) = super::store_config(&dir, args.database_url.as_deref()).await?;
    super::import(&config, &ids, std::slice::from_ref(&client), None).await?;
    let concurrency = config.delivery_client_concurrency as usize;
    config.retry_base = Duration::from_millis(100);
    config.retry_max_delay = Duration::from_secs(2);
    let from = ended_mark();
    let server = super::start(config).await?;
    let http = reqwest::Client::new();
    let counted = sink.clone();
    let progress = super::progress("deliver", "messages received", move || {
        counted.received.load(Ordering::Relaxed)
    });

    sink.timing.store(true, Ordering::Relaxed);
    let started = Instant::now();
    let url = format!("{}/v1/readings", server.base);
    let send_secs = send_changes(&args, &http, &url, ids, started).await?;
    let expected = args.changes as u64;
    drain(&http, &server.base, from, expected, args.drain).await?;
    let total_secs = started.elapsed().as_secs_f64();
    sink.timing.store(false, Ordering::Relaxed);
    let text = http
        .get(format!("{}/metrics", server.base))
        .send()
        .await?
        .text()
        .await?;
    let delivered = super::metric_sum(&text, "latch_notifications_total{status=\"delivered\"}");
    let attempts = super::metric_sum(&text, "latch_delivery_attempts_total");
    let counts = outbox_counts(&server.base, &http).await?;
    server.stop().await?;
    if let Some(pg) = pg {
        pg.drop().await?;
    }
    // Let the last messages reach the subscriber before it is read.
    let settle = Instant::now() + Duration::from_secs(5);
    while (sink.received.load(Ordering::Relaxed) as f64) < delivered && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let received = sink.received.load(Ordering::Relaxed);
    let mut lat = sink
        .latencies
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    lat.sort_by(f64::total_cmp);

    // The bare publisher: warm, then timed, with latch's concurrency towards one client.
    let body = sample_body();
    bare(&dest, concurrency, args.baseline_requests / 4, &body).await?;
    let baseline = bare(&dest, concurrency, args.baseline_requests, &body).await?;
    progress.abort();
    let rate = delivered / total_secs;

    let mut r = Report::new("deliver");
    r.add("changes_sent", args.changes as f64, "changes");
    r.add("delivered", delivered, "notifications");
    r.add("received_by_subscriber", received as f64, "messages");
    r.add("failed", counts.0 as f64, "notifications");
    r.add("superseded", counts.1 as f64, "notifications");
    r.add("pending_left", counts.2 as f64, "notifications");
    r.add("attempts", attempts, "attempts");
    r.add("send_seconds", send_secs, "s");
    r.add(
        "changes_accepted_per_s",
        (args.changes as f64 / send_secs).round(),
        "changes/s",
    );
    r.add("delivered_per_s", rate.round(), "messages/s");
    r.add("latency_p50_ms", percentile(&lat, 50.0), "ms");
    r.add("latency_p99_ms", percentile(&lat, 99.0), "ms");
    r.add(
        "baseline_bare_publisher_per_s",
        baseline.round(),
        "messages/s",
    );
    r.add("ratio_to_bare_publisher", rate / baseline, "x");
    r.notes.push(format!(
        "Store: {}. To {}: {} sensors, one client, {} changes from {} senders; latency from \
         occurred_at to the subscriber; baseline: a bare {} in this process, {} in flight.",
        if args.database_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        },
        match &dest {
            Dest::Mqtt { .. } => "an MQTT topic (QoS 1)",
            Dest::Amqp { .. } => "an AMQP exchange (persistent, mandatory, confirmed)",
        },
        args.sensors,
        args.changes,
        args.senders.max(1),
        match &dest {
            Dest::Mqtt { .. } => "rumqttc publisher at QoS 1 counting PUBACKs",
            Dest::Amqp { .. } => "lapin publisher awaiting each confirm",
        },
        concurrency,
    ));
    Ok(r)
}

/// A notification's body, as big as latch's.
fn sample_body() -> Vec<u8> {
    serde_json::json!({"id": "01JD0Y3Q6T3S8W0KZ9X7M2V4QH", "type": "sensor.state_changed",
        "occurred_at": latch::domain::time::format(latch::domain::time::now_ms()),
        "sensor": {"id": "b0000000", "address": "bench street 1"}, "data": 1, "previous": 0})
    .to_string()
    .into_bytes()
}

/// Subscribes to the destination and counts into `sink` until dropped.
async fn subscribe(dest: &Dest, sink: Arc<Sink>) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    match dest {
        Dest::Mqtt { host, port, topic } => {
            let mut o = MqttOptions::new(format!("bench-sub-{}", ulid::Ulid::new()), host, *port);
            o.set_keep_alive(Duration::from_secs(30))
                .set_receive_maximum(Some(u16::MAX));
            let (client, mut events) = AsyncClient::new(o, 1000);
            client
                .subscribe(format!("{topic}/#"), QoS::AtLeastOnce)
                .await?;
            loop {
                match events.poll().await? {
                    Event::Incoming(Packet::SubAck(_)) => break,
                    _ => continue,
                }
            }
            Ok(tokio::spawn(async move {
                let _client = client;
                loop {
                    match events.poll().await {
                        Ok(Event::Incoming(Packet::Publish(p))) => sink.got(&p.payload),
                        Ok(_) => {}
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            }))
        }
        Dest::Amqp { url, exchange, key } => {
            let conn = Connection::connect(url, ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            let queue = format!("{key}.sink");
            let exclusive = QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..Default::default()
            };
            ch.queue_declare(queue.as_str().into(), exclusive, FieldTable::default())
                .await?;
            ch.queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
            let mut consumer = ch
                .basic_consume(
                    queue.as_str().into(),
                    "bench".into(),
                    BasicConsumeOptions {
                        no_ack: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await?;
            Ok(tokio::spawn(async move {
                let _conn = conn;
                // Consumed without acknowledgements (`no_ack`): counting is all it does.
                while let Some(Ok(d)) = consumer.next().await {
                    sink.got(&d.data);
                }
            }))
        }
    }
}

/// Messages/s a bare publisher gets acknowledged by the broker, `concurrency` in flight.
async fn bare(dest: &Dest, concurrency: usize, total: usize, body: &[u8]) -> anyhow::Result<f64> {
    match dest {
        Dest::Mqtt { host, port, topic } => {
            let mut o = MqttOptions::new(format!("bench-pub-{}", ulid::Ulid::new()), host, *port);
            o.set_keep_alive(Duration::from_secs(30))
                .set_outgoing_inflight_upper_limit(concurrency as u16);
            let (client, mut events) = AsyncClient::new(o, concurrency);
            let topic = format!("{topic}/b0000000");
            let body = body.to_vec();
            let started = Instant::now();
            let publisher = tokio::spawn(async move {
                for _ in 0..total {
                    if client
                        .publish(topic.clone(), QoS::AtLeastOnce, false, body.clone())
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                client
            });
            let mut acked = 0;
            while acked < total {
                if let Event::Incoming(Packet::PubAck(_)) = events.poll().await? {
                    acked += 1;
                }
            }
            let secs = started.elapsed().as_secs_f64();
            let _ = publisher.await?.disconnect().await;
            Ok(total as f64 / secs)
        }
        Dest::Amqp { url, exchange, key } => {
            let conn = Connection::connect(url, ConnectionProperties::default()).await?;
            let ch = conn.create_channel().await?;
            ch.confirm_select(ConfirmSelectOptions::default()).await?;
            let per = total.div_ceil(concurrency);
            let body = Arc::new(body.to_vec());
            let started = Instant::now();
            let results = super::workers(concurrency, |_| {
                let (ch, exchange, key, body) =
                    (ch.clone(), exchange.clone(), key.clone(), body.clone());
                async move {
                    for _ in 0..per {
                        let props = BasicProperties::default()
                            .with_delivery_mode(2)
                            .with_message_id("01JD0Y3Q6T3S8W0KZ9X7M2V4QH".into());
                        let options = BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        };
                        ch.basic_publish(
                            exchange.as_str().into(),
                            key.as_str().into(),
                            options,
                            &body,
                            props,
                        )
                        .await?
                        .await?;
                    }
                    anyhow::Ok(())
                }
            })
            .await;
            let secs = started.elapsed().as_secs_f64();
            for r in results {
                r?;
            }
            let _ = conn.close(200, "bench done".into()).await;
            Ok((per * concurrency) as f64 / secs)
        }
    }
}
