//! A sensor leaving its site while the site's grace holds its loss (issue #68), through the
//! HTTP API of a running latch on the store under test: moved out with `PUT`, or its site
//! deleted, the loss goes to the client at once as the sensor's own, before the grace
//! would have ended, and once.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::{Receiver, TestServer, eventually, unique};

fn losses_of(r: &Receiver, sensor: &str) -> usize {
    r.received()
        .iter()
        .map(|g| &g.body)
        .filter(|b: &&Value| b["type"] == "sensor.connection_lost" && b["sensor"]["id"] == sensor)
        .count()
}

#[tokio::test]
async fn a_sensor_leaving_its_site_in_the_grace_takes_its_loss_along() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let s = TestServer::start_clocked(
        tmp.path(),
        |c| {
            c.heartbeat_timeout = Duration::from_secs(5);
            c.site_grace = Duration::from_secs(300);
        },
        clock.clone(),
    )
    .await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let site = unique("mvsite");
    let (code, body) = s.post("/v1/sites", json!({"id": site})).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let ids: Vec<String> = (0..4).map(|i| unique(&format!("mv{i}"))).collect();
    for id in &ids {
        let (code, body) = s
            .post(
                "/v1/sensors",
                json!({"id": id, "address": "Svobody 23", "site_id": site}),
            )
            .await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        s.link(&client, id).await;
        s.readings(json!({"sensor_id": id, "data": 1})).await;
    }
    eventually(15, "the first states", || async {
        (r.received().len() >= ids.len()).then_some(())
    })
    .await;
    // ids[0] and ids[1] fall silent; the others keep reporting. Their losses wait for the
    // site's grace (five minutes).
    for _ in 0..7 {
        clock.advance(Duration::from_secs(1));
        for id in &ids[2..] {
            s.readings(json!({"sensor_id": id, "data": 1})).await;
        }
        s.engine_round().await;
    }
    s.dispatcher_round().await;
    assert_eq!(losses_of(&r, &ids[0]) + losses_of(&r, &ids[1]), 0, "held");

    // Moved out of the site: its loss goes at once.
    let (code, body) = s
        .put(
            &format!("/v1/sensors/{}", ids[0]),
            json!({"address": "Svobody 23", "site_id": null}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    eventually(15, "the moved sensor's loss", || async {
        (losses_of(&r, &ids[0]) == 1).then_some(())
    })
    .await;
    // The site deleted: the loss it held goes at once too.
    let (code, body) = s.delete(&format!("/v1/sites/{site}")).await;
    assert_eq!(code, StatusCode::NO_CONTENT, "{body}");
    eventually(15, "the deleted site's held loss", || async {
        (losses_of(&r, &ids[1]) == 1).then_some(())
    })
    .await;
    // Once each, though the grace now runs out.
    clock.advance(Duration::from_secs(301));
    s.engine_round().await;
    s.dispatcher_round().await;
    assert_eq!((losses_of(&r, &ids[0]), losses_of(&r, &ids[1])), (1, 1));
}
