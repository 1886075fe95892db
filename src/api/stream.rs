//! `GET /v1/stream`: server-sent events of state changes and lost/restored events as this
//! node commits them, and of sites going down and coming back as its round decides them,
//! for the console and for integrators who would rather hold one connection open than
//! receive webhooks.
//!
//! The committer sends each committed event to a `broadcast` channel, copying them only
//! while somebody listens. A listener too slow for the channel's buffer is told how many it
//! missed (`lagged`) and should read the state again; the stream is a view, not a log:
//! history and webhooks stay the record.
//!
//! A stream lasts only while its caller may read it: it ends as soon as its token is
//! deleted (through this node, or through another one: seen at the next reload of the
//! token table, within a second) or no longer allows it ([`revoked`]).
//!
//! In a cluster each node commits only its own partitions' events, so a node serving a
//! stream also relays its peers': for each listener it reads every other live node's own
//! events (`/internal/v1/stream`, with the cluster secret) and merges them into the
//! listener's stream, following nodes as they join and leave. Chosen over PostgreSQL's
//! `LISTEN`/`NOTIFY`, which would put a `pg_notify` per event into every commit, whether
//! anyone watches or not, through a server whose payloads and queue are bounded: a relay
//! costs nothing while nobody watches, and a connection per peer while somebody does.

use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, Method};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::readings::EventOut;
use crate::cluster::Membership;
use crate::domain::{EventKind, Live, time};

/// Path of a node's own events, for the node relaying them.
pub const INTERNAL_PATH: &str = "/internal/v1/stream";

/// How often the relay looks for nodes that joined or left.
const PEERS_EVERY: Duration = Duration::from_secs(2);

/// Wait before reading a peer's events again after its stream broke.
const PEER_RETRY: Duration = Duration::from_secs(1);

/// Peer events queued for one listener before the relay waits for it (then the peer's own
/// buffer fills, and the peer tells of what was missed with `lagged`).
const RELAY_BUFFER: usize = 256;

type Events = Pin<Box<dyn Stream<Item = Result<SseEvent, Infallible>> + Send>>;

/// Events buffered per listener before it lags.
const BUFFER: usize = 4096;

/// Idle streams get a comment this often, so proxies keep them open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(stream))
}

/// The channel the committer (sensors' events) and the sites' round (sites' changes) feed
/// and every stream reads.
pub fn channel() -> broadcast::Sender<Live> {
    broadcast::channel(BUFFER).0
}

/// The `data` of one stream event (its SSE `event` name is `type`): the event as history
/// lists it, with the sensor it belongs to.
#[derive(Serialize, ToSchema)]
pub struct StreamEventOut {
    pub sensor_id: String,
    #[serde(flatten)]
    pub event: EventOut,
}

/// The `data` of one stream event: a sensor's or a site's.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum StreamData {
    Sensor(StreamEventOut),
    Site(SiteStreamEventOut),
}

/// The `data` of a site's stream event (`site.connection_lost`, `site.connection_restored`):
/// the site went down or came back, with its sensors counted as its decision read them.
#[derive(Serialize, ToSchema)]
pub struct SiteStreamEventOut {
    #[serde(rename = "type")]
    #[schema(example = "site.connection_lost")]
    pub kind: EventKind,
    #[schema(example = "bldg-7")]
    pub site_id: String,
    /// When latch decided it.
    pub at: String,
    /// Sensors in the site.
    pub sensors: u64,
    /// Of those, lost then.
    pub lost: u64,
}

/// One stream event: its SSE name and its `data`.
fn out(e: &Live) -> serde_json::Result<(&'static str, String)> {
    match e {
        Live::Sensor(e) => Ok((
            e.kind.as_str(),
            serde_json::to_string(&StreamEventOut {
                sensor_id: e.sensor_id.to_string(),
                event: EventOut::from(e),
            })?,
        )),
        Live::Site(e) => Ok((
            e.kind.as_str(),
            serde_json::to_string(&SiteStreamEventOut {
                kind: e.kind,
                site_id: e.site_id.clone(),
                at: time::format(e.at),
                sensors: e.sensors,
                lost: e.lost,
            })?,
        )),
    }
}

/// Live events as `text/event-stream`: one SSE event per committed event, named by its
/// `type` (`sensor.state_changed`, `sensor.connection_lost`, `sensor.connection_restored`,
/// `sensor.still_lost`) with a `StreamEventOut` as `data`, and one per site that went down
/// or came back (`site.connection_lost`, `site.connection_restored`) with a
/// `SiteStreamEventOut`; `lagged` with `{"missed": n}` when this listener fell behind. In
/// a cluster, the whole fleet's: this node's and, relayed, every other live node's (a
/// site's change comes from the node whose round decided it).
#[utoipa::path(get, path = "/v1/stream", tag = "sensors",
    responses((status = 200, description = "server-sent events until the client disconnects",
        content_type = "text/event-stream", body = inline(StreamData))))]
async fn stream(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let events = match &st.peers {
        None => local(&st),
        Some(c) => {
            let relayed = relay(c.clone(), st.streams_stop.child_token());
            let stop = st.streams_stop.clone();
            futures::stream::select(local(&st), relayed)
                .take_until(stop.cancelled_owned())
                .boxed()
        }
    };
    // Ending the stream drops the relay too, which stops its readers of the other nodes.
    let events = events.take_until(revoked(st, headers)).boxed();
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// Resolves once the caller who opened a stream with `headers` may read it no longer: the
/// token table changed (a token deleted here, or a reload that found it gone) and the
/// checks every request passes refuse it now — or, on a node cut off from a shared store,
/// the table went unconfirmed for longer than a request would accept (checked each
/// second: no reload comes to say so).
async fn revoked(st: AppState, headers: HeaderMap) {
    let mut changes = st.tokens.changes();
    let mut table = true;
    loop {
        if !super::still_permitted(&st, &headers, &Method::GET, "/v1/stream") {
            return;
        }
        tokio::select! {
            biased;
            changed = changes.changed(), if table => {
                // The table is gone with the service; shutdown ends the stream.
                table = changed.is_ok();
            }
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

/// This node's own events, for a node relaying them to its listeners (node-to-node: the
/// cluster secret).
pub(super) async fn internal(State(st): State<AppState>) -> Response {
    Sse::new(local(&st))
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

/// The events this node commits, until shutdown.
fn local(st: &AppState) -> Events {
    let rx = st.live.subscribe();
    let stop = st.streams_stop.clone();
    futures::stream::unfold((rx, stop), |(mut rx, stop)| async move {
        let received = tokio::select! {
            biased;
            () = stop.cancelled() => return None,
            r = rx.recv() => r,
        };
        let event = match received {
            Ok(e) => match out(&e) {
                Ok((name, data)) => SseEvent::default().event(name).data(data),
                Err(_) => SseEvent::default().comment("unserializable"),
            },
            Err(broadcast::error::RecvError::Lagged(missed)) => SseEvent::default()
                .event("lagged")
                .data(format!("{{\"missed\":{missed}}}")),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(event), (rx, stop)))
    })
    .boxed()
}

/// The other live nodes' events for one listener, until `stop` or the listener leaves
/// (the stream is dropped, which cancels the readers).
fn relay(c: Arc<Membership>, stop: CancellationToken) -> Events {
    let (tx, rx) = mpsc::channel(RELAY_BUFFER);
    tokio::spawn(follow_peers(c, tx, stop.clone()));
    let guard = stop.drop_guard();
    futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let e = rx.recv().await?;
        Some((Ok(e), (rx, guard)))
    })
    .boxed()
}

/// Keeps one reader per other live node, starting readers for nodes that join and
/// stopping those of nodes that left.
async fn follow_peers(c: Arc<Membership>, tx: mpsc::Sender<SseEvent>, stop: CancellationToken) {
    let mut readers: HashMap<String, (String, CancellationToken)> = HashMap::new();
    loop {
        match c.peers().await {
            Ok(peers) => {
                readers.retain(|id, (address, r)| {
                    let live = peers.iter().any(|p| &p.id == id && &p.address == address);
                    if !live {
                        r.cancel();
                    }
                    live
                });
                for p in peers {
                    if readers.contains_key(&p.id) {
                        continue;
                    }
                    let r = stop.child_token();
                    tokio::spawn(read_peer(
                        c.clone(),
                        p.address.clone(),
                        tx.clone(),
                        r.clone(),
                    ));
                    readers.insert(p.id, (p.address, r));
                }
            }
            Err(e) => tracing::debug!(error = %e, "Could not list the nodes to relay events from."),
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tx.closed() => return,
            () = tokio::time::sleep(PEERS_EVERY) => {}
        }
    }
}

/// Relays one node's own events, reconnecting while it stays live.
async fn read_peer(
    c: Arc<Membership>,
    address: String,
    tx: mpsc::Sender<SseEvent>,
    stop: CancellationToken,
) {
    loop {
        let sent = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            r = c.peer_get(&address, INTERNAL_PATH).send() => r,
        };
        match sent {
            Ok(mut resp) if resp.status().is_success() => {
                let mut buf = String::new();
                loop {
                    let chunk = tokio::select! {
                        biased;
                        () = stop.cancelled() => return,
                        c = resp.chunk() => c,
                    };
                    let Ok(Some(chunk)) = chunk else { break };
                    buf.push_str(&String::from_utf8_lossy(&chunk));
                    while let Some(end) = buf.find("\n\n") {
                        let block: String = buf.drain(..end + 2).collect();
                        if let Some(e) = parse(&block)
                            && tx.send(e).await.is_err()
                        {
                            return;
                        }
                    }
                }
            }
            Ok(resp) => {
                tracing::debug!(node = %address, status = %resp.status(), "A node refused its event stream.")
            }
            Err(e) => tracing::debug!(node = %address, error = %e, "A node's event stream broke."),
        }
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = tokio::time::sleep(PEER_RETRY) => {}
        }
    }
}

/// One server-sent event of a peer's stream, as it came (keep-alives are none).
fn parse(block: &str) -> Option<SseEvent> {
    let mut name = None;
    let mut data = String::new();
    for line in block.lines() {
        if let Some(n) = line.strip_prefix("event:") {
            name = Some(n.trim().to_string());
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.trim_start());
        }
    }
    Some(SseEvent::default().event(name?).data(data))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn a_peers_events_are_taken_as_they_came_and_keep_alives_are_not() {
        assert!(parse(":\n\n").is_none());
        assert!(parse("data: {}\n\n").is_none(), "no name: not one of ours");
        assert!(parse("event: sensor.state_changed\ndata: {\"a\":1}\n\n").is_some());
    }
}
