//! Escalation (issue #73, part 2): an alarm the desk was told of and nobody took goes, after
//! the desk's `after_s`, to the next client as `alarm.escalated`; the next client hears of
//! the acknowledgement and the resolution too; a circle, a chain past five and a missing
//! client are refused. On a clock the tests move by hand; on SQLite, or PostgreSQL with
//! `TEST_STORE=postgres`.

use axum::http::StatusCode;
use reqwest::Method;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Receiver, TestServer, eventually, unique};

/// The bodies of `kind` that `r` got, once there are `n`.
async fn got(r: &Receiver, kind: &str, n: usize) -> Vec<Value> {
    eventually(15, &format!("{n} {kind}"), || async {
        let got: Vec<Value> = r
            .received()
            .into_iter()
            .map(|g| g.body)
            .filter(|b| b["type"] == kind)
            .collect();
        (got.len() >= n).then_some(got)
    })
    .await
}

/// Waits until a notification of `kind` to `client` is recorded delivered.
async fn delivered(s: &TestServer, client: &str, kind: &str) {
    let query = format!("client_id={client}&status=delivered");
    eventually(15, &format!("{kind} recorded delivered"), || async {
        s.notifications(&query)
            .await
            .iter()
            .any(|n| n["type"] == kind)
            .then_some(())
    })
    .await;
}

async fn escalate(s: &TestServer, from: &str, after_s: u32, to: &str) -> (StatusCode, Value) {
    s.request(
        Method::PATCH,
        &format!("/v1/clients/{from}"),
        Some(json!({"escalation": {"after_s": after_s, "to": to}})),
    )
    .await
}

#[tokio::test]
async fn an_alarm_nobody_takes_goes_to_the_next_client_who_hears_of_its_end() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(tmp.path(), |_| {}, clock.clone()).await;
    let (desk, manager) = (Receiver::start().await, Receiver::start().await);
    let id = unique("door");
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "server room",
                   "hold_alarms": [{"data": 1, "after_s": 30}]}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let desk_id = s.client(&desk.url).await;
    let manager_id = s.client(&manager.url).await;
    s.link(&desk_id, &id).await;
    let (code, body) = escalate(&s, &desk_id, 120, &manager_id).await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        body["escalation"],
        json!({"after_s": 120, "to": manager_id})
    );

    // Held open: the desk is told; two minutes after, nobody took it.
    let t0 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    clock.set(t0 + 30_000);
    let held = &desk.bodies_of(&id, Some("sensor.state_held"), 1).await[0];
    let alarm = held["alarm_id"].as_str().unwrap().to_string();
    // The timer starts when the delivery is recorded, on the clock then: wait for it.
    delivered(&s, &desk_id, "sensor.state_held").await;
    clock.set(t0 + 30_000 + 119_000);
    s.engine_round().await;
    assert!(
        manager.received().is_empty(),
        "not before after_s: {:?}",
        manager.received()
    );
    clock.set(t0 + 30_000 + 125_000);
    let up = &got(&manager, "alarm.escalated", 1).await[0];
    assert_eq!(up["alarm"]["id"], alarm.as_str(), "{up}");
    assert_eq!(up["alarm"]["kind"], "state_held");
    assert_eq!((&up["level"], &up["from"]), (&json!(1), &json!(desk_id)));

    // Taken: the manager, reached by escalation, hears it as the desk does.
    let (code, taken) = s
        .post(
            &format!("/v1/alarms/{alarm}/ack"),
            json!({"by": "manager: Omar"}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{taken}");
    for r in [&desk, &manager] {
        let ack = &got(r, "alarm.acknowledged", 1).await[0];
        assert_eq!(ack["by"], "manager: Omar");
    }

    // The door closes: the manager hears of the end too, in its own lane.
    s.readings(json!({"sensor_id": id, "data": 0})).await;
    desk.bodies_of(&id, Some("sensor.state_held_cleared"), 1)
        .await;
    // The next round tells it.
    clock.set(clock.now() + 2_000);
    let end = &got(&manager, "sensor.state_held_cleared", 1).await[0];
    assert_eq!(end["alarm_id"], alarm.as_str(), "{end}");
    assert_eq!(end["sensor"]["id"], id.as_str());

    // An alarm taken before its time escalates to nobody.
    let t1 = clock.now();
    s.readings(json!({"sensor_id": id, "data": 1})).await;
    clock.set(t1 + 30_000);
    let held = desk.bodies_of(&id, Some("sensor.state_held"), 2).await;
    let second = held[1]["alarm_id"].as_str().unwrap().to_string();
    let (code, _) = s
        .post(&format!("/v1/alarms/{second}/ack"), json!({"by": "desk"}))
        .await;
    assert_eq!(code, StatusCode::OK);
    clock.set(t1 + 30_000 + 200_000);
    s.engine_round().await;
    s.dispatcher_round().await;
    let escalated = manager
        .received()
        .into_iter()
        .filter(|g| g.body["type"] == "alarm.escalated")
        .count();
    assert_eq!(escalated, 1, "only the first alarm escalated");
}

#[tokio::test]
async fn a_circle_a_chain_past_five_and_a_missing_client_are_refused() {
    let s = TestServer::start().await;
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(s.client("https://example.com/hook").await);
    }
    for w in ids[..6].windows(2) {
        let (code, body) = escalate(&s, &w[0], 60, &w[1]).await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    // ids[0] → … → ids[5] is five steps: one more is a sixth.
    let (code, body) = escalate(&s, &ids[5], 60, &ids[6]).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("longer than 5")
    );
    let (code, body) = escalate(&s, &ids[3], 60, &ids[1]).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("circle")
    );
    let (code, body) = escalate(&s, &ids[6], 60, "nosuchclient").await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("escalation.to")
    );
    let (code, body) = escalate(&s, &ids[6], 0, &ids[0]).await;
    assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (code, body) = s
        .request(
            Method::PATCH,
            &format!("/v1/clients/{}", ids[5]),
            Some(json!({"escalation": null})),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(body["escalation"], Value::Null);
}

/// Issue #73's "done when": three nodes on PostgreSQL, and the node that served the alarm's
/// sensor (whose delivery to the desk started the timer) killed with `kill -9` while the
/// timer runs. A survivor makes the escalation, once, when it is due; an acknowledgement
/// through another node stops the chain and is told to the client reached.
#[tokio::test]
async fn a_timer_outlives_a_kill_9_of_the_node_that_started_it() {
    use crate::utils::cluster::Cluster;
    let Some(mut c) = Cluster::start(3).await else {
        return;
    };
    let (desk, manager) = (Receiver::start().await, Receiver::start().await);
    let base = c.base(0).to_string();
    let id = unique("vault");
    c.post(
        &base,
        "/v1/sensors",
        json!({"id": id, "address": "vault door", "hold_alarms": [{"data": 1, "after_s": 1}]}),
    )
    .await;
    let manager_id = c
        .post(
            &base,
            "/v1/clients",
            json!({"name": "manager", "url": manager.url}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    let after_s = 4;
    let desk_id = c
        .post(
            &base,
            "/v1/clients",
            json!({"name": "desk", "url": desk.url,
                   "escalation": {"after_s": after_s, "to": manager_id}}),
        )
        .await["id"]
        .as_str()
        .unwrap()
        .to_string();
    c.put(&base, &format!("/v1/clients/{desk_id}/sensors/{id}"))
        .await;

    // Closed, then held open through its owner: the desk is told, the timer starts.
    let owner = c.owner_of(&id, 0).await;
    let owner_base = c.live()[owner].clone();
    crate::utils::cluster::post_until_accepted(
        &c.http,
        std::slice::from_ref(&owner_base),
        vec![json!({"sensor_id": id, "data": 1})],
        10,
    )
    .await;
    let held = got(&desk, "sensor.state_held", 1).await;
    let alarm = held[0]["alarm_id"].as_str().unwrap().to_string();
    let delivered_query = format!("/v1/notifications?client_id={desk_id}&status=delivered");
    eventually(15, "the desk's delivery recorded", || async {
        let list = c.get(&base, &delivered_query).await;
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "sensor.state_held")
            .then_some(())
    })
    .await;
    let delivered = std::time::Instant::now();
    c.kill9(owner);

    // A survivor makes it once, no sooner than it is due.
    let escalated = got(&manager, "alarm.escalated", 1).await;
    let waited = delivered.elapsed();
    assert!(
        waited >= std::time::Duration::from_secs(after_s - 1),
        "not before it was due: {waited:?}"
    );
    assert!(
        waited < std::time::Duration::from_secs(after_s + 20),
        "made within its time and a lease: {waited:?}"
    );
    assert_eq!(
        (
            &escalated[0]["alarm"]["id"],
            &escalated[0]["from"],
            &escalated[0]["level"]
        ),
        (&json!(alarm), &json!(desk_id), &json!(1)),
        "{escalated:?}"
    );
    let survivor = c.live()[0].clone();
    let (code, taken) = {
        let resp = c
            .http
            .post(format!("{survivor}/v1/alarms/{alarm}/ack"))
            .json(&json!({"by": "night manager"}))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
    };
    assert_eq!(code, 200, "{taken}");
    let acked = got(&manager, "alarm.acknowledged", 1).await;
    assert_eq!(acked[0]["by"], "night manager", "{acked:?}");
    // Made once across the cluster: no second one, whatever node's round came next.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let all: Vec<Value> = manager
        .received()
        .into_iter()
        .map(|g| g.body)
        .filter(|b| b["type"] == "alarm.escalated")
        .collect();
    assert_eq!(all.len(), 1, "one escalation: {all:?}");
}
