//! The route of HTTP ingest (`POST /v1/readings`), a thin handler over [`crate::ingest::http`],
//! and the history of a sensor: readings and events.

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tracing::Instrument;
use tracing::field::Empty;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody, JsonBytes, parse_sensor_id};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use super::{AppState, idempotency};
use crate::domain::{Detail, Event, EventKind, Millis, reading, time};
use crate::ingest::http::{self, Accepted, ReadingIn};
use crate::store::{Stored, TimeRange};
use crate::telemetry::SPANS;

pub use crate::ingest::http::{MAX_READINGS_BODY_BYTES, MAX_READINGS_PER_REQUEST};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(post_readings))
        .routes(routes!(sensor_readings))
        .routes(routes!(sensor_events))
        .layer(axum::extract::DefaultBodyLimit::max(
            MAX_READINGS_BODY_BYTES,
        ))
}

/// Post one reading or an array of up to 10,000. Each element is judged on its own.
/// Answers 202 once the accepted ones are durable; 422 with the same body when none was
/// accepted because each was refused (unknown sensor, bad field, …), so a sender that reads
/// only the status does not take it for stored. If only part of them could be committed,
/// the rest are listed as `store_unavailable` (send those again); 503 when none could
/// (`storage_full` when the store's disk is full).
#[utoipa::path(post, path = "/v1/readings", tag = "readings",
    request_body(content = Vec<ReadingIn>, description = "one reading, or an array of them"),
    responses((status = 202, description = "at least one reading accepted (or none sent)",
            body = Accepted),
        (status = 400, body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "none accepted: every reading refused, each listed in \
            `rejected` (an `Accepted` body); or more than 10,000 readings (an `ErrorBody`)",
            body = Refused),
        (status = 503, description = "none stored: the store is unavailable (an `ErrorBody`), \
            or the readings not refused for what they are could not be committed (an \
            `Accepted` body: send those listed as `store_unavailable` again)",
            body = Refused)))]
async fn post_readings(
    State(st): State<AppState>,
    headers: HeaderMap,
    JsonBytes(body): JsonBytes,
) -> Result<(StatusCode, ApiJson<Accepted>), Response> {
    let key = idempotency::key(&headers).map_err(IntoResponse::into_response)?;
    // One stamp for the request: what its readings' `ts` is judged by and what they are
    // received at.
    let received_at = st.ingest.now();
    let items = http::parse(&body, received_at)
        .map_err(|e| match e {
            reading::BodyError::Malformed(_) | reading::BodyError::NotReadings => {
                ApiError::bad_request(e.to_string())
            }
            // 422 rather than 413: the body is not too large, it breaks `maxItems`.
            reading::BodyError::TooMany { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "too_many_readings",
                e.to_string(),
            ),
        })
        .map_err(IntoResponse::into_response)?;
    if let Some(key) = key {
        let (status, answer) = idempotency::readings(&st, key, &body, items, received_at).await?;
        return Ok((status, ApiJson(answer)));
    }
    // Traces (when on): the request from parsed to durable; see `telemetry`.
    let span = tracing::info_span!(target: SPANS, "readings.accept", source = "http",
        readings = items.len(), accepted = Empty, rejected = Empty, otel.status_code = Empty);
    let result = http::submit(&st.ingest, items, received_at)
        .instrument(span.clone())
        .await;
    match &result {
        Ok(a) => {
            span.record("accepted", a.accepted);
            span.record("rejected", a.rejected.len());
        }
        Err(_) => {
            span.record("otel.status_code", "ERROR");
        }
    }
    let answer = result.map_err(|e| ApiError::from(e).into_response())?;
    let status =
        StatusCode::from_u16(answer.outcome().status()).expect("readings statuses are statuses");
    Ok((status, ApiJson(answer)))
}

/// The body of a 422 or 503 from `POST /v1/readings`: what became of each reading when none
/// was accepted, or an error about the request as a whole.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Documents the two shapes; the handler answers one or the other.
pub enum Refused {
    Readings(Accepted),
    Error(ErrorBody),
}

/// `?from=&to=`: a half-open RFC 3339 range `[from, to)`.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RangeParams {
    /// Inclusive lower bound, RFC 3339.
    pub from: Option<String>,
    /// Exclusive upper bound, RFC 3339.
    pub to: Option<String>,
}

impl Params for RangeParams {}

impl RangeParams {
    pub(super) fn range(&self) -> ApiResult<TimeRange> {
        let parse = |name: &str, v: &Option<String>| -> ApiResult<Option<Millis>> {
            match v.as_deref() {
                None => Ok(None),
                Some(s) => time::parse(s).map(Some).ok_or_else(|| {
                    ApiError::bad_request(format!("{name} must be an RFC 3339 time, got {s:?}"))
                }),
            }
        };
        Ok(TimeRange {
            from: parse("from", &self.from)?,
            to: parse("to", &self.to)?,
        })
    }
}

/// A reading in history.
#[derive(Serialize, ToSchema)]
pub struct ReadingOut {
    pub data: u8,
    /// Device time (receive time when the device sent none).
    pub ts: String,
    pub received_at: String,
    /// Older than the state it arrived at: kept, but did not change state.
    pub late: bool,
    /// The battery it reported (absent when it reported none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub battery: Option<u8>,
    /// The tamper flag it reported (absent when it reported none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tamper: Option<bool>,
    /// The fault code it reported, `null` when it cleared the fault (absent when it said
    /// nothing of it).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub fault: Option<Option<String>>,
}

/// An event in history.
#[derive(Serialize, ToSchema)]
pub struct EventOut {
    #[serde(rename = "type")]
    pub kind: EventKind,
    /// When it happened: the reading's time for a change, latch's for lost/restored.
    pub at: String,
    /// The state now, 0 or 1.
    pub data: Option<u8>,
    pub previous: Option<u8>,
    /// For lost/restored: when latch last heard from the sensor before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<String>,
    #[serde(flatten)]
    pub detail: DetailOut,
}

/// What only some types carry, as the webhook body has it.
#[derive(Serialize, ToSchema, Default)]
pub struct DetailOut {
    /// `sensor.still_lost`: when the sensor was declared lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost_since: Option<String>,
    /// `sensor.still_lost`: 1 for the first reminder, then the number of reminder
    /// intervals the sensor has been lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reminder: Option<u32>,
    /// `sensor.state_changed`: readings within its debounce window whose value differed
    /// from the reading before, itself aside (0 without debounce).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flips_suppressed: Option<u32>,
}

impl DetailOut {
    pub fn of(kind: EventKind, d: &Detail) -> Self {
        Self {
            lost_since: d.lost_since.map(time::format),
            reminder: d.reminder,
            flips_suppressed: match kind {
                EventKind::StateChanged => Some(d.flips_suppressed.unwrap_or(0)),
                _ => d.flips_suppressed,
            },
        }
    }
}

impl From<&Event> for EventOut {
    fn from(e: &Event) -> Self {
        Self {
            kind: e.kind,
            at: time::format(e.at),
            data: e.data.map(u8::from),
            previous: e.previous.map(u8::from),
            last_seen_at: e.last_seen_at.map(time::format),
            detail: DetailOut::of(e.kind, &e.detail),
        }
    }
}

/// A sensor's readings, oldest first, by device time.
#[utoipa::path(get, path = "/v1/sensors/{id}/readings", tag = "history",
    params(("id" = String, Path), RangeParams, PageParams),
    responses((status = 200, body = List<ReadingOut>), (status = 404, body = ErrorBody),
        (status = 503, description = "the store or ClickHouse is unavailable", body = ErrorBody)))]
async fn sensor_readings(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery((range, page)): ApiQuery<(RangeParams, PageParams)>,
) -> ApiResult<ApiJson<List<ReadingOut>>> {
    let (range, page) = (range.range()?, page.to_request()?);
    let id = parse_sensor_id(&id)?;
    let page = st
        .app
        .readings(id, range, page)
        .await?
        .ok_or_else(|| ApiError::not_found("sensor"))?;
    Ok(ApiJson(List::from_page(
        page,
        |Stored { row: r, .. }| ReadingOut {
            data: u8::from(r.data),
            ts: time::format(r.ts),
            received_at: time::format(r.received_at),
            late: r.late,
            battery: r.signals.battery,
            tamper: r.signals.tamper,
            fault: r.signals.fault.map(|f| f.map(|c| c.to_string())),
        },
    )))
}

/// A sensor's events (state changes, connection lost and restored, reminders while lost),
/// oldest first.
#[utoipa::path(get, path = "/v1/sensors/{id}/events", tag = "history",
    params(("id" = String, Path), RangeParams, PageParams),
    responses((status = 200, body = List<EventOut>), (status = 404, body = ErrorBody),
        (status = 503, description = "the store or ClickHouse is unavailable", body = ErrorBody)))]
async fn sensor_events(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery((range, page)): ApiQuery<(RangeParams, PageParams)>,
) -> ApiResult<ApiJson<List<EventOut>>> {
    let (range, page) = (range.range()?, page.to_request()?);
    let id = parse_sensor_id(&id)?;
    let page = st
        .app
        .events(id, range, page)
        .await?
        .ok_or_else(|| ApiError::not_found("sensor"))?;
    Ok(ApiJson(List::from_page(
        page,
        |Stored { row: e, .. }| EventOut::from(&e),
    )))
}
