//! Issue #49: a reading with a field it does not have is refused the same way over every
//! source: listed in `rejected` over HTTP (`readings.rs`), dead-lettered with the reason
//! over AMQP, acknowledged and counted over MQTT — never applied without the field.

use lapin::options::BasicGetOptions;
use lapin::types::AMQPValue;
use serde_json::json;

use crate::amqp::{broker, declare, publish};
use crate::utils::{eventually, unique};

#[tokio::test]
async fn amqp_dead_letters_a_reading_with_an_unknown_field() {
    let Some((_conn, ch)) = broker().await else {
        return;
    };
    let queue = unique("q");
    let s = crate::amqp::start(&queue).await;
    let id = unique("uf");
    s.sensor(&id).await;
    let odd = json!({"sensor_id": id, "data": 1, "humidity": 87}).to_string();
    publish(&ch, &queue, odd.as_bytes(), None).await;
    publish(
        &ch,
        &queue,
        json!({"sensor_id": id, "data": 0}).to_string().as_bytes(),
        None,
    )
    .await;
    let dlq = format!("{queue}.dlq");
    eventually(10, "the dead letter", || async {
        (declare(&ch, &dlq).await == 1).then_some(())
    })
    .await;
    let m = ch
        .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("a dead letter");
    let headers = m.properties.headers().clone().unwrap_or_default();
    let text = |name: &str| match headers.inner().get(name) {
        Some(AMQPValue::LongString(s)) => s.to_string(),
        other => panic!("no {name} header: {other:?}"),
    };
    assert_eq!(text("x-latch-reason"), "unknown_field");
    let error = text("x-latch-error");
    assert!(
        error.contains("`humidity`") && error.contains("`sensor_id`, `data`, `ts`"),
        "{error}"
    );
    assert_eq!(m.data, odd.as_bytes(), "the original body is kept");
    let (server, id) = (&s, id.as_str());
    eventually(10, "the good one applied", || async move {
        (server.reading_count(id).await == 1).then_some(())
    })
    .await;
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(sensor["status"]["data"], 0, "{sensor}");
    s.stop().await;
}

#[tokio::test]
async fn mqtt_refuses_a_json_reading_with_an_unknown_field() {
    if !crate::mqtt::broker_up().await {
        return;
    }
    let prefix = unique("t");
    let s = crate::mqtt::start_in(None, &prefix, &unique("latch")).await;
    let id = unique("uf");
    s.sensor(&id).await;
    let topic = format!("{prefix}/{id}/state");
    assert!(
        crate::mqtt::publish(&[
            (
                topic.clone(),
                json!({"data": 1, "rssi": -70}).to_string().into_bytes()
            ),
            (topic.clone(), json!({"data": 0}).to_string().into_bytes()),
        ])
        .await
    );
    let (server, id) = (&s, id.as_str());
    eventually(10, "the good one applied", || async move {
        (server.reading_count(id).await == 1).then_some(())
    })
    .await;
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(sensor["status"]["data"], 0, "{sensor}");
    let (_, metrics) = s.get("/metrics").await;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("latch_readings_rejected_total{source=\"mqtt\",reason=\"unknown_field\"} 1"),
        "{metrics}"
    );
    s.stop().await;
}
