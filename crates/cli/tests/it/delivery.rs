//! Webhook delivery against real local receivers: order, signatures, retries, dead letters,
//! supersede, registry at send time, crash safety.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::http::StatusCode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use latch::clock::Clock;
use latch::delivery::retry::RetryPolicy;
use latch::domain::time::now_ms;

use crate::utils::{
    Answer, Process, Receiver, TestServer, counting, eventually, redirecting, unique,
};

fn ms(v: &Value) -> i64 {
    latch::domain::time::parse(v.as_str().unwrap()).unwrap()
}

/// Waits until the outbox has nothing pending for `sensor`.
async fn settled(s: &TestServer, sensor: &str) {
    eventually(10, "no pending notifications", || async {
        s.notifications(&format!("sensor_id={sensor}&status=pending"))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
}

async fn setup(s: &TestServer, r: &Receiver) -> (String, String) {
    let sensor = unique("d");
    s.sensor(&sensor).await;
    let client = s.client(&r.url).await;
    s.link(&client, &sensor).await;
    (sensor, client)
}

#[tokio::test]
async fn linked_clients_get_every_change_in_order_and_nothing_else() {
    let s = TestServer::start().await;
    let linked = Receiver::start().await;
    let other = Receiver::start().await;
    let (sensor, _) = setup(&s, &linked).await;
    let unlinked_sensor = unique("u");
    s.sensor(&unlinked_sensor).await;
    let other_client = s.client(&other.url).await;
    let _ = other_client;
    for d in [1, 1, 1, 0, 0, 1] {
        s.readings(json!([{"sensor_id": sensor, "data": d}])).await;
        s.readings(json!([{"sensor_id": unlinked_sensor, "data": d}]))
            .await;
        settled(&s, &sensor).await;
    }
    let got = linked.wait_for(3, 10).await;
    // Every reading was committed before its 202, and nothing is pending: the outbox
    // holds every notification there will be.
    assert_eq!(
        s.notifications(&format!("sensor_id={sensor}")).await.len(),
        3,
        "a repeated value notifies nobody"
    );
    assert_eq!(linked.count(), 3);
    let pairs: Vec<(Value, Value)> = got
        .iter()
        .map(|g| (g.body["previous"].clone(), g.body["data"].clone()))
        .collect();
    assert_eq!(
        pairs,
        vec![
            (Value::Null, json!(1)),
            (json!(1), json!(0)),
            (json!(0), json!(1))
        ]
    );
    let first = &got[0].body;
    assert_eq!(first["type"], "sensor.state_changed");
    assert_eq!(first["sensor"]["id"], sensor.as_str());
    assert_eq!(first["sensor"]["address"], format!("{sensor} street 1"));
    assert!(first["occurred_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(got[0].headers["content-type"], "application/json");
    assert_eq!(
        other.count(),
        0,
        "a client not linked to the sensor gets nothing"
    );
    let delivered = s
        .notifications(&format!("sensor_id={sensor}&status=delivered"))
        .await;
    assert_eq!(delivered.len(), 3);
    s.stop().await;
}

#[tokio::test]
async fn signatures_verify_with_an_independent_hmac() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    let (sensor, client) = setup(&s, &r).await;
    let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
    let secret = c["secret"].as_str().unwrap().to_string();
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    let got = r.wait_for(1, 10).await;
    let h = &got[0].headers;
    let id = h["webhook-id"].to_str().unwrap();
    let ts = h["webhook-timestamp"].to_str().unwrap();
    assert_eq!(
        id,
        got[0].body["id"].as_str().unwrap(),
        "webhook-id is the notification id"
    );
    let now = chrono::Utc::now().timestamp();
    assert!((now - ts.parse::<i64>().unwrap()).abs() < 30);
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&got[0].raw);
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    assert_eq!(h["webhook-signature"].to_str().unwrap(), expected);
    s.stop().await;
}

/// On a manual clock: each retry waits exactly its scheduled delay (the policy's, within
/// its jitter), not a millisecond less, and the delays grow.
#[tokio::test]
async fn failures_are_retried_with_one_id_and_growing_gaps() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let policy = RetryPolicy::from_config(&crate::utils::fast_config(tmp.path()));
    let r = Receiver::start().await;
    r.script([Answer::status(500), Answer::status(502)]);
    let (sensor, _) = setup(&s, &r).await;
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    let mut gaps = Vec::new();
    for n in 1..=2u32 {
        let (id, next) = eventually(10, &format!("attempt {n} failed"), || async {
            let ns = s.notifications(&format!("sensor_id={sensor}")).await;
            let x = ns.first()?;
            let next = x["next_attempt_at"].as_str()?;
            (x["attempt_count"] == n).then(|| {
                let next = latch::domain::time::parse(next).unwrap();
                (x["id"].as_str().unwrap().to_string(), next)
            })
        })
        .await;
        let (_, detail) = s.get(&format!("/v1/notifications/{id}")).await;
        let tried = ms(&detail["attempts"][n as usize - 1]["at"]);
        let gap = next - tried;
        let d = policy.delay(n).as_millis() as i64;
        assert!(
            (d * 9 / 10..=d * 11 / 10).contains(&gap),
            "retry {n} due {gap} ms after the attempt; the policy says {d} ms ± 10 %"
        );
        gaps.push(gap);
        clock.set(next - 1);
        s.dispatcher_round().await;
        assert_eq!(r.count(), n as usize, "nothing before the retry is due");
        clock.set(next);
        r.wait_for(n as usize + 1, 10).await;
    }
    assert!(gaps[1] > gaps[0], "gaps grow: {gaps:?}");
    let got = r.received();
    let ids: Vec<&str> = got
        .iter()
        .map(|g| g.headers["webhook-id"].to_str().unwrap())
        .collect();
    assert!(ids.iter().all(|i| *i == ids[0]), "{ids:?}");
    settled(&s, &sensor).await;
    let n = &s.notifications(&format!("sensor_id={sensor}")).await[0];
    assert_eq!(n["status"], "delivered");
    let (_, detail) = s
        .get(&format!("/v1/notifications/{}", n["id"].as_str().unwrap()))
        .await;
    let codes: Vec<Value> = detail["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status_code"].clone())
        .collect();
    assert_eq!(codes, vec![json!(500), json!(502), json!(200)]);
    s.stop().await;
}

#[tokio::test]
async fn dead_letters_after_max_attempts_and_replay_delivers() {
    let s = TestServer::start_with(|c| c.retry_max_attempts = 3).await;
    let r = Receiver::start().await;
    r.always(Answer::status(500));
    let (sensor, _) = setup(&s, &r).await;
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    let failed = eventually(15, "a failed notification", || async {
        s.notifications(&format!("sensor_id={sensor}&status=failed"))
            .await
            .pop()
    })
    .await;
    assert_eq!(r.count(), 3);
    assert_eq!(failed["attempt_count"], 3);
    let id = failed["id"].as_str().unwrap().to_string();

    r.always(Answer::status(204));
    let (st, body) = s
        .post(&format!("/v1/notifications/{id}/retry"), json!({}))
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "pending");
    settled(&s, &sensor).await;
    let (_, detail) = s.get(&format!("/v1/notifications/{id}")).await;
    assert_eq!(detail["status"], "delivered");
    assert_eq!(detail["attempts"].as_array().unwrap().len(), 4);
    let (st, body) = s
        .post(&format!("/v1/notifications/{id}/retry"), json!({}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "only failed ones replay: {body}");
    let (st, _) = s.post("/v1/notifications/nope/retry", json!({})).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    s.stop().await;
}

#[tokio::test]
async fn gone_stops_at_once() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    r.always(Answer::status(410));
    let (sensor, _) = setup(&s, &r).await;
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    eventually(10, "failed", || async {
        (!s.notifications(&format!("sensor_id={sensor}&status=failed"))
            .await
            .is_empty())
        .then_some(())
    })
    .await;
    // Failed is final, and a lane sends one attempt at a time: the one that failed it was
    // the last.
    let failed = s
        .notifications(&format!("sensor_id={sensor}&status=failed"))
        .await;
    let (_, detail) = s
        .get(&format!(
            "/v1/notifications/{}",
            failed[0]["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(
        detail["attempts"].as_array().unwrap().len(),
        1,
        "410 Gone is not retried"
    );
    assert_eq!(r.count(), 1);
    s.stop().await;
}

#[tokio::test]
async fn a_client_never_has_more_requests_in_flight_than_its_limit() {
    let s = TestServer::start_with(|c| c.delivery_client_concurrency = 3).await;
    let r = Receiver::start().await;
    r.always(Answer {
        status: 200,
        delay: Duration::from_millis(100),
        retry_after: None,
    });
    let client = s.client(&r.url).await;
    let sensors: Vec<String> = (0..20).map(|_| unique("lim")).collect();
    for id in &sensors {
        s.sensor(id).await;
        s.link(&client, id).await;
    }
    let batch: Vec<Value> = sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    s.readings(Value::Array(batch)).await;
    // Heads are claimed ahead of the limit, but requests never exceed it.
    r.wait_for(20, 20).await;
    assert_eq!(r.max_inflight(), 3, "exactly the limit, used in full");
    s.stop().await;
}

#[tokio::test]
async fn a_slow_receiver_never_sees_two_requests_for_one_sensor() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    r.always(Answer {
        status: 200,
        delay: Duration::from_millis(150),
        retry_after: None,
    });
    let client = s.client(&r.url).await;
    let sensors: Vec<String> = (0..4).map(|_| unique("slow")).collect();
    for id in &sensors {
        s.sensor(id).await;
        s.link(&client, id).await;
    }
    for d in [1, 0, 1, 0, 1] {
        let batch: Vec<Value> = sensors
            .iter()
            .map(|id| json!({"sensor_id": id, "data": d}))
            .collect();
        s.readings(Value::Array(batch)).await;
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
    for id in &sensors {
        settled(&s, id).await;
    }
    assert_eq!(r.max_inflight_per_sensor(), 1);
    // Whatever was superseded, each sensor's last delivery carries its final state.
    let got = r.received();
    for id in &sensors {
        let last = got
            .iter()
            .rev()
            .find(|g| g.body["sensor"]["id"] == id.as_str())
            .unwrap();
        assert_eq!(last.body["data"], 1, "{id}");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_newer_state_supersedes_pending_ones() {
    let s = TestServer::start_with(|c| c.retry_base = Duration::from_secs(2)).await;
    let r = Receiver::start().await;
    r.script([Answer::status(500)]);
    let (sensor, _) = setup(&s, &r).await;
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    r.wait_for(1, 10).await; // the first attempt failed; a retry waits ~2 s
    s.readings(json!({"sensor_id": sensor, "data": 0})).await;
    settled(&s, &sensor).await;
    let all = s.notifications(&format!("sensor_id={sensor}")).await;
    let statuses: Vec<&str> = all.iter().map(|n| n["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, vec!["superseded", "delivered"]);
    let got = r.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[1].body["data"], 0, "the newer state carries the truth");
    s.stop().await;
}

#[tokio::test]
async fn a_changed_url_takes_the_next_attempt() {
    let s = TestServer::start().await;
    let old = Receiver::start().await;
    let new = Receiver::start().await;
    old.always(Answer::status(503));
    let (sensor, client) = setup(&s, &old).await;
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    old.wait_for(1, 10).await;
    let (st, _) = s
        .put(
            &format!("/v1/clients/{client}"),
            json!({"name": "moved", "url": new.url}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let got = new.wait_for(1, 10).await;
    assert_eq!(
        got[0].headers["webhook-id"],
        old.received()[0].headers["webhook-id"]
    );
    s.stop().await;
}

#[tokio::test]
async fn unlinking_cancels_pending_notifications() {
    // On a manual clock: past every retry delay the notification would have had, the
    // dispatcher is seen to have acted, and sent nothing.
    let tmp = tempfile::tempdir().unwrap();
    let clock = latch::clock::Clock::manual(latch::domain::time::now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let r = Receiver::start().await;
    r.always(Answer::status(500));
    let (sensor, client) = setup(&s, &r).await;
    s.readings(json!({"sensor_id": sensor, "data": 1})).await;
    r.wait_for(1, 10).await;
    let (st, _) = s
        .delete(&format!("/v1/clients/{client}/sensors/{sensor}"))
        .await;
    assert_eq!(st, StatusCode::NO_CONTENT);
    let sent = r.count();
    // The retry falls due: its claim reads the registry and cancels instead of sending.
    clock.advance(Duration::from_secs(60));
    let n = eventually(10, "cancelled", || async {
        s.notifications(&format!("sensor_id={sensor}&status=cancelled"))
            .await
            .pop()
    })
    .await;
    s.dispatcher_round().await;
    assert_eq!(r.count(), sent, "nothing is sent after the unlink");
    assert_eq!(n["client_id"], client.as_str());
    s.stop().await;
}

#[tokio::test]
async fn redirects_are_not_followed_and_fail_the_attempt() {
    let s = TestServer::start_with(|c| c.retry_max_attempts = 2).await;
    let (elsewhere, hits) = counting("/elsewhere").await;
    for status in [303u16, 307, 308] {
        let sensor = unique("rd");
        s.sensor(&sensor).await;
        let client = s.client(&redirecting(status, &elsewhere).await).await;
        s.link(&client, &sensor).await;
        s.readings(json!({"sensor_id": sensor, "data": 1})).await;
        let failed = eventually(15, "a failed notification", || async {
            s.notifications(&format!("sensor_id={sensor}&status=failed"))
                .await
                .pop()
        })
        .await;
        let (_, detail) = s
            .get(&format!(
                "/v1/notifications/{}",
                failed["id"].as_str().unwrap()
            ))
            .await;
        let codes: Vec<Value> = detail["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["status_code"].clone())
            .collect();
        assert_eq!(
            codes,
            vec![json!(status), json!(status)],
            "each {status} is a failed attempt, retried, then dead-lettered: {detail}"
        );
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "nothing (no POST, no GET, no signature) reaches the redirect target"
    );
    s.stop().await;
}

#[tokio::test]
async fn kill_9_with_pending_notifications_then_restart_delivers_all() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let r = Receiver::start().await;
    r.always(Answer::status(503));
    let p = Process::start(dir.path(), crate::utils::database_url(dir.path()).await);
    p.ready(&http).await;
    let post = |path: &str, body: Value| {
        let req = http.post(format!("{}{path}", p.base)).json(&body);
        async move { req.send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let client = post("/v1/clients", json!({"name": "c", "url": r.url})).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let sensors: Vec<String> = (0..5).map(|_| unique("k")).collect();
    for id in &sensors {
        post("/v1/sensors", json!({"id": id, "address": "a"})).await;
        http.put(format!("{}/v1/clients/{client}/sensors/{id}", p.base))
            .send()
            .await
            .unwrap();
    }
    let batch: Vec<Value> = sensors
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    let ack = post("/v1/readings", Value::Array(batch)).await;
    assert_eq!(ack["accepted"], 5);
    r.wait_for(5, 10).await;
    p.kill9();

    r.always(Answer::status(200));
    let p = Process::start(dir.path(), crate::utils::database_url(dir.path()).await);
    p.ready(&http).await;
    let delivered = eventually(20, "all 5 delivered after restart", || async {
        let body: Value = http
            .get(format!("{}/v1/notifications?status=delivered", p.base))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        let items = body["items"].as_array()?.clone();
        (items.len() == 5).then_some(items)
    })
    .await;
    let mut got: Vec<&str> = delivered
        .iter()
        .map(|n| n["sensor_id"].as_str().unwrap())
        .collect();
    let mut want: Vec<&str> = sensors.iter().map(String::as_str).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    p.kill9();
}
