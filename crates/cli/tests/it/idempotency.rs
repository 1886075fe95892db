//! `Idempotency-Key`: a request sent again with its key gets the first answer and applies
//! nothing — readings (also across a `kill -9` and across the cluster's nodes) and the
//! `POST`s that create.

use std::time::Duration;

use serde_json::{Value, json};

use crate::utils::cluster::Cluster;
use crate::utils::{Process, TestServer, unique};

fn in_a_day() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    latch::domain::time::format(now + 86_400_000)
}

/// Posts `body` to `path` with `key`; answers status, the `Idempotent-Replayed` header and
/// the body.
async fn keyed(
    http: &reqwest::Client,
    base: &str,
    path: &str,
    key: &str,
    body: &Value,
) -> (u16, bool, Value) {
    let r = http
        .post(format!("{base}{path}"))
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let replayed = r.headers().get("idempotent-replayed").is_some();
    (status, replayed, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_repeated_readings_request_gets_the_first_answer_and_applies_nothing() {
    let s = TestServer::start().await;
    let a = unique("ik");
    s.sensor(&a).await;
    let body = json!([
        {"sensor_id": a, "data": 1},
        {"sensor_id": unique("nope"), "data": 1},
        {"sensor_id": a, "data": 0},
    ]);
    let key = unique("key");
    let (st, replayed, first) = keyed(&s.http, &s.base, "/v1/readings", &key, &body).await;
    assert_eq!((st, replayed), (202, false), "{first}");
    assert_eq!(first["accepted"], 2, "{first}");
    assert_eq!(first["rejected"][0]["index"], 1, "{first}");
    assert_eq!(s.reading_count(&a).await, 2);

    let (st, replayed, again) = keyed(&s.http, &s.base, "/v1/readings", &key, &body).await;
    assert_eq!((st, replayed), (202, true), "{again}");
    assert_eq!(again, first, "the first answer, word for word");
    assert_eq!(s.reading_count(&a).await, 2, "the repeat applied nothing");

    // The key with another body is another request: refused, nothing applied.
    let other = json!({"sensor_id": a, "data": 1});
    let (st, _, refused) = keyed(&s.http, &s.base, "/v1/readings", &key, &other).await;
    assert_eq!(st, 422, "{refused}");
    assert_eq!(
        refused["error"]["code"], "idempotency_key_reused",
        "{refused}"
    );
    assert_eq!(s.reading_count(&a).await, 2);

    // A key that is not one: 400, nothing applied.
    for bad in ["", "a key", &"k".repeat(256)] {
        let (st, _, refused) = keyed(&s.http, &s.base, "/v1/readings", bad, &other).await;
        assert_eq!(st, 400, "{bad:?}: {refused}");
        assert_eq!(refused["error"]["code"], "invalid_idempotency_key");
    }
    assert_eq!(s.reading_count(&a).await, 2);

    // Without a key, the same body is applied each time it is sent.
    s.post("/v1/readings", body.clone()).await;
    assert_eq!(s.reading_count(&a).await, 4);
}

#[tokio::test]
async fn a_readings_request_all_refused_frees_its_key_for_a_repeat() {
    let s = TestServer::start().await;
    let a = unique("ik");
    let body = json!({"sensor_id": a, "data": 1});
    let key = unique("key");
    let (st, _, refused) = keyed(&s.http, &s.base, "/v1/readings", &key, &body).await;
    assert_eq!(st, 422, "unknown sensor: {refused}");
    // Nothing changed, so nothing is kept: once the sensor exists the repeat applies.
    s.sensor(&a).await;
    let (st, replayed, ok) = keyed(&s.http, &s.base, "/v1/readings", &key, &body).await;
    assert_eq!((st, replayed), (202, false), "{ok}");
    assert_eq!(s.reading_count(&a).await, 1);
}

#[tokio::test]
async fn a_repeated_create_answers_what_it_made_and_makes_nothing_more() {
    let s = TestServer::start().await;
    let sensor = unique("ik");
    // A client: the repeat names the same client, with its signing secret.
    let client = json!({"name": "door desk", "url": "http://127.0.0.1:9/hook"});
    let key = unique("key");
    let (st, _, made) = keyed(&s.http, &s.base, "/v1/clients", &key, &client).await;
    assert_eq!(st, 201, "{made}");
    assert!(made["secret"].is_string(), "{made}");
    let (st, replayed, again) = keyed(&s.http, &s.base, "/v1/clients", &key, &client).await;
    assert_eq!((st, replayed), (201, true), "{again}");
    assert_eq!(again["id"], made["id"]);
    assert_eq!(
        again["secret"], made["secret"],
        "the secret, read from the client"
    );
    let (_, list) = s.get("/v1/clients").await;
    let named = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["name"] == "door desk")
        .count();
    assert_eq!(named, 1, "one client made: {list}");

    // A sensor: the repeat is the first 201, not "already exists".
    let body = json!({"id": sensor, "address": "door 1"});
    let key = unique("key");
    let (st, _, _) = keyed(&s.http, &s.base, "/v1/sensors", &key, &body).await;
    assert_eq!(st, 201);
    let (st, replayed, _) = keyed(&s.http, &s.base, "/v1/sensors", &key, &body).await;
    assert_eq!((st, replayed), (201, true));

    // A silence: one made, however often it is sent.
    let silence = json!({"match": {"sensor_ids": [sensor]}, "ends_at": in_a_day(),
        "comment": "lock swap"});
    let key = unique("key");
    let (st, _, first) = keyed(&s.http, &s.base, "/v1/silences", &key, &silence).await;
    assert_eq!(st, 201, "{first}");
    let (st, replayed, again) = keyed(&s.http, &s.base, "/v1/silences", &key, &silence).await;
    assert_eq!((st, replayed), (201, true));
    assert_eq!(again["id"], first["id"]);
    let (_, list) = s.get("/v1/silences").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");

    // A create refused changed nothing and keeps nothing: its repeat runs again.
    let site = unique("st");
    let other = unique("ik");
    let body = json!({"id": other, "address": "door 2", "site_id": site});
    let key = unique("key");
    let (st, _, refused) = keyed(&s.http, &s.base, "/v1/sensors", &key, &body).await;
    assert_eq!(st, 422, "no such site: {refused}");
    let (st, made) = s.post("/v1/sites", json!({"id": site, "name": "HQ"})).await;
    assert_eq!(st.as_u16(), 201, "{made}");
    let (st, replayed, _) = keyed(&s.http, &s.base, "/v1/sensors", &key, &body).await;
    assert_eq!((st, replayed), (201, false));
}

/// Forgets every kept answer, as if latch had died between a request's commits and the
/// keeping of its answer.
async fn lose_the_answers(dir: &std::path::Path) {
    let sql = "UPDATE idempotency_keys SET status = NULL, body = NULL, taken_at = 0";
    match crate::utils::database_url(dir).await {
        None => {
            let c = rusqlite::Connection::open(dir.join("latch.db")).unwrap();
            assert_eq!(c.execute(sql, []).unwrap(), 1);
        }
        Some(url) => {
            let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            assert_eq!(c.execute(sql, &[]).await.unwrap(), 1);
        }
    }
}

#[tokio::test]
async fn a_request_whose_answer_was_lost_after_its_commits_applies_nothing_again() {
    let s = TestServer::start().await;
    let sensors: Vec<String> = (0..8).map(|_| unique("la")).collect();
    for id in &sensors {
        s.sensor(id).await;
    }
    let body = Value::Array(
        sensors
            .iter()
            .flat_map(|id| {
                [
                    json!({"sensor_id": id, "data": 1}),
                    json!({"sensor_id": id, "data": 0}),
                ]
            })
            .chain([json!({"sensor_id": unique("nope"), "data": 1})])
            .collect(),
    );
    let key = unique("key");
    let (st, _, first) = keyed(&s.http, &s.base, "/v1/readings", &key, &body).await;
    assert_eq!(st, 202, "{first}");
    let dir = s.dir.clone();
    let tmp = s.stop().await;
    lose_the_answers(&dir).await;
    let s = TestServer::start_in(&dir, |_| {}).await;
    // Not the kept answer (there is none): the commits' own record of what they applied.
    let (st, replayed, again) = keyed(&s.http, &s.base, "/v1/readings", &key, &body).await;
    assert_eq!((st, replayed), (202, false), "{again}");
    assert_eq!(again, first, "{again}");
    for id in &sensors {
        assert_eq!(s.reading_count(id).await, 2, "{id}: applied once");
    }
    s.stop().await;
    drop(tmp);
}

/// Sends `body` with `key` until it is not 409 (the key still held by a request of a
/// process that died; on PostgreSQL its hold runs out within a minute).
async fn until_free(http: &reqwest::Client, base: &str, key: &str, body: &Value) -> Value {
    for _ in 0..80 {
        let (st, _, answer) = keyed(http, base, "/v1/readings", key, body).await;
        if st != 409 {
            assert_eq!(st, 202, "{answer}");
            return answer;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("the key stayed held");
}

#[tokio::test]
async fn a_keyed_request_cut_by_kill_9_is_completed_by_its_repeat_without_applying_twice() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let url = crate::utils::database_url(dir.path()).await;
    let p = Process::start(dir.path(), url.clone());
    p.ready(&http).await;
    let sensors: Vec<String> = (0..50).map(|_| unique("kc")).collect();
    for id in &sensors {
        let r = http
            .post(format!("{}/v1/sensors", p.base))
            .json(&json!({"id": id, "address": "a"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    // 10,000 readings, 200 per sensor: the kill lands while they are being committed, or
    // before, or after (any of them must come out right).
    let readings: Vec<Value> = (0..10_000)
        .map(|i| json!({"sensor_id": sensors[i % sensors.len()], "data": (i / 50) % 2}))
        .collect();
    let body = Value::Array(readings);
    let key = unique("key");
    let sent = {
        let (http, base, key, body) = (http.clone(), p.base.clone(), key.clone(), body.clone());
        tokio::spawn(async move { keyed(&http, &base, "/v1/readings", &key, &body).await })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    p.kill9();
    let _ = sent.await;

    let p = Process::start(dir.path(), url);
    p.ready(&http).await;
    let answer = until_free(&http, &p.base, &key, &body).await;
    assert_eq!(answer["accepted"], 10_000, "{answer}");
    for id in &sensors {
        let r: Value = http
            .get(format!("{}/v1/sensors/{id}/readings?limit=1000", p.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            r["items"].as_array().unwrap().len(),
            200,
            "{id}: each reading once"
        );
    }
    // And once more: the answer kept now.
    let (st, replayed, again) = keyed(&http, &p.base, "/v1/readings", &key, &body).await;
    assert_eq!((st, replayed), (202, true));
    assert_eq!(again, answer);
    p.kill9();
}

#[tokio::test]
async fn a_keyed_request_over_two_nodes_applies_each_reading_once_whichever_node_is_asked() {
    let Some(c) = Cluster::start(2).await else {
        return;
    };
    let (a, b) = (c.base(0).to_string(), c.base(1).to_string());
    // Enough sensors that both nodes serve some.
    let sensors: Vec<String> = (0..32).map(|_| unique("kn")).collect();
    for id in &sensors {
        c.post(&a, "/v1/sensors", json!({"id": id, "address": "a"}))
            .await;
    }
    let body = Value::Array(
        sensors
            .iter()
            .map(|id| json!({"sensor_id": id, "data": 1}))
            .collect(),
    );
    let key = unique("key");
    let mut first = Value::Null;
    for _ in 0..40 {
        let (st, _, answer) = keyed(&c.http, &a, "/v1/readings", &key, &body).await;
        first = answer;
        if st == 202 && first["rejected"].as_array().is_some_and(Vec::is_empty) {
            break;
        }
        // A partition still moving: the key is free again, and what did commit is not
        // applied twice by the next try.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(first["accepted"], 32, "{first}");
    let (st, replayed, again) = keyed(&c.http, &b, "/v1/readings", &key, &body).await;
    assert_eq!((st, replayed), (202, true), "{again}");
    assert_eq!(again, first);
    // Without the kept answer, the owners' commits (forwarded readings' too) still say
    // what they applied.
    let (pg, conn) = tokio_postgres::connect(&c.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    pg.execute(
        "UPDATE idempotency_keys SET status = NULL, body = NULL, taken_at = 0",
        &[],
    )
    .await
    .unwrap();
    let (st, replayed, again) = keyed(&c.http, &b, "/v1/readings", &key, &body).await;
    assert_eq!((st, replayed), (202, false), "{again}");
    assert_eq!(again["accepted"], 32, "{again}");
    for id in &sensors {
        let r = c.get(&b, &format!("/v1/sensors/{id}/readings")).await;
        assert_eq!(r["items"].as_array().unwrap().len(), 1, "{id}: {r}");
    }
}
