//! Silences that follow a schedule (issue #73, part 3), through the HTTP API on a clock
//! moved by hand: active in every window of the schedule and pending between, reconciled
//! at each window's end and moved to the next; a schedule a silence follows is not deleted.
//! On SQLite, or PostgreSQL with `TEST_STORE=postgres`.

use std::time::Duration;

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::silence::SETTLE_MS;
use latch::domain::time::parse;

use crate::utils::{Receiver, TestServer, eventually, unique};

async fn silenced(s: &TestServer, client: &str) -> usize {
    let (code, body) = s
        .get(&format!(
            "/v1/notifications?client_id={client}&status=silenced"
        ))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    body["items"].as_array().unwrap().len()
}

async fn received(r: &Receiver, n: usize, what: &str) -> Vec<Value> {
    eventually(15, what, || async {
        let got = r.received();
        (got.len() >= n).then(|| got.into_iter().map(|g| g.body).collect())
    })
    .await
}

fn at(s: &str) -> i64 {
    parse(s).unwrap()
}

/// Every day 08:00–08:10 UTC: a reading inside a window is kept, one between windows is
/// sent; the window's end brings the client up to date once and the silence moves to the
/// next day's window.
#[tokio::test]
async fn a_scheduled_silence_keeps_only_inside_its_windows() {
    let tmp = tempfile::tempdir().unwrap();
    // Tuesday 2026-12-01, 07:00 UTC. The sensor is not lost while the clock jumps a day.
    let clock = Clock::manual(at("2026-12-01T07:00:00Z"));
    let days = |c: &mut latch::config::Config| {
        c.heartbeat_timeout = Duration::from_secs(3 * 24 * 3600);
    };
    let s = TestServer::start_clocked(tmp.path(), days, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let door = unique("sdoor");
    s.sensor(&door).await;
    s.link(&client, &door).await;
    s.readings(json!({"sensor_id": door, "data": 1})).await;
    received(&r, 1, "the first state").await;

    let schedule = unique("mornings");
    let (code, body) = s
        .post(
            "/v1/schedules",
            json!({"id": schedule, "name": "Cleaning", "tz": "UTC",
                   "weekly": [{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                               "from": "08:00", "to": "08:10"}]}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let (code, body) = s
        .post(
            "/v1/silences",
            json!({"match": {"client_id": client}, "schedule_id": schedule,
                   "comment": "the cleaners open every door"}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["state"], "pending", "{body}");
    assert_eq!(body["schedule_id"], schedule.as_str());
    assert_eq!(body["starts_at"], "2026-12-01T08:00:00.000Z");
    assert_eq!(body["ends_at"], "2026-12-01T08:10:00.000Z");
    let silence = body["id"].as_str().unwrap().to_string();

    // Before the window: sent.
    s.readings(json!({"sensor_id": door, "data": 0})).await;
    received(&r, 2, "a change before the window").await;

    // Inside: kept.
    clock.set(at("2026-12-01T08:01:00Z"));
    let (_, read) = s.get(&format!("/v1/silences/{silence}")).await;
    assert_eq!(read["state"], "active", "{read}");
    let (_, active) = s.get("/v1/silences?state=active").await;
    assert_eq!(active["items"].as_array().unwrap().len(), 1, "{active}");
    s.readings(json!({"sensor_id": door, "data": 1})).await;
    eventually(15, "the change inside the window kept", || async {
        (silenced(&s, &client).await == 1).then_some(())
    })
    .await;

    // Its end: one notification brings the client up to date; the silence moves on.
    clock.set(at("2026-12-01T08:10:00Z") + SETTLE_MS + 1_500);
    let got = received(&r, 3, "the reconciliation at the window's end").await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(
        (got[2]["type"].clone(), got[2]["data"].clone()),
        (json!("sensor.state_changed"), json!(1))
    );
    let moved = eventually(15, "the silence moved to the next window", || async {
        let (_, read) = s.get(&format!("/v1/silences/{silence}")).await;
        (read["starts_at"] == "2026-12-02T08:00:00.000Z").then_some(read)
    })
    .await;
    assert_eq!(moved["state"], "pending", "{moved}");
    assert_eq!(moved["ends_at"], "2026-12-02T08:10:00.000Z");
    assert!(moved["reconciled_at"].is_null(), "{moved}");
    let (_, pending) = s.get("/v1/silences?state=pending").await;
    assert_eq!(pending["items"].as_array().unwrap().len(), 1, "{pending}");

    // Between windows: sent.
    clock.advance(Duration::from_secs(60));
    s.readings(json!({"sensor_id": door, "data": 0})).await;
    received(&r, 4, "a change between windows").await;
    assert_eq!(silenced(&s, &client).await, 1);

    // The next day's window keeps again.
    clock.set(at("2026-12-02T08:05:00Z"));
    s.readings(json!({"sensor_id": door, "data": 1})).await;
    eventually(15, "the change inside the second window kept", || async {
        (silenced(&s, &client).await == 2).then_some(())
    })
    .await;
    assert_eq!(r.received().len(), 4);
    s.stop().await;
}

/// `schedule_id` or times, not both nor neither; an unknown schedule is refused; a change
/// to the schedule moves a silence between windows; the schedule is not deleted while a
/// silence follows it, and is once the silence is ended.
#[tokio::test]
async fn scheduled_silences_are_refused_moved_and_keep_their_schedule() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(at("2026-12-01T07:00:00Z"));
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let schedule = unique("evenings");
    let (code, _) = s
        .post(
            "/v1/schedules",
            json!({"id": schedule, "name": "Evenings", "tz": "UTC",
                   "weekly": [{"days": ["tue"], "from": "18:00", "to": "20:00"}]}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED);
    let types = json!({"types": ["sensor.connection_lost"]});
    for (body, code, field) in [
        (
            json!({"schedule_id": schedule, "ends_at": "2026-12-01T09:00:00Z"}),
            "invalid",
            "ends_at",
        ),
        (
            json!({"schedule_id": schedule, "starts_at": "2026-12-01T08:00:00Z"}),
            "invalid",
            "starts_at",
        ),
        (json!({}), "invalid", "ends_at"),
        (
            json!({"schedule_id": "nowhere"}),
            "unknown_schedule",
            "schedule_id",
        ),
    ] {
        let mut body = body;
        body["match"] = types.clone();
        body["comment"] = json!("x");
        let (status, answer) = s.post("/v1/silences", body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }

    let (code, made) = s
        .post(
            "/v1/silences",
            json!({"match": types, "schedule_id": schedule, "comment": "evening shift"}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{made}");
    assert_eq!(made["starts_at"], "2026-12-01T18:00:00.000Z");
    let silence = made["id"].as_str().unwrap().to_string();
    let path = format!("/v1/silences/{silence}");
    let (code, answer) = s
        .request(
            Method::PATCH,
            &path,
            Some(json!({"ends_at": "2026-12-01T21:00:00Z"})),
        )
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ends_at")
    );

    // The schedule changes: the silence, between windows, moves with it.
    let (code, body) = s
        .request(
            Method::PATCH,
            &format!("/v1/schedules/{schedule}"),
            Some(json!({"weekly": [{"days": ["tue"], "from": "12:00", "to": "13:00"}]})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (_, read) = s.get(&path).await;
    assert_eq!(read["starts_at"], "2026-12-01T12:00:00.000Z", "{read}");
    assert_eq!(read["ends_at"], "2026-12-01T13:00:00.000Z");

    // In use: not deleted; ended, it follows the schedule no more.
    let (code, answer) = s.delete(&format!("/v1/schedules/{schedule}")).await;
    assert_eq!(code, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error"]["code"], "schedule_in_use");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&silence)
    );
    let (code, _) = s.delete(&path).await;
    assert_eq!(code, StatusCode::NO_CONTENT);
    let (_, read) = s.get(&path).await;
    assert_eq!(read["state"], "ended", "{read}");
    assert_eq!(read["schedule_id"], schedule.as_str());
    let (code, answer) = s.delete(&format!("/v1/schedules/{schedule}")).await;
    assert_eq!(code, StatusCode::NO_CONTENT, "{answer}");
    s.stop().await;
}
