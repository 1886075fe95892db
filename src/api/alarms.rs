//! `/v1/alarms`: alarms as operators work them — one per sensor (or site) and kind while
//! open, whatever the number of clients told; acknowledged by a person (its reminders
//! stop, and the clients told hear who took it); resolved by its clearing event.

use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use crate::domain::alarm::{Alarm, AlarmKind, AlarmState, MAX_BY_LEN, MAX_NOTE_LEN};
use crate::domain::{SensorId, time};
use crate::store::AlarmFilter;
use crate::store::rules::alarms::{Ack, Acked};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_alarms))
        .routes(routes!(get_alarm))
        .routes(routes!(ack_alarm))
}

/// An alarm.
#[derive(Serialize, ToSchema)]
pub struct AlarmOut {
    pub id: String,
    pub kind: AlarmKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sensor_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub site_id: Option<String>,
    pub state: AlarmState,
    /// When its opening event happened.
    pub opened_at: String,
    pub acknowledged_at: Option<String>,
    pub acknowledged_by: Option<String>,
    pub note: Option<String>,
    /// When its clearing event happened.
    pub resolved_at: Option<String>,
    /// The notifications that opened, reminded of, cleared or acknowledged it, in the
    /// order they were made (`GET /v1/alarms/{id}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub notification_ids: Option<Vec<String>>,
}

fn alarm_out(a: Alarm, notification_ids: Option<Vec<String>>) -> AlarmOut {
    AlarmOut {
        id: a.id,
        kind: a.kind,
        sensor_id: a.sensor_id.map(|s| s.to_string()),
        site_id: a.site_id,
        state: a.state,
        opened_at: time::format(a.opened_at),
        acknowledged_at: a.acknowledged_at.map(time::format),
        acknowledged_by: a.acknowledged_by,
        note: a.note,
        resolved_at: a.resolved_at.map(time::format),
        notification_ids,
    }
}

/// `GET /v1/alarms`' filters: every one given must match.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AlarmListParams {
    /// `open`, `acknowledged` or `resolved`.
    pub state: Option<String>,
    /// `connection_lost`, `site_down`, `state_held`, `battery_low`, `tamper`, `fault`,
    /// `flapping` or `out_of_schedule`.
    pub kind: Option<String>,
    pub sensor_id: Option<String>,
    pub site_id: Option<String>,
}

impl Params for AlarmListParams {}

impl AlarmListParams {
    fn filter(self) -> ApiResult<AlarmFilter> {
        let state = match self.state.as_deref() {
            None => None,
            Some(s) => Some(AlarmState::parse(s).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "state must be open, acknowledged or resolved, got {s:?}"
                ))
            })?),
        };
        let kind = match self.kind.as_deref() {
            None => None,
            Some(k) => Some(AlarmKind::parse(k).ok_or_else(|| {
                let kinds: Vec<&str> = AlarmKind::ALL.iter().map(|k| k.as_str()).collect();
                ApiError::bad_request(format!(
                    "kind must be one of {}, got {k:?}",
                    kinds.join(", ")
                ))
            })?),
        };
        let sensor_id = match self.sensor_id.as_deref() {
            None => None,
            Some(s) => Some(
                SensorId::parse(s)
                    .map_err(|e| ApiError::bad_request(format!("sensor_id: {e} (got {s:?})")))?,
            ),
        };
        Ok(AlarmFilter {
            state,
            kind,
            sensor_id,
            site_id: self.site_id,
        })
    }
}

/// An acknowledgement: who takes the alarm, and why.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// Who: a person or a desk, 1 to 200 characters.
    pub by: String,
    /// Up to 2000 characters.
    pub note: Option<String>,
}

/// List alarms, newest first; the filters combine.
#[utoipa::path(get, path = "/v1/alarms", tag = "alarms", params(PageParams, AlarmListParams),
    responses((status = 200, body = List<AlarmOut>), (status = 400, body = ErrorBody)))]
async fn list_alarms(
    State(st): State<AppState>,
    ApiQuery((page, filter)): ApiQuery<(PageParams, AlarmListParams)>,
) -> ApiResult<ApiJson<List<AlarmOut>>> {
    let page = st.app.alarms(filter.filter()?, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, |a| alarm_out(a, None))))
}

/// Read an alarm, with the notifications that name it.
#[utoipa::path(get, path = "/v1/alarms/{id}", tag = "alarms", params(("id" = String, Path)),
    responses((status = 200, body = AlarmOut), (status = 404, body = ErrorBody)))]
async fn get_alarm(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<AlarmOut>> {
    let (a, ids) = st
        .app
        .alarm(id)
        .await?
        .ok_or_else(|| ApiError::not_found("alarm"))?;
    Ok(ApiJson(alarm_out(a, Some(ids))))
}

/// Acknowledge an alarm: its reminders stop, and every client told of it gets
/// `alarm.acknowledged`. A second acknowledgement changes nothing and says so (409).
#[utoipa::path(post, path = "/v1/alarms/{id}/ack", tag = "alarms", params(("id" = String, Path)),
    request_body = AckBody,
    responses((status = 200, body = AlarmOut), (status = 404, body = ErrorBody),
        (status = 409, description = "acknowledged already (`already_acknowledged`), or resolved before anyone did (`already_resolved`)", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn ack_alarm(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<AckBody>,
) -> ApiResult<ApiJson<AlarmOut>> {
    let by = body.by.trim();
    if by.is_empty() || by.chars().count() > MAX_BY_LEN {
        return Err(ApiError::invalid(format!(
            "by must be 1 to {MAX_BY_LEN} characters, not blank"
        )));
    }
    if body
        .note
        .as_ref()
        .is_some_and(|n| n.chars().count() > MAX_NOTE_LEN)
    {
        return Err(ApiError::invalid(format!(
            "note must be at most {MAX_NOTE_LEN} characters"
        )));
    }
    let ack = Ack {
        by: by.to_string(),
        note: body.note,
    };
    let conflict = |code, what: String| ApiError::new(axum::http::StatusCode::CONFLICT, code, what);
    match st.app.ack_alarm(id, ack).await? {
        Acked::Taken(a, _) => Ok(ApiJson(alarm_out(a, None))),
        Acked::Already(a) => Err(conflict(
            "already_acknowledged",
            format!(
                "alarm {} was acknowledged already by {:?} at {}; nothing changed",
                a.id,
                a.acknowledged_by.unwrap_or_default(),
                a.acknowledged_at.map(time::format).unwrap_or_default()
            ),
        )),
        Acked::Resolved(a) => Err(conflict(
            "already_resolved",
            format!(
                "alarm {} was resolved at {} before anyone acknowledged it; nothing changed",
                a.id,
                a.resolved_at.map(time::format).unwrap_or_default()
            ),
        )),
        Acked::Missing => Err(ApiError::not_found("alarm")),
    }
}
