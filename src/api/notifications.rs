//! `/v1/notifications`: the outbox, each notification's attempts, and replay of dead letters.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody, parse_sensor_id};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use super::readings::{DetailOut, RangeParams};
use crate::domain::{Attempt, EventKind, Notification, Status, time};
use crate::store::{NotificationFilter, ReplayFilter};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_notifications))
        .routes(routes!(get_notification))
        .routes(routes!(retry_notification))
        .routes(routes!(retry_notifications))
}

/// A notification and where it stands.
#[derive(Serialize, ToSchema)]
pub struct NotificationOut {
    /// Also the `webhook-id` header of every attempt.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: EventKind,
    pub client_id: String,
    /// A site's notification: the site it is about (its `sensor_id` is the first sensor
    /// it names, whose lane it travels in).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site_id: Option<String>,
    /// A site's notification: the sensors it named, its client's (a loss's lost ones; a
    /// return's restored, then still lost ones), so one event is found from each of them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sensor_ids: Option<Vec<String>>,
    pub sensor_id: String,
    pub status: Status,
    pub data: Option<u8>,
    pub previous: Option<u8>,
    pub occurred_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen_at: Option<String>,
    #[serde(flatten)]
    pub detail: DetailOut,
    /// Attempts made in the current round (a replay starts a new round).
    pub attempt_count: u32,
    /// When the next attempt is due, while pending.
    pub next_attempt_at: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// The batch its last attempt was sent in (its client batches); a retry of that batch
    /// carries the same id, the `webhook-id` of the batch's request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
}

/// A notification with every attempt made.
#[derive(Serialize, ToSchema)]
pub struct NotificationDetail {
    #[serde(flatten)]
    pub notification: NotificationOut,
    pub attempts: Vec<AttemptOut>,
}

/// One delivery attempt.
#[derive(Serialize, ToSchema)]
pub struct AttemptOut {
    pub at: String,
    /// HTTP status of the answer; `null` when none came (timeout, connection error), and
    /// always for a broker destination (MQTT, AMQP), which answers without one.
    pub status_code: Option<u16>,
    /// Why the attempt failed; `null` when it delivered. For a broker destination this is
    /// the broker's answer (`refused by the broker: PUBACK not authorized`, `… returned 312
    /// NO_ROUTE …`, a refused login), a lost connection or a timeout: an attempt with
    /// neither a status nor an error is the broker's acknowledgement.
    pub error: Option<String>,
    pub duration_ms: u32,
}

fn out(n: Notification) -> NotificationOut {
    NotificationOut {
        id: n.id,
        kind: n.kind,
        site_id: crate::domain::site::named_in(n.body.as_deref()),
        sensor_ids: n.kind.is_site().then(|| {
            crate::domain::site::sensors_named_in(n.body.as_deref())
                .iter()
                .map(|s| s.to_string())
                .collect()
        }),
        client_id: n.client_id,
        sensor_id: n.sensor_id.to_string(),
        status: n.status,
        data: n.data.map(u8::from),
        previous: n.previous.map(u8::from),
        occurred_at: time::format(n.occurred_at),
        last_seen_at: n.last_seen_at.map(time::format),
        detail: DetailOut::of(n.kind, &n.detail),
        attempt_count: n.attempts,
        next_attempt_at: (n.status == Status::Pending)
            .then_some(n.next_attempt_at)
            .flatten()
            .map(time::format),
        created_at: time::format(n.created_at),
        updated_at: time::format(n.updated_at),
        batch_id: n.batch_id,
    }
}

fn attempt_out(a: Attempt) -> AttemptOut {
    AttemptOut {
        at: time::format(a.at),
        status_code: a.status_code,
        error: a.error,
        duration_ms: a.duration_ms,
    }
}

/// Filters of the notification list, and its order.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct NotificationParams {
    pub client_id: Option<String>,
    /// The sensor's own notifications and the site events that named it (`sensor_ids`).
    pub sensor_id: Option<String>,
    /// `pending`, `delivered`, `failed`, `superseded` or `cancelled`.
    pub status: Option<String>,
    /// Only notifications of this type (`sensor.state_changed`, …).
    #[serde(rename = "type")]
    #[param(rename = "type")]
    pub kind: Option<String>,
    /// Only a site's notifications (`site.connection_lost`, `site.connection_restored`)
    /// of this site.
    pub site_id: Option<String>,
    /// `asc` (the default: oldest first, as the list always was) or `desc` (newest
    /// first). A cursor pages on in the order it was given in.
    pub order: Option<String>,
}

impl Params for NotificationParams {}

/// List notifications, oldest first (or newest first with `order=desc`); `from` and `to`
/// bound when they were created.
#[utoipa::path(get, path = "/v1/notifications", tag = "notifications",
    params(NotificationParams, RangeParams, PageParams),
    responses((status = 200, body = List<NotificationOut>), (status = 400, body = ErrorBody)))]
async fn list_notifications(
    State(st): State<AppState>,
    ApiQuery((f, range, page)): ApiQuery<(NotificationParams, RangeParams, PageParams)>,
) -> ApiResult<ApiJson<List<NotificationOut>>> {
    let filter = NotificationFilter {
        kind: match f.kind.as_deref() {
            None => None,
            Some(k) => Some(EventKind::parse(k).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "type must be one of {}, got {k:?}",
                    EventKind::ALL.map(|k| k.as_str()).join(", ")
                ))
            })?),
        },
        created: range.range()?,
        newest_first: match f.order.as_deref() {
            None | Some("asc") => false,
            Some("desc") => true,
            Some(o) => {
                return Err(ApiError::bad_request(format!(
                    "order must be asc or desc, got {o:?}"
                )));
            }
        },
        client_id: f.client_id.filter(|s| !s.is_empty()),
        site_id: f.site_id.filter(|s| !s.is_empty()),
        sensor_id: match f.sensor_id.as_deref() {
            None => None,
            Some(s) => Some(parse_sensor_id(s)?),
        },
        status: match f.status.as_deref() {
            None => None,
            Some(s) => Some(Status::parse(s).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "status must be pending, delivered, failed, superseded, cancelled or silenced, got {s:?}"
                ))
            })?),
        },
    };
    let page = st.app.notifications(filter, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, out)))
}

/// Read a notification with its attempts.
#[utoipa::path(get, path = "/v1/notifications/{id}", tag = "notifications",
    params(("id" = String, Path)),
    responses((status = 200, body = NotificationDetail), (status = 404, body = ErrorBody)))]
async fn get_notification(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<NotificationDetail>> {
    let (n, attempts) = st
        .app
        .notification(id)
        .await?
        .ok_or_else(|| ApiError::not_found("notification"))?;
    Ok(ApiJson(NotificationDetail {
        notification: out(n),
        attempts: attempts.into_iter().map(attempt_out).collect(),
    }))
}

/// Send a failed (dead-lettered) notification again, with a fresh attempt budget.
/// 409 when it is not failed, or when a newer one of its kind (a state for a state, a lost
/// or restored for a lost or restored) of its sensor was sent to the client since, or waits.
#[utoipa::path(post, path = "/v1/notifications/{id}/retry", tag = "notifications",
    params(("id" = String, Path)),
    responses((status = 202, body = NotificationOut), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
async fn retry_notification(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<(StatusCode, ApiJson<NotificationOut>)> {
    st.app.retry_notification(id.clone()).await?;
    let (n, _) = st
        .app
        .notification(id)
        .await?
        .ok_or_else(|| ApiError::not_found("notification"))?;
    Ok((StatusCode::ACCEPTED, ApiJson(out(n))))
}

/// Which failed notifications to send again.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayIn {
    pub client_id: String,
    /// Only this sensor's.
    pub sensor_id: Option<String>,
    /// Only those created at or after this time (RFC 3339).
    pub since: Option<String>,
}

/// How many went back to pending.
#[derive(Serialize, ToSchema)]
pub struct ReplayOut {
    pub retried: usize,
}

/// Send every failed notification of a client (optionally of one sensor, created since a
/// time) again, in order per sensor, each with a fresh attempt budget. One that a single
/// retry would refuse (a newer one of its kind was sent to the client since) is skipped.
#[utoipa::path(post, path = "/v1/notifications/retry", tag = "notifications",
    request_body = ReplayIn,
    responses((status = 202, body = ReplayOut), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn retry_notifications(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<ReplayIn>,
) -> ApiResult<(StatusCode, ApiJson<ReplayOut>)> {
    let filter = ReplayFilter {
        client_id: body.client_id,
        sensor_id: match body.sensor_id.as_deref() {
            None => None,
            Some(s) => Some(parse_sensor_id(s)?),
        },
        since: match body.since.as_deref() {
            None => None,
            Some(s) => Some(time::parse(s).ok_or_else(|| {
                ApiError::invalid(format!("since must be an RFC 3339 time, got {s:?}"))
            })?),
        },
    };
    let retried = st.app.retry_notifications(filter).await?;
    Ok((StatusCode::ACCEPTED, ApiJson(ReplayOut { retried })))
}
