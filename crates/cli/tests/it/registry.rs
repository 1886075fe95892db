//! Sensors, clients, links: CRUD, validation, pagination, auth.

use axum::http::StatusCode;
use serde_json::json;

use crate::utils::{TestServer, database_url, eventually, unique};

#[tokio::test]
async fn contract_sample_ids_are_accepted() {
    let s = TestServer::start().await;
    for id in ["xa7v9Dfadr7H", "0xA", "TestSensor", "0123456789aBcDeF"] {
        let (st, body) = s
            .post(
                "/v1/sensors",
                json!({"id": id, "address": "Moscow, Russia, Svobody st. 23 fl 1 room 16"}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{id}: {body}");
        assert_eq!(body["id"], id);
        assert_eq!(body["status"]["connection"], "unknown");
        let (st, body) = s.get(&format!("/v1/sensors/{id}")).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(
            body["address"],
            "Moscow, Russia, Svobody st. 23 fl 1 room 16"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn bad_sensor_ids_get_the_contract_error() {
    let s = TestServer::start().await;
    for id in [
        "0123456789aBcDeFx",
        "has space",
        "da-sh",
        "кириллица",
        "",
        "snow☃",
    ] {
        let (st, body) = s
            .post("/v1/sensors", json!({"id": id, "address": "x"}))
            .await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{id:?}: {body}");
        assert_eq!(body["error"]["code"], "invalid", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("sensor id"),
            "{body}"
        );
    }
    let (st, body) = s
        .post("/v1/sensors", json!({"id": "ok1", "address": "  "}))
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (st, body) = s.post("/v1/sensors", json!({"id": "ok1"})).await;
    assert_eq!(
        st,
        StatusCode::UNPROCESSABLE_ENTITY,
        "missing address: {body}"
    );
    let (st, body) = s
        .post(
            "/v1/sensors",
            json!({"id": "ok1", "address": "a", "heartbeat_timeout_s": 0}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (st, _) = s.get("/v1/sensors/da-sh").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    s.stop().await;
}

#[tokio::test]
async fn sensor_lifecycle() {
    let s = TestServer::start().await;
    let id = unique("s");
    s.sensor(&id).await;
    let (st, body) = s
        .post("/v1/sensors", json!({"id": id, "address": "again"}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "conflict");

    let (st, body) = s
        .put(
            &format!("/v1/sensors/{id}"),
            json!({"address": "moved", "heartbeat_timeout_s": 120}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["address"], "moved");
    assert_eq!(body["heartbeat_timeout_s"], 120);
    let (st, body) = s
        .put(
            &format!("/v1/sensors/{id}"),
            json!({"id": "other", "address": "x"}),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "an id differing from the path: {body}"
    );
    let (st, _) = s.put("/v1/sensors/missing1", json!({"address": "x"})).await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    let (st, _) = s.delete(&format!("/v1/sensors/{id}")).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
    let (st, _) = s.delete(&format!("/v1/sensors/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // Its readings are now refused.
    let (_, body) = s
        .post("/v1/readings", json!({"sensor_id": id, "data": 1}))
        .await;
    assert_eq!(body["rejected"][0]["code"], "unknown_sensor");
    s.stop().await;
}

/// Makes the service's store refuse (or allow again) deleting sensors, as a failing disk or a
/// lost database would: a trigger in the test's own SQLite file or PostgreSQL schema.
async fn refuse_sensor_deletes(s: &TestServer, refuse: bool) {
    match database_url(&s.dir).await {
        Some(url) => {
            let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            c.batch_execute(if refuse {
                "CREATE OR REPLACE FUNCTION latch_test_refuse() RETURNS trigger \
                 LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'injected: deletes refused'; END $$; \
                 CREATE TRIGGER latch_test_refuse BEFORE DELETE ON sensors \
                 FOR EACH ROW EXECUTE FUNCTION latch_test_refuse()"
            } else {
                "DROP TRIGGER latch_test_refuse ON sensors"
            })
            .await
            .unwrap();
        }
        None => {
            let c = rusqlite::Connection::open(s.dir.join("latch.db")).unwrap();
            c.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
            c.execute_batch(if refuse {
                "CREATE TRIGGER latch_test_refuse BEFORE DELETE ON sensors \
                 BEGIN SELECT RAISE(ABORT, 'injected: deletes refused'); END"
            } else {
                "DROP TRIGGER latch_test_refuse"
            })
            .unwrap();
        }
    }
}

#[tokio::test]
async fn a_delete_the_store_refuses_leaves_the_sensor_whole() {
    let s = TestServer::start().await;
    let id = unique("dl");
    s.sensor(&id).await;
    s.readings(json!({"sensor_id": id, "data": 1})).await;

    refuse_sensor_deletes(&s, true).await;
    let (st, body) = s.delete(&format!("/v1/sensors/{id}")).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (st, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(st, StatusCode::OK, "still registered: {body}");
    // Still tracked: its readings are accepted and change its state.
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(body["status"]["data"], 0, "{body}");
    assert_eq!(s.reading_count(&id).await, 2);

    // Once the store takes the delete, it is gone everywhere.
    refuse_sensor_deletes(&s, false).await;
    let (st, body) = s.delete(&format!("/v1/sensors/{id}")).await;
    assert_eq!(st, StatusCode::NO_CONTENT, "{body}");
    let (_, body) = s
        .post("/v1/readings", json!({"sensor_id": id, "data": 1}))
        .await;
    assert_eq!(body["rejected"][0]["code"], "unknown_sensor", "{body}");
    s.sensor(&id).await;
    assert_eq!(s.reading_count(&id).await, 0, "nothing of it was left");
    let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(body["status"]["connection"], "unknown", "{body}");
    s.stop().await;
}

#[tokio::test]
async fn a_delete_racing_readings_leaves_nothing_of_the_sensor() {
    let s = TestServer::start().await;
    for _ in 0..10 {
        let id = unique("rc");
        s.sensor(&id).await;
        // Readings keep coming while the sensor is deleted, so commits are in flight.
        let poster = {
            let (base, http, id) = (s.base.clone(), s.http.clone(), id.clone());
            tokio::spawn(async move {
                for _ in 0..40 {
                    let pair = json!([{"sensor_id": id, "data": 1}, {"sensor_id": id, "data": 0}]);
                    let r = http.post(format!("{base}/v1/readings")).json(&pair);
                    let _ = r.send().await;
                }
            })
        };
        eventually(10, "the first readings stored", || async {
            (s.reading_count(&id).await > 0).then_some(())
        })
        .await;
        let (st, body) = s.delete(&format!("/v1/sensors/{id}")).await;
        assert_eq!(st, StatusCode::NO_CONTENT, "{body}");
        let (_, body) = s
            .post("/v1/readings", json!({"sensor_id": id, "data": 1}))
            .await;
        assert_eq!(body["rejected"][0]["code"], "unknown_sensor", "{body}");
        poster.await.unwrap();

        // A sensor registered again under the id starts from nothing.
        s.sensor(&id).await;
        assert_eq!(s.reading_count(&id).await, 0, "readings of {id} were left");
        let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
        assert_eq!(body["status"]["connection"], "unknown", "{body}");
        let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
        assert_eq!(events["items"], json!([]), "{events}");
    }
    s.stop().await;
}

#[tokio::test]
async fn pagination_walks_every_item_once() {
    let s = TestServer::start().await;
    let mut ids: Vec<String> = (0..250).map(|i| format!("p{i:03}")).collect();
    for id in &ids {
        s.sensor(id).await;
    }
    let mut seen = vec![];
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let q = match &cursor {
            Some(c) => format!("/v1/sensors?limit=100&cursor={c}"),
            None => "/v1/sensors?limit=100".to_string(),
        };
        let (st, body) = s.get(&q).await;
        assert_eq!(st, StatusCode::OK, "{body}");
        pages += 1;
        for item in body["items"].as_array().unwrap() {
            seen.push(item["id"].as_str().unwrap().to_string());
        }
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    ids.sort();
    assert_eq!(seen, ids);
    let (st, _) = s.get("/v1/sensors?limit=1001").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    // A cursor is a position among keys: for ids any text has one; a sequence number
    // must be a number.
    let (st, body) = s.get("/v1/sensors?cursor=zzzz").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let (st, body) = s.get("/v1/notifications?cursor=abc").await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "invalid_cursor", "{body}");
    let (_, body) = s.get("/v1/sensors").await;
    assert_eq!(
        body["items"].as_array().unwrap().len(),
        100,
        "default limit"
    );
    s.stop().await;
}

#[tokio::test]
async fn clients_and_links() {
    let s = TestServer::start().await;
    let (st, body) = s
        .post(
            "/v1/clients",
            json!({"name": "acme", "url": "http://127.0.0.1:9/hook"}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let secret = body["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"));

    for bad in [
        json!({"name": "x", "url": "ftp://a/"}),
        json!({"name": "x", "url": "nope"}),
        json!({"name": "", "url": "http://a/"}),
        json!({"name": "x", "url": "http://a/", "secret": "plain"}),
    ] {
        let (st, body) = s.post("/v1/clients", bad.clone()).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
    }

    // Replace without a secret keeps it; with one, changes it.
    let (st, body) = s
        .put(
            &format!("/v1/clients/{id}"),
            json!({"name": "acme2", "url": "https://example.com/h"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["secret"], secret);
    let (_, body) = s.get(&format!("/v1/clients/{id}")).await;
    assert_eq!(body["url"], "https://example.com/h");
    let (_, list) = s.get("/v1/clients").await;
    let mine = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id.as_str())
        .unwrap();
    assert!(mine.get("secret").is_none(), "lists do not show secrets");

    let sensor = unique("l");
    s.sensor(&sensor).await;
    s.link(&id, &sensor).await;
    s.link(&id, &sensor).await;
    let (st, _) = s
        .put_empty(&format!("/v1/clients/{id}/sensors/nosuch"))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s
        .put_empty(&format!("/v1/clients/nosuch/sensors/{sensor}"))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (_, body) = s.get(&format!("/v1/clients/{id}/sensors")).await;
    assert_eq!(body["items"][0]["id"], sensor.as_str());
    let (_, body) = s.get(&format!("/v1/sensors/{sensor}/clients")).await;
    assert_eq!(body["items"][0]["id"], id.as_str());
    let (st, _) = s
        .delete(&format!("/v1/clients/{id}/sensors/{sensor}"))
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = s
        .delete(&format!("/v1/clients/{id}/sensors/{sensor}"))
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (_, body) = s.get(&format!("/v1/sensors/{sensor}/clients")).await;
    assert!(body["items"].as_array().unwrap().is_empty());

    let (st, _) = s.delete(&format!("/v1/clients/{id}")).await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let (st, _) = s.get(&format!("/v1/clients/{id}")).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn bearer_token_guards_the_api_but_not_health() {
    let s = TestServer::start_with(|c| c.api_token = Some("s3cret".into())).await;
    let anon = reqwest::Client::new();
    let r = anon
        .get(format!("{}/v1/sensors", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let r = anon
        .get(format!("{}/v1/sensors", s.base))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let (st, _) = s.get("/v1/sensors").await; // the harness sends the right token
    assert_eq!(st, StatusCode::OK);
    for open in ["/healthz", "/readyz", "/metrics", "/openapi.json"] {
        let r = anon.get(format!("{}{open}", s.base)).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "{open}");
    }
    s.stop().await;

    let open = TestServer::start().await;
    let r = anon
        .get(format!("{}/v1/sensors", open.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "no token configured: open");
    open.stop().await;
}

#[tokio::test]
async fn openapi_documents_every_contract_path() {
    let s = TestServer::start().await;
    let (st, doc) = s.get("/openapi.json").await;
    assert_eq!(st, StatusCode::OK);
    for path in [
        "/v1/sensors",
        "/v1/sensors/{id}",
        "/v1/clients",
        "/v1/clients/{id}",
        "/v1/clients/{id}/sensors/{sensor_id}",
        "/v1/clients/{id}/sensors",
        "/v1/sensors/{id}/clients",
        "/v1/readings",
        "/v1/sensors/{id}/readings",
        "/v1/sensors/{id}/events",
        "/v1/notifications",
        "/v1/notifications/{id}",
        "/v1/notifications/{id}/retry",
    ] {
        assert!(doc["paths"].get(path).is_some(), "missing {path}");
    }
    let (st, body) = s.get("/v1/nothing-here").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], "not_found");
    s.stop().await;
}
