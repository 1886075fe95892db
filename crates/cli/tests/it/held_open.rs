//! Door alarms (issue #72, a state held too long): a door left open past its sensor's
//! `hold_alarms` makes `sensor.state_held`, reminders while it stays open, and
//! `sensor.state_held_cleared` once it closes; the timers survive a restart, and alarms set
//! on a door already open time it from then. On a clock the tests move by hand; on
//! SQLite, or PostgreSQL with `TEST_STORE=postgres`.

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::{now_ms, parse};

use crate::utils::{Receiver, TestServer, unique};

fn ms(v: &Value) -> i64 {
    parse(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap()
}

fn count(r: &Receiver, sensor: &str, kind: &str) -> usize {
    r.received()
        .iter()
        .filter(|g| g.body["sensor"]["id"] == sensor && g.body["type"] == kind)
        .count()
}

/// A door that alarms once open for 30 s, then every minute while it stays open.
async fn door(s: &TestServer, client: &str) -> String {
    let id = unique("held");
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "loading dock door", "heartbeat_timeout_s": 3600,
                   "labels": {"0": "closed", "1": "open"},
                   "hold_alarms": [{"data": 1, "after_s": 30, "remind_every_s": 60}]}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(
        body["hold_alarms"],
        json!([{"data": 1, "after_s": 30, "remind_every_s": 60}])
    );
    s.link(client, &id).await;
    id
}

async fn held_since(s: &TestServer, id: &str) -> Value {
    let (code, body) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    body["status"]["held_since"].clone()
}

#[tokio::test]
async fn a_door_held_open_alarms_reminds_and_clears_once_it_closes() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = door(&s, &client).await;
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    r.bodies_of(&id, Some("sensor.state_changed"), 1).await;

    // A millisecond before its time, nothing.
    clock.set(t0 + 29_999);
    s.engine_round().await;
    s.dispatcher_round().await;
    assert_eq!(count(&r, &id, "sensor.state_held"), 0);
    assert!(held_since(&s, &id).await.is_null());

    clock.set(t0 + 30_000);
    let held = r.bodies_of(&id, Some("sensor.state_held"), 1).await;
    let h = &held[0];
    assert_eq!((&h["data"], &h["label"]), (&json!(1), &json!("open")));
    assert_eq!(ms(&h["since"]), t0, "from the reading that opened it");
    assert_eq!(ms(&h["occurred_at"]), t0 + 30_000);
    assert_eq!(h["held_s"], 30);
    assert!(h.get("reminder").is_none(), "the first is no reminder: {h}");
    assert_eq!(ms(&held_since(&s, &id).await), t0);

    // Open on: one reminder a minute, numbered.
    clock.set(t0 + 90_000);
    let held = r.bodies_of(&id, Some("sensor.state_held"), 2).await;
    assert_eq!(
        (&held[1]["reminder"], &held[1]["held_s"]),
        (&json!(1), &json!(90))
    );

    // Closed: the change, and the alarm's clearing.
    clock.set(t0 + 100_000);
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let cleared = r.bodies_of(&id, Some("sensor.state_held_cleared"), 1).await;
    let c = &cleared[0];
    assert_eq!((&c["data"], &c["previous"]), (&json!(0), &json!(1)));
    assert_eq!(
        (&c["label"], &c["previous_label"]),
        (&json!("closed"), &json!("open"))
    );
    assert_eq!(c["held_s"], 100);
    assert!(held_since(&s, &id).await.is_null());

    // Closed for long: no alarm of its own (it has none for 0), no more reminders.
    clock.set(t0 + 1_000_000);
    s.engine_round().await;
    s.dispatcher_round().await;
    assert_eq!(count(&r, &id, "sensor.state_held"), 2);
    assert_eq!(count(&r, &id, "sensor.state_held_cleared"), 1);
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
    let kinds: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "sensor.state_changed",
            "sensor.state_held",
            "sensor.state_held",
            "sensor.state_changed",
            "sensor.state_held_cleared"
        ]
    );
    s.stop().await;
}

#[tokio::test]
async fn a_hold_that_fell_due_while_latch_was_down_alarms_once_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = door(&s, &client).await;
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    r.bodies_of(&id, Some("sensor.state_changed"), 1).await;
    clock.set(t0 + 10_000);
    s.stop().await;

    // Down past the alarm and two reminders' times.
    clock.set(t0 + 200_000);
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let held = r.bodies_of(&id, Some("sensor.state_held"), 1).await;
    assert_eq!(ms(&held[0]["occurred_at"]), t0 + 30_000, "when it fell due");
    s.engine_round().await;
    s.dispatcher_round().await;
    assert_eq!(count(&r, &id, "sensor.state_held"), 1, "once, not a burst");
    // The next reminder is the next interval's: 30 s + 3 minutes.
    clock.set(t0 + 209_999);
    s.engine_round().await;
    s.dispatcher_round().await;
    assert_eq!(count(&r, &id, "sensor.state_held"), 1);
    clock.set(t0 + 210_000);
    let held = r.bodies_of(&id, Some("sensor.state_held"), 2).await;
    assert_eq!(
        (&held[1]["reminder"], &held[1]["held_s"]),
        (&json!(3), &json!(210))
    );
    s.stop().await;
}

#[tokio::test]
async fn hold_alarms_are_checked_patched_and_time_a_door_already_open_from_then() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let refused = [
        (
            json!([{"data": 1, "after_s": 30}, {"data": 1, "after_s": 60}]),
            "at most one per value",
        ),
        (json!([{"data": 1, "after_s": 0}]), "after_s"),
        (json!([{"data": 1, "after_s": 604_801}]), "after_s"),
        (
            json!([{"data": 0, "after_s": 5, "remind_every_s": 0}]),
            "remind_every_s",
        ),
        (json!([{"data": 2, "after_s": 5}]), "0 or 1"),
        (json!([{"data": 1, "after_s": 5, "every": 5}]), "every"),
    ];
    s.sensor_refused("hold_alarms", &refused).await;

    // Open for a while with no alarm, then one is set: the door is timed from then.
    let id = unique("late");
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "side door", "heartbeat_timeout_s": 3600}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["hold_alarms"], json!([]));
    s.link(&client, &id).await;
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    clock.set(t0 + 100_000);
    let path = format!("/v1/sensors/{id}");
    let patch = json!({"hold_alarms": [{"data": 1, "after_s": 30}]});
    let (code, body) = s.request(Method::PATCH, &path, Some(patch)).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body["hold_alarms"], json!([{"data": 1, "after_s": 30}]));
    assert_eq!(body["address"], "side door", "the rest kept");
    clock.set(t0 + 129_999);
    s.engine_round().await;
    s.dispatcher_round().await;
    assert_eq!(count(&r, &id, "sensor.state_held"), 0);
    clock.set(t0 + 130_000);
    let held = r.bodies_of(&id, Some("sensor.state_held"), 1).await;
    assert_eq!(
        ms(&held[0]["since"]),
        t0 + 100_000,
        "from the alarm's setting"
    );

    // `null` takes the alarms away; the open alarm still clears when the door closes.
    let (code, body) = s
        .request(Method::PATCH, &path, Some(json!({"hold_alarms": null})))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body["hold_alarms"], json!([]));
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let cleared = r.bodies_of(&id, Some("sensor.state_held_cleared"), 1).await;
    assert_eq!(cleared[0]["previous"], 1);
    s.stop().await;
}
