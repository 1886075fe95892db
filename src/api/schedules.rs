//! `/v1/schedules`: weekly windows in an IANA time zone (`{id, name, tz, weekly: [{days,
//! from, to}], except}`), for silences and sensors' arming to name. The caller chooses the
//! id, as for sites; a time that does not exist on a daylight-saving night is read as the
//! first instant after the gap, a repeated one as its first occurrence.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody};
use super::pagination::{List, PageParams};
use super::patch::MergePatch;
use super::query::ApiQuery;
use crate::domain::schedule::Schedule;
use crate::domain::{Millis, time};
use crate::store::StoredSchedule;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_schedule, list_schedules))
        .routes(routes!(get_schedule, patch_schedule, delete_schedule))
}

/// A schedule, with when it was written and where it stands now.
#[derive(Serialize, ToSchema)]
pub struct ScheduleOut {
    #[serde(flatten)]
    pub schedule: Schedule,
    pub created_at: String,
    pub updated_at: String,
    pub status: ScheduleStatus,
}

/// Where a schedule stands at the time of the answer.
#[derive(Serialize, ToSchema)]
pub struct ScheduleStatus {
    /// Whether now is inside one of its windows.
    pub inside: bool,
    /// When that next changes (a window begins or ends), in UTC; `null`: never.
    pub next_change: Option<String>,
}

fn schedule_out(s: StoredSchedule, now: Millis) -> ScheduleOut {
    let status = ScheduleStatus {
        inside: s.schedule.inside(now),
        next_change: s.schedule.next_change(now).map(time::format),
    };
    ScheduleOut {
        schedule: s.schedule,
        created_at: time::format(s.created_at),
        updated_at: time::format(s.updated_at),
        status,
    }
}

/// A schedule read from a request's JSON: 422 naming the field and why.
fn parse(body: Value) -> ApiResult<Schedule> {
    Schedule::parse(body).map_err(|e| ApiError::invalid(e.to_string()))
}

/// Register a schedule.
#[utoipa::path(post, path = "/v1/schedules", tag = "schedules", request_body = Schedule,
    responses((status = 201, body = ScheduleOut), (status = 409, body = ErrorBody),
        (status = 422, description = "a field is missing or wrong (an unknown tz, a day, a time, an empty window)", body = ErrorBody)))]
async fn create_schedule(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<(StatusCode, ApiJson<ScheduleOut>)> {
    let s = st.app.create_schedule(parse(body)?).await?;
    Ok((StatusCode::CREATED, ApiJson(schedule_out(s, st.app.now()))))
}

/// List schedules, by id.
#[utoipa::path(get, path = "/v1/schedules", tag = "schedules", params(PageParams),
    responses((status = 200, body = List<ScheduleOut>), (status = 400, body = ErrorBody)))]
async fn list_schedules(
    State(st): State<AppState>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<ApiJson<List<ScheduleOut>>> {
    let now = st.app.now();
    let page = st.app.schedules(page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, |s| schedule_out(s, now))))
}

/// Read a schedule, with whether now is inside it and when that next changes.
#[utoipa::path(get, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = String, Path)),
    responses((status = 200, body = ScheduleOut), (status = 404, body = ErrorBody)))]
async fn get_schedule(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<ScheduleOut>> {
    let s = st
        .app
        .schedule(id)
        .await?
        .ok_or_else(|| ApiError::not_found("schedule"))?;
    Ok(ApiJson(schedule_out(s, st.app.now())))
}

/// Change a schedule (JSON merge patch: a list such as `weekly` is replaced whole, `null`
/// clears `except`); its id stays. A silence that follows it and is between windows moves
/// to the new next window; one inside a window keeps it to its end.
#[utoipa::path(patch, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = String, Path)),
    request_body(content = Object, content_type = "application/merge-patch+json"),
    responses((status = 200, body = ScheduleOut), (status = 404, body = ErrorBody),
        (status = 409, description = "the patch changes its id", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn patch_schedule(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    patch: MergePatch,
) -> ApiResult<ApiJson<ScheduleOut>> {
    let old = st
        .app
        .schedule(id.clone())
        .await?
        .ok_or_else(|| ApiError::not_found("schedule"))?;
    let patch = Value::Object(patch.0);
    if patch
        .get("id")
        .is_some_and(|i| *i != Value::String(id.clone()))
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("a schedule's id stays {id:?}: make a new one instead"),
        ));
    }
    // A schedule is plain data: it always makes a JSON value.
    let mut doc = serde_json::to_value(&old.schedule).unwrap_or(Value::Null);
    json_patch::merge(&mut doc, &patch);
    let s = st
        .app
        .replace_schedule(parse(doc)?, old.created_at)
        .await?
        .ok_or_else(|| ApiError::not_found("schedule"))?;
    Ok(ApiJson(schedule_out(s, st.app.now())))
}

/// Delete a schedule nothing follows.
#[utoipa::path(delete, path = "/v1/schedules/{id}", tag = "schedules", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody),
        (status = 409, description = "a silence not ended follows it (`schedule_in_use`)", body = ErrorBody)))]
async fn delete_schedule(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    if !st.app.delete_schedule(id).await? {
        return Err(ApiError::not_found("schedule"));
    }
    Ok(StatusCode::NO_CONTENT)
}
