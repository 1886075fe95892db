//! MQTT ingest: subscribes `mqtt_topic` at QoS 1 on a persistent session (fixed client id,
//! clean start off, a session that never expires), so readings published while latch is
//! down arrive when it returns. Each PUBACK is sent only after the reading's effects are
//! durable (manual acks).
//!
//! latch connects as an MQTT 5 client to ask for a receive window ([`RECEIVE_MAXIMUM`]) of
//! its own: the broker sends no more unacknowledged publishes than that, and since a PUBACK
//! waits for the commit, the window over the commit latency is the most latch can take. A
//! 3.1.1 client gets the broker's default instead (Mosquitto's `max_inflight_messages`,
//! 20), which held ingest to a few hundred readings per commit-second.
//!
//! A publish on `sensors/{id}/state` may carry just `0` or `1`: the sensor id is the topic
//! level where the subscription has its first `+`. Any other payload is the JSON reading.
//! Bad payloads are acknowledged (a broker would resend them forever otherwise), counted in
//! `latch_readings_rejected_total{source="mqtt"}` and logged at most once a second.
//!
//! A failed commit must not leave the publishes unacknowledged on a live connection: the
//! broker only resends on a new one, and meanwhile its in-flight window fills and it stops
//! delivering. So the first uncommitted publish ends the connection: what came before it
//! is acknowledged, nothing after it is, no further publish of that connection is applied,
//! and latch reconnects after a growing delay; the broker then resends the rest in order.
//! What committed behind the failure (another shard's readings, a batch already in the
//! engine) is recognised when resent and acknowledged without being applied again
//! ([`applier`], [`resent`]). Until a commit goes through again the source counts as down,
//! so `/readyz` shows the stall.
//!
//! The broker's session outlives latch's process, so that memory must too. A stop first
//! acknowledges what it can: it reconnects at once if it must, takes the broker's resends
//! of committed publishes and acknowledges them, applying nothing ([`applier`]); what is
//! still unacknowledged after that (the broker away, say) goes into the store
//! ([`crate::store::Sessions`]), and the next start, here or on the node the session
//! moves to, takes it back before it connects. Acknowledgements wait in the client's
//! request channel until the event loop writes them, so the loop runs until the broker
//! has them all (the `DISCONNECT` queued behind them went out) or a bound runs out.
//!
//! Publishes with the retain flag are the broker's stored last value, sent again at every
//! subscribe (so after every reconnect): not a reading the sensor just sent. They are
//! acknowledged and ignored, counted in `latch_mqtt_retained_ignored_total`.

mod applier;
mod resent;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish};
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Ingest, Sources, paused};
use crate::domain::{Millis, Reading, RejectCode, Rejection, SensorId, reading};
use crate::store::Sessions;
use crate::telemetry::events::{self, Emit};
use resent::Resent;

pub(crate) const SOURCE: &str = "mqtt";
/// Most publishes handed to the engine as one batch.
pub const BATCH_MAX: usize = 2000;
/// Batches waiting for their commit at once.
pub const PIPELINE: usize = 4;
/// Client id when the URL names none; fixed, so the broker keeps our session.
pub const DEFAULT_CLIENT_ID: &str = "latch";
/// Unacknowledged publishes the broker may send us at once (MQTT 5 receive maximum):
/// what the pipeline can hold, so that batches are not cut short by the window.
pub const RECEIVE_MAXIMUM: u16 = (BATCH_MAX * PIPELINE) as u16;
/// Longest a stop waits for the broker to take the acknowledgements queued for it.
const FLUSH_AT_STOP: Duration = Duration::from_secs(5);

/// Where to subscribe.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `mqtt://host:port[?client_id=…]`.
    pub url: String,
    pub topic: String,
}

/// Broker options from the URL, with our session semantics forced on.
pub fn options(url: &str) -> anyhow::Result<MqttOptions> {
    // No TLS in this build: refused at start rather than silently reached in plain text.
    if url.starts_with("mqtts://") || url.starts_with("ssl://") {
        anyhow::bail!(
            "invalid setting `mqtt_url`: mqtts:// and ssl:// (TLS) are not supported by this \
             build; use mqtt:// on a trusted network or behind a TLS-terminating tunnel"
        );
    }
    let url = if url.contains("client_id=") {
        url.to_string()
    } else if url.contains('?') {
        format!("{url}&client_id={DEFAULT_CLIENT_ID}")
    } else {
        format!("{url}?client_id={DEFAULT_CLIENT_ID}")
    };
    let mut o = MqttOptions::parse_url(&url)
        .map_err(|e| anyhow::anyhow!("invalid setting `mqtt_url`: {e}"))?;
    // A window given in the URL (`inflight_num`) is the user's to choose.
    let window = o.receive_maximum().unwrap_or(RECEIVE_MAXIMUM);
    o.set_clean_start(false)
        // Never expires, as a 3.1.1 session without clean-session does not.
        .set_session_expiry_interval(Some(u32::MAX))
        .set_receive_maximum(Some(window))
        .set_manual_acks(true)
        .set_keep_alive(Duration::from_secs(30))
        .set_max_packet_size(Some(64 * 1024));
    Ok(o)
}

/// What the event loop hands the applier, in arrival order.
enum Inbound {
    /// A publish that came on connection number `.0` (boxed: an MQTT 5 publish is large
    /// beside the other variant).
    Publish(u64, Box<Publish>),
    /// The broker acknowledged our subscription on connection number `.0`.
    Subscribed(u64),
    /// Connection number `.0` is up; `.1`: the broker resumed our session (else it resends
    /// nothing).
    Connected(u64, bool),
    /// The event loop wrote the acknowledgement of packet `.1` on connection number `.0`.
    Written(u64, u16),
}

/// The connection state the event loop and the applier share, and the readiness that
/// follows from it: up when subscribed on the current connection with no commit failure
/// left unresolved.
struct Link {
    sources: Sources,
    state: Mutex<LinkState>,
}

#[derive(Default)]
struct LinkState {
    /// Bumped at every connection and every loss of one. A PUBACK is only sent for a
    /// publish of the current connection: packet ids mean nothing on another one, and the
    /// broker resends what a lost connection left unacknowledged.
    generation: u64,
    subscribed: bool,
    /// A commit failed and none has gone through since.
    stalled: bool,
}

impl Link {
    /// Changes the state and publishes the readiness that results, under one lock, so an
    /// update from one task cannot overwrite a newer one from the other.
    fn update(&self, f: impl FnOnce(&mut LinkState)) -> u64 {
        let mut st = self.state.lock().expect("mqtt link lock");
        f(&mut st);
        self.sources.set(SOURCE, st.subscribed && !st.stalled);
        st.generation
    }

    /// A new connection, or the loss of one: nothing of the old one is acknowledged.
    fn next_connection(&self) -> u64 {
        self.update(|st| {
            st.generation += 1;
            st.subscribed = false;
        })
    }

    fn generation(&self) -> u64 {
        self.state.lock().expect("mqtt link lock").generation
    }
}

/// The name the store keeps a session's unacknowledged publishes under: the broker and
/// the client id, which together name the session.
fn session_key(o: &MqttOptions) -> String {
    let (host, port) = o.broker_address();
    format!("{host}:{port}/{}", o.client_id())
}

/// What the last session of `key` left unacknowledged, taken from the store: asked again
/// (with backoff) until the store answers, since a session that went on without it would
/// apply its resends again. `None` when `stop` came first.
async fn take_unacked(store: &dyn Sessions, key: &str, stop: &CancellationToken) -> Option<Resent> {
    let mut backoff = Duration::ZERO;
    loop {
        match store.take_unacked(key.to_string()).await {
            Ok(kept) => {
                if !kept.is_empty() {
                    tracing::info!(
                        publishes = kept.len(),
                        "MQTT ingest: publishes the last session committed without acknowledging; their resends will be acknowledged, not applied."
                    );
                }
                return Some(Resent::restore(kept));
            }
            Err(e) => {
                let what = "the unacknowledged publishes of the last session";
                if !paused(SOURCE, what, &e.to_string(), &mut backoff, stop).await {
                    return None;
                }
            }
        }
    }
}

/// Subscribes until `stop`; the event loop reconnects with backoff on its own, and when
/// the applier asks for it after a failed commit. The source counts as down until the
/// first subscription (the caller marks it so before spawning this). `store` keeps what a
/// stop leaves unacknowledged.
pub async fn run(
    ingest: Ingest,
    settings: Settings,
    sources: Sources,
    store: Arc<dyn Sessions>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let link = Arc::new(Link {
        sources,
        state: Mutex::default(),
    });
    let options = options(&settings.url)?;
    let key = session_key(&options);
    let Some(resent) = take_unacked(store.as_ref(), &key, &stop).await else {
        return Ok(());
    };
    let (client, mut events) = AsyncClient::new(options, 1024);
    // Unbounded on purpose: the event loop must never wait on the applier, or the applier's
    // acks (which only the event loop sends) could never drain. What the broker sends us
    // unacknowledged is bounded by its in-flight window anyway.
    let (tx, rx) = mpsc::unbounded_channel::<Inbound>();
    // The applier's requests to drop connection number `.0`, with the delay before the next.
    let (reconnect_tx, mut reconnect_rx) = mpsc::unbounded_channel::<(u64, Duration)>();
    let shared = applier::Shared {
        client: client.clone(),
        link: link.clone(),
        reconnect: reconnect_tx,
    };
    let applier = tokio::spawn(applier::run(
        ingest,
        settings.topic.clone(),
        shared,
        rx,
        resent,
        stop.clone(),
    ));
    let mut backoff = Duration::ZERO;
    loop {
        let event = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            Some((g, delay)) = reconnect_rx.recv() => {
                if g != link.generation() {
                    continue; // That connection is gone already.
                }
                // Dropping the network makes the next poll connect again; the session
                // stays on the broker, which resends every unacknowledged publish.
                end_connection(&client, &mut events, &link, &tx).await;
                events::MqttReconnecting { retry_in: delay }.emit();
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(delay) => {}
                }
                continue;
            }
            e = events.poll() => e,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                let g = link.next_connection();
                if tx.send(Inbound::Connected(g, ack.session_present)).is_err() {
                    break;
                }
                // Resubscribing is harmless on a resumed session and needed on a new one.
                // Never awaited here: only this loop drains the client's requests.
                if let Err(e) = client.try_subscribe(settings.topic.clone(), QoS::AtLeastOnce) {
                    // Not ready without the subscription; the next connection tries again.
                    tracing::error!(error = %e, "MQTT subscribe could not be sent.");
                }
            }
            // Ready only once subscribed: what is published before that is not ours. The
            // applier decides, after the publishes the broker resent ahead of this.
            Ok(Event::Incoming(Packet::SubAck(_))) => {
                backoff = Duration::ZERO;
                tracing::info!(topic = %settings.topic, "MQTT ingest subscribed.");
                if tx.send(Inbound::Subscribed(link.generation())).is_err() {
                    break;
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if tx
                    .send(Inbound::Publish(link.generation(), Box::new(p)))
                    .is_err()
                {
                    break;
                }
            }
            Ok(Event::Outgoing(rumqttc::Outgoing::PubAck(pkid))) => {
                if tx.send(Inbound::Written(link.generation(), pkid)).is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                link.next_connection();
                let what = format!("topic {}", settings.topic);
                if !paused(SOURCE, &what, &e.to_string(), &mut backoff, &stop).await {
                    break;
                }
            }
        }
    }
    let resent = settle(applier, &client, &mut reconnect_rx, &mut events, &link, &tx).await;
    drop(tx);
    // What is kept across the stop does not hold the acks queued (`Resent::is_empty`).
    if !flush(&client, &mut events, |_| {}).await {
        tracing::warn!(
            "MQTT ingest: the broker may not have taken every acknowledgement at the stop; it resends those publishes to the next session."
        );
    }
    link.update(|st| st.subscribed = false);
    keep(store.as_ref(), key, resent).await;
    tracing::info!("MQTT ingest stopped.");
    Ok(())
}

/// At a stop: the applier finishes what it holds and acknowledges the broker's resends of
/// what committed (see `applier`); answers what it leaves unacknowledged. The event loop is
/// polled meanwhile, since only it sends the acks the applier queues, and it keeps feeding
/// the applier: a connection lost is made again at once, for them.
async fn settle(
    applier: tokio::task::JoinHandle<Resent>,
    client: &AsyncClient,
    reconnect_rx: &mut mpsc::UnboundedReceiver<(u64, Duration)>,
    events: &mut rumqttc::v5::EventLoop,
    link: &Link,
    tx: &mpsc::UnboundedSender<Inbound>,
) -> Resent {
    let drain = async {
        loop {
            tokio::select! {
                biased;
                Some((g, _)) = reconnect_rx.recv() => {
                    if g == link.generation() {
                        end_connection(client, events, link, tx).await;
                    }
                }
                e = events.poll() => match e {
                    Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                        let g = link.next_connection();
                        let _ = tx.send(Inbound::Connected(g, ack.session_present));
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        let _ = tx.send(Inbound::Publish(link.generation(), Box::new(p)));
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::PubAck(pkid))) => {
                        let _ = tx.send(Inbound::Written(link.generation(), pkid));
                    }
                    Ok(_) => {}
                    Err(_) => {
                        link.next_connection();
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
    };
    tokio::select! {
        biased;
        r = applier => r.unwrap_or_default(),
        _ = drain => unreachable!("the drain never ends"),
    }
}

/// Keeps in the store the publishes that committed and were never acknowledged, for the
/// session's next connection (another process's, perhaps): the broker resends them there.
async fn keep(store: &dyn Sessions, key: String, resent: Resent) {
    if resent.is_empty() {
        return;
    }
    let kept = resent.kept();
    match store.keep_unacked(key, kept.clone()).await {
        Ok(()) => tracing::info!(
            publishes = kept.len(),
            "MQTT ingest: kept the publishes committed but not acknowledged, for the next session."
        ),
        Err(e) => tracing::error!(publishes = kept.len(), error = %e,
            "MQTT ingest: could not keep the publishes committed but not acknowledged; the next session applies their resends again."),
    }
}

/// Sends the acknowledgements queued in the client's request channel, then a
/// `DISCONNECT` behind them (the session stays on the broker), polling the event loop all
/// along: only it writes them, and the channel (bounded) may be full of acks, so queueing
/// the disconnect must not wait without it. `false` if the broker may not have them all
/// (the connection broke, or the bound ran out). Each acknowledgement written is told to
/// `written`.
async fn flush(
    client: &AsyncClient,
    events: &mut rumqttc::v5::EventLoop,
    mut written: impl FnMut(u16),
) -> bool {
    let flushed = tokio::time::timeout(FLUSH_AT_STOP, async {
        let disconnect = client.disconnect();
        tokio::pin!(disconnect);
        let mut queued = false;
        loop {
            tokio::select! {
                biased;
                sent = &mut disconnect, if !queued => {
                    queued = true;
                    if sent.is_err() {
                        return false;
                    }
                }
                e = events.poll() => match e {
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => return true,
                    Ok(Event::Outgoing(rumqttc::Outgoing::PubAck(pkid))) => written(pkid),
                    Ok(_) => {}
                    Err(_) => return false,
                },
            }
        }
    })
    .await;
    flushed == Ok(true)
}

/// Ends the current connection so that the next poll makes a new one, on which the broker
/// resends what is unacknowledged. The acknowledgements the applier queued go out first
/// ([`flush`]): the event loop's `clean` drops those still in the client's channel
/// (rumqttc leaves them to the broker's resend). Those it drops stay recognised (the
/// applier forgets a publish only once its ack is written), so their resends are
/// acknowledged, not applied again; written, they spare the broker the resends.
/// Publishes that arrive meanwhile are dropped: they came on the connection that ends,
/// and the broker resends them on the next.
async fn end_connection(
    client: &AsyncClient,
    events: &mut rumqttc::v5::EventLoop,
    link: &Link,
    tx: &mpsc::UnboundedSender<Inbound>,
) {
    let g = link.generation();
    if !flush(client, events, |pkid| {
        let _ = tx.send(Inbound::Written(g, pkid));
    })
    .await
    {
        tracing::warn!(
            "MQTT ingest: the broker may not have taken every acknowledgement before the reconnect; it resends those publishes, which are acknowledged without being applied again."
        );
    }
    events.clean();
    link.next_connection();
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
            signals: Default::default(),
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
        assert!(!o.clean_start());
        assert_eq!(o.session_expiry_interval(), Some(u32::MAX));
        assert_eq!(o.receive_maximum(), Some(RECEIVE_MAXIMUM));
        assert!(o.manual_acks());
        let o = options("mqtt://127.0.0.1:1883?inflight_num=100").unwrap();
        assert_eq!(o.receive_maximum(), Some(100));
        let o = options("mqtt://127.0.0.1:1883?client_id=node2").unwrap();
        assert_eq!(o.client_id(), "node2");
        assert!(options("http://127.0.0.1").is_err());
    }

    #[test]
    fn tls_urls_are_refused_not_reached_in_plain_text() {
        for url in ["mqtts://127.0.0.1:8883", "ssl://127.0.0.1:8883"] {
            let e = options(url).unwrap_err().to_string();
            assert!(e.contains("mqtt_url") && e.contains("TLS"), "{e}");
        }
    }
}
