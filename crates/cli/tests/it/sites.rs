//! Sites (issue #50) through a running latch on the store under test: a building that goes
//! dark is one `site.connection_lost` per client and site, naming only that client's
//! sensors, and no sensor-level loss for them; a sensor lost alone in a site that stays up
//! is its own loss after the grace; the site's return is one `site.connection_restored`.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Receiver, TestServer, eventually, unique};

/// Per type, the notifications `r` received.
fn by_type(r: &Receiver) -> BTreeMap<String, Vec<Value>> {
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for g in r.received() {
        let t = g.body["type"].as_str().unwrap_or_default().to_string();
        out.entry(t).or_default().push(g.body);
    }
    out
}

fn ids(v: &Value) -> Vec<String> {
    let mut ids: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn a_dark_building_is_one_alarm_per_client_and_a_lone_loss_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let tweak = |c: &mut latch::config::Config| {
        c.heartbeat_timeout = Duration::from_secs(5);
        c.site_grace = Duration::from_secs(10);
    };
    let s = TestServer::start_clocked(tmp.path(), tweak, clock.clone()).await;
    let (all_r, half_r) = (Receiver::start().await, Receiver::start().await);
    let (all, half) = (s.client(&all_r.url).await, s.client(&half_r.url).await);
    // Three buildings go dark; in a fourth one sensor alone goes silent.
    let mut sites: Vec<(String, Vec<String>)> = Vec::new();
    for _ in 0..4 {
        let site = unique("bldg-");
        let (code, body) = s
            .post("/v1/sites", json!({"id": site, "name": "a building"}))
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        let mut sensors = Vec::new();
        for i in 0..10 {
            let id = unique(&format!("st{i}"));
            let (code, body) = s
                .post(
                    "/v1/sensors",
                    json!({"id": id, "address": format!("room {i}"), "site_id": site}),
                )
                .await;
            assert_eq!(code, StatusCode::CREATED, "{body}");
            s.link(&all, &id).await;
            if i % 2 == 0 {
                s.link(&half, &id).await;
            }
            sensors.push(id);
        }
        sites.push((site, sensors));
    }
    let every: Vec<&String> = sites.iter().flat_map(|(_, ss)| ss).collect();
    let report = |ids: Vec<&String>| {
        Value::Array(
            ids.iter()
                .map(|id| json!({"sensor_id": id, "data": 1}))
                .collect(),
        )
    };
    s.readings(report(every.clone())).await;
    eventually(20, "the first states", || async {
        (all_r.received().len() >= 40 && half_r.received().len() >= 20).then_some(())
    })
    .await;
    let (lone_site, lone_sensors) = &sites[3];
    let lone = &lone_sensors[0];
    let keep_alive: Vec<&String> = lone_sensors[1..].iter().collect();
    // Past the timeout and then the grace, the fourth building's other sensors report.
    for _ in 0..20 {
        clock.advance(Duration::from_secs(1));
        s.readings(report(keep_alive.clone())).await;
        s.engine_round().await;
    }
    let got = eventually(20, "the sites' decisions", || async {
        let t = by_type(&all_r);
        let sites = t.get("site.connection_lost").map_or(0, Vec::len);
        let lone = t.get("sensor.connection_lost").map_or(0, Vec::len);
        (sites >= 3 && lone >= 1).then_some(t)
    })
    .await;
    let site_lost = &got["site.connection_lost"];
    assert_eq!(site_lost.len(), 3, "one per dark building");
    for e in site_lost {
        assert_eq!(e["sensors"].as_array().unwrap().len(), 10);
        assert_eq!(e["sensors_total"], 10);
        assert_ne!(e["site"]["id"], json!(lone_site));
    }
    let own: Vec<&Value> = got["sensor.connection_lost"].iter().collect();
    assert_eq!(
        own.len(),
        1,
        "no sensor-level loss for the dark buildings: {own:?}"
    );
    assert_eq!(own[0]["sensor"]["id"], json!(lone));

    let half_got = eventually(20, "the other client's", || async {
        let t = by_type(&half_r);
        (t.get("site.connection_lost").map_or(0, Vec::len) >= 3).then_some(t)
    })
    .await;
    for e in &half_got["site.connection_lost"] {
        let site = sites
            .iter()
            .find(|(id, _)| e["site"]["id"] == json!(id))
            .unwrap();
        let mine: Vec<String> = {
            let mut v: Vec<String> = site.1.iter().step_by(2).cloned().collect();
            v.sort();
            v
        };
        assert_eq!(ids(&e["sensors"]), mine, "only its own sensors");
        assert_eq!(e["sensors_total"], 5);
    }
    let (_, read) = s.get(&format!("/v1/sites/{}", sites[0].0)).await;
    assert_eq!(read["status"]["state"], "down", "{read}");

    // The first building comes back but for one sensor: one restoration naming it still lost.
    let back: Vec<&String> = sites[0].1[1..].iter().collect();
    s.readings(report(back)).await;
    clock.advance(Duration::from_secs(2));
    s.engine_round().await;
    let restored = eventually(20, "the site's restoration", || async {
        by_type(&all_r).get("site.connection_restored").cloned()
    })
    .await;
    assert_eq!(restored.len(), 1);
    assert_eq!(restored[0]["restored"].as_array().unwrap().len(), 9);
    assert_eq!(ids(&restored[0]["still_lost"]), [sites[0].1[0].clone()]);
    assert!(
        !by_type(&all_r).contains_key("sensor.connection_restored"),
        "no sensor-level restoration for those the site's event told"
    );
    // The one still lost comes back on its own: its own restoration.
    s.readings(report(vec![&sites[0].1[0]])).await;
    let own = eventually(20, "its own restoration", || async {
        by_type(&all_r).get("sensor.connection_restored").cloned()
    })
    .await;
    assert_eq!(own[0]["sensor"]["id"], json!(sites[0].1[0]));
    s.stop().await;
}

/// Three nodes: a site's 20 sensors spread over their partitions go silent, and the node
/// that owns a third of them is killed (`kill -9`) while the site's grace runs. The
/// survivors decide the site once: one `site.connection_lost` naming all 20, no sensor's
/// own loss, and nothing more in the seconds after.
#[tokio::test]
async fn a_cluster_decides_a_site_once_though_a_node_is_killed() {
    use crate::utils::cluster::{Cluster, post_until_accepted};
    let env = [("LATCH_SITE_GRACE", "5s".to_string())];
    let Some(mut c) = Cluster::start_env(3, &env).await else {
        return;
    };
    let r = Receiver::start().await;
    let site = unique("bldg-");
    c.post(c.base(0), "/v1/sites", json!({"id": site})).await;
    let (_, ids) = c
        .fleet(
            "k",
            20,
            &r.url,
            json!({"heartbeat_timeout_s": 3, "site_id": site}),
        )
        .await;
    let readings: Vec<Value> = ids
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    post_until_accepted(&c.http, &c.live(), readings, 20).await;
    eventually(20, "the first states", || async {
        (r.received().len() >= 20).then_some(())
    })
    .await;
    // Lost after 3 s; killed at 4.5 s, inside the 5 s grace.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    c.kill9(2);
    let via = c.live()[0].clone();
    let lost = eventually(40, "the site's loss", || async {
        by_type(&r).get("site.connection_lost").cloned()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t = by_type(&r);
    assert_eq!(t["site.connection_lost"].len(), 1, "decided once: {lost:?}");
    assert_eq!(lost[0]["sensors"].as_array().unwrap().len(), 20);
    assert!(!t.contains_key("sensor.connection_lost"), "{t:?}");
    let read = c.get(&via, &format!("/v1/sites/{site}")).await;
    assert_eq!(read["status"]["state"], "down", "{read}");
}
