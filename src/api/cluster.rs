//! `GET /v1/cluster`, and the node-to-node endpoints of cluster mode (not part of the
//! public API: authenticated by `cluster_secret`, absent from the OpenAPI document).

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::{ApiError, ApiJson, ApiResult, ErrorBody, is_json};
use crate::cluster::FOLLOW_PATH;
use crate::cluster::forward::{ForwardRequest, ForwardResponse, READINGS_PATH};
use crate::domain::reading::{self, RejectCode};
use crate::domain::{Rejection, time};
use crate::engine::Sequence;
use crate::store::Keyed;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_cluster))
}

/// Most bytes of one forwarded request (the forwarder sends at most 20,000 readings).
const MAX_FORWARD_BYTES: usize = 16 << 20;

/// The node-to-node routes, behind [`super::peers::admit`] (in [`super::router`]).
pub fn internal() -> axum::Router<AppState> {
    axum::Router::new()
        .route(READINGS_PATH, post(forwarded))
        .route(FOLLOW_PATH, post(follow))
        .route(super::rates::INTERNAL_PATH, get(super::rates::internal))
        .route(super::stream::INTERNAL_PATH, get(super::stream::internal))
        .layer(DefaultBodyLimit::max(MAX_FORWARD_BYTES))
}

/// The nodes of the cluster and how the partitions are spread over them.
#[derive(Serialize, ToSchema)]
pub struct ClusterOut {
    /// Partitions of the fleet, fixed when the database was first used.
    pub partitions: u32,
    /// How sensors map to partitions, fixed with them: `exchange` (the bucket RabbitMQ's
    /// consistent-hash exchange picks for the sensor id, so each partition's queue of
    /// `amqp_exchange` holds exactly its sensors) or `md5` (ranges of the MD5 of the id:
    /// databases whose cluster was formed before latch kept this choice, and the
    /// embedded store).
    #[schema(example = "exchange")]
    pub partitioning: &'static str,
    /// Live nodes (a heartbeat within the lease), by id.
    pub nodes: Vec<NodeOut>,
}

#[derive(Serialize, ToSchema)]
pub struct NodeOut {
    pub id: String,
    /// Where other nodes reach it; empty when it listens on a wildcard address without
    /// `node_advertise`.
    pub address: String,
    /// Its last heartbeat (the database's clock).
    pub heartbeat_at: String,
    /// Partitions whose lease it holds.
    pub partitions: u32,
}

/// The cluster: partitions and live nodes. On the embedded store, this one node serving
/// every partition.
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster",
    responses((status = 200, body = ClusterOut),
        (status = 503, description = "the store is unavailable", body = ErrorBody)))]
async fn get_cluster(State(st): State<AppState>) -> ApiResult<ApiJson<ClusterOut>> {
    let c = st.app.cluster().await?;
    let nodes = match c.nodes {
        // One node serving every partition.
        None => vec![NodeOut {
            id: st.node.clone(),
            address: st.address.clone(),
            heartbeat_at: time::format(st.app.now()),
            partitions: c.partitions,
        }],
        Some(nodes) => nodes
            .into_iter()
            .map(|n| NodeOut {
                id: n.id,
                address: n.address,
                heartbeat_at: time::format(n.heartbeat_at),
                partitions: n.partitions,
            })
            .collect(),
    };
    Ok(ApiJson(ClusterOut {
        partitions: c.partitions,
        partitioning: c.partitioning.scheme.as_str(),
        nodes,
    }))
}

/// Readings another node took in for partitions served here: applied here, in the order
/// of the batches, answered per reading once durable. Never forwarded again: a reading
/// of a partition not served here is refused as `store_unavailable` (send again).
///
/// Judged as `POST /v1/readings` judges them: a JSON body only, each `ts` held to the
/// bounds of [`reading::check`] and every reading stamped with this node's clock — the
/// owner's, which its sensors' deadlines are counted on.
async fn forwarded(State(st): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    if !is_json(&headers) {
        return ApiError::unsupported_media_type().into_response();
    }
    let req: ForwardRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", e.to_string())
                .into_response();
        }
    };
    // Checked whole before any batch goes in: a refusal applies nothing.
    if req.batches.iter().any(|b| {
        b.keyed
            .as_ref()
            .is_some_and(|k| k.positions.len() != b.readings.len())
    }) {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            "keyed.positions must name one position per reading",
        )
        .into_response();
    }
    // The sender's sequences, one here per request: the sender sends none of a sequence
    // behind a batch it was told did not commit, so one request is all this node sees.
    let mut sequences: HashMap<u64, Sequence> = HashMap::new();
    let mut tickets = Vec::with_capacity(req.batches.len());
    for b in req.batches {
        let n = b.readings.len();
        let now = st.ingest.now();
        let items = b
            .readings
            .into_iter()
            .map(|r| reading::check(r, now))
            .collect();
        let seq = b
            .sequence
            .map(|id| sequences.entry(id).or_default().clone());
        let keyed = b.keyed.map(|k| Keyed {
            key: k.key.into(),
            positions: k.positions,
        });
        tickets.push((
            n,
            st.ingest
                .enqueue_forwarded(b.source, items, now, seq.as_ref(), keyed.as_ref())
                .await,
        ));
    }
    let mut verdicts = Vec::with_capacity(tickets.len());
    for (n, ticket) in tickets {
        let report = match ticket {
            Ok(t) => t.wait().await,
            Err(e) => Err(e),
        };
        verdicts.push(match report {
            Ok(report) => {
                let mut v: Vec<Option<Rejection>> = vec![None; n];
                for (i, rej) in report.rejected {
                    v[i] = Some(rej);
                }
                v
            }
            Err(e) => vec![
                Some(Rejection::new(
                    RejectCode::StoreUnavailable,
                    format!("not stored ({e}); send it again"),
                ));
                n
            ],
        });
    }
    Json(ForwardResponse { verdicts }).into_response()
}

/// Another node changed the registry: read the changes now.
async fn follow(State(st): State<AppState>) -> Response {
    st.app.follow_now().await;
    StatusCode::NO_CONTENT.into_response()
}
