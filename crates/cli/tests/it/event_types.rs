//! Issue #70: the notification types a client may choose come from the API, one list in
//! the code. The console kept its own list of four `sensor.*` types, so unticking one
//! saved the three left and silently unsubscribed the client from its sites' alarms.

use serde_json::{Value, json};

use crate::utils::TestServer;

#[tokio::test]
async fn every_notification_type_is_listed_with_what_it_means() {
    let s = TestServer::start().await;
    let (st, body) = s.get("/v1/event-types").await;
    assert_eq!(st, 200, "{body}");
    let items = body["items"].as_array().expect("items");
    let types: Vec<&str> = items.iter().map(|t| t["type"].as_str().unwrap()).collect();
    for t in [
        "sensor.state_changed",
        "sensor.connection_lost",
        "sensor.connection_restored",
        "sensor.still_lost",
        "site.connection_lost",
        "site.connection_restored",
    ] {
        assert!(types.contains(&t), "{t} not in {types:?}");
    }
    for t in items {
        let said = t["description"].as_str().unwrap_or("");
        assert!(!said.is_empty() && !said.contains('\n'), "one line for {t}");
    }
    // Each is a type a client may choose.
    let client = s.client("http://127.0.0.1:9/hook").await;
    let (st, body) = s
        .put(
            &format!("/v1/clients/{client}"),
            json!({"name": "all", "url": "http://127.0.0.1:9/hook", "events": types}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["events"], json!(types));

    // The document declares it, each type's name and meaning included.
    let (_, doc) = s.get("/openapi.json").await;
    let op = &doc["paths"]["/v1/event-types"]["get"];
    assert!(op.is_object(), "no GET /v1/event-types in the document");
    let example = &op["responses"]["200"]["content"]["application/json"]["example"];
    assert_eq!(
        example,
        &body_of(&s).await,
        "the document's example is the list"
    );
    let schema = &doc["components"]["schemas"]["EventType"]["properties"]["type"]["enum"];
    assert_eq!(schema, &json!(types));
}

async fn body_of(s: &TestServer) -> Value {
    s.get("/v1/event-types").await.1
}
