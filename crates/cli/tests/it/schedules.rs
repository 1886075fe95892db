//! Weekly schedules (issue #73, part 3): kept as written, refused with the field and the
//! reason when wrong, and right across a daylight-saving change — a night window on the
//! night the clocks go back lasts an hour longer. On SQLite, or PostgreSQL with
//! `TEST_STORE=postgres`.

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::parse;

use crate::utils::TestServer;

fn night(id: &str) -> Value {
    json!({"id": id, "name": "Armed at night", "tz": "Europe/Berlin",
           "weekly": [{"days": ["sat"], "from": "22:00", "to": "06:00"}],
           "except": ["2026-12-26"]})
}

#[tokio::test]
async fn a_night_window_lasts_an_hour_longer_when_the_clocks_go_back() {
    let tmp = tempfile::tempdir().unwrap();
    // Saturday 2026-10-24, 22:00 in Berlin (summer time): the window has begun. The clocks
    // go back at 03:00 that night, so it ends at 06:00 winter time, 9 hours on.
    let clock = Clock::manual(parse("2026-10-24T20:00:00Z").unwrap());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let (code, made) = s.post("/v1/schedules", night("nights")).await;
    assert_eq!(code, StatusCode::CREATED, "{made}");
    assert_eq!(made["tz"], "Europe/Berlin");
    assert_eq!(
        made["weekly"],
        json!([{"days": ["sat"], "from": "22:00", "to": "06:00"}])
    );
    assert_eq!(made["except"], json!(["2026-12-26"]));
    assert_eq!(made["status"]["inside"], true, "{made}");
    assert_eq!(made["status"]["next_change"], "2026-10-25T05:00:00.000Z");

    // A week later, winter time: the same window begins at 21:00 UTC.
    clock.set(parse("2026-10-31T20:30:00Z").unwrap());
    let (_, read) = s.get("/v1/schedules/nights").await;
    assert_eq!(read["status"]["inside"], false, "{read}");
    assert_eq!(read["status"]["next_change"], "2026-10-31T21:00:00.000Z");
}

#[tokio::test]
async fn schedules_are_kept_patched_deleted_and_refused_with_reasons() {
    let s = TestServer::start().await;
    let (code, _) = s.post("/v1/schedules", night("office")).await;
    assert_eq!(code, StatusCode::CREATED);
    let (code, body) = s.post("/v1/schedules", night("office")).await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");

    for (bad, what) in [
        (json!({"tz": "Mars/Olympus"}), "tz"),
        (
            json!({"weekly": [{"days": ["someday"], "from": "08:00", "to": "18:00"}]}),
            "someday",
        ),
        (
            json!({"weekly": [{"days": ["mon"], "from": "08:00", "to": "08:00"}]}),
            "weekly[0]",
        ),
        (
            json!({"weekly": [{"days": ["mon"], "from": "25:00", "to": "08:00"}]}),
            "from",
        ),
        (
            json!({"weekly": [{"days": [], "from": "08:00", "to": "18:00"}]}),
            "days",
        ),
        (json!({"name": " "}), "name"),
        (json!({"except": ["2026-02-30"]}), "except"),
        (json!({"colour": "red"}), "colour"),
    ] {
        let mut body = night("bad");
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (code, answer) = s.post("/v1/schedules", body).await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{bad}: {message}");
    }
    let (code, _) = s.get("/v1/schedules/bad").await;
    assert_eq!(code, StatusCode::NOT_FOUND, "nothing refused was kept");

    // A merge patch: the name changes, the windows are replaced whole, `null` clears the
    // holidays, the id stays.
    let (code, patched) = s
        .request(
            Method::PATCH,
            "/v1/schedules/office",
            Some(json!({"name": "Office hours", "except": null,
                        "weekly": [{"days": ["mon", "fri"], "from": "08:00", "to": "18:00"}]})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{patched}");
    assert_eq!(
        (&patched["name"], &patched["except"], &patched["tz"]),
        (&json!("Office hours"), &json!([]), &json!("Europe/Berlin"))
    );
    assert_eq!(patched["weekly"][0]["days"], json!(["mon", "fri"]));
    let (code, body) = s
        .request(
            Method::PATCH,
            "/v1/schedules/office",
            Some(json!({"tz": "Nowhere/Else"})),
        )
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (code, body) = s
        .request(
            Method::PATCH,
            "/v1/schedules/office",
            Some(json!({"id": "other"})),
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{body}");
    let (_, read) = s.get("/v1/schedules/office").await;
    assert_eq!(
        read["name"], "Office hours",
        "a refused patch changes nothing"
    );

    let (_, list) = s.get("/v1/schedules").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (code, _) = s.delete("/v1/schedules/office").await;
    assert_eq!(code, StatusCode::NO_CONTENT);
    let (code, _) = s.delete("/v1/schedules/office").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}
