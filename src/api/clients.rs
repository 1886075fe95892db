//! `/v1/clients` and the links between clients and sensors.

use crate::domain::escalation::Escalation;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiPath, ApiResult, ErrorBody, is_json, parse_sensor_id};
use super::pagination::{List, PageParams};
use super::query::{ApiQuery, Params};
use super::receivers::{AuthIn, AuthOut, Given, TlsIn, TlsOut, check_new_origin, settle};
use super::sensors::{SensorOut, sensor_out};
use crate::delivery::destination::validate_url;
use crate::delivery::guard::Guard;
use crate::domain::client::{
    Batch, DisabledReason, Health, generate_secret, new_client_id, secret_key, validate_batch,
    validate_events, validate_name, validate_rate_limit,
};
use crate::domain::{Client, Millis, destination, time};
use std::collections::BTreeMap;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_client, list_clients))
        .routes(routes!(get_client, replace_client, delete_client))
        .routes(routes!(link, unlink))
        .routes(routes!(client_sensors))
        .routes(routes!(sensor_clients))
        .routes(routes!(rotate_secret))
        .routes(routes!(enable_client))
        .routes(routes!(test_client))
}

/// A client to create, or a client's replacement.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientIn {
    pub name: String,
    /// Where notifications go: a webhook URL (`http(s)://`, only https when
    /// `LATCH_DELIVERY_HTTPS_ONLY` is set), an MQTT topic
    /// (`mqtt://[user:password@]host[:port]/topic`, published at QoS 1) or an AMQP exchange
    /// (`amqp://[user:password@]host[:port][/vhost]?exchange=NAME&routing_key=KEY`,
    /// persistent, mandatory, with publisher confirms). A topic or routing key may hold
    /// `{sensor_id}` and `{type}`, filled in per notification. Its address, or every
    /// address its name resolves to, must be globally routable unless
    /// `LATCH_DELIVERY_ALLOW_NETS` lets it through: otherwise 422. No TLS to brokers in
    /// this build: `mqtts://` and `amqps://` are refused.
    #[schema(example = "https://example.com/hooks/latch")]
    pub url: String,
    /// `whsec_` + base64 of a 16 to 64 byte key. Generated on create when absent; kept on
    /// replace when absent.
    pub secret: Option<String>,
    /// Most webhook requests per second latch sends this client (evenly spaced, from all
    /// nodes of a cluster together); absent: only the concurrency limits.
    #[schema(minimum = 1, maximum = 10000)]
    #[serde(default, deserialize_with = "super::whole_number")]
    pub rate_limit: Option<u32>,
    /// The notification types it wants, as `GET /v1/event-types` lists them (`client.test`
    /// may be listed too, and is sent on request whatever the list says). Other types make no notification for
    /// it at all. Absent or `null`: all, including types added later; on replace too.
    #[schema(example = json!(["sensor.connection_lost", "sensor.connection_restored"]))]
    #[serde(default)]
    pub events: Option<Vec<String>>,
    /// Several notifications in one request: `{"id", "type": "batch", "events": [...]}`,
    /// each event exactly the notification it would have been alone (its own `id`),
    /// signed over the whole body with the batch id as `webhook-id`. For webhook URLs: a
    /// broker destination gets one message a notification whatever this says. Absent or
    /// `null`: one request a notification; on replace too.
    #[serde(default)]
    pub batch: Option<BatchIo>,
    /// Headers sent on every webhook request, `{name: value}`; values are write-only (read
    /// back as `"[redacted]"`). A broker destination does not use `headers`, `auth` or
    /// `tls` (its credentials are in its URL). Not `host`, `content-length`, `content-type`,
    /// `content-encoding`, `user-agent`, `webhook-*` or a hop-by-hop header (latch sets
    /// those), nor `authorization` together with `auth`. On replace: absent keeps them,
    /// `null` removes them, and a value `"[redacted]"` keeps that header's value.
    #[serde(default, deserialize_with = "super::receivers::present")]
    #[schema(value_type = Option<BTreeMap<String, String>>, nullable)]
    pub headers: Option<Option<BTreeMap<String, String>>>,
    /// How latch authenticates to the receiver; its secret is write-only. On replace:
    /// absent keeps it, `null` removes it.
    #[serde(default, deserialize_with = "super::receivers::present_object")]
    #[schema(value_type = Option<AuthIn>, nullable)]
    pub auth: Option<Option<AuthIn>>,
    /// A client certificate for mutual TLS; its key is write-only. On replace: absent
    /// keeps it, `null` removes it.
    #[serde(default, deserialize_with = "super::receivers::present_object")]
    #[schema(value_type = Option<TlsIn>, nullable)]
    pub tls: Option<Option<TlsIn>>,
    /// Who is next when it leaves an alarm untaken: `{after_s, to}` — an alarm sent to
    /// it, still open and not acknowledged `after_s` (1–604800) after that notification
    /// was delivered or failed, goes to client `to` as `alarm.escalated`, whose own
    /// escalation continues the chain (five levels at most; a circle is refused). Absent
    /// or `null`: nobody; on replace too.
    #[serde(default)]
    pub escalation: Option<Escalation>,
    /// Read-only, as shown; on replace it must be the path's, on create it must be absent.
    #[serde(default)]
    #[schema(read_only)]
    pub id: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only)]
    pub created_at: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only)]
    pub previous_secret_expires_at: Option<String>,
    /// Read-only, as shown; ignored (`POST /v1/clients/{id}/enable` resumes).
    #[serde(default)]
    #[schema(read_only)]
    pub disabled_at: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only)]
    pub disabled_reason: Option<String>,
    /// Read-only, as shown; ignored.
    #[serde(default)]
    #[schema(read_only, value_type = Option<Object>)]
    pub health: Option<serde_json::Map<String, serde_json::Value>>,
}

impl ClientIn {
    /// The receiver settings given, taken out of the body.
    fn given(&mut self) -> Given {
        Given {
            headers: self.headers.take(),
            auth: self.auth.take(),
            tls: self.tls.take(),
        }
    }
}

/// A client's batching: requests of up to `max_events` notifications, the first waiting
/// at most `max_wait_ms` for others to join it. One batch of a client is in flight at a
/// time (per node); a failed batch is retried as the same batch (same id).
#[derive(Serialize, Deserialize, ToSchema, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct BatchIo {
    #[schema(minimum = 1, maximum = 1000)]
    #[serde(deserialize_with = "super::whole")]
    pub max_events: u32,
    #[schema(minimum = 0, maximum = 10000)]
    #[serde(deserialize_with = "super::whole")]
    pub max_wait_ms: u32,
}

impl From<BatchIo> for Batch {
    fn from(b: BatchIo) -> Self {
        Batch {
            max_events: b.max_events,
            max_wait_ms: b.max_wait_ms,
        }
    }
}

impl From<Batch> for BatchIo {
    fn from(b: Batch) -> Self {
        BatchIo {
            max_events: b.max_events,
            max_wait_ms: b.max_wait_ms,
        }
    }
}

/// A client. `secret` is shown when reading one client, not in lists.
#[derive(Serialize, ToSchema)]
pub struct ClientOut {
    pub id: String,
    pub name: String,
    /// Where its notifications go. The password of a broker destination is a secret: it
    /// is shown as `***` to a token that may not see secrets (`read`).
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    pub created_at: String,
    pub rate_limit: Option<u32>,
    /// The notification types it wants; `null`: all.
    pub events: Option<Vec<String>>,
    /// Its batching; `null`: one request a notification.
    pub batch: Option<BatchIo>,
    /// Until when requests also carry a signature with the secret the last rotation
    /// replaced.
    pub previous_secret_expires_at: Option<String>,
    /// When latch stopped sending to it; `POST /v1/clients/{id}/enable` resumes.
    pub disabled_at: Option<String>,
    pub disabled_reason: Option<DisabledReason>,
    /// Its headers' names, each with the value `"[redacted]"`.
    pub headers: BTreeMap<String, String>,
    /// How latch authenticates to it, without the secret; `null`: no authentication.
    pub auth: Option<AuthOut>,
    /// Its client certificate; `null`: none.
    pub tls: Option<TlsOut>,
    /// Who is next when it leaves an alarm untaken; `null`: nobody.
    pub escalation: Option<Escalation>,
    /// How its endpoint has been answering; only when reading one client.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthOut>,
}

/// A client's endpoint health, from its attempts and notifications.
#[derive(Serialize, ToSchema)]
pub struct HealthOut {
    pub last_success_at: Option<String>,
    pub last_failure_at: Option<String>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// Failed attempts since the last delivered one.
    pub consecutive_failures: u64,
    /// Delivered attempts / attempts over the last hour; `null` without attempts.
    pub success_ratio_1h: Option<f64>,
    /// Attempt duration percentiles over the last hour.
    pub latency_p50_ms_1h: Option<u32>,
    pub latency_p99_ms_1h: Option<u32>,
    /// Its notifications pending, and failed (dead letters).
    pub pending: u64,
    pub failed: u64,
    /// The last hour in twelve 5-minute slices, oldest first: attempts, failed ones and
    /// their median duration, for a chart of its recent deliveries.
    pub series_1h: Vec<HealthSliceOut>,
}

/// Five minutes of a client's attempts.
#[derive(Serialize, ToSchema)]
pub struct HealthSliceOut {
    /// Start of the slice.
    pub at: String,
    pub attempts: u64,
    pub failed: u64,
    /// Median attempt duration; `null` without attempts.
    pub latency_p50_ms: Option<u32>,
}

impl From<Health> for HealthOut {
    fn from(h: Health) -> Self {
        Self {
            last_success_at: h.last_success_at.map(time::format),
            last_failure_at: h.last_failure_at.map(time::format),
            last_error: h.last_error,
            consecutive_failures: h.consecutive_failures,
            success_ratio_1h: h.success_ratio_1h,
            latency_p50_ms_1h: h.latency_p50_ms_1h,
            latency_p99_ms_1h: h.latency_p99_ms_1h,
            pending: h.pending,
            failed: h.failed,
            series_1h: h
                .series_1h
                .into_iter()
                .map(|b| HealthSliceOut {
                    at: time::format(b.at),
                    attempts: b.attempts,
                    failed: b.failed,
                    latency_p50_ms: b.latency_p50_ms,
                })
                .collect(),
        }
    }
}

/// A client as the API shows it at `now`: with its signing secret when `with_secret`;
/// with the password in a broker URL only when `sees_secrets` (the caller may see
/// secrets).
pub(super) fn client_out(
    c: Client,
    with_secret: bool,
    sees_secrets: bool,
    now: Millis,
) -> ClientOut {
    let shown = super::receivers::shown(&c.receiver);
    ClientOut {
        id: c.id,
        name: c.name,
        url: if sees_secrets {
            c.url
        } else {
            destination::redact(&c.url)
        },
        secret: with_secret.then_some(c.secret),
        created_at: time::format(c.created_at),
        rate_limit: c.rate_limit,
        events: c.events,
        batch: c.batch.map(BatchIo::from),
        previous_secret_expires_at: c
            .previous_secret_until
            .filter(|until| *until > now && c.previous_secret.is_some())
            .map(time::format),
        disabled_at: c.disabled_at.map(time::format),
        disabled_reason: c.disabled_reason,
        headers: shown.headers,
        auth: shown.auth,
        tls: shown.tls,
        escalation: c.escalation,
        health: None,
    }
}

fn check(body: &ClientIn) -> ApiResult<()> {
    validate_name(&body.name).map_err(ApiError::invalid)?;
    validate_url(&body.url).map_err(ApiError::invalid)?;
    if let Some(s) = &body.secret {
        secret_key(s).map_err(ApiError::invalid)?;
    }
    validate_rate_limit(body.rate_limit).map_err(ApiError::invalid)?;
    if let Some(events) = &body.events {
        validate_events(events).map_err(ApiError::invalid)?;
    }
    validate_batch(body.batch.map(Batch::from)).map_err(ApiError::invalid)?;
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
    ApiJson(mut body): ApiJson<ClientIn>,
) -> ApiResult<(StatusCode, ApiJson<ClientOut>)> {
    if body.id.is_some() {
        return Err(ApiError::invalid(
            "id is made by latch on create: leave it out",
        ));
    }
    check(&body)?;
    vet_url(&st, &body.url).await?;
    let guard = Guard::from_config(&st.config);
    let receiver = settle(body.given(), None, &guard, st.app.now()).await?;
    let client = Client {
        id: new_client_id(),
        name: body.name,
        url: body.url,
        secret: body.secret.unwrap_or_else(generate_secret),
        created_at: st.app.now(),
        rate_limit: body.rate_limit,
        events: body.events,
        batch: body.batch.map(Batch::from),
        receiver,
        escalation: body.escalation,
        ..Client::default()
    };
    st.app.create_client(&client).await?;
    Ok((
        StatusCode::CREATED,
        ApiJson(client_out(client, true, true, st.app.now())),
    ))
}

/// Filters of the client list.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ClientParams {
    /// `true`: only disabled clients; `false`: only enabled ones.
    pub disabled: Option<bool>,
    /// Search: clients whose name holds it (case aside).
    pub q: Option<String>,
}

impl Params for ClientParams {}

/// List clients, oldest first; `q` finds them by name.
#[utoipa::path(get, path = "/v1/clients", tag = "clients", params(ClientParams, PageParams),
    responses((status = 200, body = List<ClientOut>)))]
async fn list_clients(
    State(st): State<AppState>,
    axum::Extension(sees): axum::Extension<super::SeesSecrets>,
    ApiQuery((f, page)): ApiQuery<(ClientParams, PageParams)>,
) -> ApiResult<ApiJson<List<ClientOut>>> {
    let search = super::search(f.q.as_deref())?;
    let page = st
        .app
        .clients(search, f.disabled, page.to_request()?)
        .await?;
    Ok(ApiJson(List::from_page(page, |c| {
        client_out(c, false, sees.0, st.app.now())
    })))
}

/// Read a client, with its endpoint's health and (to an admin, or on an open API) its
/// secret.
#[utoipa::path(get, path = "/v1/clients/{id}", tag = "clients", params(("id" = String, Path)),
    responses((status = 200, body = ClientOut), (status = 404, body = ErrorBody)))]
async fn get_client(
    State(st): State<AppState>,
    axum::Extension(sees): axum::Extension<super::SeesSecrets>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<ClientOut>> {
    let c = existing(&st, id.clone()).await?;
    let health = st.app.client_health(id).await?;
    Ok(ApiJson(ClientOut {
        health: health.map(HealthOut::from),
        ..client_out(c, sees.0, sees.0, st.app.now())
    }))
}

/// Replace a client's name, URL, (when given) secret, rate limit, `events` and `batch`; a
/// client as `GET` answers it, sent back unchanged, changes nothing. Pending
/// notifications go to the new URL from their next attempt on; `events` applies to
/// notifications made from then on. The URL is checked as on create (422 when not
/// allowed); a URL on another origin needs `headers` and `auth` given again (422 when they
/// would be kept).
#[utoipa::path(put, path = "/v1/clients/{id}", tag = "clients", params(("id" = String, Path)),
    request_body = ClientIn,
    responses((status = 200, body = ClientOut), (status = 404, body = ErrorBody),
        (status = 409, description = "an id in the body differs from the path", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
async fn replace_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ClientIn>,
) -> ApiResult<ApiJson<ClientOut>> {
    let current = existing(&st, id).await?;
    replace(&st, current, body).await.map(ApiJson)
}

/// The client `current` replaced by `body`: a `PUT`, or a `PATCH` merged into what a
/// `GET` shows. What it shows only (`created_at`, `health`, …) is ignored; its `id` must
/// be the client's; a URL as a `read` token sees it (`***` for a broker's password) keeps
/// the password.
pub(super) async fn replace(
    st: &AppState,
    current: Client,
    mut body: ClientIn,
) -> ApiResult<ClientOut> {
    if let Some(body_id) = &body.id
        && *body_id != current.id
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "id in the body ({body_id:?}) does not match the path ({})",
                current.id
            ),
        ));
    }
    if body.url != current.url && body.url == destination::redact(&current.url) {
        body.url = current.url.clone();
    }
    check(&body)?;
    vet_url(st, &body.url).await?;
    let guard = Guard::from_config(&st.config);
    let given = body.given();
    check_new_origin(&given, &current.receiver, &current.url, &body.url)?;
    let receiver = settle(given, Some(&current.receiver), &guard, st.app.now()).await?;
    let client = Client {
        name: body.name,
        url: body.url,
        secret: body.secret.unwrap_or(current.secret.clone()),
        rate_limit: body.rate_limit,
        events: body.events,
        batch: body.batch.map(Batch::from),
        receiver,
        escalation: body.escalation,
        ..current
    };
    if !st.app.replace_client(&client).await? {
        return Err(ApiError::not_found("client"));
    }
    Ok(client_out(client, true, true, st.app.now()))
}

/// The client `id`, or 404.
pub(super) async fn existing(st: &AppState, id: String) -> ApiResult<Client> {
    st.app
        .client(id)
        .await?
        .ok_or_else(|| ApiError::not_found("client"))
}

/// Delete a client and its links; its pending notifications are cancelled.
#[utoipa::path(delete, path = "/v1/clients/{id}", tag = "clients", params(("id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody)))]
async fn delete_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    if !st.app.delete_client(id).await? {
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
    st.app.link(client_id, sensor_id).await?;
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
    st.app.unlink(client_id, sensor_id).await?;
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
    let page = st.app.client_sensors(id, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, sensor_out)))
}

/// The clients linked to a sensor.
#[utoipa::path(get, path = "/v1/sensors/{id}/clients", tag = "links",
    params(("id" = String, Path), PageParams),
    responses((status = 200, body = List<ClientOut>), (status = 404, body = ErrorBody)))]
async fn sensor_clients(
    State(st): State<AppState>,
    axum::Extension(sees): axum::Extension<super::SeesSecrets>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<ApiJson<List<ClientOut>>> {
    let id = parse_sensor_id(&id)?;
    let page = st.app.sensor_clients(id, page.to_request()?).await?;
    Ok(ApiJson(List::from_page(page, |c| {
        client_out(c, false, sees.0, st.app.now())
    })))
}

/// A secret rotation: the new secret, or none to have one generated.
#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct RotateIn {
    /// `whsec_` + base64 of a 16 to 64 byte key.
    pub secret: Option<String>,
}

/// Rotate a client's secret (the body is optional). For `secret_rotation_grace` every
/// request carries two signatures in `webhook-signature`, `v1,<new> v1,<old>`, then only
/// the new one.
#[utoipa::path(post, path = "/v1/clients/{id}/secret/rotate", tag = "clients",
    params(("id" = String, Path)), request_body(content = Option<RotateIn>),
    responses((status = 200, body = ClientOut), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
async fn rotate_secret(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<ApiJson<ClientOut>> {
    // No body, or JSON `null`: a generated secret.
    let body: RotateIn = if body.iter().all(u8::is_ascii_whitespace) {
        RotateIn::default()
    } else if !is_json(&headers) {
        // As for every JSON body: no browser form posts one without a CORS preflight.
        return Err(ApiError::unsupported_media_type());
    } else {
        let value: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))?;
        match value {
            serde_json::Value::Null => RotateIn::default(),
            // Not an array: serde would read one as the struct's fields in order.
            serde_json::Value::Object(_) => serde_json::from_value(value)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?,
            _ => {
                return Err(ApiError::bad_request(
                    "the body must be a JSON object (or empty)",
                ));
            }
        }
    };
    if let Some(s) = &body.secret {
        secret_key(s).map_err(ApiError::invalid)?;
    }
    let grace = st.config.secret_rotation_grace.as_millis() as Millis;
    let secret = body.secret.unwrap_or_else(generate_secret);
    let c = st
        .app
        .rotate_secret(id, secret, grace)
        .await?
        .ok_or_else(|| ApiError::not_found("client"))?;
    tracing::info!(client_id = %c.id, "Rotated a client's secret.");
    Ok(ApiJson(client_out(c, true, true, st.app.now())))
}

/// Enable a disabled client: its pending notifications go out, in order per sensor.
#[utoipa::path(post, path = "/v1/clients/{id}/enable", tag = "clients",
    params(("id" = String, Path)),
    responses((status = 200, body = ClientOut), (status = 404, body = ErrorBody)))]
async fn enable_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<ClientOut>> {
    let c = st
        .app
        .enable_client(id)
        .await?
        .ok_or_else(|| ApiError::not_found("client"))?;
    Ok(ApiJson(client_out(c, true, true, st.app.now())))
}

/// What a test request came to.
#[derive(Serialize, ToSchema)]
pub struct TestOut {
    /// The receiver's HTTP status; `null` when none came (refused by the SSRF guard,
    /// connection failed, timed out).
    pub status: Option<u16>,
    pub duration_ms: u64,
    /// Why it did not succeed; `null` for a 2xx answer.
    pub error: Option<String>,
}

/// Send one signed `client.test` notification to the client's URL now, through the same
/// SSRF guard, signing (both secrets during a rotation's grace) and timeout as any
/// attempt, and answer what happened. It is not stored, not retried and not counted as an
/// attempt; it goes out whatever the client's `events` say, and also to a disabled client.
#[utoipa::path(post, path = "/v1/clients/{id}/test", tag = "clients",
    params(("id" = String, Path)),
    responses((status = 200, description = "the request was made (or refused by the guard): see `status` and `error`", body = TestOut),
        (status = 404, body = ErrorBody)))]
async fn test_client(
    State(st): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<ApiJson<TestOut>> {
    let client = existing(&st, id).await?;
    let r = st.app.test_client(&client).await;
    tracing::info!(client_id = %client.id, status = r.status_code, error = r.error.as_deref(),
        "Sent a test notification.");
    Ok(ApiJson(TestOut {
        status: r.status_code,
        duration_ms: r.duration.as_millis() as u64,
        error: r.error,
    }))
}
