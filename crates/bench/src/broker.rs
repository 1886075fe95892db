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
use latch::domain::SensorId;

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

/// Readings latch accepted from `source` since `base` (a reading of the count before).
/// An atomic load in this process, where latch runs: watching its progress costs latch
/// nothing, unlike a `/metrics` scrape, which renders every family in latch's process.
fn accepted_since(source: &str, base: u64) -> usize {
    (latch::ingest::accepted_total(source) - base) as usize
}

/// Waits until `taken()` reaches `n`, looking every millisecond; when it did.
async fn taken_at(n: usize, limit: Duration, taken: impl Fn() -> usize) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + limit;
    while taken() < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {n} readings taken within {limit:?}",
            taken()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(Instant::now())
}

/// A consumer's pace over a timed run.
struct Rate {
    /// Messages (readings) a second.
    per_s: f64,
    /// CPU time of this whole process per message, in µs: the publisher's part is the
    /// same in both runs, so the difference is what latch costs over a bare client. A
    /// figure that a busy machine disturbs far less than the rate.
    cpu_us: f64,
    /// Share of the run the publisher waited on the consumer (MQTT; 0 for AMQP).
    waited: f64,
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

/// How fast a bare consumer drains a queue holding `n`.
async fn amqp_bare_rate(url: &str, queue: &str, n: usize) -> anyhow::Result<Rate> {
    let conn = Connection::connect(url, ConnectionProperties::default()).await?;
    let ch = conn.create_channel().await?;
    ch.basic_qos(latch::ingest::amqp::PREFETCH, BasicQosOptions::default())
        .await?;
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "bare".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (started, cpu) = (Instant::now(), super::cpu_seconds());
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
    let rate = Rate {
        per_s: n as f64 / started.elapsed().as_secs_f64(),
        cpu_us: (super::cpu_seconds() - cpu) * 1e6 / n as f64,
        waited: 0.0,
    };
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
    let base = latch::ingest::accepted_total("amqp");
    let started = Instant::now();
    let server = super::start(config).await?;
    // Ready means consuming; what latch took before this is left out of its rate.
    let (ready, cpu) = (Instant::now(), super::cpu_seconds());
    let before_ready = accepted_since("amqp", base) as f64;
    let done = taken_at(messages, Duration::from_secs(600), || {
        accepted_since("amqp", base)
    })
    .await?;
    let (secs, with_start) = ((done - ready).as_secs_f64(), (done - started).as_secs_f64());
    let cpu = super::cpu_seconds() - cpu;
    let commits = super::Commits::read(&server.base).await?;
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
        bare_rate.per_s.round(),
        "messages/s",
    );
    r.add("ratio_to_bare_consumer", rate / bare_rate.per_s, "x");
    r.add(
        "cpu_us_per_reading",
        cpu * 1e6 / (messages as f64 - before_ready).max(1.0),
        "µs",
    );
    r.add("baseline_cpu_us_per_message", bare_rate.cpu_us, "µs");
    commits.report(&mut r, with_start);
    r.notes.push(format!(
        "{messages} persistent messages (one reading each, {:.0} % changes, {sensors} sensors) \
         waiting in a queue; latch started and drained it, acknowledging after durable commit, \
         timed from when it was consuming (ready; {before_ready} readings taken before that \
         are left out); readings_per_s_with_start times the whole run from latch's start. \
         Baseline: a bare lapin consumer draining the same messages with the same prefetch \
         ({}), acking each batch at once, timed from its consume. latch's count is read \
         in-process (an atomic load), not scraped. cpu_us_per_reading and \
         baseline_cpu_us_per_message: this process's CPU time over each timed run per message \
         (the broker's own CPU is not in it).",
        ratio * 100.0,
        latch::ingest::amqp::PREFETCH
    ));
    Ok(r)
}

/// Most messages published ahead of what the consumer has taken (received by the bare
/// subscriber, committed by latch). Both ask for a receive window of
/// [`latch::ingest::mqtt::RECEIVE_MAXIMUM`], larger than this, so the broker sends on at once
/// and queues nothing (Mosquitto drops QoS 1 messages queued for a subscriber beyond
/// `max_queued_messages`, 1000 by default).
const MQTT_WINDOW: usize = 1000;

/// What a publisher run saw.
struct Published {
    /// When the consumer had taken every message: the end of the timed run for latch and
    /// the bare subscriber alike.
    done: Instant,
    /// How long the publisher waited on the consumer, [`MQTT_WINDOW`] ahead: near 0, the
    /// consumer kept up and the publisher and broker set the pace.
    waited: Duration,
}

/// Publishes every message at QoS 1, staying at most [`MQTT_WINDOW`] ahead of what the
/// consumer has `taken`, until it has taken them all.
async fn mqtt_publish(
    host: &str,
    port: u16,
    msgs: &[(String, Vec<u8>)],
    taken: impl Fn() -> usize,
) -> anyhow::Result<Published> {
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
    let mut waited = Duration::ZERO;
    for (k, (t, b)) in msgs.iter().enumerate() {
        if k >= taken() + MQTT_WINDOW {
            let since = Instant::now();
            while k >= taken() + MQTT_WINDOW {
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            waited += since.elapsed();
        }
        client
            .publish(t.clone(), QoS::AtLeastOnce, false, b.clone())
            .await?;
    }
    // Generous: a loaded machine takes a few hundred readings a second at worst.
    let limit = Duration::from_secs(60 + msgs.len() as u64 / 50);
    let done = taken_at(msgs.len(), limit, &taken).await;
    closing.store(true, Ordering::Relaxed);
    let _ = client.disconnect().await;
    // Time for the disconnect to go out; then the driver would only reconnect.
    let _ = tokio::time::timeout(Duration::from_secs(1), &mut driver).await;
    driver.abort();
    Ok(Published {
        done: done?,
        waited,
    })
}

/// How fast a bare subscriber (acking each at once) receives while `msgs` are published.
async fn mqtt_bare_rate(
    host: &str,
    port: u16,
    filter: &str,
    msgs: &[(String, Vec<u8>)],
) -> anyhow::Result<Rate> {
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};
    let mut o = MqttOptions::new(format!("bench-bare-{}", ulid::Ulid::new()), host, port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_receive_maximum(Some(latch::ingest::mqtt::RECEIVE_MAXIMUM))
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
    let (started, cpu) = (Instant::now(), super::cpu_seconds());
    let publisher =
        tokio::spawn(async move { mqtt_publish(&h, p, &m, || t.load(Ordering::Relaxed)).await });
    let mut got = 0;
    while got < n {
        if let Event::Incoming(Packet::Publish(p)) = events.poll().await? {
            got += 1;
            taken.store(got, Ordering::Relaxed);
            client.ack(&p).await?;
        }
    }
    let published = publisher.await??;
    let secs = (published.done - started).as_secs_f64();
    Ok(Rate {
        per_s: n as f64 / secs,
        cpu_us: (super::cpu_seconds() - cpu) * 1e6 / n as f64,
        waited: published.waited.as_secs_f64() / secs,
    })
}

pub async fn mqtt(
    url: &str,
    sensors: usize,
    messages: usize,
    ratio: f64,
) -> anyhow::Result<Report> {
    let opts = latch::ingest::mqtt::options(url)?;
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
    let base = latch::ingest::accepted_total("mqtt");
    let (started, cpu) = (Instant::now(), super::cpu_seconds());
    let published = mqtt_publish(&host, port, &msgs, || accepted_since("mqtt", base)).await;
    let published = match published {
        Ok(p) => p,
        Err(e) => {
            // What latch saw, so a stall can be told from a loss.
            let text = reqwest::get(format!("{}/metrics", server.base))
                .await?
                .text()
                .await?;
            let seen: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("latch_") && l.contains("mqtt"))
                .collect();
            anyhow::bail!("{e}; latch's MQTT metrics:\n{}", seen.join("\n"));
        }
    };
    let secs = (published.done - started).as_secs_f64();
    let cpu = super::cpu_seconds() - cpu;
    let commits = super::Commits::read(&server.base).await?;
    server.stop().await?;

    let rate = messages as f64 / secs;
    let mut r = Report::new("ingest-mqtt");
    r.add("messages", messages as f64, "messages");
    r.add("readings_per_s", rate.round(), "readings/s");
    r.add(
        "baseline_bare_subscriber_per_s",
        bare_rate.per_s.round(),
        "messages/s",
    );
    r.add("ratio_to_bare_subscriber", rate / bare_rate.per_s, "x");
    r.add("cpu_us_per_reading", cpu * 1e6 / messages as f64, "µs");
    r.add("baseline_cpu_us_per_message", bare_rate.cpu_us, "µs");
    r.add(
        "publisher_waited_share",
        published.waited.as_secs_f64() / secs,
        "x",
    );
    r.add("baseline_publisher_waited_share", bare_rate.waited, "x");
    commits.report(&mut r, secs);
    r.notes.push(format!(
        "{messages} QoS 1 publishes (JSON readings, {:.0} % changes, {sensors} sensors) sent as \
         fast as the broker acknowledges while latch is subscribed; latch PUBACKs after \
         durable commit. Baseline: the same publishes to a bare rumqttc subscriber that \
         acknowledges each at once. Both are MQTT 5 clients asking for a receive window of \
         {} (Mosquitto honours it over max_inflight_messages); the publisher stays at most \
         {MQTT_WINDOW} messages ahead of what the consumer has taken (committed, for latch), \
         so the broker queues nothing (it drops QoS 1 messages queued beyond \
         max_queued_messages). Both runs end when the publisher sees the last message taken; \
         latch's count is read in-process (an atomic load), not scraped. cpu_us_per_reading and \
         baseline_cpu_us_per_message: this process's CPU time over each timed run per message \
         (the broker's own CPU is not in it). publisher_waited_share: the share of the run \
         the publisher waited, {MQTT_WINDOW} ahead of the consumer (near 0: the consumer kept \
         up, and the publisher and the broker set the pace).",
        ratio * 100.0,
        latch::ingest::mqtt::RECEIVE_MAXIMUM
    ));
    Ok(r)
}
