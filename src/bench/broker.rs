//! `latch bench ingest --via amqp|mqtt`: readings through a real broker into latch, beside
//! the broker's own rate with a bare consumer measured in the same run.
//!
//! - AMQP: N messages wait in a queue; latch starts and drains it, timed from when it is
//!   consuming (ready), as the bare consumer is timed from its `basic.consume`; the rate
//!   with latch's start included is reported beside it. Baseline: the same N messages
//!   drained from another queue by a bare lapin consumer (same prefetch, one
//!   `ack multiple` per batch, nothing else).
//! - MQTT: a publisher sends N QoS 1 messages as fast as the broker takes them while latch
//!   is subscribed (Mosquitto keeps only a small backlog per session, so there is no queue
//!   to drain). Baseline: the same publisher to a bare rumqttc subscriber that acknowledges
//!   each message at once, an MQTT 5 client asking for the same receive window as latch.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use rumqttc::{AsyncClient, MqttOptions, QoS};

use super::Report;
use crate::domain::SensorId;

/// Bodies of `n` readings over `ids`, `ratio` of them changing their sensor's state.
fn bodies(ids: &[SensorId], n: usize, ratio: f64) -> Vec<Vec<u8>> {
    let mut state = vec![false; ids.len()];
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|k| {
            let i = k % ids.len();
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if (rng % 10_000) as f64 / 10_000.0 < ratio {
                state[i] = !state[i];
            }
            format!(
                r#"{{"sensor_id":"{}","data":{}}}"#,
                ids[i],
                u8::from(state[i])
            )
            .into_bytes()
        })
        .collect()
}

/// Accepted readings of `source` so far, from latch's metrics.
async fn accepted(http: &reqwest::Client, base: &str, source: &str) -> anyhow::Result<f64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let needle = format!("source=\"{source}\"");
    Ok(text
        .lines()
        .filter(|l| l.starts_with("latch_readings_accepted_total") && l.contains(&needle))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum())
}

async fn wait_accepted(base: &str, source: &str, n: usize, limit: Duration) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + limit;
    while accepted(&http, base, source).await? < n as f64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "latch did not take all {n} readings"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn amqp_fill(url: &str, queue: &str, bodies: &[Vec<u8>]) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue.into(), durable, FieldTable::default())
        .await?;
    for chunk in bodies.chunks(5000) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for b in chunk {
            confirms.push(
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    b,
                    BasicProperties::default().with_delivery_mode(2),
                )
                .await?,
            );
        }
        for c in confirms {
            c.await?;
        }
    }
    conn.close(200, "filled".into()).await?;
    Ok(())
}

async fn amqp_delete(url: &str, queues: &[String]) -> anyhow::Result<()> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    for q in queues {
        let _ = ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    Ok(())
}

/// Messages/s a bare consumer drains from a queue holding `n`.
async fn amqp_bare_rate(url: &str, queue: &str, n: usize) -> anyhow::Result<f64> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(crate::ingest::amqp::PREFETCH, BasicQosOptions::default())
        .await?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "bare".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let started = Instant::now();
    let mut got = 0usize;
    while got < n {
        let d = consumer
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("consumer ended"))??;
        got += 1;
        let mut last = d.delivery_tag;
        while let Some(Some(Ok(more))) = futures::FutureExt::now_or_never(consumer.next()) {
            got += 1;
            last = more.delivery_tag;
            if got >= n {
                break;
            }
        }
        ch.basic_ack(last, BasicAckOptions { multiple: true })
            .await?;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    conn.close(200, "done".into()).await?;
    Ok(rate)
}

pub async fn amqp(
    url: &str,
    sensors: usize,
    messages: usize,
    ratio: f64,
) -> anyhow::Result<Report> {
    let (dir, _tmp) = super::data_dir(None)?;
    let ids = super::sensor_ids(sensors);
    super::import(&super::config(&dir), &ids, &[], None).await?;
    let bodies = bodies(&ids, messages, ratio);
    let tag = ulid::Ulid::new().to_string().to_lowercase();
    let (queue, bare) = (format!("bench.{tag}"), format!("bench.{tag}.bare"));

    amqp_fill(url, &bare, &bodies).await?;
    let bare_rate = amqp_bare_rate(url, &bare, messages).await?;

    amqp_fill(url, &queue, &bodies).await?;
    let mut config = super::config(&dir);
    config.amqp_url = Some(url.to_string());
    config.amqp_queue = queue.clone();
    let started = Instant::now();
    let server = super::start(config).await?;
    // Ready means consuming; what latch took before this is left out of its rate.
    let ready = Instant::now();
    let before_ready = accepted(&reqwest::Client::new(), &server.base, "amqp").await?;
    wait_accepted(&server.base, "amqp", messages, Duration::from_secs(600)).await?;
    let (secs, with_start) = (
        ready.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    server.stop().await?;
    amqp_delete(url, &[queue.clone(), format!("{queue}.dlq"), bare]).await?;

    // A queue so short that latch drained it before it was seen ready has only the rate
    // with its start.
    let rate = match messages as f64 - before_ready {
        left if left > 0.0 => left / secs,
        _ => messages as f64 / with_start,
    };
    let mut r = Report::new("ingest-amqp");
    r.add("messages", messages as f64, "messages");
    r.add("readings_per_s", rate.round(), "readings/s");
    r.add(
        "readings_per_s_with_start",
        (messages as f64 / with_start).round(),
        "readings/s",
    );
    r.add(
        "baseline_bare_consumer_per_s",
        bare_rate.round(),
        "messages/s",
    );
    r.add("ratio_to_bare_consumer", rate / bare_rate, "x");
    r.notes.push(format!(
        "{messages} persistent messages (one reading each, {:.0} % changes, {sensors} sensors) \
         waiting in a queue; latch started and drained it, acknowledging after durable commit, \
         timed from when it was consuming (ready; {before_ready} readings taken before that \
         are left out); readings_per_s_with_start times the whole run from latch's start. \
         Baseline: a bare lapin consumer draining the same messages with the same prefetch \
         ({}), acking each batch at once, timed from its consume.",
        ratio * 100.0,
        crate::ingest::amqp::PREFETCH
    ));
    Ok(r)
}

/// Most messages published ahead of what the consumer has taken (received by the bare
/// subscriber, committed by latch). Both ask for a receive window of
/// [`crate::ingest::mqtt::RECEIVE_MAXIMUM`], larger than this, so the broker sends on at once
/// and queues nothing (Mosquitto drops QoS 1 messages queued for a subscriber beyond
/// `max_queued_messages`, 1000 by default).
const MQTT_WINDOW: usize = 1000;

/// Publishes every message at QoS 1, staying at most [`MQTT_WINDOW`] ahead of `taken`.
async fn mqtt_publish(
    host: &str,
    port: u16,
    msgs: &[(String, Vec<u8>)],
    taken: Arc<AtomicUsize>,
) -> anyhow::Result<()> {
    let mut o = MqttOptions::new(format!("bench-pub-{}", ulid::Ulid::new()), host, port);
    o.set_keep_alive(Duration::from_secs(30)).set_inflight(1000);
    let (client, mut events) = AsyncClient::new(o, 10_000);
    // The event loop reconnects on the poll after an error; a driver that stopped at the
    // first one would leave every later publish unsent and the run waiting for nothing.
    let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let closed = closing.clone();
    let mut driver = tokio::spawn(async move {
        loop {
            if let Err(e) = events.poll().await {
                if closed.load(Ordering::Relaxed) {
                    break;
                }
                eprintln!("bench: MQTT publisher connection: {e}; reconnecting");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });
    for (k, (t, b)) in msgs.iter().enumerate() {
        while k >= taken.load(Ordering::Relaxed) + MQTT_WINDOW {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        client
            .publish(t.clone(), QoS::AtLeastOnce, false, b.clone())
            .await?;
    }
    while taken.load(Ordering::Relaxed) < msgs.len() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    closing.store(true, Ordering::Relaxed);
    let _ = client.disconnect().await;
    // Time for the disconnect to go out; then the driver would only reconnect.
    let _ = tokio::time::timeout(Duration::from_secs(1), &mut driver).await;
    driver.abort();
    Ok(())
}

/// Messages/s a bare subscriber (acking each at once) receives while `msgs` are published.
async fn mqtt_bare_rate(
    host: &str,
    port: u16,
    filter: &str,
    msgs: &[(String, Vec<u8>)],
) -> anyhow::Result<f64> {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let mut o = MqttOptions::new(format!("bench-bare-{}", ulid::Ulid::new()), host, port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_receive_maximum(Some(crate::ingest::mqtt::RECEIVE_MAXIMUM))
        .set_manual_acks(true);
    let (client, mut events) = AsyncClient::new(o, 10_000);
    client
        .subscribe(filter, rumqttc::v5::mqttbytes::QoS::AtLeastOnce)
        .await?;
    loop {
        if let Event::Incoming(Packet::SubAck(_)) = events.poll().await? {
            break;
        }
    }
    let n = msgs.len();
    let taken = Arc::new(AtomicUsize::new(0));
    let (h, p, m, t) = (host.to_string(), port, msgs.to_vec(), taken.clone());
    let started = Instant::now();
    let publisher = tokio::spawn(async move { mqtt_publish(&h, p, &m, t).await });
    let mut got = 0;
    while got < n {
        if let Event::Incoming(Packet::Publish(p)) = events.poll().await? {
            got += 1;
            taken.store(got, Ordering::Relaxed);
            client.ack(&p).await?;
        }
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    publisher.await??;
    Ok(rate)
}

pub async fn mqtt(
    url: &str,
    sensors: usize,
    messages: usize,
    ratio: f64,
) -> anyhow::Result<Report> {
    let opts = crate::ingest::mqtt::options(url)?;
    let (host, port) = opts.broker_address();
    let (dir, _tmp) = super::data_dir(None)?;
    let ids = super::sensor_ids(sensors);
    super::import(&super::config(&dir), &ids, &[], None).await?;
    let prefix = format!("bench{}", ulid::Ulid::new());
    let filter = format!("{prefix}/+/state");
    let bodies = bodies(&ids, messages, ratio);
    let msgs: Vec<(String, Vec<u8>)> = bodies
        .into_iter()
        .enumerate()
        .map(|(k, b)| (format!("{prefix}/{}/state", ids[k % ids.len()]), b))
        .collect();

    let bare_rate = mqtt_bare_rate(&host, port, &format!("{prefix}b/+/state"), &{
        msgs.iter()
            .map(|(t, b)| (t.replacen(&prefix, &format!("{prefix}b"), 1), b.clone()))
            .collect::<Vec<_>>()
    })
    .await?;

    let mut config = super::config(&dir);
    config.mqtt_url = Some(format!(
        "mqtt://{host}:{port}?client_id=bench-latch-{}",
        ulid::Ulid::new()
    ));
    config.mqtt_topic = filter;
    let server = super::start(config).await?;
    let taken = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (taken, base) = (taken.clone(), server.base.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            while taken.load(Ordering::Relaxed) < messages {
                if let Ok(n) = accepted(&http, &base, "mqtt").await {
                    taken.store(n as usize, Ordering::Relaxed);
                }
                // Each look renders all of latch's metrics in its process; the window is
                // wide enough that a few milliseconds of lag do not hold the publisher.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let started = Instant::now();
    // Generous: a loaded machine takes a few hundred readings a second at worst.
    let limit = Duration::from_secs(60 + messages as u64 / 50);
    let published = tokio::time::timeout(limit, mqtt_publish(&host, port, &msgs, taken.clone()));
    if published.await.is_err() {
        // What latch saw, so a stall can be told from a loss.
        let text = reqwest::get(format!("{}/metrics", server.base))
            .await?
            .text()
            .await?;
        let seen: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("latch_") && l.contains("mqtt"))
            .collect();
        anyhow::bail!(
            "latch took {} of {messages} readings within {limit:?}; its MQTT metrics:\n{}",
            taken.load(Ordering::Relaxed),
            seen.join("\n")
        );
    }
    watcher.await?;
    let secs = started.elapsed().as_secs_f64();
    server.stop().await?;

    let rate = messages as f64 / secs;
    let mut r = Report::new("ingest-mqtt");
    r.add("messages", messages as f64, "messages");
    r.add("readings_per_s", rate.round(), "readings/s");
    r.add(
        "baseline_bare_subscriber_per_s",
        bare_rate.round(),
        "messages/s",
    );
    r.add("ratio_to_bare_subscriber", rate / bare_rate, "x");
    r.notes.push(format!(
        "{messages} QoS 1 publishes (JSON readings, {:.0} % changes, {sensors} sensors) sent as \
         fast as the broker acknowledges while latch is subscribed; latch PUBACKs after \
         durable commit. Baseline: the same publishes to a bare rumqttc subscriber that \
         acknowledges each at once. Both are MQTT 5 clients asking for a receive window of \
         {} (Mosquitto honours it over max_inflight_messages); the publisher stays at most \
         {MQTT_WINDOW} messages ahead of what the consumer has taken (committed, for latch), \
         so the broker queues nothing (it drops QoS 1 messages queued beyond \
         max_queued_messages).",
        ratio * 100.0,
        crate::ingest::mqtt::RECEIVE_MAXIMUM
    ));
    Ok(r)
}
