//! What a client receives, under its control (issue #36): subscriptions by type, a test
//! event on request, debounced flapping, and reminders while a sensor stays lost. Where
//! the moment matters latch runs on a manual clock the test moves.

use std::time::Duration;

use axum::http::StatusCode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Answer, Received, Receiver, TestServer, eventually, unique};

fn ms(v: &Value) -> i64 {
    latch::domain::time::parse(v.as_str().unwrap()).unwrap()
}

fn of_type<'a>(got: &'a [Received], sensor: &str, kind: &str) -> Vec<&'a Value> {
    got.iter()
        .map(|g| &g.body)
        .filter(|b| b["sensor"]["id"] == sensor && b["type"] == kind)
        .collect()
}

/// Waits until `r` got `n` notifications of `kind` about `sensor`, and returns them.
async fn wait_for_type(r: &Receiver, sensor: &str, kind: &str, n: usize) -> Vec<Value> {
    eventually(15, kind, || async {
        let got = r.received();
        let of: Vec<Value> = of_type(&got, sensor, kind).into_iter().cloned().collect();
        (of.len() >= n).then_some(of)
    })
    .await
}

async fn status(s: &TestServer, id: &str) -> Value {
    let (code, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    body["status"].clone()
}

/// A client wanting only some types gets only those, and nothing is made for it of the
/// others (no notification row); a bad type is refused with a reason.
#[tokio::test]
async fn a_client_gets_only_the_types_it_wants() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let timeout = |c: &mut latch::config::Config| c.heartbeat_timeout = Duration::from_secs(2);
    let s = TestServer::start_clocked(tmp.path(), timeout, clock.clone()).await;
    let (all, lost_only) = (Receiver::start().await, Receiver::start().await);
    let everything = s.client(&all.url).await;
    let (code, body) = s
        .post(
            "/v1/clients",
            json!({"name": "pager", "url": lost_only.url, "events": ["sensor.connection_lost"]}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["events"], json!(["sensor.connection_lost"]));
    let pager = body["id"].as_str().unwrap().to_string();
    let (_, read) = s.get(&format!("/v1/clients/{everything}")).await;
    assert!(read["events"].is_null(), "absent: every type");

    let id = unique("sub");
    s.sensor(&id).await;
    s.link(&everything, &id).await;
    s.link(&pager, &id).await;
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    clock.set(t0 + 2_000);
    wait_for_type(&all, &id, "sensor.connection_lost", 1).await;
    let lost = wait_for_type(&lost_only, &id, "sensor.connection_lost", 1).await;
    assert_eq!(lost[0]["data"], 1);
    let got: Vec<String> = lost_only
        .received()
        .iter()
        .map(|g| g.body["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, ["sensor.connection_lost"], "no state change came");
    let rows = s.notifications(&format!("client_id={pager}")).await;
    assert_eq!(rows.len(), 1, "nothing made of the unwanted type: {rows:?}");
    assert_eq!(
        s.notifications(&format!("client_id={everything}"))
            .await
            .len(),
        2
    );

    for bad in [
        json!(["sensor.lost"]),
        json!(["sensor.state_changed", "sensor.state_changed"]),
    ] {
        let (code, body) = s
            .put(
                &format!("/v1/clients/{pager}"),
                json!({"name": "pager", "url": lost_only.url, "events": bad}),
            )
            .await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("events[")
        );
    }
    // Replaced without `events`: every type again, from the next notification on.
    let (code, body) = s
        .put(
            &format!("/v1/clients/{pager}"),
            json!({"name": "pager", "url": lost_only.url}),
        )
        .await;
    assert_eq!(
        (code, body["events"].clone()),
        (StatusCode::OK, Value::Null)
    );
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    wait_for_type(&lost_only, &id, "sensor.state_changed", 1).await;
    s.stop().await;
}

/// The Standard Webhooks signature of `body` with `secret`.
pub(crate) fn signature(secret: &str, id: &str, ts: &str, body: &[u8]) -> String {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

/// `POST /v1/clients/{id}/test` sends one signed `client.test` at once and answers what
/// came of it; nothing is stored, so nothing is retried.
#[tokio::test]
async fn a_test_event_goes_out_signed_and_its_answer_comes_back() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    let (code, c) = s
        .post(
            "/v1/clients",
            json!({"name": "tested", "url": r.url, "events": []}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{c}");
    let (id, secret) = (c["id"].as_str().unwrap(), c["secret"].as_str().unwrap());

    let (code, answer) = s.post(&format!("/v1/clients/{id}/test"), Value::Null).await;
    assert_eq!(code, StatusCode::OK, "{answer}");
    assert_eq!(answer["status"], 200);
    assert!(answer["error"].is_null(), "{answer}");
    assert!(answer["duration_ms"].is_u64());
    let got = r.received();
    assert_eq!(
        got.len(),
        1,
        "sent at once, even to a client that wants no type"
    );
    let (h, body) = (&got[0].headers, &got[0].body);
    assert_eq!(body["type"], "client.test");
    assert_eq!(
        (
            body["client"]["id"].as_str(),
            body["client"]["name"].as_str()
        ),
        (Some(id), Some("tested"))
    );
    assert_eq!(
        h["webhook-id"].to_str().unwrap(),
        body["id"].as_str().unwrap()
    );
    let ts = h["webhook-timestamp"].to_str().unwrap();
    assert_eq!(
        h["webhook-signature"].to_str().unwrap(),
        signature(secret, body["id"].as_str().unwrap(), ts, &got[0].raw)
    );

    r.script([Answer::status(500)]);
    let (_, answer) = s.post(&format!("/v1/clients/{id}/test"), Value::Null).await;
    assert_eq!(
        (answer["status"].clone(), answer["error"].clone()),
        (json!(500), json!("HTTP 500"))
    );
    assert!(
        s.notifications(&format!("client_id={id}")).await.is_empty(),
        "not stored, so never retried"
    );
    assert_eq!(r.count(), 2);

    // Nobody listening: no status, the reason instead.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/hook", l.local_addr().unwrap())
    };
    let (_, c2) = s
        .post("/v1/clients", json!({"name": "gone", "url": closed}))
        .await;
    let (code, answer) = s
        .post(
            &format!("/v1/clients/{}/test", c2["id"].as_str().unwrap()),
            Value::Null,
        )
        .await;
    assert_eq!(code, StatusCode::OK);
    assert!(answer["status"].is_null(), "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("connection"),
        "{answer}"
    );

    let (code, _) = s.post("/v1/clients/nope/test", Value::Null).await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    s.stop().await;
}

/// With a debounce window, flapping notifies nobody while the API shows every reading at
/// once; the state that held is notified once, with the flips it held back; a window open
/// at a restart ends on time after it.
#[tokio::test]
async fn flapping_within_the_debounce_window_is_one_notification() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let long = |c: &mut latch::config::Config| c.heartbeat_timeout = Duration::from_secs(3600);
    let s = TestServer::start_clocked(tmp.path(), long, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("db");
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "hall", "debounce_s": 10}),
        )
        .await;
    assert_eq!(
        (code, body["debounce_s"].clone()),
        (StatusCode::CREATED, json!(10))
    );
    s.link(&client, &id).await;

    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    clock.set(t0 + 10_000);
    let first = wait_for_type(&r, &id, "sensor.state_changed", 1).await;
    assert_eq!(
        (
            first[0]["data"].clone(),
            first[0]["flips_suppressed"].clone()
        ),
        (json!(0), json!(0))
    );

    // 1, 0, 1, 0, 1 a second apart: the API follows each, nobody is notified.
    for (i, d) in [1, 0, 1, 0, 1].into_iter().enumerate() {
        clock.set(t0 + 20_000 + 1_000 * i as i64);
        s.readings(json!({"sensor_id": id, "data": d})).await;
        assert_eq!(status(&s, &id).await["data"], d, "the API shows it at once");
    }
    clock.set(t0 + 34_000);
    let changes = wait_for_type(&r, &id, "sensor.state_changed", 2).await;
    assert_eq!(changes.len(), 2, "one notification for the five flips");
    let c = &changes[1];
    assert_eq!(
        (c["data"].clone(), c["previous"].clone()),
        (json!(1), json!(0))
    );
    assert_eq!(c["flips_suppressed"], 4);
    assert_eq!(
        ms(&c["occurred_at"]),
        t0 + 24_000,
        "when the held state began"
    );
    assert_eq!(
        s.reading_count(&id).await,
        6,
        "every reading kept in history"
    );
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
    let flips: Vec<Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["flips_suppressed"].clone())
        .collect();
    assert_eq!(flips, [json!(0), json!(4)]);

    // A window open when latch stops ends on time after the restart.
    clock.set(t0 + 40_000);
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let keep = s.stop().await;
    let clock = Clock::manual(t0 + 45_000);
    let s = TestServer::start_clocked(tmp.path(), long, clock.clone()).await;
    assert_eq!(status(&s, &id).await["data"], 0);
    clock.set(t0 + 50_000);
    let changes = wait_for_type(&r, &id, "sensor.state_changed", 3).await;
    assert_eq!(
        (changes[2]["data"].clone(), changes[2]["previous"].clone()),
        (json!(0), json!(1))
    );
    assert_eq!(ms(&changes[2]["occurred_at"]), t0 + 40_000);
    s.stop().await;
    drop(keep);
}

/// While a sensor stays lost, `sensor.still_lost` comes once per interval with
/// `lost_since` and the count so far; a restart shorter than the interval misses none and
/// repeats none.
#[tokio::test]
async fn reminders_come_once_per_interval_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let tweak = |c: &mut latch::config::Config| {
        c.heartbeat_timeout = Duration::from_secs(2);
        c.lost_reminder = Some(Duration::from_secs(60));
    };
    let s = TestServer::start_clocked(tmp.path(), tweak, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("rm");
    s.sensor(&id).await;
    s.link(&client, &id).await;
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    clock.set(t0 + 2_000);
    wait_for_type(&r, &id, "sensor.connection_lost", 1).await;
    clock.set(t0 + 62_000);
    let first = wait_for_type(&r, &id, "sensor.still_lost", 1).await;
    let f = &first[0];
    assert_eq!(
        (f["reminder"].clone(), f["data"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(ms(&f["lost_since"]), t0 + 2_000);
    assert_eq!(ms(&f["occurred_at"]), t0 + 62_000);
    assert_eq!(ms(&f["last_seen_at"]), t0);

    // Stopped from +100 s to +130 s: reminder 2 fell due meanwhile and comes at start.
    clock.set(t0 + 100_000);
    let keep = s.stop().await;
    let clock = Clock::manual(t0 + 130_000);
    let s = TestServer::start_clocked(tmp.path(), tweak, clock.clone()).await;
    let two = wait_for_type(&r, &id, "sensor.still_lost", 2).await;
    assert_eq!(two[1]["reminder"], 2);
    assert_eq!(ms(&two[1]["occurred_at"]), t0 + 122_000);
    // Straight away again: no second reminder 2.
    let keep2 = s.stop().await;
    let clock = Clock::manual(t0 + 131_000);
    let s = TestServer::start_clocked(tmp.path(), tweak, clock.clone()).await;
    clock.set(t0 + 182_000);
    let three = wait_for_type(&r, &id, "sensor.still_lost", 3).await;
    let numbers: Vec<Value> = three.iter().map(|b| b["reminder"].clone()).collect();
    assert_eq!(
        numbers,
        [json!(1), json!(2), json!(3)],
        "each once, in order"
    );
    // Back: the reminders end.
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    wait_for_type(&r, &id, "sensor.connection_restored", 1).await;
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
    let reminders: Vec<Value> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "sensor.still_lost")
        .map(|e| e["reminder"].clone())
        .collect();
    assert_eq!(reminders, [json!(1), json!(2), json!(3)]);
    s.stop().await;
    drop((keep, keep2));
}
