//! `GET /v1/fleet/rates`: the last hour of activity in 10-second buckets (readings, state
//! changes, attempts delivered and failed, sensors lost and restored), so the console's
//! charts are full at first paint. In a cluster, the node asked sums every live node's
//! ring ([`crate::telemetry::recent`]), each read over the node-to-node API for the same
//! buckets, so the sum is exact whichever node serves the page.

use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiJson, ApiResult};
use crate::domain::time;
use crate::telemetry::recent::{BUCKET_MS, BUCKETS, Measure, Series, bucket_of};

/// Path of a node's own ring, for the node summing the cluster's.
pub const INTERNAL_PATH: &str = "/internal/v1/rates";

/// How long a peer's ring may take: a slow node is left out (and named), not waited for.
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_rates))
}

/// Counts per 10-second bucket over the last hour, oldest first (360 each): the bucket
/// in progress is left out, so the newest is the last complete one.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RatesOut {
    /// Width of a bucket in seconds (10).
    pub bucket_s: u32,
    /// Start of the first bucket.
    pub from: String,
    /// End of the last bucket (exclusive).
    pub to: String,
    /// Nodes whose counts are in the sum (1 on the embedded store).
    pub nodes: u32,
    /// Live nodes that did not answer in time: their counts are missing from the sum.
    pub missing: Vec<String>,
    /// Readings made durable.
    pub readings: Vec<u64>,
    /// State changes (`sensor.state_changed` events).
    pub changes: Vec<u64>,
    /// Delivery attempts that delivered.
    pub delivered: Vec<u64>,
    /// Delivery attempts that failed (answers other than 2xx, timeouts, refusals).
    pub failed: Vec<u64>,
    /// Sensors declared lost.
    pub lost: Vec<u64>,
    /// Sensors restored.
    pub restored: Vec<u64>,
}

impl RatesOut {
    fn of(s: &Series, nodes: u32, missing: Vec<String>) -> Self {
        let col = |m| s.column(m).to_vec();
        let end = (s.end + 1) * BUCKET_MS;
        Self {
            bucket_s: (BUCKET_MS / 1000) as u32,
            from: time::format(end - BUCKETS as i64 * BUCKET_MS),
            to: time::format(end),
            nodes,
            missing,
            readings: col(Measure::Readings),
            changes: col(Measure::Changes),
            delivered: col(Measure::Delivered),
            failed: col(Measure::Failed),
            lost: col(Measure::Lost),
            restored: col(Measure::Restored),
        }
    }

    /// The series a peer answered, checked to be the buckets asked for.
    fn series(self, end: i64) -> Option<Series> {
        let columns = [
            self.readings,
            self.changes,
            self.delivered,
            self.failed,
            self.lost,
            self.restored,
        ];
        let to = time::parse(&self.to)?;
        (to == (end + 1) * BUCKET_MS && columns.iter().all(|c| c.len() == BUCKETS))
            .then_some(Series { end, columns })
    }
}

/// Activity over the last hour in 10-second buckets: readings, state changes, delivery
/// attempts delivered and failed, sensors lost and restored. In a cluster, summed over the
/// live nodes (`missing` names any that did not answer).
#[utoipa::path(get, path = "/v1/fleet/rates", tag = "sensors",
    responses((status = 200, body = RatesOut)))]
async fn get_rates(State(st): State<AppState>) -> ApiResult<ApiJson<RatesOut>> {
    let mine = st.recent.last_hour(st.app.now());
    let Some(c) = &st.peers else {
        return Ok(ApiJson(RatesOut::of(&mine, 1, Vec::new())));
    };
    let end = mine.end;
    let mut sum = mine;
    let mut nodes = 1;
    let mut missing = Vec::new();
    // The list of nodes is the database's; without it, this node's own counts still are.
    let peers = match c.peers().await {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "Could not list the cluster's nodes for the rates.");
            Vec::new()
        }
    };
    let asks = peers.into_iter().map(|p| async move {
        let answer = async {
            let resp = c
                .peer_get(&p.address, &format!("{INTERNAL_PATH}?end={end}"))
                .timeout(PEER_TIMEOUT)
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("status {}", resp.status()));
            }
            let out: RatesOut = resp.json().await.map_err(|e| e.to_string())?;
            out.series(end)
                .ok_or_else(|| "answered other buckets".to_string())
        }
        .await;
        (p.id, answer)
    });
    for (node, answer) in futures::future::join_all(asks).await {
        match answer {
            Ok(s) => {
                sum.add(&s);
                nodes += 1;
            }
            Err(e) => {
                tracing::warn!(%node, error = %e, "A node's rates did not come; left out of the sum.");
                missing.push(node);
            }
        }
    }
    Ok(ApiJson(RatesOut::of(&sum, nodes, missing)))
}

#[derive(Deserialize)]
pub(super) struct EndParam {
    /// The newest bucket wanted ([`bucket_of`]); the node's own latest complete one when
    /// absent.
    end: Option<i64>,
}

/// This node's own ring, for another node summing the cluster's (node-to-node: the
/// cluster secret).
pub(super) async fn internal(State(st): State<AppState>, Query(p): Query<EndParam>) -> Response {
    let now = st.app.now();
    let end = p.end.unwrap_or(bucket_of(now) - 1);
    axum::Json(RatesOut::of(&st.recent.ending(end), 1, Vec::new())).into_response()
}
