//! Sites and maintenance windows (issue #50), through the HTTP API of a running latch on
//! the store under test: a silence keeps what it matches from being sent, keeps it in
//! history as `silenced`, and brings each client up to date once at its end.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::{format, now_ms};

use crate::utils::{Received, Receiver, TestServer, eventually, unique};

fn about<'a>(got: &'a [Received], sensor: &str) -> Vec<&'a Value> {
    got.iter()
        .map(|g| &g.body)
        .filter(|b| b["sensor"]["id"] == sensor)
        .collect()
}

async fn silenced(s: &TestServer, client: &str) -> usize {
    let (code, body) = s
        .get(&format!(
            "/v1/notifications?client_id={client}&status=silenced"
        ))
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    body["items"].as_array().unwrap().len()
}

/// Two clients on two sensors, one of them silenced: the other gets every change at once;
/// the silenced one gets nothing during the window, and at its end exactly one
/// notification, for the sensor whose state differs from what it was told (the one that
/// flipped and flipped back sends nothing).
#[tokio::test]
async fn a_silence_keeps_what_it_matches_and_reconciles_once_at_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let (quiet_r, loud_r) = (Receiver::start().await, Receiver::start().await);
    let (quiet, loud) = (s.client(&quiet_r.url).await, s.client(&loud_r.url).await);
    let (flip, change) = (unique("sflip"), unique("schg"));
    for id in [&flip, &change] {
        s.sensor(id).await;
        s.link(&quiet, id).await;
        s.link(&loud, id).await;
        s.readings(json!({"sensor_id": id, "data": 1})).await;
    }
    for r in [&quiet_r, &loud_r] {
        eventually(15, "the first states", || async {
            (r.received().len() >= 2).then_some(())
        })
        .await;
    }

    let ends = clock.now() + 60_000;
    let (code, body) = s
        .post(
            "/v1/silences",
            json!({"match": {"client_id": quiet}, "ends_at": format(ends), "comment": "router swap"}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["state"], "active");
    let silence = body["id"].as_str().unwrap().to_string();

    for (id, data) in [(&flip, 0), (&flip, 1), (&change, 0)] {
        clock.advance(Duration::from_secs(1));
        s.readings(json!({"sensor_id": id, "data": data})).await;
    }
    // The loud client gets each sensor's last state; its `flip` to 0 may be superseded
    // by the 1 that followed it if that came before the 0 went out.
    eventually(15, "the loud client's last states", || async {
        let got = loud_r.received();
        let (flips, changes) = (about(&got, &flip), about(&got, &change));
        let flipped_back = flips.len() >= 2 && flips.last().unwrap()["data"] == 1;
        let changed = changes.len() == 2 && changes[1]["data"] == 0;
        (flipped_back && changed).then_some(())
    })
    .await;
    // Delivery of the loud client's changes went by; nothing reached the silenced one.
    assert_eq!(quiet_r.received().len(), 2);
    assert_eq!(silenced(&s, &quiet).await, 3);
    assert_eq!(silenced(&s, &loud).await, 0);

    clock.set(ends + latch::domain::silence::SETTLE_MS + 1_500);
    let got = eventually(15, "the reconciliation", || async {
        let got = quiet_r.received();
        (got.len() >= 3).then_some(got)
    })
    .await;
    let up_to_date = about(&got, &change);
    assert_eq!(up_to_date.len(), 2, "{up_to_date:?}");
    assert_eq!(up_to_date[1]["type"], "sensor.state_changed");
    assert_eq!(
        (
            up_to_date[1]["data"].clone(),
            up_to_date[1]["previous"].clone()
        ),
        (json!(0), json!(1))
    );
    assert_eq!(about(&got, &flip).len(), 1, "back where the client saw it");

    // Once: later rounds make nothing more.
    for _ in 0..3 {
        clock.advance(Duration::from_secs(2));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(quiet_r.received().len(), 3);
    let (_, read) = s.get(&format!("/v1/silences/{silence}")).await;
    assert_eq!(read["state"], "ended");
    assert!(read["reconciled_at"].is_string(), "{read}");
    let (code, _) = s
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/silences/{silence}"),
            Some(json!({"ends_at": format(clock.now() + 60_000)})),
        )
        .await;
    assert_eq!(
        code,
        StatusCode::CONFLICT,
        "an ended silence is not extended"
    );
    s.stop().await;
}

/// A silence by site and type: a sensor of the site that goes lost is kept silent while
/// one outside it is notified; still lost at the end, the client is told once.
#[tokio::test]
async fn a_site_silence_holds_its_losses_and_tells_what_is_still_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let timeout = |c: &mut latch::config::Config| c.heartbeat_timeout = Duration::from_secs(5);
    let s = TestServer::start_clocked(tmp.path(), timeout, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let site = unique("bldg-");
    let (code, body) = s
        .post("/v1/sites", json!({"id": site, "name": "Svobody 23"}))
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let (inside, outside) = (unique("sin"), unique("sout"));
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": inside, "address": "fl 1", "site_id": site}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["site_id"], json!(site));
    s.sensor(&outside).await;
    for id in [&inside, &outside] {
        s.link(&client, id).await;
        s.readings(json!({"sensor_id": id, "data": 1})).await;
    }
    eventually(15, "the first states", || async {
        (r.received().len() >= 2).then_some(())
    })
    .await;
    let ends = clock.now() + 30_000;
    let (code, body) = s
        .post(
            "/v1/silences",
            json!({"match": {"site_id": site, "types": ["sensor.connection_lost"]},
                   "ends_at": format(ends), "comment": "uplink replaced"}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");

    clock.advance(Duration::from_secs(6));
    let got = eventually(15, "the loss outside the site", || async {
        let got = r.received();
        (!about(&got, &outside)
            .iter()
            .all(|b| b["type"] != "sensor.connection_lost"))
        .then_some(got)
    })
    .await;
    assert!(
        about(&got, &inside)
            .iter()
            .all(|b| b["type"] != "sensor.connection_lost")
    );
    // The sensor inside may be judged by another engine shard a moment later.
    let site_read = eventually(10, "the site's loss counted", || async {
        let (_, site_read) = s.get(&format!("/v1/sites/{site}")).await;
        (site_read["status"]["lost"] == 1).then_some(site_read)
    })
    .await;
    assert_eq!(site_read["status"]["sensors"], 1);

    clock.set(ends + latch::domain::silence::SETTLE_MS + 1_500);
    let told = eventually(15, "the loss told at the end", || async {
        let got = r.received();
        let lost: Vec<Value> = about(&got, &inside)
            .into_iter()
            .filter(|b| b["type"] == "sensor.connection_lost")
            .cloned()
            .collect();
        (!lost.is_empty()).then_some(lost)
    })
    .await;
    assert_eq!(told.len(), 1);
    s.stop().await;
}

/// What the API refuses, and says why: a silence that names nothing, that ends before it
/// starts or in the past, that names what does not exist; a site id of the wrong shape;
/// a sensor in a site that does not exist. Sites read, change and go; silences list by
/// state, extend and end.
#[tokio::test]
async fn sites_and_silences_refuse_what_cannot_be_and_say_why() {
    let s = TestServer::start().await;
    let now = now_ms();
    let cases = [
        json!({"match": {}, "ends_at": format(now + 60_000), "comment": "x"}),
        json!({"match": {"client_id": "nobody"}, "ends_at": format(now + 60_000), "comment": "x"}),
        json!({"match": {"types": ["sensor.exploded"]}, "ends_at": format(now + 60_000), "comment": "x"}),
        json!({"match": {"types": ["sensor.connection_lost"]}, "ends_at": format(now - 1_000), "comment": "x"}),
        json!({"match": {"types": ["sensor.connection_lost"]}, "starts_at": format(now + 90_000), "ends_at": format(now + 60_000), "comment": "x"}),
        json!({"match": {"types": ["sensor.connection_lost"]}, "ends_at": format(now + 40 * 86_400_000), "comment": "x"}),
        json!({"match": {"types": ["sensor.connection_lost"]}, "ends_at": format(now + 60_000), "comment": " "}),
    ];
    for body in cases {
        let (code, got) = s.post("/v1/silences", body.clone()).await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body} → {got}");
        assert!(got["error"]["message"].as_str().unwrap().len() > 5, "{got}");
    }
    let (code, _) = s.post("/v1/sites", json!({"id": "has space"})).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
    let (code, got) = s
        .post(
            "/v1/sensors",
            json!({"id": unique("nos"), "address": "a", "site_id": "nowhere"}),
        )
        .await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{got}");

    let site = unique("b-");
    assert_eq!(
        s.post("/v1/sites", json!({"id": site})).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        s.post("/v1/sites", json!({"id": site})).await.0,
        StatusCode::CONFLICT
    );
    let (code, got) = s
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/sites/{site}"),
            Some(json!({"address": "Svobody 23"})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{got}");
    assert_eq!(got["address"], "Svobody 23");
    assert_eq!(got["status"]["state"], "up");

    let later = json!({"match": {"site_id": site}, "starts_at": format(now + 3_600_000),
        "ends_at": format(now + 7_200_000), "comment": "Saturday"});
    let (code, pending) = s.post("/v1/silences", later).await;
    assert_eq!(code, StatusCode::CREATED, "{pending}");
    assert_eq!(pending["state"], "pending");
    let id = pending["id"].as_str().unwrap();
    let (_, listed) = s.get("/v1/silences?state=pending").await;
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == id)
    );
    let (_, listed) = s.get("/v1/silences?state=active").await;
    assert!(
        !listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == id)
    );
    assert_eq!(
        s.get("/v1/silences?state=soon").await.0,
        StatusCode::BAD_REQUEST
    );
    let (code, got) = s
        .request(
            reqwest::Method::PATCH,
            &format!("/v1/silences/{id}"),
            Some(json!({"ends_at": format(now + 10_800_000), "comment": "and Sunday"})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{got}");
    assert_eq!(got["comment"], "and Sunday");
    assert_eq!(
        s.delete(&format!("/v1/silences/{id}")).await.0,
        StatusCode::NO_CONTENT
    );
    let (_, got) = s.get(&format!("/v1/silences/{id}")).await;
    assert_eq!(got["state"], "ended");
    assert_eq!(
        s.delete(&format!("/v1/sites/{site}")).await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        s.get(&format!("/v1/sites/{site}")).await.0,
        StatusCode::NOT_FOUND
    );
    s.stop().await;
}
