//! Sensor liveness: connection lost after silence, restored by the next reading, exactly once
//! per silence, across restarts. Where the exact moment matters the tests run latch on a
//! manual clock and move it across the deadline, so they neither sleep through timeouts
//! nor depend on how busy the machine is.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Receiver, TestServer, eventually, unique};

/// How many events of `kind` the sensor's history holds. After
/// [`TestServer::engine_round`] at a clock time, what was due by then is in it.
async fn events(s: &TestServer, id: &str, kind: &str) -> usize {
    let (_, body) = s.get(&format!("/v1/sensors/{id}/events?limit=1000")).await;
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == kind)
        .count()
}

/// A manual clock a little past the wall clock's now.
fn manual_clock() -> Clock {
    Clock::manual(now_ms())
}

fn ms(v: &Value) -> i64 {
    latch::domain::time::parse(v.as_str().unwrap()).unwrap()
}

async fn connection(s: &TestServer, id: &str) -> String {
    let (_, body) = s.get(&format!("/v1/sensors/{id}")).await;
    body["status"]["connection"].as_str().unwrap().to_string()
}

fn of_type<'a>(got: &'a [crate::utils::Received], sensor: &str, kind: &str) -> Vec<&'a Value> {
    got.iter()
        .map(|g| &g.body)
        .filter(|b| b["sensor"]["id"] == sensor && b["type"] == kind)
        .collect()
}

#[tokio::test]
async fn silence_is_lost_once_and_a_reading_restores() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = manual_clock();
    let timeout = |c: &mut latch::config::Config| c.heartbeat_timeout = Duration::from_secs(2);
    let s = TestServer::start_clocked(tmp.path(), timeout, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("lv");
    s.sensor(&id).await;
    s.link(&client, &id).await;
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    assert_eq!(connection(&s, &id).await, "online");

    // A millisecond before the deadline it is still online.
    clock.set(t0 + 1_999);
    s.engine_round().await;
    assert_eq!(connection(&s, &id).await, "online");
    assert_eq!(events(&s, &id, "sensor.connection_lost").await, 0);

    clock.set(t0 + 2_000);
    let lost = eventually(10, "connection_lost", || async {
        of_type(&r.received(), &id, "sensor.connection_lost")
            .first()
            .map(|b| (*b).clone())
    })
    .await;
    assert_eq!(lost["data"], 1, "the last known state");
    assert!(lost["previous"].is_null());
    let last_seen = ms(&lost["last_seen_at"]);
    assert_eq!(
        last_seen, t0,
        "latch's own receive time of the last reading"
    );
    assert_eq!(
        ms(&lost["occurred_at"]),
        t0 + 2_000,
        "lost exactly one timeout after the last reading"
    );
    assert_eq!(connection(&s, &id).await, "lost");

    // Silent on, for many timeouts: no second announcement.
    clock.set(t0 + 60_000);
    s.engine_round().await;
    assert_eq!(events(&s, &id, "sensor.connection_lost").await, 1);
    assert_eq!(
        of_type(&r.received(), &id, "sensor.connection_lost").len(),
        1
    );

    // The next reading restores, and a different value is a change as well.
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    let got = r.wait_for(4, 10).await;
    let kinds: Vec<&str> = got
        .iter()
        .filter(|g| g.body["sensor"]["id"] == id.as_str())
        .map(|g| g.body["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "sensor.state_changed",
            "sensor.connection_lost",
            "sensor.connection_restored",
            "sensor.state_changed"
        ]
    );
    let restored = of_type(&got, &id, "sensor.connection_restored")[0];
    assert_eq!(
        restored["data"], 1,
        "restored carries the state known before"
    );
    assert_eq!(ms(&restored["last_seen_at"]), last_seen);
    assert_eq!(connection(&s, &id).await, "online");
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
            "sensor.connection_lost",
            "sensor.connection_restored",
            "sensor.state_changed"
        ]
    );
    s.stop().await;
}

#[tokio::test]
async fn a_sensors_own_timeout_wins_and_the_filter_lists_the_right_ones() {
    let s = TestServer::start_with(|c| c.heartbeat_timeout = Duration::from_secs(3600)).await;
    let fast = unique("fast");
    let slow = unique("slow");
    let never = unique("never");
    let (st, body) = s
        .post(
            "/v1/sensors",
            json!({"id": fast, "address": "a", "heartbeat_timeout_s": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{body}");
    s.sensor(&slow).await;
    s.sensor(&never).await;
    s.readings(json!([{"sensor_id": fast, "data": 1}, {"sensor_id": slow, "data": 1}]))
        .await;
    eventually(10, "fast sensor lost", || async {
        (connection(&s, &fast).await == "lost").then_some(())
    })
    .await;
    assert_eq!(
        connection(&s, &slow).await,
        "online",
        "the default hour has not passed"
    );

    let list = |c: &'static str| {
        let s = &s;
        async move {
            let (st, body) = s
                .get(&format!("/v1/sensors?connection={c}&limit=1000"))
                .await;
            assert_eq!(st, StatusCode::OK);
            body["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    assert!(list("lost").await.contains(&fast));
    assert!(!list("lost").await.contains(&slow));
    assert!(list("online").await.contains(&slow));
    assert!(list("unknown").await.contains(&never));
    assert!(!list("unknown").await.contains(&fast));
    let (st, _) = s.get("/v1/sensors?connection=sleepy").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    // Giving the slow one a short timeout of its own takes effect at once.
    let (st, _) = s
        .put(
            &format!("/v1/sensors/{slow}"),
            json!({"address": "a", "heartbeat_timeout_s": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    eventually(10, "slow sensor lost after its timeout shrank", || async {
        (connection(&s, &slow).await == "lost").then_some(())
    })
    .await;
    s.stop().await;
}

#[tokio::test]
async fn our_downtime_causes_no_false_alarm_and_lost_stays_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = manual_clock();
    let timeout = |c: &mut latch::config::Config| c.heartbeat_timeout = Duration::from_secs(2);
    let s = TestServer::start_clocked(tmp.path(), timeout, clock.clone()).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let reporting = unique("rep");
    let silent = unique("sil");
    for id in [&reporting, &silent] {
        s.sensor(id).await;
        s.link(&client, id).await;
    }
    let t0 = clock.now();
    s.readings(json!([{"sensor_id": silent, "data": 1}])).await;
    clock.set(t0 + 2_000);
    eventually(10, "silent sensor lost", || async {
        (of_type(&r.received(), &silent, "sensor.connection_lost").len() == 1).then_some(())
    })
    .await;
    s.readings(json!([{"sensor_id": reporting, "data": 1}]))
        .await;
    s.stop().await;

    // latch is down past `reporting`'s deadline (t0 + 4 s) and back at t0 + 5 s. Its own
    // downtime is not the sensor's silence: the deadline counts from the restart.
    clock.set(t0 + 5_000);
    let s = TestServer::start_clocked(tmp.path(), timeout, clock.clone()).await;
    clock.set(t0 + 6_999);
    s.engine_round().await;
    assert_eq!(
        events(&s, &reporting, "sensor.connection_lost").await,
        0,
        "no false alarm for latch's own downtime"
    );
    assert_eq!(connection(&s, &reporting).await, "online");
    assert_eq!(
        connection(&s, &silent).await,
        "lost",
        "lost survives the restart"
    );

    // A sensor that stays silent after the restart is lost one timeout after it.
    clock.set(t0 + 7_000);
    let lost = eventually(10, "reporting sensor lost after the restart", || async {
        of_type(&r.received(), &reporting, "sensor.connection_lost")
            .first()
            .map(|b| (*b).clone())
    })
    .await;
    assert_eq!(ms(&lost["occurred_at"]), t0 + 7_000);
    assert_eq!(ms(&lost["last_seen_at"]), t0 + 2_000);
    s.engine_round().await;
    assert_eq!(
        events(&s, &silent, "sensor.connection_lost").await,
        1,
        "and the one lost before is not announced again"
    );
    s.stop().await;
}

/// A client disabled while a sensor comes and goes keeps a backlog of a few notifications
/// for that sensor, not one pair per outage: an undelivered lost and its restored are
/// superseded once a newer pair exists. Enabled again, it learns of its newest outage that
/// ended, and that the sensor is lost now.
#[tokio::test]
async fn a_disabled_clients_backlog_of_outages_folds() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = manual_clock();
    let timeout = |c: &mut latch::config::Config| c.heartbeat_timeout = Duration::from_secs(2);
    let s = TestServer::start_clocked(tmp.path(), timeout, clock.clone()).await;
    // 410 Gone: the client is disabled at its first answer.
    let r = Receiver::start().await;
    r.script([crate::utils::Answer::status(410)]);
    let client = s.client(&r.url).await;
    let id = unique("fo");
    s.sensor(&id).await;
    s.link(&client, &id).await;
    let mut now = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    eventually(10, "the client disabled", || async {
        let (_, c) = s.get(&format!("/v1/clients/{client}")).await;
        (!c["disabled_at"].is_null()).then_some(())
    })
    .await;
    // Seven outages, each ended by a reading but the last.
    for outage in 0..7 {
        now += 2_000;
        clock.set(now);
        eventually(10, "lost", || async {
            (connection(&s, &id).await == "lost").then_some(())
        })
        .await;
        if outage < 6 {
            s.readings(json!({"sensor_id": id, "data": 1})).await;
        }
        now = clock.now();
    }
    let kinds = |status: &'static str| {
        let s = &s;
        let client = &client;
        async move {
            s.notifications(&format!("client_id={client}&status={status}"))
                .await
                .iter()
                .map(|n| n["type"].as_str().unwrap().to_string())
                .collect::<Vec<_>>()
        }
    };
    let waiting = eventually(10, "the older pairs folded", || async {
        let k = kinds("pending").await;
        (k.len() <= 3).then_some(k)
    })
    .await;
    assert_eq!(
        waiting,
        [
            "sensor.connection_lost",
            "sensor.connection_restored",
            "sensor.connection_lost"
        ],
        "the newest outage that ended, and the one under way"
    );
    assert_eq!(kinds("superseded").await.len(), 10, "five older pairs");
    s.stop().await;
}
