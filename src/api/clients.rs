//! `/v1/clients` and the links between clients and sensors.

use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, ApiResult, ErrorBody, parse_sensor_id};
use super::pagination::{List, PageParams};
use super::sensors::{SensorOut, sensor_out};
use crate::delivery::guard::Guard;
use crate::domain::client::{
    generate_secret, new_client_id, secret_key, validate_name, validate_url,
};
use crate::domain::{Client, time};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_client, list_clients))
        .routes(routes!(get_client, replace_client, delete_client))
        .routes(routes!(link, unlink))
        .routes(routes!(client_sensors))
        .routes(routes!(sensor_clients))
}

/// A client to create, or a client's replacement.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientIn {
    pub name: String,
    /// Webhook URL, http or https (only https when `LATCH_DELIVERY_HTTPS_ONLY` is set). Its
    /// address, or every address its name resolves to, must be globally routable unless
    /// `LATCH_DELIVERY_ALLOW_NETS` lets it through: otherwise 422.
    #[schema(example = "https://example.com/hooks/latch")]
    pub url: String,
    /// `whsec_` + base64 of a 16 to 64 byte key. Generated on create when absent; kept on
    /// replace when absent.
    pub secret: Option<String>,
}

/// A client. `secret` is shown when reading one client, not in lists.
#[derive(Serialize, ToSchema)]
pub struct ClientOut {
    pub id: String,
    pub name: String,
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    pub created_at: String,
}

fn client_out(c: Client, with_secret: bool) -> ClientOut {
    ClientOut {
        id: c.id,
        name: c.name,
        url: c.url,
        secret: with_secret.then_some(c.secret),
        created_at: time::format(c.created_at),
    }
}

fn check(body: &ClientIn) -> ApiResult<()> {
    validate_name(&body.name).map_err(ApiError::invalid)?;
    validate_url(&body.url).map_err(ApiError::invalid)?;
    if let Some(s) = &body.secret {
        secret_key(s).map_err(ApiError::invalid)?;
    }
    Ok(())
}

/// The SSRF guard's verdict on a client's URL: its scheme when only https is allowed, its
/// literal address, or the addresses its name resolves to now. Every attempt is checked
/// again at connect time; this is so a user hears why at once.
async fn vet_url(st: &AppState, url: &str) -> ApiResult<()> {
    Guard::from_config(&st.config)
        .vet(url)
        .await
        .map_err(|r| ApiError::invalid(format!("url is not allowed: {r}")))
}

/// Register a client; its id (and secret, unless given) are generated. A URL whose address
/// is not globally routable (loopback, private, link-local, …; or a name resolving only to
/// such addresses) is refused with 422 unless `LATCH_DELIVERY_ALLOW_NETS` lets it through,
/// and so is an `http://` URL under `LATCH_DELIVERY_HTTPS_ONLY`.
#[utoipa::path(post, path = "/v1/clients", tag = "clients", request_body = ClientIn,
    responses((status = 201, body = ClientOut), (status = 422, body = ErrorBody)))]
async fn create_client(
    State(st): State<AppState>,
    ApiJson(body): ApiJson<ClientIn>,
) -> ApiResult<(StatusCode, ApiJson<ClientOut>)> {
    check(&body)?;
    vet_url(&st, &body.url).await?;
    let client = Client {
        id: new_client_id(),
        name: body.name,
        url: body.url,
        secret: body.secret.unwrap_or_else(generate_secret),
        created_at: time::now_ms(),
    };
    st.store.create_client(client.clone()).await?;
    Ok((StatusCode::CREATED, ApiJson(client_out(client, true))))
}

/// List clients, oldest first.
#[utoipa::path(get, path = "/v1/clients", tag = "clients", params(PageParams),
    responses((status = 200, body = List<ClientOut>)))]
async fn list_clients(
    State(st): State<AppState>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<ApiJson<List<ClientOut>>> {
    let page = st.store.list_clients(page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, |c| client_out(c, false))))
}

/// Read a client, with its secret.
#[utoipa::path(get, path = "/v1/clients/{id}", tag = "clients", params(("id" = String, Path)),
    responses((status = 200, body = ClientOut), (status = 404, body = ErrorBody)))]
async fn get_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<ClientOut>> {
    let c = st
        .store
        .get_client(id)
        .await?
        .ok_or_else(|| ApiError::not_found("client"))?;
    Ok(ApiJson(client_out(c, true)))
}

/// Replace a client's name, URL and (when given) secret. Pending notifications go to the
/// new URL from their next attempt on. The URL is checked as on create (422 when not
/// allowed).
#[utoipa::path(put, path = "/v1/clients/{id}", tag = "clients", params(("id" = String, Path)),
    request_body = ClientIn,
    responses((status = 200, body = ClientOut), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn replace_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ClientIn>,
) -> ApiResult<ApiJson<ClientOut>> {
    check(&body)?;
    vet_url(&st, &body.url).await?;
    let current = st
        .store
        .get_client(id)
        .await?
        .ok_or_else(|| ApiError::not_found("client"))?;
    let client = Client {
        name: body.name,
        url: body.url,
        secret: body.secret.unwrap_or(current.secret),
        ..current
    };
    if !st.store.replace_client(client.clone()).await? {
        return Err(ApiError::not_found("client"));
    }
    Ok(ApiJson(client_out(client, true)))
}

/// Delete a client and its links; its pending notifications are cancelled.
#[utoipa::path(delete, path = "/v1/clients/{id}", tag = "clients", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    if !st.store.delete_client(id, st.engine.now()).await? {
        return Err(ApiError::not_found("client"));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Link a sensor to a client (idempotent).
#[utoipa::path(put, path = "/v1/clients/{id}/sensors/{sensor_id}", tag = "links",
    params(("id" = String, Path), ("sensor_id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn link(
    State(st): State<AppState>,
    ApiPath((client_id, sensor_id)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let sensor_id = parse_sensor_id(&sensor_id)?;
    st.store.link(client_id, sensor_id, st.engine.now()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Unlink a sensor from a client (idempotent); its pending notifications to the client are
/// cancelled at their next attempt.
#[utoipa::path(delete, path = "/v1/clients/{id}/sensors/{sensor_id}", tag = "links",
    params(("id" = String, Path), ("sensor_id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn unlink(
    State(st): State<AppState>,
    ApiPath((client_id, sensor_id)): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    let sensor_id = parse_sensor_id(&sensor_id)?;
    st.store.unlink(client_id, sensor_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The sensors linked to a client.
#[utoipa::path(get, path = "/v1/clients/{id}/sensors", tag = "links",
    params(("id" = String, Path), PageParams),
    responses((status = 200, body = List<SensorOut>), (status = 404, body = ErrorBody)))]
async fn client_sensors(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<ApiJson<List<SensorOut>>> {
    let page = st.store.list_client_sensors(id, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, sensor_out)))
}

/// The clients linked to a sensor.
#[utoipa::path(get, path = "/v1/sensors/{id}/clients", tag = "links",
    params(("id" = String, Path), PageParams),
    responses((status = 200, body = List<ClientOut>), (status = 404, body = ErrorBody)))]
async fn sensor_clients(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<ApiJson<List<ClientOut>>> {
    let id = parse_sensor_id(&id)?;
    let page = st.store.list_sensor_clients(id, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, |c| client_out(c, false))))
}
