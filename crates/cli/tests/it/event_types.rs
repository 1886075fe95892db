//! Issue #70: the notification types a client may choose come from the API, one list in
//! the code. The console kept its own list of four `sensor.*` types, so unticking one
//! saved the three left and silently unsubscribed the client from its sites' alarms.
//! Issue #75: each type comes with the JSON Schema of its body and an example, and the
//! OpenAPI document's `webhooks` carry the same.

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
        "client.test",
        "batch",
    ] {
        assert!(types.contains(&t), "{t} not in {types:?}");
    }
    for t in items {
        let said = t["description"].as_str().unwrap_or("");
        assert!(!said.is_empty() && !said.contains('\n'), "one line for {t}");
    }
    // Each but the batch, an envelope of others, is a type a client may choose.
    let chosen: Vec<&str> = types.iter().copied().filter(|t| *t != "batch").collect();
    let client = s.client("http://127.0.0.1:9/hook").await;
    let (st, body) = s
        .put(
            &format!("/v1/clients/{client}"),
            json!({"name": "all", "url": "http://127.0.0.1:9/hook", "events": chosen}),
        )
        .await;
    assert_eq!(st, 200, "{body}");
    assert_eq!(body["events"], json!(chosen));

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
    s.stop().await;
}

/// Each type's schema is a whole draft 2020-12 schema, the one the tests hold every body
/// to; its example passes it; the document's `webhooks` carry the same, one per type.
#[tokio::test]
async fn every_type_has_its_schema_and_example_served_and_in_the_webhooks() {
    let s = TestServer::start().await;
    let body = body_of(&s).await;
    let (_, doc) = s.get("/openapi.json").await;
    assert_eq!(doc["openapi"], "3.1.0", "webhooks are OpenAPI 3.1");
    let items = body["items"].as_array().expect("items");
    let hooks = doc["webhooks"]
        .as_object()
        .expect("webhooks in the document");
    assert_eq!(hooks.len(), items.len(), "{:?}", hooks.keys());
    for t in items {
        let kind = t["type"].as_str().unwrap();
        let schema = &t["schema"];
        assert_eq!(
            schema["$schema"], "https://json-schema.org/draft/2020-12/schema",
            "{kind}"
        );
        assert!(
            !schema.to_string().contains("\"$ref\""),
            "{kind}: a schema whole in itself"
        );
        assert_eq!(
            Some(schema),
            latch::delivery::catalog::schema_of(kind),
            "{kind}: served as the tests check it"
        );
        assert_eq!(t["example"]["type"], kind);
        latch_testkit::check_body(t["example"].to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{kind}'s example: {e}"));
        let hook = &hooks[kind]["post"];
        let content = &hook["requestBody"]["content"]["application/json"];
        assert_eq!(&content["schema"], schema, "{kind}");
        assert_eq!(&content["example"], &t["example"], "{kind}");
        assert_eq!(hook["summary"], t["description"], "{kind}");
    }
    // The check can fail: a field no schema lists.
    let mut changed = items[0]["example"].clone();
    changed["colour"] = json!("open");
    let e = latch_testkit::check_body(changed.to_string().as_bytes()).unwrap_err();
    assert!(e.contains("sensor.state_changed"), "{e}");
    s.stop().await;
}

async fn body_of(s: &TestServer) -> Value {
    s.get("/v1/event-types").await.1
}
