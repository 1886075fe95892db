//! `GET /v1/stream`: server-sent events of state changes and lost/restored events as this
//! node commits them, for the console and for integrators who would rather hold one
//! connection open than receive webhooks.
//!
//! The committer sends each committed event to a `broadcast` channel, copying them only
//! while somebody listens. A listener too slow for the channel's buffer is told how many it
//! missed (`lagged`) and should read the state again; the stream is a view, not a log:
//! history and webhooks stay the record.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tokio::sync::broadcast;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::readings::EventOut;
use crate::domain::Event;

/// Events buffered per listener before it lags.
const BUFFER: usize = 4096;

/// Idle streams get a comment this often, so proxies keep them open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(stream))
}

/// The channel the committer feeds and every stream reads.
pub fn channel() -> broadcast::Sender<Event> {
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

fn out(e: &Event) -> StreamEventOut {
    StreamEventOut {
        sensor_id: e.sensor_id.to_string(),
        event: EventOut::from(e),
    }
}

/// Live events as `text/event-stream`: one SSE event per committed event, named by its
/// `type` (`sensor.state_changed`, `sensor.connection_lost`, `sensor.connection_restored`)
/// with a `StreamEventOut` as `data`; `lagged` with `{"missed": n}` when this listener fell
/// behind. In a cluster, the events of the partitions this node serves.
#[utoipa::path(get, path = "/v1/stream", tag = "sensors",
    responses((status = 200, description = "server-sent events until the client disconnects",
        content_type = "text/event-stream", body = StreamEventOut)))]
async fn stream(
    State(st): State<AppState>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let rx = st.live.subscribe();
    let stop = st.streams_stop.clone();
    let events = futures::stream::unfold((rx, stop), |(mut rx, stop)| async move {
        let received = tokio::select! {
            r = rx.recv() => r,
            () = stop.cancelled() => return None,
        };
        let event = match received {
            Ok(e) => {
                let name = e.kind.as_str();
                SseEvent::default()
                    .event(name)
                    .json_data(out(&e))
                    .unwrap_or_else(|_| SseEvent::default().comment("unserializable"))
            }
            Err(broadcast::error::RecvError::Lagged(missed)) => SseEvent::default()
                .event("lagged")
                .data(format!("{{\"missed\":{missed}}}")),
            Err(broadcast::error::RecvError::Closed) => return None,
        };
        Some((Ok(event), (rx, stop)))
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}
