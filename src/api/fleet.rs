//! `GET /v1/fleet`: the fleet at a glance (the console's first page), from aggregate
//! queries, so it costs the same on ten sensors as on a million.

use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiJson, ApiResult};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_fleet))
}

/// Registered sensors by connection, sites down, and the notifications waiting to go out.
#[derive(Serialize, ToSchema)]
pub struct FleetOut {
    /// Every registered sensor.
    pub sensors: u64,
    /// Reporting within their heartbeat timeout.
    pub online: u64,
    /// Silent past their heartbeat timeout.
    pub lost: u64,
    /// Registered, never reported.
    pub unknown: u64,
    /// Sites whose decision says they are down now (`GET /v1/sites?state=down`), so a
    /// building gone dark reads as one site, not only as its lost sensors.
    pub sites_down: u64,
    /// Sensors whose state has held too long (a `sensor.state_held` open): doors held open.
    pub held: u64,
    /// Sensors whose battery is low (a `sensor.battery_low` open).
    pub battery_low: u64,
    /// Sensors flapping now.
    pub flapping: u64,
    /// Notifications not yet delivered (nor failed, superseded or cancelled).
    pub notifications_pending: u64,
    /// How far back history goes: the time of the oldest reading kept (older ones were
    /// deleted by retention, `LATCH_RETENTION_READINGS`), refreshed every few minutes;
    /// `null` when there is none (or latch has not looked yet, just after its start).
    pub history_from: Option<String>,
}

/// Counts of the fleet: sensors by connection, sites down, pending notifications.
#[utoipa::path(get, path = "/v1/fleet", tag = "sensors",
    responses((status = 200, body = FleetOut)))]
async fn get_fleet(State(st): State<AppState>) -> ApiResult<ApiJson<FleetOut>> {
    let f = st.app.fleet().await?;
    let (counts, sites) = (f.sensors, f.sites);
    Ok(ApiJson(FleetOut {
        sensors: counts.online + counts.lost + counts.unknown,
        online: counts.online,
        lost: counts.lost,
        unknown: counts.unknown,
        sites_down: sites.down,
        held: counts.held,
        battery_low: counts.battery_low,
        flapping: counts.flapping,
        notifications_pending: f.pending,
        history_from: f.history_from.map(crate::domain::time::format),
    }))
}
