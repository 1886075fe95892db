//! `/v1/sensors`: the sensor registry, with each sensor's current status.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody, parse_sensor_id};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use crate::domain::armed::Armed;
use crate::domain::flap::Flap;
use crate::domain::hold::{HoldAlarm, HoldAlarms};
use crate::domain::sensor::{Labels, SensorAlarms};
use crate::domain::signals::DEFAULT_BATTERY_LOW_PCT;
use crate::domain::{Connection, SensorId, SensorStatus, Source, sensor::validate_address, time};
use crate::store::{SensorFilter, SensorView};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_sensor, list_sensors))
        .routes(routes!(get_sensor, replace_sensor, delete_sensor))
}

/// Longest per-sensor heartbeat timeout: 30 days.
pub const MAX_TIMEOUT_S: u32 = 30 * 24 * 3600;

/// Longest per-sensor debounce window: a day.
pub const MAX_DEBOUNCE_S: u32 = crate::config::MAX_DEBOUNCE.as_secs() as u32;

/// A sensor to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SensorCreate {
    /// 1 to 16 ASCII letters and digits.
    #[schema(example = "xa7v9Dfadr7H")]
    pub id: String,
    /// Where it is installed.
    #[schema(example = "Moscow, Russia, Svobody st. 23 fl 1 room 16")]
    pub address: String,
    /// Silence, in seconds, after which it is "lost"; the service default when absent.
    #[serde(default, deserialize_with = "super::whole_number")]
    pub heartbeat_timeout_s: Option<u32>,
    /// Seconds a new state must hold before it is notified (readings flipping back within
    /// them notify nobody); `0`: at once; the service default (`LATCH_DEBOUNCE`) when
    /// absent.
    #[serde(default, deserialize_with = "super::whole_number")]
    pub debounce_s: Option<u32>,
    /// The site it is installed in (`/v1/sites`).
    pub site_id: Option<String>,
    /// Battery percentage at or below which a reading raises `sensor.battery_low`
    /// (0–100; 0 turns it off); 20 when absent.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0, maximum = 100)]
    pub battery_low_pct: Option<u32>,
    /// What its states mean (`{"0": "closed", "1": "open"}`, each up to 32 characters):
    /// its notifications carry them as `label` and `previous_label`.
    pub labels: Option<Labels>,
    /// How long each state may hold before `sensor.state_held` (at most one per value;
    /// seconds from 1 to 604800), and how often it reminds while the state holds on.
    pub hold_alarms: Option<Vec<HoldAlarm>>,
    /// `changes` (2–100) within `window_s` (10–3600) are flapping: one `sensor.flapping`
    /// instead of their `state_changed`s, until the sensor is quiet for `window_s`.
    pub flap: Option<Flap>,
    /// `{schedule_id, data, when}`: its state becoming `data` outside (`when: "outside"`)
    /// or inside the schedule's windows is `sensor.state_out_of_schedule` (a door opened
    /// at night); the schedule must exist.
    pub armed: Option<Armed>,
}

/// A sensor's new address, timeout, debounce window and site; a sensor as `GET` answers it,
/// sent back unchanged, changes nothing.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SensorReplace {
    /// Optional; must match the path when given.
    pub id: Option<String>,
    pub address: String,
    #[serde(default, deserialize_with = "super::whole_number")]
    pub heartbeat_timeout_s: Option<u32>,
    #[serde(default, deserialize_with = "super::whole_number")]
    pub debounce_s: Option<u32>,
    /// Its site; absent: in no site.
    pub site_id: Option<String>,
    /// Absent: 20.
    #[serde(default, deserialize_with = "super::whole_number")]
    #[schema(minimum = 0, maximum = 100)]
    pub battery_low_pct: Option<u32>,
    /// Absent or `null`: none.
    pub labels: Option<Labels>,
    /// Absent, `null` or `[]`: none.
    pub hold_alarms: Option<Vec<HoldAlarm>>,
    /// Absent or `null`: never flapping.
    pub flap: Option<Flap>,
    /// Absent or `null`: not armed.
    pub armed: Option<Armed>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only)]
    pub created_at: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only, value_type = Option<Object>)]
    pub status: Option<serde_json::Map<String, serde_json::Value>>,
}

/// A sensor with its current status.
#[derive(Serialize, ToSchema)]
pub struct SensorOut {
    pub id: String,
    pub address: String,
    pub heartbeat_timeout_s: Option<u32>,
    /// Its own debounce window; `null`: the service default.
    pub debounce_s: Option<u32>,
    /// The site it is installed in.
    pub site_id: Option<String>,
    /// Battery threshold in percent (0: off).
    pub battery_low_pct: u8,
    /// What its states mean; `null`: none.
    pub labels: Option<Labels>,
    /// Its hold alarms; `[]`: none.
    pub hold_alarms: Vec<HoldAlarm>,
    /// How many changes within how long are flapping; `null`: never.
    pub flap: Option<Flap>,
    /// The schedule its state is news out of (or in); `null`: not armed.
    pub armed: Option<Armed>,
    pub created_at: String,
    pub status: StatusOut,
}

/// What latch knows of a sensor now.
#[derive(Serialize, ToSchema)]
pub struct StatusOut {
    /// Current state, 0 or 1, as the latest reading says (also while a debounce window
    /// holds back its notification); `null` before the first reading.
    pub data: Option<u8>,
    /// When the state last changed (device time).
    pub changed_at: Option<String>,
    /// When latch last received a reading from it (latch's clock).
    pub last_seen_at: Option<String>,
    pub connection: Connection,
    /// How its last reading came in; while latch's connection to that broker is down it
    /// is not declared lost. `null` before the first reading.
    pub last_source: Option<Source>,
    /// Battery percentage last reported; `null` when it never reported one.
    pub battery: Option<u8>,
    /// Tamper flag last reported; `null` when it never reported one.
    pub tamper: Option<bool>,
    /// Fault code set now; `null`: none.
    pub fault: Option<String>,
    /// While a `sensor.state_held` of its current state is open: since when the state has
    /// held (latch's clock); `null` otherwise.
    pub held_since: Option<String>,
    /// Whether it flaps now (its state changes are not sent until it stops).
    pub flapping: bool,
}

impl From<SensorStatus> for StatusOut {
    fn from(s: SensorStatus) -> Self {
        Self {
            data: s.data.map(u8::from),
            changed_at: s.changed_at.map(time::format),
            last_seen_at: s.last_seen_at.map(time::format),
            connection: s.connection,
            last_source: s.last_source,
            battery: s.signals.battery,
            tamper: s.signals.tamper,
            fault: s.signals.fault.map(|f| f.to_string()),
            held_since: s.hold.filter(|h| h.sent > 0).map(|h| time::format(h.since)),
            flapping: s.flapping,
        }
    }
}

pub fn sensor_out((s, status): SensorView) -> SensorOut {
    SensorOut {
        id: s.id.to_string(),
        address: s.address,
        heartbeat_timeout_s: s.heartbeat_timeout_s,
        debounce_s: s.debounce_s,
        site_id: s.site_id,
        battery_low_pct: s.battery_low_pct,
        labels: (!s.labels.is_empty()).then_some(s.labels),
        hold_alarms: s.hold_alarms.to_list(),
        flap: s.flap,
        armed: s.armed,
        created_at: time::format(s.created_at),
        status: status.into(),
    }
}

fn check_fields(address: &str, timeout: Option<u32>, debounce: Option<u32>) -> ApiResult<()> {
    validate_address(address).map_err(ApiError::invalid)?;
    if let Some(t) = timeout
        && !(1..=MAX_TIMEOUT_S).contains(&t)
    {
        return Err(ApiError::invalid(format!(
            "heartbeat_timeout_s must be between 1 and {MAX_TIMEOUT_S}, got {t}"
        )));
    }
    if let Some(d) = debounce
        && d > MAX_DEBOUNCE_S
    {
        return Err(ApiError::invalid(format!(
            "debounce_s must be between 0 and {MAX_DEBOUNCE_S}, got {d}"
        )));
    }
    Ok(())
}

/// The door-alarm settings a create or replace asks for, checked.
fn alarms(
    battery_low_pct: Option<u32>,
    labels: Option<Labels>,
    hold_alarms: Option<Vec<HoldAlarm>>,
    flap: Option<Flap>,
    armed: Option<Armed>,
) -> ApiResult<SensorAlarms> {
    let battery_low_pct = match battery_low_pct {
        None => DEFAULT_BATTERY_LOW_PCT,
        Some(p) if p <= 100 => p as u8,
        Some(p) => {
            return Err(ApiError::invalid(format!(
                "battery_low_pct must be between 0 and 100, got {p}"
            )));
        }
    };
    let labels = labels.unwrap_or_default();
    labels.validate().map_err(ApiError::invalid)?;
    let hold_alarms =
        HoldAlarms::from_list(&hold_alarms.unwrap_or_default()).map_err(ApiError::invalid)?;
    if let Some(f) = &flap {
        f.validate().map_err(ApiError::invalid)?;
    }
    if let Some(a) = &armed {
        a.validate().map_err(ApiError::invalid)?;
    }
    Ok(SensorAlarms {
        battery_low_pct,
        labels,
        hold_alarms,
        flap,
        armed,
    })
}

/// `?connection=` and `?q=` filters of the sensor list.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SensorListParams {
    /// `online`, `lost` or `unknown` (never reported).
    pub connection: Option<String>,
    /// Search: sensors whose id starts with it (case kept), or whose address has a word
    /// starting with each of its words (case and accents aside).
    pub q: Option<String>,
    /// Only the sensors of this site (`/v1/sites`); a site that does not exist has none.
    pub site_id: Option<String>,
    /// Only sensors whose last reported battery is below this (strictly; 0–101).
    pub battery_below: Option<u32>,
    /// `true`: only sensors whose tamper flag is up; `false`: only those whose is not.
    pub tamper: Option<bool>,
    /// `true`: only sensors whose state has held too long (a `sensor.state_held` open);
    /// `false`: the others.
    pub held: Option<bool>,
    /// `true`: only sensors flapping now; `false`: the others.
    pub flapping: Option<bool>,
    /// `true`: only sensors whose battery is low (a `sensor.battery_low` open, until
    /// `sensor.battery_ok`); `false`: the others.
    pub battery_low: Option<bool>,
}

impl Params for SensorListParams {}

/// Register a sensor.
#[utoipa::path(post, path = "/v1/sensors", tag = "sensors", request_body = SensorCreate,
    responses((status = 201, body = SensorOut), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn create_sensor(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<SensorCreate>,
) -> ApiResult<(StatusCode, ApiJson<SensorOut>)> {
    let id = SensorId::parse(&body.id)
        .map_err(|e| ApiError::invalid(format!("id: {e} (got {:?})", body.id)))?;
    check_fields(&body.address, body.heartbeat_timeout_s, body.debounce_s)?;
    let alarms = alarms(
        body.battery_low_pct,
        body.labels,
        body.hold_alarms,
        body.flap,
        body.armed,
    )?;
    let sensor = st
        .app
        .create_sensor(
            id,
            body.address,
            body.heartbeat_timeout_s,
            body.debounce_s,
            body.site_id,
            alarms,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        ApiJson(sensor_out((sensor, SensorStatus::default()))),
    ))
}

/// A `?connection=` filter of a sensors' list: `online`, `lost` or `unknown`.
pub(super) fn connection_filter(c: Option<&str>) -> Result<Option<Connection>, ApiError> {
    c.map(|c| {
        Connection::parse(c).ok_or_else(|| {
            ApiError::bad_request(format!(
                "connection must be online, lost or unknown, got {c:?}"
            ))
        })
    })
    .transpose()
}

/// List sensors, by id; `q` finds them by id prefix or address words, `site_id` keeps a
/// site's.
#[utoipa::path(get, path = "/v1/sensors", tag = "sensors", params(PageParams, SensorListParams),
    responses((status = 200, body = List<SensorOut>)))]
async fn list_sensors(
    State(st): State<AppState>,
    ApiQuery((page, filter)): ApiQuery<(PageParams, SensorListParams)>,
) -> ApiResult<ApiJson<List<SensorOut>>> {
    let connection = connection_filter(filter.connection.as_deref())?;
    let site = filter.site_id.filter(|s| !s.is_empty());
    let page = page.to_request()?;
    let search = super::search(filter.q.as_deref())?;
    let battery_below = match filter.battery_below {
        None => None,
        Some(b) if b <= 101 => Some(b as u8),
        Some(b) => {
            return Err(ApiError::bad_request(format!(
                "battery_below must be between 0 and 101, got {b}"
            )));
        }
    };
    let filter = SensorFilter {
        connection,
        battery_below,
        tamper: filter.tamper,
        held: filter.held,
        flapping: filter.flapping,
        battery_low: filter.battery_low,
    };
    let page = st.app.sensors(search, filter, site, page).await?;
    Ok(ApiJson(List::from_page(page, sensor_out)))
}

/// Read a sensor and its status.
#[utoipa::path(get, path = "/v1/sensors/{id}", tag = "sensors", params(("id" = String, Path)),
    responses((status = 200, body = SensorOut), (status = 404, body = ErrorBody)))]
async fn get_sensor(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<SensorOut>> {
    let id = parse_sensor_id(&id)?;
    let view = st
        .app
        .sensor(id)
        .await?
        .ok_or_else(|| ApiError::not_found("sensor"))?;
    Ok(ApiJson(sensor_out(view)))
}

/// Replace a sensor's address, heartbeat timeout and debounce window (a window changed
/// while one is open counts from that window's start).
#[utoipa::path(put, path = "/v1/sensors/{id}", tag = "sensors", params(("id" = String, Path)),
    request_body = SensorReplace,
    responses((status = 200, body = SensorOut), (status = 404, body = ErrorBody),
        (status = 409, description = "an id in the body differs from the path", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn replace_sensor(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SensorReplace>,
) -> ApiResult<ApiJson<SensorOut>> {
    let id = parse_sensor_id(&id)?;
    replace(&st, id, body).await.map(ApiJson)
}

/// The sensor `id` replaced by `body`: a `PUT`, or a `PATCH` merged into what a `GET`
/// shows.
pub(super) async fn replace(
    st: &AppState,
    id: SensorId,
    body: SensorReplace,
) -> ApiResult<SensorOut> {
    if let Some(body_id) = &body.id
        && body_id != &id.to_string()
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!("id in the body ({body_id:?}) does not match the path ({id})"),
        ));
    }
    check_fields(&body.address, body.heartbeat_timeout_s, body.debounce_s)?;
    let alarms = alarms(
        body.battery_low_pct,
        body.labels,
        body.hold_alarms,
        body.flap,
        body.armed,
    )?;
    let view = st
        .app
        .replace_sensor(
            id,
            body.address,
            body.heartbeat_timeout_s,
            body.debounce_s,
            body.site_id,
            alarms,
        )
        .await?
        .ok_or_else(|| ApiError::not_found("sensor"))?;
    Ok(sensor_out(view))
}

/// Delete a sensor with its links, state and history; its pending notifications are cancelled.
#[utoipa::path(delete, path = "/v1/sensors/{id}", tag = "sensors", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody),
        (status = 503, description = "the store is unavailable; nothing was deleted", body = ErrorBody)))]
async fn delete_sensor(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    let id = parse_sensor_id(&id)?;
    if !st.app.delete_sensor(id).await? {
        return Err(ApiError::not_found("sensor"));
    }
    Ok(StatusCode::NO_CONTENT)
}
