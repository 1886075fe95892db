//! Alarms an operator works (issue #73, part 1): a door held open opens one alarm however
//! many clients are told, every notification of it names it, an acknowledgement is taken
//! once, stops its reminders and tells each client told who took it, and the door closing
//! resolves it. On a clock the tests move by hand; on SQLite, or PostgreSQL with
//! `TEST_STORE=postgres`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::{now_ms, parse};

use crate::utils::{Receiver, TestServer, eventually, unique};

fn ms(v: &Value) -> i64 {
    parse(v.as_str().unwrap_or_else(|| panic!("a time: {v}"))).unwrap()
}

/// Waits until `/metrics` shows the line `line` (the gauges are counted every round).
async fn metric_line(s: &TestServer, line: &str) {
    eventually(15, line, || async {
        let (_, m) = s.get("/metrics").await;
        m.as_str()
            .unwrap_or("")
            .lines()
            .any(|l| l == line)
            .then_some(())
    })
    .await;
}

/// The `alarm.acknowledged` bodies `r` got, once there are `n`.
async fn acks(r: &Receiver, n: usize) -> Vec<Value> {
    eventually(15, &format!("{n} alarm.acknowledged"), || async {
        let got: Vec<Value> = r
            .received()
            .into_iter()
            .map(|g| g.body)
            .filter(|b| b["type"] == "alarm.acknowledged")
            .collect();
        (got.len() >= n).then_some(got)
    })
    .await
}

#[tokio::test]
async fn a_door_held_open_is_one_alarm_acknowledged_once_and_resolved_when_it_closes() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let (desk, guard) = (Receiver::start().await, Receiver::start().await);
    let id = unique("door");
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "loading dock door",
                   "hold_alarms": [{"data": 1, "after_s": 30, "remind_every_s": 60}]}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    for r in [&desk, &guard] {
        let c = s.client(&r.url).await;
        s.link(&c, &id).await;
    }
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    desk.bodies_of(&id, Some("sensor.state_changed"), 1).await;
    let changed = &desk.bodies_of(&id, Some("sensor.state_changed"), 1).await[0];
    assert!(
        changed.get("alarm_id").is_none(),
        "a change is no alarm: {changed}"
    );

    // Held past 30 s: both clients told, one alarm.
    clock.set(t0 + 30_000);
    let held = desk.bodies_of(&id, Some("sensor.state_held"), 1).await;
    let alarm = held[0]["alarm_id"]
        .as_str()
        .expect("names its alarm")
        .to_string();
    let held = guard.bodies_of(&id, Some("sensor.state_held"), 1).await;
    assert_eq!(held[0]["alarm_id"], alarm.as_str());
    let (code, list) = s
        .get(&format!("/v1/alarms?state=open&sensor_id={id}"))
        .await;
    assert_eq!(code, StatusCode::OK, "{list}");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "one alarm for two clients: {list}");
    assert_eq!(
        (&items[0]["id"], &items[0]["kind"], &items[0]["state"]),
        (&json!(alarm), &json!("state_held"), &json!("open"))
    );
    assert_eq!(ms(&items[0]["opened_at"]), t0 + 30_000);
    let (_, one) = s.get(&format!("/v1/alarms/{alarm}")).await;
    assert_eq!(
        one["notification_ids"].as_array().unwrap().len(),
        2,
        "{one}"
    );

    // Taken: both clients hear who took it.
    let (code, taken) = s
        .post(
            &format!("/v1/alarms/{alarm}/ack"),
            json!({"by": "night desk: Anna", "note": "guard sent"}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{taken}");
    assert_eq!(
        (&taken["state"], &taken["acknowledged_by"], &taken["note"]),
        (
            &json!("acknowledged"),
            &json!("night desk: Anna"),
            &json!("guard sent")
        )
    );
    for r in [&desk, &guard] {
        let a = &acks(r, 1).await[0];
        assert_eq!(
            (
                &a["alarm"]["id"],
                &a["alarm"]["kind"],
                &a["alarm"]["sensor_id"]
            ),
            (&json!(alarm), &json!("state_held"), &json!(id))
        );
        assert_eq!(
            (&a["by"], &a["note"]),
            (&json!("night desk: Anna"), &json!("guard sent"))
        );
    }
    let (code, again) = s
        .post(&format!("/v1/alarms/{alarm}/ack"), json!({"by": "Boris"}))
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{again}");
    // The audit trail keeps the acknowledgement taken, with the alarm as it was before,
    // and not the one refused.
    let (code, trail) = s.get(&format!("/v1/audit?resource=alarms/{alarm}")).await;
    assert_eq!(code, StatusCode::OK, "{trail}");
    let items = trail["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "one acknowledgement recorded: {trail}");
    assert_eq!(
        (&items[0]["resource"], &items[0]["method"]),
        (&json!(format!("alarms/{alarm}/ack")), &json!("POST"))
    );
    assert_eq!(items[0]["before"]["state"], "open", "{trail}");
    assert_eq!(items[0]["after"]["by"], "night desk: Anna", "{trail}");
    assert_eq!(again["error"]["code"], "already_acknowledged");
    // The rounds that count them run on latch's clock.
    clock.set(t0 + 31_000);
    metric_line(
        &s,
        r#"latch_alarms_open{kind="state_held",state="acknowledged"} 1"#,
    )
    .await;
    metric_line(&s, r#"latch_alarms_open{kind="state_held",state="open"} 0"#).await;
    metric_line(&s, "latch_alarm_oldest_unacknowledged_seconds 0").await;
    assert!(
        again["error"]["message"]
            .as_str()
            .unwrap()
            .contains("night desk: Anna"),
        "{again}"
    );

    // Its reminder falls due: kept in the history, sent to nobody.
    clock.set(t0 + 90_000);
    s.engine_round().await;
    s.dispatcher_round().await;
    let (_, events) = s.get(&format!("/v1/sensors/{id}/events")).await;
    let reminders = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "sensor.state_held")
        .count();
    assert_eq!(
        reminders, 2,
        "the alarm and its reminder are history: {events}"
    );
    for r in [&desk, &guard] {
        let sent = r.bodies_of(&id, Some("sensor.state_held"), 1).await;
        assert_eq!(
            sent.len(),
            1,
            "no reminder after the acknowledgement: {sent:?}"
        );
    }

    // Closed: the clearing names the alarm, which is resolved.
    clock.set(t0 + 100_000);
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let cleared = guard
        .bodies_of(&id, Some("sensor.state_held_cleared"), 1)
        .await;
    assert_eq!(cleared[0]["alarm_id"], alarm.as_str());
    let (_, one) = s.get(&format!("/v1/alarms/{alarm}")).await;
    assert_eq!(
        (&one["state"], &one["acknowledged_by"]),
        (&json!("resolved"), &json!("night desk: Anna"))
    );
    assert_eq!(ms(&one["resolved_at"]), t0 + 100_000);
    let (_, open) = s.get("/v1/alarms?state=open").await;
    assert_eq!(open["items"], json!([]));
}

#[tokio::test]
async fn bad_acknowledgements_and_filters_get_clear_errors() {
    let s = TestServer::start().await;
    let (code, body) = s
        .post(
            "/v1/alarms/01JD0Y3Q6T3S8W0KZ9X7M2V4AA/ack",
            json!({"by": "x"}),
        )
        .await;
    assert_eq!(
        (code, &body["error"]["code"]),
        (StatusCode::NOT_FOUND, &json!("not_found"))
    );
    let (code, body) = s
        .post(
            "/v1/alarms/01JD0Y3Q6T3S8W0KZ9X7M2V4AA/ack",
            json!({"by": "  "}),
        )
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("by must be")
    );
    let (code, body) = s
        .post(
            "/v1/alarms/01JD0Y3Q6T3S8W0KZ9X7M2V4AA/ack",
            json!({"by": "x", "who": "y"}),
        )
        .await;
    assert_eq!(
        code,
        StatusCode::UNPROCESSABLE_ENTITY,
        "an unknown field: {body}"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `who`")
    );
    for (query, what) in [
        (
            "state=closed",
            "state must be open, acknowledged or resolved",
        ),
        ("kind=door", "kind must be one of"),
        ("sensor_id=no-dashes", "sensor_id"),
        ("colour=red", "colour"),
    ] {
        let (code, body) = s.get(&format!("/v1/alarms?{query}")).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(what),
            "{query}: {body}"
        );
    }
    let (code, body) = s.get("/v1/alarms/nope").await;
    assert_eq!(code, StatusCode::NOT_FOUND, "{body}");
}
