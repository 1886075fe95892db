//! A client's lifecycle against real receivers: secret rotation, auto-disable and enable,
//! bulk replay of dead letters, endpoint health, and the per-client rate limit.

use std::time::Duration;

use axum::http::StatusCode;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Answer, Received, Receiver, TestServer, eventually, unique};

fn ms(v: &Value) -> i64 {
    latch::domain::time::parse(v.as_str().unwrap()).unwrap()
}

/// Which of the request's signatures (`v1,<b64> v1,<b64>`) verify with `secret`.
fn verifies(secret: &str, got: &Received) -> Vec<bool> {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let h = &got.headers;
    let id = h["webhook-id"].to_str().unwrap();
    let ts = h["webhook-timestamp"].to_str().unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&got.raw);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    h["webhook-signature"]
        .to_str()
        .unwrap()
        .split(' ')
        .map(|s| s == expected)
        .collect()
}

async fn setup(s: &TestServer, r: &Receiver) -> (String, String) {
    let sensor = unique("c");
    s.sensor(&sensor).await;
    let client = s.client(&r.url).await;
    s.link(&client, &sensor).await;
    (sensor, client)
}

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_new_one_until_its_grace_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let grace = |c: &mut latch::config::Config| c.secret_rotation_grace = Duration::from_secs(60);
    let s = TestServer::start_clocked(tmp.path(), grace, clock.clone()).await;
    let r = Receiver::start().await;
    let (sensor, client) = setup(&s, &r).await;
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    let old = c["secret"].as_str().unwrap().to_string();
    assert!(c["previous_secret_expires_at"].is_null());

    let (st, body) = s
        .post(
            &format!("/v1/clients/{client}/secret/rotate"),
            json!({"secret": "whsec_!"}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (st, body) = s
        .post(
            &format!("/v1/clients/{}/secret/rotate", unique("x")),
            json!({}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{body}");
    let given = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let (st, rotated) = s
        .post(
            &format!("/v1/clients/{client}/secret/rotate"),
            json!({"secret": given}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{rotated}");
    assert_eq!(rotated["secret"], given);
    let t0 = clock.now();
    assert_eq!(ms(&rotated["previous_secret_expires_at"]), t0 + 60_000);

    // During the grace: the new signature, then the old one.
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    let got = r.wait_for(1, 10).await;
    assert_eq!(verifies(given, &got[0]), vec![true, false]);
    assert_eq!(verifies(&old, &got[0]), vec![false, true]);

    // Once it ended, only the new one.
    clock.set(t0 + 60_000);
    s.readings(json!({"sensor_id": sensor, "data": 0})).await;
    let got = r.wait_for(2, 10).await;
    assert_eq!(verifies(given, &got[1]), vec![true]);

    // A body must be JSON, as everywhere.
    let resp = s
        .http
        .post(format!("{}/v1/clients/{client}/secret/rotate", s.base))
        .header("content-type", "text/plain")
        .body(r#"{"secret": null}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 415);

    // Without a body, latch generates the new secret.
    let resp = s
        .http
        .post(format!("{}/v1/clients/{client}/secret/rotate", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await.unwrap();
    let generated = body["secret"].as_str().unwrap();
    assert!(generated.starts_with("whsec_") && generated != given);
    s.stop().await;
}

#[tokio::test]
async fn gone_disables_pending_waits_and_enable_delivers() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    r.script([Answer::status(410)]);
    r.always(Answer::status(200));
    let (a, client) = setup(&s, &r).await;
    let b = unique("c");
    s.sensor(&b).await;
    s.link(&client, &b).await;
    s.readings(json!({"sensor_id": a, "data": 1})).await;
    let c = eventually(10, "the client disabled", || async {
        let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
        (!c["disabled_at"].is_null()).then_some(c)
    })
    .await;
    assert_eq!(c["disabled_reason"], "gone");
    let listed = |disabled: bool| {
        let s = &s;
        async move {
            let (_, body) = s
                .get(&format!("/v1/clients?disabled={disabled}&limit=1000"))
                .await;
            body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert!(listed(true).await.contains(&client));
    assert!(!listed(false).await.contains(&client));

    // While disabled: nothing is sent; a newer state supersedes an older one as usual.
    s.readings(json!([{"sensor_id": a, "data": 0}, {"sensor_id": b, "data": 1}]))
        .await;
    s.readings(json!({"sensor_id": b, "data": 0})).await;
    s.dispatcher_round().await;
    assert_eq!(r.count(), 1, "no attempt while disabled");
    let pending = s
        .notifications(&format!("client_id={client}&status=pending"))
        .await;
    assert_eq!(pending.len(), 2, "{pending:?}");
    let superseded = s
        .notifications(&format!("client_id={client}&status=superseded"))
        .await;
    assert_eq!(superseded.len(), 1);
    assert_eq!(superseded[0]["sensor_id"], b.as_str());

    let (st, body) = s
        .post(&format!("/v1/clients/{client}/enable"), json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert!(body["disabled_at"].is_null());
    let got = r.wait_for(3, 10).await;
    let mut sent: Vec<(String, i64)> = got[1..]
        .iter()
        .map(|g| {
            (
                g.body["sensor"]["id"].as_str().unwrap().to_string(),
                g.body["data"].as_i64().unwrap(),
            )
        })
        .collect();
    sent.sort();
    let mut want = vec![(a.clone(), 0), (b.clone(), 0)];
    want.sort();
    assert_eq!(sent, want);
    assert!(!listed(true).await.contains(&client));
    let (st, _) = s
        .post(&format!("/v1/clients/{}/enable", unique("x")), json!({}))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn bulk_replay_sends_every_failed_notification_again_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let tweak = |c: &mut latch::config::Config| {
        c.heartbeat_timeout = Duration::from_secs(2);
        c.retry_max_attempts = 1;
    };
    let s = TestServer::start_clocked(tmp.path(), tweak, clock.clone()).await;
    let r = Receiver::start().await;
    r.always(Answer::status(500));
    let (sensor, client) = setup(&s, &r).await;
    let t0 = clock.now();
    // A state, lost, restored and a new state: four dead letters.
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    r.wait_for(1, 10).await;
    clock.set(t0 + 2_000);
    r.wait_for(2, 10).await;
    s.readings(json!({"sensor_id": sensor, "data": 0})).await;
    let failed = eventually(10, "four failed notifications", || async {
        let f = s
            .notifications(&format!("client_id={client}&status=failed"))
            .await;
        (f.len() == 4).then_some(f)
    })
    .await;
    let ids: Vec<&str> = failed.iter().map(|n| n["id"].as_str().unwrap()).collect();

    let (st, body) = s
        .post(
            "/v1/notifications/retry",
            json!({"client_id": client, "since": "2100-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!((st, body), (StatusCode::ACCEPTED, json!({"retried": 0})));
    let (st, _) = s
        .post("/v1/notifications/retry", json!({"client_id": unique("x")}))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    r.always(Answer::status(200));
    let (st, body) = s
        .post(
            "/v1/notifications/retry",
            json!({"client_id": client, "sensor_id": sensor}),
        )
        .await;
    assert_eq!((st, body), (StatusCode::ACCEPTED, json!({"retried": 4})));
    eventually(10, "nothing pending", || async {
        s.notifications(&format!("client_id={client}&status=pending"))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let again: Vec<String> = r.received()[4..]
        .iter()
        .map(|g| g.headers["webhook-id"].to_str().unwrap().to_string())
        .collect();
    // In outbox order; the first state may be superseded by the newer one behind it.
    let order: Vec<usize> = again
        .iter()
        .map(|id| ids.iter().position(|i| i == id).unwrap())
        .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    assert_eq!(order[order.len() - 3..], [1, 2, 3], "lost, restored, state");
    s.stop().await;
}

#[tokio::test]
async fn health_sums_up_a_known_sequence_of_answers() {
    let s = TestServer::start_with(|c| c.retry_max_attempts = 1).await;
    let r = Receiver::start().await;
    r.script([
        Answer::status(500),
        Answer::status(503),
        Answer::status(200),
        Answer::status(500),
    ]);
    let (sensor, client) = setup(&s, &r).await;
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    let h = &c["health"];
    assert_eq!(h["consecutive_failures"], 0);
    assert!(h["success_ratio_1h"].is_null() && h["last_success_at"].is_null());
    for (n, d) in [1, 0, 1, 0].into_iter().enumerate() {
        s.readings(json!({"sensor_id": sensor, "data": d})).await;
        r.wait_for(n + 1, 10).await;
        eventually(10, "the attempt recorded", || async {
            s.notifications(&format!("client_id={client}&status=pending"))
                .await
                .is_empty()
                .then_some(())
        })
        .await;
    }
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    let h = &c["health"];
    assert_eq!(h["consecutive_failures"], 1);
    assert_eq!(h["success_ratio_1h"], 0.25);
    assert_eq!(h["last_error"], "HTTP 500");
    assert_eq!(
        (h["pending"].clone(), h["failed"].clone()),
        (json!(0), json!(3))
    );
    assert!(ms(&h["last_failure_at"]) > ms(&h["last_success_at"]));
    assert!(h["latency_p50_ms_1h"].as_u64().unwrap() <= h["latency_p99_ms_1h"].as_u64().unwrap());
    let (_, list) = s.get("/v1/clients?limit=1000").await;
    assert!(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c.get("health").is_none()),
        "health only when reading one client"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_rate_limited_client_gets_evenly_spaced_requests() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let r = Receiver::start().await;
    let (st, body) = s
        .post(
            "/v1/clients",
            json!({"name": "slow", "url": r.url, "rate_limit": 0}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (st, body) = s
        .post(
            "/v1/clients",
            json!({"name": "slow", "url": r.url, "rate_limit": 2}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(body["rate_limit"], 2);
    let client = body["id"].as_str().unwrap().to_string();
    let sensors: Vec<String> = (0..4).map(|_| unique("c")).collect();
    for sensor in &sensors {
        s.sensor(sensor).await;
        s.link(&client, sensor).await;
    }
    let t0 = clock.now();
    let batch: Vec<Value> = sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    s.readings(Value::Array(batch)).await;
    r.wait_for(1, 10).await;
    // One request every 500 ms of latch's clock, not a millisecond sooner.
    for k in 1..4 {
        clock.set(t0 + 500 * k as i64 - 1);
        s.dispatcher_round().await;
        assert_eq!(r.count(), k, "nothing before the next token");
        clock.set(t0 + 500 * k as i64);
        r.wait_for(k + 1, 10).await;
    }
    // Attempts are recorded after the answer: wait until all four are.
    let delivered = eventually(10, "four delivered", || async {
        let d = s
            .notifications(&format!("client_id={client}&status=delivered"))
            .await;
        (d.len() == 4).then_some(d)
    })
    .await;
    let mut at = Vec::new();
    for n in delivered {
        let (_, d) = s
            .get(&format!("/v1/notifications/{}", n["id"].as_str().unwrap()))
            .await;
        at.push(ms(&d["attempts"][0]["at"]));
    }
    at.sort();
    let gaps: Vec<i64> = at.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps, vec![500, 500, 500]);

    // Lifted on update: the rest go at once.
    let (st, _) = s
        .put(
            &format!("/v1/clients/{client}"),
            json!({"name": "slow", "url": r.url}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let batch: Vec<Value> = sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 0}))
        .collect();
    s.readings(Value::Array(batch)).await;
    r.wait_for(8, 10).await;
    s.stop().await;
}

#[tokio::test]
async fn the_lifecycle_operations_are_in_the_openapi_document() {
    let s = TestServer::start().await;
    let (_, doc) = s.get("/openapi.json").await;
    for (path, method) in [
        ("/v1/clients/{id}/secret/rotate", "post"),
        ("/v1/clients/{id}/enable", "post"),
        ("/v1/notifications/retry", "post"),
    ] {
        assert!(
            doc["paths"][path].get(method).is_some(),
            "missing {method} {path}"
        );
    }
    let client = &doc["components"]["schemas"]["ClientOut"]["properties"];
    for field in ["rate_limit", "disabled_at", "disabled_reason", "health"] {
        assert!(client.get(field).is_some(), "ClientOut has no {field}");
    }
    s.stop().await;
}

/// What a generic client may send, as the OpenAPI document allows it: a whole number
/// written `5.0`, a `null` body for the optional rotation body.
#[tokio::test]
async fn schema_valid_forms_of_the_lifecycle_bodies_are_accepted() {
    let s = TestServer::start().await;
    let (st, body) = s
        .post(
            "/v1/clients",
            json!({"name": "n", "url": "http://127.0.0.1:9/hook", "rate_limit": 5.0}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    assert_eq!(body["rate_limit"], 5);
    let id = body["id"].as_str().unwrap().to_string();
    let (st, body) = s
        .post(
            "/v1/clients",
            json!({"name": "n", "url": "http://127.0.0.1:9/hook", "rate_limit": 5.5}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (st, before) = s.get(&format!("/v1/clients/{id}")).await;
    assert_eq!(st, StatusCode::OK);
    let (st, after) = s
        .post(&format!("/v1/clients/{id}/secret/rotate"), Value::Null)
        .await;
    assert_eq!(st, StatusCode::OK, "{after}");
    assert_ne!(
        after["secret"], before["secret"],
        "a new secret was generated"
    );
    let (st, body) = s
        .post(&format!("/v1/clients/{id}/secret/rotate"), json!([null]))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "not an object: {body}");
    s.stop().await;
}
