//! MQTT ingest: subscribes `mqtt_topic` at QoS 1 on a persistent session (fixed client id,
//! clean session off), so readings published while latch is down arrive when it returns.
//! Each PUBACK is sent only after the reading's effects are durable (manual acks).
//!
//! A publish on `sensors/{id}/state` may carry just `0` or `1`: the sensor id is the topic
//! level where the subscription has its first `+`. Any other payload is the JSON reading.
//! Bad payloads are acknowledged (a broker would resend them forever otherwise), counted in
//! `latch_readings_rejected_total{source="mqtt"}` and logged at most once a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt, stream::FuturesOrdered};
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, Publish, QoS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Ingest, Sources, next_backoff};
use crate::domain::{Millis, Reading, RejectCode, Rejection, SensorId, reading, time::now_ms};

const SOURCE: &str = "mqtt";
/// Most publishes handed to the engine as one batch.
pub const BATCH_MAX: usize = 2000;
/// Batches waiting for their commit at once.
pub const PIPELINE: usize = 4;
/// Client id when the URL names none; fixed, so the broker keeps our session.
pub const DEFAULT_CLIENT_ID: &str = "latch";

/// Where to subscribe.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `mqtt://host:port[?client_id=…]`.
    pub url: String,
    pub topic: String,
}

/// Broker options from the URL, with our session semantics forced on.
pub fn options(url: &str) -> anyhow::Result<MqttOptions> {
    let url = if url.contains("client_id=") {
        url.to_string()
    } else if url.contains('?') {
        format!("{url}&client_id={DEFAULT_CLIENT_ID}")
    } else {
        format!("{url}?client_id={DEFAULT_CLIENT_ID}")
    };
    let mut o = MqttOptions::parse_url(&url)
        .map_err(|e| anyhow::anyhow!("invalid setting `mqtt_url`: {e}"))?;
    o.set_clean_session(false)
        .set_manual_acks(true)
        .set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(64 * 1024, 64 * 1024);
    Ok(o)
}

/// Subscribes until `stop`; the event loop reconnects with backoff on its own.
pub async fn run(
    ingest: Ingest,
    settings: Settings,
    sources: Sources,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    sources.set(SOURCE, false);
    let (client, mut events) = AsyncClient::new(options(&settings.url)?, 1024);
    // Bumped at every connection: acks for publishes of an earlier connection are skipped
    // (the broker resends those), since packet ids are only meaningful per connection.
    let generation = Arc::new(AtomicU64::new(0));
    // Unbounded on purpose: the event loop must never wait on the applier, or the applier's
    // acks (which only the event loop sends) could never drain. What the broker sends us
    // unacknowledged is bounded by its in-flight window anyway.
    let (tx, rx) = mpsc::unbounded_channel::<(u64, Publish)>();
    let applier = tokio::spawn(apply(
        ingest,
        settings.topic.clone(),
        client.clone(),
        generation.clone(),
        rx,
    ));
    let mut backoff = Duration::ZERO;
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => break,
            e = events.poll() => e,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                generation.fetch_add(1, Ordering::SeqCst);
                // Resubscribing is harmless on a resumed session and needed on a new one.
                // Never awaited here: only this loop drains the client's requests.
                if let Err(e) = client.try_subscribe(settings.topic.clone(), QoS::AtLeastOnce) {
                    // Not ready without the subscription; the next connection tries again.
                    tracing::error!(error = %e, "MQTT subscribe could not be sent.");
                }
            }
            // Ready only once subscribed: what is published before that is not ours.
            Ok(Event::Incoming(Packet::SubAck(_))) => {
                sources.set(SOURCE, true);
                backoff = Duration::ZERO;
                tracing::info!(topic = %settings.topic, "MQTT ingest subscribed.");
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let g = generation.load(Ordering::SeqCst);
                if tx.send((g, p)).is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                sources.set(SOURCE, false);
                backoff = next_backoff(backoff);
                tracing::warn!(error = %e, retry_in = ?backoff, "MQTT ingest paused.");
                metrics::counter!("latch_source_reconnects_total", "source" => SOURCE).increment(1);
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
            }
        }
    }
    // Let the applier finish and acknowledge what it has, then leave the session as is.
    drop(tx);
    let _ = applier.await;
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = client.disconnect().await;
        while let Ok(e) = events.poll().await {
            if matches!(e, Event::Outgoing(rumqttc::Outgoing::Disconnect)) {
                break;
            }
        }
    })
    .await;
    sources.set(SOURCE, false);
    tracing::info!("MQTT ingest stopped.");
    Ok(())
}

/// Batches publishes into the engine in arrival order and acknowledges each batch, in order,
/// once durable.
async fn apply(
    ingest: Ingest,
    filter: String,
    client: AsyncClient,
    generation: Arc<AtomicU64>,
    mut rx: mpsc::UnboundedReceiver<(u64, Publish)>,
) {
    let mut waiting = FuturesOrdered::new();
    let mut last_log = Instant::now() - Duration::from_secs(2);
    let mut open = true;
    while open || !waiting.is_empty() {
        tokio::select! {
            biased;
            done = waiting.next(), if !waiting.is_empty() => {
                let (publishes, result): (Vec<(u64, Publish)>, Result<super::Report, super::Error>) =
                    done.expect("non-empty");
                match result {
                    Ok(report) => {
                        if let Some((_, rej)) = report.rejected.first()
                            && last_log.elapsed() >= Duration::from_secs(1)
                        {
                            last_log = Instant::now();
                            tracing::warn!(count = report.rejected.len(), first = %rej,
                                "MQTT readings rejected.");
                        }
                        let current = generation.load(Ordering::SeqCst);
                        for (g, p) in publishes.iter().filter(|(g, _)| *g == current) {
                            let _ = g;
                            let _ = client.ack(p).await;
                        }
                    }
                    // Not acknowledged: the broker resends them on the next connection.
                    Err(e) => tracing::error!(error = %e, "MQTT readings not applied."),
                }
            }
            first = rx.recv(), if open && waiting.len() < PIPELINE => {
                let Some(first) = first else { open = false; continue; };
                let mut publishes = vec![first];
                while publishes.len() < BATCH_MAX {
                    match rx.recv().now_or_never() {
                        Some(Some(p)) => publishes.push(p),
                        _ => break,
                    }
                }
                let now = now_ms();
                let items = publishes
                    .iter()
                    .map(|(_, p)| parse_publish(&filter, &p.topic, &p.payload, now))
                    .collect();
                match ingest.enqueue(SOURCE, items).await {
                    Ok(ticket) => waiting.push_back(async move { (publishes, ticket.wait().await) }),
                    Err(e) => tracing::error!(error = %e, "MQTT readings not applied."),
                }
            }
        }
    }
}

/// The sensor id a topic carries at the filter's first `+` level, if any.
fn topic_sensor(filter: &str, topic: &str) -> Option<SensorId> {
    let pos = filter.split('/').position(|l| l == "+")?;
    SensorId::parse(topic.split('/').nth(pos)?).ok()
}

/// A publish as a reading: `0`/`1` with the id from the topic, or the JSON reading (whose
/// `sensor_id` may also come from the topic when the body has none).
pub fn parse_publish(
    filter: &str,
    topic: &str,
    payload: &[u8],
    now: Millis,
) -> Result<Reading, Rejection> {
    let text = std::str::from_utf8(payload).map(str::trim);
    if let Ok(bit @ ("0" | "1")) = text {
        let sensor_id = topic_sensor(filter, topic).ok_or_else(|| {
            Rejection::new(
                RejectCode::InvalidSensorId,
                format!("topic {topic:?} names no valid sensor id for a bare 0/1 payload"),
            )
        })?;
        return Ok(Reading {
            sensor_id,
            data: bit == "1",
            ts: None,
        });
    }
    let mut v: serde_json::Value = serde_json::from_slice(payload)
        .map_err(|e| Rejection::new(RejectCode::MalformedJson, format!("malformed JSON: {e}")))?;
    if v.is_number() {
        return Err(Rejection::new(
            RejectCode::InvalidData,
            format!("payload must be 0 or 1, got {v}"),
        ));
    }
    if let Some(obj) = v.as_object_mut()
        && !obj.contains_key("sensor_id")
        && let Some(id) = topic_sensor(filter, topic)
    {
        obj.insert("sensor_id".into(), id.to_string().into());
    }
    reading::parse_value(&v, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_800_000_000_000;
    const F: &str = "sensors/+/state";

    #[test]
    fn bare_bits_take_the_id_from_the_topic() {
        let r = parse_publish(F, "sensors/door7/state", b"1", NOW).unwrap();
        assert_eq!(r.sensor_id.to_string(), "door7");
        assert!(r.data);
        let r = parse_publish(F, "sensors/door7/state", b" 0\n", NOW).unwrap();
        assert!(!r.data);
    }

    #[test]
    fn json_readings_work_on_any_topic() {
        let r =
            parse_publish("fleet/#", "fleet/x", br#"{"sensor_id":"a1","data":0}"#, NOW).unwrap();
        assert_eq!(r.sensor_id.to_string(), "a1");
        let r = parse_publish(F, "sensors/b2/state", br#"{"data":1}"#, NOW).unwrap();
        assert_eq!(r.sensor_id.to_string(), "b2");
    }

    #[test]
    fn bad_payloads_are_rejected_with_reasons() {
        let code = |f: &str, t: &str, p: &[u8]| parse_publish(f, t, p, NOW).unwrap_err().code;
        assert_eq!(
            code(F, "sensors/door7/state", b"2"),
            RejectCode::InvalidData
        );
        assert_eq!(
            code(F, "sensors/door7/state", b"open"),
            RejectCode::MalformedJson
        );
        assert_eq!(
            code(F, "sensors/no-pe!/state", b"1"),
            RejectCode::InvalidSensorId
        );
        assert_eq!(
            code("fleet/#", "fleet/x", b"1"),
            RejectCode::InvalidSensorId
        );
    }

    #[test]
    fn client_id_defaults_and_session_persists() {
        let o = options("mqtt://127.0.0.1:1883").unwrap();
        assert_eq!(o.client_id(), DEFAULT_CLIENT_ID);
        assert!(!o.clean_session());
        let o = options("mqtt://127.0.0.1:1883?client_id=node2").unwrap();
        assert_eq!(o.client_id(), "node2");
        assert!(options("http://127.0.0.1").is_err());
    }
}
