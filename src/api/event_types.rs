//! `GET /v1/event-types`: the notification types a client may choose in its `events`,
//! each with what it means. The list is [`EventKind::ALL`], so a type added to the domain
//! is offered everywhere at once: the console takes its choice of types from here rather
//! than keep a list of its own that falls behind (issue #70: a list without the site types
//! unsubscribed a client from them when saved).

use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;
use utoipa_axum::{router::OpenApiRouter, routes};

use super::AppState;
use super::error::ApiJson;
use crate::domain::EventKind;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(event_types))
}

/// A notification type.
#[derive(Serialize, ToSchema)]
pub struct EventType {
    /// The notification's `type`, as a client's `events` names it.
    #[serde(rename = "type")]
    #[schema(rename = "type")]
    pub kind: String,
    /// What a notification of this type tells, in one line.
    pub description: String,
}

/// Every notification type.
#[derive(Serialize, ToSchema)]
pub struct EventTypes {
    pub items: Vec<EventType>,
}

/// The list, as served and as the document's example.
pub fn list() -> EventTypes {
    EventTypes {
        items: EventKind::ALL
            .iter()
            .map(|k| EventType {
                kind: k.as_str().to_string(),
                description: k.description().to_string(),
            })
            .collect(),
    }
}

/// The document's example of the answer: the list itself.
pub fn example() -> serde_json::Value {
    json!(list())
}

/// List the notification types a client may choose in its `events`, with what each means.
#[utoipa::path(get, path = "/v1/event-types", tag = "clients",
    responses((status = 200, body = EventTypes)))]
async fn event_types() -> ApiJson<EventTypes> {
    ApiJson(list())
}
