//! Issue #70: a query parameter an endpoint does not take is refused by name, not ignored.
//! `/v1/notifications?stat=failed` answered every notification as if unfiltered, and an
//! operator took the list for the failed ones.

use serde_json::{Value, json};

use crate::utils::{TestServer, unique};

/// Every endpoint that takes a query, as the OpenAPI document lists them, with its path's
/// ids filled in with ones that exist.
async fn endpoints_with_a_query(s: &TestServer) -> Vec<(String, Value)> {
    let sensor = unique("qp");
    s.sensor(&sensor).await;
    let client = s.client("http://127.0.0.1:9/hook").await;
    let site = unique("site").to_lowercase();
    let (st, body) = s.post("/v1/sites", json!({"id": site})).await;
    assert_eq!(st, 201, "{body}");
    let (_, doc) = s.get("/openapi.json").await;
    let mut found = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        let Some(get) = ops.get("get") else { continue };
        let params = get["parameters"].as_array().cloned().unwrap_or_default();
        if !params.iter().any(|p| p["in"] == "query") {
            continue;
        }
        let id = if path.starts_with("/v1/sensors/") {
            &sensor
        } else if path.starts_with("/v1/clients/") {
            &client
        } else {
            &site
        };
        found.push((path.replace("{id}", id), get.clone()));
    }
    found
}

#[tokio::test]
async fn unknown_query_parameters_are_refused_by_name() {
    let s = TestServer::start().await;
    // What the operator typed: misspelt filters.
    for (query, name) in [
        ("?stat=failed", "stat"),
        ("?site=bldg-7", "site"),
        ("?status=failed&limit=5&colour=red", "colour"),
    ] {
        let (st, body) = s.get(&format!("/v1/notifications{query}")).await;
        assert_eq!(st, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "unknown_parameter", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("`{name}`")), "{message}");
        assert!(message.contains("status"), "names what it takes: {message}");
    }
    let (st, body) = s
        .get("/v1/notifications?status=failed&type=sensor.state_changed&order=desc&limit=5")
        .await;
    assert_eq!(st, 200, "what it takes still works: {body}");

    let endpoints = endpoints_with_a_query(&s).await;
    assert!(endpoints.len() >= 8, "{endpoints:?}");
    for (path, op) in endpoints {
        let (st, body) = s.get(&format!("{path}?limit=2&bogus_filter=1")).await;
        assert_eq!(st, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "unknown_parameter", "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("`bogus_filter`"), "{path}: {message}");
        let (st, body) = s.get(&format!("{path}?limit=2")).await;
        assert_eq!(st, 200, "{path}: {body}");
        // The document says so, where a client generator reads it.
        let said = op["responses"]["400"]["description"].as_str().unwrap_or("");
        assert!(said.contains("unknown_parameter"), "{path}: {said:?}");
    }
}

/// An operation that takes no query parameter refuses one too, rather than answering as
/// if a filter or cursor had been applied.
#[tokio::test]
async fn a_query_on_an_operation_that_takes_none_is_refused() {
    let s = TestServer::start().await;
    let id = crate::utils::unique("q");
    s.sensor(&id).await;
    for (path, name) in [
        (format!("/v1/sensors/{id}?cursor=abc"), "cursor"),
        ("/v1/event-types?type=x".to_string(), "type"),
        (format!("/v1/sensors/{id}/clients?limit=1&x=1"), "x"),
    ] {
        let (st, body) = s.get(&path).await;
        assert_eq!(st, 400, "{path}: {body}");
        assert_eq!(body["error"]["code"], "unknown_parameter", "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("`{name}`")), "{path}: {message}");
    }
    let (st, body) = s
        .request(
            reqwest::Method::DELETE,
            &format!("/v1/sensors/{id}?force=true"),
            None,
        )
        .await;
    assert_eq!(st, 400, "a delete that takes no options: {body}");
    assert_eq!(
        s.get(&format!("/v1/sensors/{id}")).await.0,
        200,
        "not deleted"
    );
}
