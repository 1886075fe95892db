//! Debounce and reminders in cluster mode (issue #36): the partition's owner decides, so
//! readings of one sensor entering through different nodes make one debounced change, and
//! a lost sensor is reminded once per interval across the cluster.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use crate::utils::cluster::{Cluster, post_until_accepted};
use crate::utils::{Receiver, eventually};

#[tokio::test]
async fn the_owner_debounces_and_reminds_once_for_the_cluster() {
    let Some(c) = Cluster::start_env(2, &[("LATCH_LOST_REMINDER", "1s".into())]).await else {
        return;
    };
    let r = Receiver::start().await;
    let live = c.live();
    let (_, flapping) = c
        .fleet(
            "d",
            4,
            &r.url,
            json!({"debounce_s": 5, "heartbeat_timeout_s": 3600}),
        )
        .await;
    let (_, silent) = c
        .fleet("l", 4, &r.url, json!({"heartbeat_timeout_s": 1}))
        .await;

    // 1, 0, 1 for each, back to back (well within its 5 s debounce however slow the
    // machine), every reading through the other node than the one before: half go to a
    // node that does not own the sensor and is forwarded.
    for (i, id) in flapping.iter().enumerate() {
        for (k, d) in [1, 0, 1].into_iter().enumerate() {
            let via = std::slice::from_ref(&live[(i + k) % live.len()]);
            post_until_accepted(&c.http, via, vec![json!({"sensor_id": id, "data": d})], 10).await;
        }
    }
    for id in &silent {
        post_until_accepted(
            &c.http,
            &live,
            vec![json!({"sensor_id": id, "data": 0})],
            10,
        )
        .await;
    }
    let of = |kind: &'static str| {
        let r = r.clone();
        move || {
            r.received()
                .into_iter()
                .map(|g| g.body)
                .filter(|b| b["type"] == kind)
                .collect::<Vec<Value>>()
        }
    };
    let changes = of("sensor.state_changed");
    let got = eventually(20, "a debounced change of each", || async {
        let got: Vec<Value> = changes()
            .into_iter()
            .filter(|b| flapping.iter().any(|id| b["sensor"]["id"] == id.as_str()))
            .collect();
        (got.len() >= flapping.len()).then_some(got)
    })
    .await;
    for id in &flapping {
        let mine: Vec<&Value> = got
            .iter()
            .filter(|b| b["sensor"]["id"] == id.as_str())
            .collect();
        assert_eq!(mine.len(), 1, "one change for three readings: {got:?}");
        assert_eq!(
            (mine[0]["data"].clone(), mine[0]["flips_suppressed"].clone()),
            (json!(1), json!(2))
        );
    }

    let reminders = of("sensor.still_lost");
    let got = eventually(30, "three reminders of each silent sensor", || async {
        let got = reminders();
        silent
            .iter()
            .all(|id| {
                got.iter()
                    .filter(|b| b["sensor"]["id"] == id.as_str())
                    .count()
                    >= 3
            })
            .then_some(got)
    })
    .await;
    let mut seen: HashMap<(String, u64), HashSet<String>> = HashMap::new();
    for b in &got {
        let key = (
            b["sensor"]["id"].as_str().unwrap().to_string(),
            b["reminder"].as_u64().unwrap(),
        );
        seen.entry(key)
            .or_default()
            .insert(b["id"].as_str().unwrap().to_string());
    }
    assert!(
        seen.values().all(|ids| ids.len() == 1),
        "each reminder made once for the cluster: {seen:?}"
    );
    for id in &silent {
        let ev = c.get(&live[0], &format!("/v1/sensors/{id}/events")).await;
        let numbers: Vec<u64> = ev["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["type"] == "sensor.still_lost")
            .map(|e| e["reminder"].as_u64().unwrap())
            .collect();
        assert!(
            numbers.windows(2).all(|w| w[0] < w[1]),
            "never two for one interval: {numbers:?}"
        );
    }
}
