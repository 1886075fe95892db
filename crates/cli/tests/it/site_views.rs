//! Sites where operators look (issue #70), through the HTTP API of a running latch on the
//! store under test: the sensor list filtered by site, the fleet's count of sites down, and
//! a site's notification naming its sensors, found from each of them (also by type),
//! though it travels in the lane of the first.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Receiver, TestServer, eventually, unique};

fn ids_of(items: &Value) -> Vec<String> {
    items["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn sensors_are_listed_by_site() {
    let s = TestServer::start().await;
    let (a, b) = (unique("sva"), unique("svb"));
    for site in [&a, &b] {
        let (code, body) = s.post("/v1/sites", json!({"id": site})).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }
    let prefix = unique("sl");
    let id = |n: &str| format!("{}{n}", &prefix[..10]);
    for (sensor, site) in [
        ("a1", Some(&a)),
        ("a2", Some(&a)),
        ("b1", Some(&b)),
        ("x", None),
    ] {
        let (code, body) = s
            .post(
                "/v1/sensors",
                json!({"id": id(sensor), "address": format!("Svobody 23 {sensor}"), "site_id": site}),
            )
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
    }
    let s = &s;
    let list = |query: String| async move {
        let (code, body) = s.get(&format!("/v1/sensors?{query}")).await;
        assert_eq!(code, StatusCode::OK, "{query}: {body}");
        ids_of(&body)
    };
    assert_eq!(list(format!("site_id={a}")).await, [id("a1"), id("a2")]);
    assert_eq!(
        list(format!("site_id={a}&connection=unknown&limit=1")).await,
        [id("a1")]
    );
    // With a search: its matches in the site.
    assert_eq!(
        list(format!("site_id={a}&q={}", &prefix[..10])).await,
        [id("a1"), id("a2")]
    );
    assert_eq!(list(format!("site_id={b}&q=svobody")).await, [id("b1")]);
    assert!(list("site_id=nosuchsite".into()).await.is_empty());
    // Without it, every sensor, with its site.
    let (_, all) = s.get(&format!("/v1/sensors?q={}", &prefix[..10])).await;
    let sites: Vec<&Value> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| &x["site_id"])
        .collect();
    assert_eq!(sites, [&json!(a), &json!(a), &json!(b), &Value::Null]);
    // A misspelt filter is refused, not ignored.
    let (code, body) = s.get(&format!("/v1/sensors?site={a}")).await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "unknown_parameter", "{body}");
    let (_, fleet) = s.get("/v1/fleet").await;
    assert_eq!(fleet["sites_down"], 0, "{fleet}");
}

#[tokio::test]
async fn a_site_event_is_found_from_each_sensor_it_named() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(
        tmp.path(),
        |c| {
            c.heartbeat_timeout = Duration::from_secs(5);
            c.site_grace = Duration::from_secs(10);
        },
        clock.clone(),
    )
    .await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let site = unique("dark");
    let (code, body) = s.post("/v1/sites", json!({"id": site})).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    // Ids in order, as the site's event lists them.
    let prefix = unique("nm");
    let ids: Vec<String> = (0..3).map(|i| format!("{}{i}", &prefix[..12])).collect();
    let loose = format!("{}x", &prefix[..12]);
    for id in &ids {
        let (code, body) = s
            .post(
                "/v1/sensors",
                json!({"id": id, "address": "Svobody 23", "site_id": site}),
            )
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        s.link(&client, id).await;
    }
    s.sensor(&loose).await;
    s.link(&client, &loose).await;
    for id in ids.iter().chain([&loose]) {
        s.readings(json!({"sensor_id": id, "data": 1})).await;
    }
    // All fall silent: lost at 5 s, the site down once its grace ends at 15 s; the loose
    // sensor keeps reporting.
    for _ in 0..16 {
        clock.advance(Duration::from_secs(1));
        s.readings(json!({"sensor_id": loose, "data": 1})).await;
        s.engine_round().await;
    }
    eventually(15, "the site down", || async {
        let (_, got) = s.get(&format!("/v1/sites/{site}")).await;
        (got["status"]["state"] == "down").then_some(())
    })
    .await;
    let (_, fleet) = s.get("/v1/fleet").await;
    assert_eq!(fleet["sites_down"], 1, "{fleet}");

    let of = |query: String| {
        let client = client.clone();
        let s = &s;
        async move {
            s.notifications(&format!("client_id={client}&{query}"))
                .await
        }
    };
    let lost = of(format!("sensor_id={}&type=site.connection_lost", ids[2])).await;
    assert_eq!(lost.len(), 1, "{lost:?}");
    let n = &lost[0];
    assert_eq!(n["site_id"], json!(site), "{n}");
    assert_eq!(n["sensor_ids"], json!(ids), "{n}");
    assert_eq!(
        n["sensor_id"],
        json!(ids[0]),
        "in the first one's lane: {n}"
    );
    let (_, one) = s
        .get(&format!("/v1/notifications/{}", n["id"].as_str().unwrap()))
        .await;
    assert_eq!(one["sensor_ids"], json!(ids), "{one}");
    // From each sensor it named, with or without its type; not as a sensor's own loss.
    for id in &ids {
        let all = of(format!("sensor_id={id}")).await;
        let kinds: Vec<&Value> = all.iter().map(|n| &n["type"]).collect();
        assert_eq!(
            kinds,
            [
                &json!("sensor.state_changed"),
                &json!("site.connection_lost")
            ],
            "{id}"
        );
        assert!(all[0].get("site_id").is_none() && all[0].get("sensor_ids").is_none());
        assert!(
            of(format!("sensor_id={id}&type=sensor.connection_lost"))
                .await
                .is_empty()
        );
    }
    let own = of(format!("sensor_id={loose}")).await;
    assert!(
        own.iter().all(|n| n["type"] == "sensor.state_changed"),
        "{own:?}"
    );

    // Back but for the last: the return names what came back, then what is still lost.
    for id in &ids[..2] {
        s.readings(json!({"sensor_id": id, "data": 0})).await;
    }
    for _ in 0..2 {
        clock.advance(Duration::from_secs(1));
        s.engine_round().await;
    }
    let back = eventually(15, "the site's return", || async {
        let got = of(format!(
            "sensor_id={}&type=site.connection_restored",
            ids[2]
        ))
        .await;
        (!got.is_empty()).then_some(got)
    })
    .await;
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(back[0]["sensor_ids"], json!(ids), "{}", back[0]);
    let newest = of(format!("sensor_id={}&order=desc", ids[1])).await;
    assert_eq!(newest[0]["id"], back[0]["id"]);
}
