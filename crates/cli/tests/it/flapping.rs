//! Door alarms (issue #72, a flapping contact): a sensor whose state changes `changes`
//! times within its `flap`'s window sends one `sensor.flapping` instead of the change that
//! crosses, none of its state changes while it flaps, and `sensor.flapping_stopped` with
//! the state now once quiet for the window; the flapping survives a restart. On a clock the
//! tests move by hand; on SQLite, or PostgreSQL with `TEST_STORE=postgres`.

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::{now_ms, parse};

use crate::utils::{Receiver, TestServer, unique};

fn ms(v: &Value) -> i64 {
    parse(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap()
}

fn kinds(got: &[Value]) -> Vec<&str> {
    got.iter().map(|b| b["type"].as_str().unwrap()).collect()
}

/// A door that flaps at 3 changes within 10 s.
async fn door(s: &TestServer, client: &str) -> String {
    let id = unique("flap");
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "stairwell door", "heartbeat_timeout_s": 3600,
                   "labels": {"0": "closed", "1": "open"},
                   "flap": {"changes": 3, "window_s": 10}}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["flap"], json!({"changes": 3, "window_s": 10}));
    assert_eq!(body["status"]["flapping"], false);
    s.link(client, &id).await;
    id
}

async fn flapping(s: &TestServer, id: &str) -> bool {
    let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
    body["status"]["flapping"].as_bool().unwrap()
}

#[tokio::test]
async fn a_flapping_door_is_told_once_then_its_state_once_quiet() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = door(&s, &client).await;
    let t0 = clock.now();
    // Its first value, then four changes a second apart: the third crosses. Each is
    // received before the next is sent (a newer change may supersede one still waiting).
    for (k, data) in [1, 0, 1, 0, 1].into_iter().enumerate() {
        clock.set(t0 + 1_000 * k as i64);
        s.readings(json!({"sensor_id": id, "data": data})).await;
        r.bodies_of(&id, None, (k + 1).min(4)).await;
    }
    let got = r.bodies_of(&id, None, 4).await;
    assert_eq!(
        kinds(&got),
        [
            "sensor.state_changed",
            "sensor.state_changed",
            "sensor.state_changed",
            "sensor.flapping"
        ]
    );
    let f = &got[3];
    assert_eq!((&f["changes"], &f["window_s"]), (&json!(3), &json!(10)));
    assert_eq!((&f["data"], &f["label"]), (&json!(0), &json!("closed")));
    assert!(flapping(&s, &id).await);
    s.dispatcher_round().await;
    assert_eq!(
        r.received()
            .iter()
            .filter(|g| g.body["sensor"]["id"] == id.as_str())
            .count(),
        4,
        "the fifth change is not sent"
    );
    let (_, status) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(
        status["status"]["data"], 1,
        "the state follows every reading"
    );

    // A restart while it flaps: it still flaps, and still stops a window after the last change.
    s.stop().await;
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    assert!(flapping(&s, &id).await);
    clock.set(t0 + 13_999);
    s.engine_round().await;
    s.dispatcher_round().await;
    assert_eq!(r.bodies_of(&id, None, 4).await.len(), 4);
    clock.set(t0 + 14_000);
    let got = r.bodies_of(&id, None, 5).await;
    let stopped = &got[4];
    assert_eq!(stopped["type"], "sensor.flapping_stopped");
    assert_eq!(
        (&stopped["data"], &stopped["previous"]),
        (&json!(1), &json!(0))
    );
    assert_eq!(
        (&stopped["label"], &stopped["previous_label"]),
        (&json!("open"), &json!("closed"))
    );
    assert_eq!(ms(&stopped["occurred_at"]), t0 + 14_000);
    assert!(!flapping(&s, &id).await);

    // Counted afresh: the next change is sent as it is.
    clock.set(t0 + 20_000);
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let got = r.bodies_of(&id, None, 6).await;
    assert_eq!(got[5]["type"], "sensor.state_changed");
    s.stop().await;
}

#[tokio::test]
async fn a_flap_is_checked_merged_by_a_patch_and_taken_away() {
    let s = TestServer::start().await;
    let refused = [
        (json!({"changes": 1, "window_s": 10}), "flap.changes"),
        (json!({"changes": 101, "window_s": 10}), "flap.changes"),
        (json!({"changes": 3, "window_s": 9}), "flap.window_s"),
        (json!({"changes": 3, "window_s": 3601}), "flap.window_s"),
        (json!({"changes": 3}), "window_s"),
        (json!({"changes": 3, "window_s": 10, "every": 1}), "every"),
    ];
    s.sensor_refused("flap", &refused).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = door(&s, &client).await;
    let path = format!("/v1/sensors/{id}");
    let (code, body) = s
        .request(Method::PATCH, &path, Some(json!({"flap": {"changes": 5}})))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        body["flap"],
        json!({"changes": 5, "window_s": 10}),
        "merged"
    );
    let (code, body) = s
        .request(Method::PATCH, &path, Some(json!({"flap": null})))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert!(body["flap"].is_null());
    // Without a flap, every change is notified (each newer one may supersede an older
    // one still waiting, as changes do).
    for (k, data) in [1, 0, 1, 0, 1, 0].into_iter().enumerate() {
        let ts = latch::domain::time::format(now_ms() + k as i64);
        s.readings(json!({"sensor_id": id, "data": data, "ts": ts}))
            .await;
    }
    let made = s.notifications(&format!("sensor_id={id}")).await;
    let made: Vec<&str> = made.iter().map(|n| n["type"].as_str().unwrap()).collect();
    assert_eq!(made, ["sensor.state_changed"; 6], "{made:?}");
    s.stop().await;
}
