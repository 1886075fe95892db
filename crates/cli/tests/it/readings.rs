//! HTTP ingest, change detection, state, history, metrics and restart.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::utils::{TestServer, unique};

#[tokio::test]
async fn each_reading_is_judged_on_its_own() {
    let s = TestServer::start().await;
    let id = unique("r");
    s.sensor(&id).await;
    let (st, body) = s
        .post(
            "/v1/readings",
            json!([
                {"sensor_id": id, "data": 1},
                {"sensor_id": "neverRegistered", "data": 1},
                {"sensor_id": id, "data": 2},
                {"sensor_id": "bad id", "data": 0},
                {"sensor_id": id, "data": 0, "ts": "last tuesday"},
                "not an object",
                {"sensor_id": id, "data": 0, "ts": "2026-01-01T00:00:00Z"},
            ]),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["accepted"], 2);
    let codes: Vec<(u64, &str)> = body["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["index"].as_u64().unwrap(), r["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        codes,
        vec![
            (1, "unknown_sensor"),
            (2, "invalid_data"),
            (3, "invalid_sensor_id"),
            (4, "invalid_ts"),
            (5, "not_an_object")
        ]
    );

    let (st, body) = s
        .post("/v1/readings", json!({"sensor_id": id, "data": 1}))
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "a single reading works too");
    assert_eq!(body["accepted"], 1);

    let r = s
        .http
        .post(format!("{}/v1/readings", s.base))
        .header("content-type", "application/json")
        .body("{\"sensor_id\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "bad_request");

    let too_many: Vec<Value> = (0..10_001)
        .map(|_| json!({"sensor_id": id, "data": 1}))
        .collect();
    let (st, body) = s.post("/v1/readings", Value::Array(too_many)).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "too_many_readings", "{body}");

    let (_, metrics) = s.get("/metrics").await;
    let metrics = metrics.as_str().unwrap().to_string();
    assert!(
        metrics
            .contains("latch_readings_rejected_total{source=\"http\",reason=\"unknown_sensor\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("latch_readings_accepted_total{source=\"http\"}"));
    s.stop().await;
}

#[tokio::test]
async fn state_follows_changes_and_ignores_repeats() {
    let s = TestServer::start().await;
    let id = unique("st");
    s.sensor(&id).await;
    for (d, ts) in [
        (1, "2026-11-22T10:00:00Z"),
        (1, "2026-11-22T10:01:00Z"),
        (0, "2026-11-22T10:02:00Z"),
        (0, "2026-11-22T10:03:00Z"),
    ] {
        s.readings(json!([{"sensor_id": id, "data": d, "ts": ts}]))
            .await;
    }
    let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(body["status"]["data"], 0);
    assert_eq!(
        body["status"]["changed_at"], "2026-11-22T10:02:00.000Z",
        "a repeat is not a change"
    );
    assert_eq!(body["status"]["connection"], "online");
    assert!(body["status"]["last_seen_at"].is_string());
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
    let kinds: Vec<(Value, Value)> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["data"].clone(), e["previous"].clone()))
        .collect();
    assert_eq!(
        kinds,
        vec![(json!(1), Value::Null), (json!(0), json!(1))],
        "{events}"
    );
    s.stop().await;
}

#[tokio::test]
async fn late_readings_are_kept_but_never_flip_state() {
    let s = TestServer::start().await;
    let id = unique("late");
    s.sensor(&id).await;
    s.readings(json!([{"sensor_id": id, "data": 1, "ts": "2026-11-22T10:00:00Z"}]))
        .await;
    s.readings(json!([{"sensor_id": id, "data": 0, "ts": "2026-11-22T09:00:00Z"}]))
        .await;
    let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(body["status"]["data"], 1);
    let (_, hist) = s.get(&format!("/v1/sensors/{id}/readings")).await;
    let items = hist["items"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0]["ts"], "2026-11-22T09:00:00.000Z");
    assert_eq!(items[0]["late"], true);
    assert_eq!(items[1]["late"], false);
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
    assert_eq!(events["items"].as_array().unwrap().len(), 1);
    s.stop().await;
}

#[tokio::test]
async fn history_ranges_and_pages() {
    let s = TestServer::start().await;
    let id = unique("h");
    s.sensor(&id).await;
    let batch: Vec<Value> = (0..30)
        .map(|m| json!({"sensor_id": id, "data": m % 2, "ts": format!("2026-11-22T10:{m:02}:00Z")}))
        .collect();
    s.readings(Value::Array(batch)).await;
    let (st, body) = s
        .get(&format!(
            "/v1/sensors/{id}/readings?from=2026-11-22T10:10:00Z&to=2026-11-22T10:20:00Z"
        ))
        .await;
    assert_eq!(st, StatusCode::OK);
    let items = body["items"].as_array().unwrap();
    assert_eq!(items.len(), 10, "from inclusive, to exclusive");
    assert_eq!(items[0]["ts"], "2026-11-22T10:10:00.000Z");
    assert_eq!(items[9]["ts"], "2026-11-22T10:19:00.000Z");

    let mut all = vec![];
    let mut url = format!("/v1/sensors/{id}/events?limit=7");
    loop {
        let (_, body) = s.get(&url).await;
        all.extend(body["items"].as_array().unwrap().clone());
        match body["next_cursor"].as_str() {
            Some(c) => url = format!("/v1/sensors/{id}/events?limit=7&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(
        all.len(),
        30,
        "every reading alternates, so each is a change"
    );
    let (st, _) = s
        .get(&format!("/v1/sensors/{id}/readings?from=yesterday"))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, _) = s.get("/v1/sensors/nosuchsensor/readings").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn restart_keeps_registry_state_and_history() {
    let s = TestServer::start().await;
    let id = unique("rs");
    s.sensor(&id).await;
    let client = s.client("http://127.0.0.1:9/hook").await;
    s.link(&client, &id).await;
    s.readings(json!([{"sensor_id": id, "data": 1, "ts": "2026-11-22T10:00:00Z"}]))
        .await;
    let dir = s.dir.clone();
    let keep = s.stop().await;

    let s = TestServer::start_in(&dir, |_| {}).await;
    let (st, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(body["status"]["data"], 1);
    // The engine reloaded the state: a repeat is no change, a new value is.
    s.readings(json!([{"sensor_id": id, "data": 1, "ts": "2026-11-22T10:05:00Z"}]))
        .await;
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
    assert_eq!(events["items"].as_array().unwrap().len(), 1);
    let (_, links) = s.get(&format!("/v1/sensors/{id}/clients")).await;
    assert_eq!(links["items"][0]["id"], client.as_str());
    let (_, hist) = s.get(&format!("/v1/sensors/{id}/readings")).await;
    assert_eq!(hist["items"].as_array().unwrap().len(), 2);
    s.stop().await;
    drop(keep);
}

/// Issue #49: a device that looks only at the status code must not take a request of which
/// nothing was stored for a success. None accepted: 422 with the usual body; some accepted:
/// 202; an empty array refuses nothing: 202.
#[tokio::test]
async fn a_request_with_nothing_accepted_answers_422_with_the_same_body() {
    let s = TestServer::start().await;
    let id = unique("n");
    s.sensor(&id).await;
    let (st, body) = s
        .post(
            "/v1/readings",
            json!({"sensor_id": unique("nobody"), "data": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["accepted"], 0, "{body}");
    assert_eq!(body["rejected"][0]["index"], 0, "{body}");
    assert_eq!(body["rejected"][0]["code"], "unknown_sensor", "{body}");

    let (st, body) = s
        .post(
            "/v1/readings",
            json!([{"sensor_id": id, "data": 7}, {"sensor_id": "bad id", "data": 1}]),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let codes: Vec<&str> = body["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(codes, ["invalid_data", "invalid_sensor_id"], "{body}");
    assert_eq!(s.reading_count(&id).await, 0, "nothing stored");

    let (st, body) = s
        .post(
            "/v1/readings",
            json!([{"sensor_id": id, "data": 7}, {"sensor_id": id, "data": 1}]),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "partly accepted: {body}");
    assert_eq!(body["accepted"], 1, "{body}");
    assert_eq!(body["rejected"][0]["index"], 0, "{body}");

    let (st, body) = s.post("/v1/readings", json!([])).await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body, json!({"accepted": 0, "rejected": []}));
    s.stop().await;
}

/// Issue #49: a field a reading does not have (a typo, a 5 MiB `pad`) is refused for that
/// reading, naming the fields a reading has, as sensors and clients refuse theirs.
#[tokio::test]
async fn unknown_fields_in_a_reading_are_refused_per_reading() {
    let s = TestServer::start().await;
    let id = unique("uf");
    s.sensor(&id).await;
    let pad = "x".repeat(5 * 1024 * 1024);
    let (st, body) = s
        .post(
            "/v1/readings",
            json!([
                {"sensor_id": id, "data": 1, "pad": pad},
                {"sensor_id": id, "data": 1, "timestamp": "2026-11-22T10:00:00Z"},
                {"sensor_id": id, "data": 0, "ts": null},
            ]),
        )
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["accepted"], 1, "{body}");
    let rejected = body["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 2, "{body}");
    for (r, field) in rejected.iter().zip(["pad", "timestamp"]) {
        assert_eq!(r["code"], "unknown_field", "{body}");
        let msg = r["error"].as_str().unwrap();
        assert!(
            msg.contains(&format!("`{field}`")) && msg.contains("`sensor_id`, `data`, `ts`"),
            "{msg}"
        );
    }
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(
        sensor["status"]["data"], 0,
        "only the third applied: {sensor}"
    );
    assert_eq!(s.reading_count(&id).await, 1);

    let (st, body) = s
        .post(
            "/v1/readings",
            json!({"sensor_id": id, "data": 1, "Data": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["rejected"][0]["code"], "unknown_field", "{body}");
    // The metrics are the test process's: other tests in it refuse unknown fields too, so
    // this test's three are at least counted.
    let (_, metrics) = s.get("/metrics").await;
    let family = "latch_readings_rejected_total{source=\"http\",reason=\"unknown_field\"} ";
    let counted: u64 = metrics
        .as_str()
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(family)?.parse().ok())
        .unwrap_or_else(|| panic!("no {family} in {metrics}"));
    assert!(counted >= 3, "{counted} unknown fields counted");
    s.stop().await;
}

/// Issue #49: when nothing was accepted but some readings were refused only because their
/// commit failed, the answer says "send again" (503), with what became of each reading,
/// rather than a 422 that a sender would take as a verdict on all of them.
#[tokio::test]
async fn nothing_accepted_with_a_failed_commit_answers_503_with_the_same_body() {
    let s = TestServer::start().await;
    let id = unique("nf");
    s.sensor(&id).await;
    let fault = crate::utils::fault::CommitFault::new(&s.dir);
    fault.fail(&id).await;
    // Unknown sensors in every shard (hashed by id), so one shard commits only refusals
    // while the one holding the registered sensor fails.
    let mut body: Vec<Value> = (0..32)
        .map(|i| json!({"sensor_id": format!("nobody{i}x{}", &id[2..8]), "data": 1}))
        .collect();
    body.push(json!({"sensor_id": id, "data": 1}));
    let (st, answer) = s.post("/v1/readings", Value::Array(body)).await;
    assert_eq!(st, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["accepted"], 0, "{answer}");
    let rejected = answer["rejected"].as_array().unwrap();
    assert_eq!(rejected.len(), 33, "{answer}");
    assert_eq!(rejected[32]["code"], "store_unavailable", "{answer}");
    assert!(
        rejected.iter().any(|r| r["code"] == "unknown_sensor"),
        "{answer}"
    );
    fault.heal().await;
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    s.stop().await;
}
