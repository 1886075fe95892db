//! Sensors armed by a schedule (issue #73, part 3): a door opened out of office hours is
//! `sensor.state_out_of_schedule` beside its `state_changed`, naming the schedule and an
//! `out_of_schedule` alarm that the door closing resolves; one opened in hours is not. On
//! a clock the tests move by hand; on SQLite, or PostgreSQL with `TEST_STORE=postgres`.

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::parse;

use crate::utils::{Receiver, TestServer, unique};

fn office(id: &str) -> Value {
    json!({"id": id, "name": "Office hours", "tz": "Europe/Berlin",
           "weekly": [{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00", "to": "18:00"}]})
}

#[tokio::test]
async fn a_door_opened_at_night_is_out_of_schedule_and_closing_it_resolves_its_alarm() {
    let tmp = tempfile::tempdir().unwrap();
    // Tuesday 2026-12-01, 10:00 in Berlin: office hours.
    let clock = Clock::manual(parse("2026-12-01T09:00:00Z").unwrap());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let schedule = unique("office");
    let (code, body) = s.post("/v1/schedules", office(&schedule)).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let id = unique("door");
    let armed = json!({"schedule_id": schedule, "data": 1, "when": "outside"});
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "front door", "armed": armed,
                   "labels": {"0": "closed", "1": "open"}}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["armed"], armed);
    let desk = Receiver::start().await;
    let c = s.client(&desk.url).await;
    s.link(&c, &id).await;

    // Opened and closed in hours: changes only (each waited for, so the second does not
    // supersede the first).
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    desk.bodies_of(&id, Some("sensor.state_changed"), 1).await;
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    desk.bodies_of(&id, Some("sensor.state_changed"), 2).await;

    // 02:00 the next night: the door opens.
    clock.set(parse("2026-12-02T01:00:00Z").unwrap());
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    let out = &desk
        .bodies_of(&id, Some("sensor.state_out_of_schedule"), 1)
        .await[0];
    assert_eq!(out["data"], 1, "{out}");
    assert_eq!(out["label"], "open", "{out}");
    assert_eq!(
        out["schedule"],
        json!({"id": schedule, "name": "Office hours"})
    );
    assert_eq!(out["occurred_at"], "2026-12-02T01:00:00.000Z");
    let alarm = out["alarm_id"]
        .as_str()
        .expect("names its alarm")
        .to_string();
    let got: Vec<String> = desk
        .received()
        .into_iter()
        .map(|g| g.body["type"].as_str().unwrap_or("").to_string())
        .collect();
    let at = got.len() - 1;
    assert_eq!(
        got[at - 1..],
        ["sensor.state_changed", "sensor.state_out_of_schedule"],
        "beside the change, after it: {got:?}"
    );
    let (_, list) = s
        .get(&format!("/v1/alarms?kind=out_of_schedule&sensor_id={id}"))
        .await;
    assert_eq!(list["items"][0]["id"], alarm.as_str(), "{list}");
    assert_eq!(list["items"][0]["state"], "open");

    // Closed: the change names the alarm it resolves.
    clock.set(parse("2026-12-02T01:05:00Z").unwrap());
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let changes = desk.bodies_of(&id, Some("sensor.state_changed"), 4).await;
    assert_eq!(changes[3]["alarm_id"], alarm.as_str(), "{}", changes[3]);
    let (_, a) = s.get(&format!("/v1/alarms/{alarm}")).await;
    assert_eq!(a["state"], "resolved", "{a}");
    assert_eq!(a["resolved_at"], "2026-12-02T01:05:00.000Z");
    assert_eq!(
        desk.bodies_of(&id, Some("sensor.state_out_of_schedule"), 1)
            .await
            .len(),
        1,
        "the only one is the night's"
    );
}

#[tokio::test]
async fn arming_is_patched_cleared_and_refused_with_reasons() {
    let s = TestServer::start().await;
    let schedule = unique("hours");
    s.post("/v1/schedules", office(&schedule)).await;
    let id = unique("door");
    s.sensor(&id).await;
    let (code, body) = s
        .request(
            Method::PATCH,
            &format!("/v1/sensors/{id}"),
            Some(json!({"armed": {"schedule_id": schedule, "data": 1, "when": "outside"}})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (_, body) = s
        .request(
            Method::PATCH,
            &format!("/v1/sensors/{id}"),
            Some(json!({"armed": {"when": "inside"}})),
        )
        .await;
    assert_eq!(
        body["armed"],
        json!({"schedule_id": schedule, "data": 1, "when": "inside"}),
        "merged: the schedule and state kept"
    );
    for (armed, what) in [
        (
            json!({"schedule_id": "nosuch", "data": 1, "when": "outside"}),
            "armed.schedule_id",
        ),
        (
            json!({"schedule_id": schedule, "data": 2, "when": "outside"}),
            "armed.data",
        ),
        (
            json!({"schedule_id": schedule, "data": 1, "when": "sometimes"}),
            "sometimes",
        ),
        (json!({"schedule_id": schedule, "data": 1}), "when"),
    ] {
        let (code, answer) = s
            .put(
                &format!("/v1/sensors/{id}"),
                json!({"address": "front door", "armed": armed}),
            )
            .await;
        assert!(
            code == StatusCode::UNPROCESSABLE_ENTITY || code == StatusCode::BAD_REQUEST,
            "{armed}: {code} {answer}"
        );
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(what), "{armed}: {answer}");
    }
    let (code, body) = s.delete(&format!("/v1/schedules/{schedule}")).await;
    assert_eq!(
        code,
        StatusCode::CONFLICT,
        "a schedule a sensor is armed by: {body}"
    );
    assert_eq!(body["error"]["code"], "schedule_in_use");
    assert!(
        body["error"]["message"].as_str().unwrap().contains(&id),
        "{body}"
    );
    let (_, body) = s
        .request(
            Method::PATCH,
            &format!("/v1/sensors/{id}"),
            Some(json!({"armed": null})),
        )
        .await;
    assert_eq!(body["armed"], Value::Null, "{body}");
    let (code, body) = s.delete(&format!("/v1/schedules/{schedule}")).await;
    assert_eq!(code, StatusCode::NO_CONTENT, "disarmed, it goes: {body}");
}
