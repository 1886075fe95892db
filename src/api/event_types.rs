//! `GET /v1/event-types`: every type of body latch sends, each with what it means, its
//! JSON Schema and an example — the event catalog of [`crate::delivery::catalog`], served
//! as it is. The console takes its choice of types from here rather than keep a list of
//! its own that falls behind (issue #70: a list without the site types unsubscribed a
//! client from them when saved).

use serde::Serialize;
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::ApiJson;
use crate::delivery::catalog::catalog;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(event_types))
}

/// A type of notification body: a notification's `type` (as a client's `events` names
/// it), `client.test`, or `batch` (the envelope of a client's batches).
#[derive(Serialize, ToSchema)]
pub struct EventType {
    /// The body's `type`.
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    pub kind: String,
    /// What a body of this type tells, in one line.
    pub description: String,
    /// The JSON Schema (draft 2020-12) of the body, whole in itself (no `$ref`).
    #[schema(value_type = Object)]
    pub schema: Value,
    /// A body of this type, as latch builds it.
    #[schema(value_type = Object)]
    pub example: Value,
}

/// Every type of body.
#[derive(Serialize, ToSchema)]
pub struct EventTypes {
    pub items: Vec<EventType>,
}

/// The list, as served and as the document's example.
pub fn list() -> EventTypes {
    EventTypes {
        items: catalog()
            .iter()
            .map(|t| EventType {
                kind: t.kind.to_string(),
                description: t.description.to_string(),
                schema: t.schema.clone(),
                example: t.example.clone(),
            })
            .collect(),
    }
}

/// The document's example of the answer: the list itself.
pub fn example() -> serde_json::Value {
    json!(list())
}

/// List every type of notification body latch sends (the types a client may choose in its
/// `events`, `client.test` and `batch`), each with what it means, its JSON Schema and an
/// example.
#[utoipa::path(get, path = "/v1/event-types", tag = "clients",
    responses((status = 200, body = EventTypes)))]
async fn event_types() -> ApiJson<EventTypes> {
    ApiJson(list())
}
