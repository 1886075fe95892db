//! `/v1/silences`: maintenance windows. While one is active the notifications it matches
//! are kept with status `silenced`, never sent; at its end each client it kept something
//! from is brought up to date once. A silence gives its own `starts_at`/`ends_at` or a
//! `schedule_id`: then it is active in every window of the schedule, pending between them.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use crate::app::silences::{SilenceChange, When};
use crate::domain::silence::{Match, Silence, SilenceState};
use crate::domain::{EventKind, Millis, SensorId, time};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_silence, list_silences))
        .routes(routes!(get_silence, update_silence, delete_silence))
}

/// Longest comment.
pub const MAX_COMMENT: usize = 1000;
/// Most sensors one silence names.
pub const MAX_SENSORS: usize = 10_000;

/// What a silence applies to: every field given must match; at least one is needed.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MatchBody {
    pub site_id: Option<String>,
    pub sensor_ids: Option<Vec<String>>,
    pub client_id: Option<String>,
    /// Notification types, e.g. `sensor.connection_lost`.
    pub types: Option<Vec<String>>,
}

/// A silence to create: `ends_at` (and `starts_at`) or `schedule_id`, not both.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SilenceCreate {
    #[serde(rename = "match")]
    pub matcher: MatchBody,
    /// RFC 3339; now when absent. Not with `schedule_id`.
    pub starts_at: Option<String>,
    /// RFC 3339, after `starts_at` and in the future; at most 31 days on. Required unless
    /// `schedule_id` is given.
    pub ends_at: Option<String>,
    /// A schedule (`/v1/schedules`) whose every window the silence is active in, instead
    /// of `starts_at`/`ends_at`; one unknown is 422 `unknown_schedule`.
    pub schedule_id: Option<String>,
    /// Why: who is doing what.
    pub comment: String,
}

/// A silence's new times or comment; `starts_at` only before it begins. Or the schedule it
/// follows (not with times): a one-off silence may take one before it begins; the times of
/// one that follows a schedule are the schedule's.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SilencePatch {
    pub starts_at: Option<String>,
    pub ends_at: Option<String>,
    pub schedule_id: Option<String>,
    pub comment: Option<String>,
}

/// A silence.
#[derive(Serialize, ToSchema)]
pub struct SilenceOut {
    pub id: String,
    #[serde(rename = "match")]
    pub matcher: MatchBody,
    /// Its window: following a schedule, the current or next one.
    pub starts_at: String,
    pub ends_at: String,
    /// The schedule it follows; `null` for a one-off silence.
    pub schedule_id: Option<String>,
    pub comment: String,
    /// `pending` between a schedule's windows; `ended` once its end passed (one-off) or a
    /// caller ended it.
    pub state: SilenceState,
    pub created_at: String,
    pub updated_at: String,
    /// When its end brought clients up to date; `null` before.
    pub reconciled_at: Option<String>,
}

/// `?state=` of the silence list.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SilenceListParams {
    /// `active`, `pending` (starts later, or between the windows of its schedule) or
    /// `ended`.
    pub state: Option<String>,
}

impl Params for SilenceListParams {}

fn silence_out(s: Silence, now: Millis) -> SilenceOut {
    let state = s.state(now);
    let m = s.matcher;
    SilenceOut {
        id: s.id,
        matcher: MatchBody {
            site_id: m.site_id,
            sensor_ids: m
                .sensor_ids
                .map(|ids| ids.iter().map(|i| i.to_string()).collect()),
            client_id: m.client_id,
            types: m
                .types
                .map(|t| t.iter().map(|k| k.as_str().to_string()).collect()),
        },
        starts_at: time::format(s.starts_at),
        ends_at: time::format(s.ends_at),
        schedule_id: s.schedule_id,
        comment: s.comment,
        state,
        created_at: time::format(s.created_at),
        updated_at: time::format(s.updated_at),
        reconciled_at: s.reconciled_at.map(time::format),
    }
}

fn when(what: &str, v: &str) -> ApiResult<Millis> {
    time::parse(v)
        .ok_or_else(|| ApiError::invalid(format!("{what} must be an RFC 3339 time, got {v:?}")))
}

/// `schedule_id` or times, not both: 422 naming the field given beside it.
fn check_either(
    schedule_id: &Option<String>,
    starts_at: &Option<String>,
    ends_at: &Option<String>,
) -> ApiResult<()> {
    if schedule_id.is_none() {
        return Ok(());
    }
    for (field, given) in [("starts_at", starts_at), ("ends_at", ends_at)] {
        if given.is_some() {
            return Err(ApiError::invalid(format!(
                "{field}: give schedule_id or starts_at/ends_at, not both"
            )));
        }
    }
    Ok(())
}

fn check_comment(c: &str) -> ApiResult<()> {
    if c.trim().is_empty() || c.chars().count() > MAX_COMMENT {
        return Err(ApiError::invalid(format!(
            "comment must be 1 to {MAX_COMMENT} characters, not blank"
        )));
    }
    Ok(())
}

fn matcher(m: MatchBody) -> ApiResult<Match> {
    let sensor_ids = match m.sensor_ids {
        None => None,
        Some(ids) if ids.len() > MAX_SENSORS => {
            return Err(ApiError::invalid(format!(
                "match.sensor_ids: at most {MAX_SENSORS} sensors"
            )));
        }
        Some(ids) => Some(
            ids.iter()
                .map(|i| {
                    SensorId::parse(i).map_err(|e| {
                        ApiError::invalid(format!("match.sensor_ids: {e} (got {i:?})"))
                    })
                })
                .collect::<ApiResult<Vec<_>>>()?,
        ),
    };
    let types = match m.types {
        None => None,
        Some(t) => Some(
            t.iter()
                .map(|k| {
                    EventKind::parse(k).ok_or_else(|| {
                        ApiError::invalid(format!("match.types: no notification type {k:?}"))
                    })
                })
                .collect::<ApiResult<Vec<_>>>()?,
        ),
    };
    Ok(Match {
        site_id: m.site_id,
        sensor_ids,
        client_id: m.client_id,
        types,
    })
}

/// Silence matching notifications for a while (a maintenance window).
#[utoipa::path(post, path = "/v1/silences", tag = "silences", request_body = SilenceCreate,
    responses((status = 201, body = SilenceOut),
        (status = 422, description = "a field is missing or wrong; `schedule_id` with times, or neither; an unknown schedule (`unknown_schedule`)", body = ErrorBody)))]
async fn create_silence(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<SilenceCreate>,
) -> ApiResult<(StatusCode, ApiJson<SilenceOut>)> {
    check_comment(&body.comment)?;
    check_either(&body.schedule_id, &body.starts_at, &body.ends_at)?;
    let applies = match (body.schedule_id, body.ends_at) {
        (Some(id), _) => When::Schedule(id),
        (None, Some(ends_at)) => When::Times {
            starts_at: body
                .starts_at
                .as_deref()
                .map(|s| when("starts_at", s))
                .transpose()?,
            ends_at: when("ends_at", &ends_at)?,
        },
        (None, None) => {
            return Err(ApiError::invalid(
                "ends_at: give ends_at (and starts_at, or it starts now) or schedule_id",
            ));
        }
    };
    let s = st
        .app
        .create_silence(matcher(body.matcher)?, applies, body.comment)
        .await?;
    Ok((StatusCode::CREATED, ApiJson(silence_out(s, st.app.now()))))
}

/// List silences, oldest first; `?state=` filters.
#[utoipa::path(get, path = "/v1/silences", tag = "silences", params(PageParams, SilenceListParams),
    responses((status = 200, body = List<SilenceOut>), (status = 400, body = ErrorBody)))]
async fn list_silences(
    State(st): State<AppState>,
    ApiQuery((page, filter)): ApiQuery<(PageParams, SilenceListParams)>,
) -> ApiResult<ApiJson<List<SilenceOut>>> {
    let state = match filter.state.as_deref() {
        None => None,
        Some(s) => Some(SilenceState::parse(s).ok_or_else(|| {
            ApiError::bad_request(format!("state must be active, pending or ended, got {s:?}"))
        })?),
    };
    let now = st.app.now();
    let page = st.app.silences(state, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, |s| silence_out(s, now))))
}

/// Read a silence.
#[utoipa::path(get, path = "/v1/silences/{id}", tag = "silences", params(("id" = String, Path)),
    responses((status = 200, body = SilenceOut), (status = 404, body = ErrorBody)))]
async fn get_silence(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<SilenceOut>> {
    let s = st
        .app
        .silence(id)
        .await?
        .ok_or_else(|| ApiError::not_found("silence"))?;
    Ok(ApiJson(silence_out(s, st.app.now())))
}

/// Extend, shorten or re-comment a silence that has not ended.
#[utoipa::path(patch, path = "/v1/silences/{id}", tag = "silences", params(("id" = String, Path)),
    request_body = SilencePatch,
    responses((status = 200, body = SilenceOut), (status = 404, body = ErrorBody),
        (status = 409, description = "the silence has ended", body = ErrorBody),
        (status = 422, description = "a field is wrong; `schedule_id` with times; times of a silence that follows a schedule; an unknown schedule (`unknown_schedule`)", body = ErrorBody)))]
async fn update_silence(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SilencePatch>,
) -> ApiResult<ApiJson<SilenceOut>> {
    if let Some(c) = &body.comment {
        check_comment(c)?;
    }
    check_either(&body.schedule_id, &body.starts_at, &body.ends_at)?;
    let change = SilenceChange {
        schedule_id: body.schedule_id,
        starts_at: body
            .starts_at
            .as_deref()
            .map(|s| when("starts_at", s))
            .transpose()?,
        ends_at: body
            .ends_at
            .as_deref()
            .map(|s| when("ends_at", s))
            .transpose()?,
        comment: body.comment,
    };
    let s = st
        .app
        .update_silence(id, change)
        .await?
        .ok_or_else(|| ApiError::not_found("silence"))?;
    Ok(ApiJson(silence_out(s, st.app.now())))
}

/// End a silence now.
#[utoipa::path(delete, path = "/v1/silences/{id}", tag = "silences", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_silence(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    if !st.app.end_silence(id).await? {
        return Err(ApiError::not_found("silence"));
    }
    Ok(StatusCode::NO_CONTENT)
}
