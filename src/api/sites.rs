//! `/v1/sites`: the buildings sensors are installed in, each with its sensors counted.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use super::sensors::{SensorOut, sensor_out};
use crate::app::sites::SiteFields;
use crate::domain::site::{Site, SiteCounts, check_site_id};
use crate::domain::{SensorId, time};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_site, list_sites))
        .routes(routes!(get_site, update_site, delete_site))
        .routes(routes!(site_sensors))
}

/// `?state=` of the site list.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SiteListParams {
    /// `down` or `up`.
    pub state: Option<String>,
}

impl Params for SiteListParams {}

/// `?connection=` of a site's sensors.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SiteSensorsParams {
    /// `online`, `lost` or `unknown` (never reported).
    pub connection: Option<String>,
}

impl Params for SiteSensorsParams {}

/// Longest name or address of a site.
pub const MAX_TEXT: usize = 512;

/// A site to create.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SiteCreate {
    /// 1 to 64 ASCII letters, digits, `-`, `_` and `.`.
    #[schema(example = "bldg-7")]
    pub id: String,
    #[schema(example = "Svobody 23")]
    pub name: Option<String>,
    pub address: Option<String>,
    /// A sensor whose loss alone means the site is down (its gateway).
    pub gateway_sensor_id: Option<String>,
}

/// Fields of a site to change; an absent one is kept, `null` clears it.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SitePatch {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub name: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub address: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub gateway_sensor_id: Option<Option<String>>,
}

/// A field given (even as `null`), told apart from one left out.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// A site with its sensors' state.
#[derive(Serialize, ToSchema)]
pub struct SiteOut {
    pub id: String,
    pub name: Option<String>,
    pub address: Option<String>,
    pub gateway_sensor_id: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub status: SiteStatusOut,
}

/// Whether a site is down now, and its sensors counted.
#[derive(Serialize, ToSchema)]
pub struct SiteStatusOut {
    /// `down` once latch decided so (`site.connection_lost`): its gateway sensor was lost,
    /// or at least `LATCH_SITE_DOWN_RATIO` of its sensors (and at least
    /// `LATCH_SITE_MIN_SENSORS`) were, `LATCH_SITE_GRACE` after the first loss; `up`
    /// again once that no longer holds (`site.connection_restored`).
    #[schema(example = "up")]
    pub state: String,
    /// When it went down or came back; `null` if it never went down.
    pub since: Option<String>,
    /// Sensors in the site.
    pub sensors: u64,
    /// Of those, lost now.
    pub lost: u64,
}

fn site_out((s, counts): (Site, SiteCounts)) -> SiteOut {
    SiteOut {
        id: s.id,
        name: s.name,
        address: s.address,
        gateway_sensor_id: s.gateway_sensor_id.map(|g| g.to_string()),
        created_at: time::format(s.created_at),
        updated_at: time::format(s.updated_at),
        status: SiteStatusOut {
            state: if counts.down { "down" } else { "up" }.into(),
            since: counts.since.map(time::format),
            sensors: counts.sensors,
            lost: counts.lost,
        },
    }
}

fn check_text(what: &str, v: Option<&str>) -> ApiResult<()> {
    if let Some(v) = v
        && (v.trim().is_empty() || v.chars().count() > MAX_TEXT)
    {
        return Err(ApiError::invalid(format!(
            "{what} must be 1 to {MAX_TEXT} characters, not blank"
        )));
    }
    Ok(())
}

fn gateway(g: Option<&str>) -> ApiResult<Option<SensorId>> {
    g.map(|g| {
        SensorId::parse(g)
            .map_err(|e| ApiError::invalid(format!("gateway_sensor_id: {e} (got {g:?})")))
    })
    .transpose()
}

/// Register a site.
#[utoipa::path(post, path = "/v1/sites", tag = "sites", request_body = SiteCreate,
    responses((status = 201, body = SiteOut), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn create_site(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<SiteCreate>,
) -> ApiResult<(StatusCode, ApiJson<SiteOut>)> {
    check_site_id(&body.id)
        .map_err(|e| ApiError::invalid(format!("id: {e} (got {:?})", body.id)))?;
    check_text("name", body.name.as_deref())?;
    check_text("address", body.address.as_deref())?;
    let fields = SiteFields {
        name: Some(body.name),
        address: Some(body.address),
        gateway_sensor_id: Some(gateway(body.gateway_sensor_id.as_deref())?),
    };
    let site = st.app.create_site(body.id, fields).await?;
    Ok((StatusCode::CREATED, ApiJson(site_out(site))))
}

/// List sites, by id; `?state=down` lists only the sites down (the console shows them
/// first), `?state=up` the others.
#[utoipa::path(get, path = "/v1/sites", tag = "sites", params(PageParams, SiteListParams),
    responses((status = 200, body = List<SiteOut>), (status = 400, body = ErrorBody)))]
async fn list_sites(
    State(st): State<AppState>,
    ApiQuery((page, filter)): ApiQuery<(PageParams, SiteListParams)>,
) -> ApiResult<ApiJson<List<SiteOut>>> {
    let down = match filter.state.as_deref() {
        None => None,
        Some("down") => Some(true),
        Some("up") => Some(false),
        Some(s) => {
            return Err(ApiError::bad_request(format!(
                "state must be down or up, got {s:?}"
            )));
        }
    };
    let page = st.app.sites(down, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, site_out)))
}

/// A site's sensors, by id, each with its status; `?connection=lost` lists those lost.
#[utoipa::path(get, path = "/v1/sites/{id}/sensors", tag = "sites",
    params(("id" = String, Path), PageParams, SiteSensorsParams),
    responses((status = 200, body = List<SensorOut>), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
async fn site_sensors(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery((page, filter)): ApiQuery<(PageParams, SiteSensorsParams)>,
) -> ApiResult<ApiJson<List<SensorOut>>> {
    let connection = super::sensors::connection_filter(filter.connection.as_deref())?;
    let page = page.to_request()?;
    let page = st
        .app
        .site_sensors(id, connection, page)
        .await?
        .ok_or_else(|| ApiError::not_found("site"))?;
    Ok(ApiJson(List::from_page(page, sensor_out)))
}

/// Read a site and its status.
#[utoipa::path(get, path = "/v1/sites/{id}", tag = "sites", params(("id" = String, Path)),
    responses((status = 200, body = SiteOut), (status = 404, body = ErrorBody)))]
async fn get_site(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<SiteOut>> {
    let site = st
        .app
        .site(id)
        .await?
        .ok_or_else(|| ApiError::not_found("site"))?;
    Ok(ApiJson(site_out(site)))
}

/// Change a site's name, address or gateway sensor.
#[utoipa::path(patch, path = "/v1/sites/{id}", tag = "sites", params(("id" = String, Path)),
    request_body(content = SitePatch, content_type = "application/merge-patch+json"),
    responses((status = 200, body = SiteOut), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn update_site(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SitePatch>,
) -> ApiResult<ApiJson<SiteOut>> {
    check_text("name", body.name.clone().flatten().as_deref())?;
    check_text("address", body.address.clone().flatten().as_deref())?;
    let gateway_sensor_id = match body.gateway_sensor_id {
        None => None,
        Some(g) => Some(gateway(g.as_deref())?),
    };
    let fields = SiteFields {
        name: body.name,
        address: body.address,
        gateway_sensor_id,
    };
    let site = st
        .app
        .update_site(id, fields)
        .await?
        .ok_or_else(|| ApiError::not_found("site"))?;
    Ok(ApiJson(site_out(site)))
}

/// Delete a site; its sensors stay, in no site, and what it held back of them goes to
/// their clients as their own.
#[utoipa::path(delete, path = "/v1/sites/{id}", tag = "sites", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_site(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    if !st.app.delete_site(id).await? {
        return Err(ApiError::not_found("site"));
    }
    Ok(StatusCode::NO_CONTENT)
}
