//! Door alarms (issue #72, battery, tamper, fault and labels): what a reading's `battery`,
//! `tamper` and `fault` raise, what a sensor's `status` shows of them, what is refused,
//! and the labels a sensor's notifications carry. Over HTTP, and over MQTT and RabbitMQ; on
//! SQLite, or PostgreSQL with `TEST_STORE=postgres`.

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::domain::time::{format, now_ms};

use crate::utils::{Receiver, TestServer, eventually, unique};

fn types(got: &[Value]) -> Vec<String> {
    got.iter()
        .map(|b| b["type"].as_str().unwrap().to_string())
        .collect()
}

async fn post_readings(s: &TestServer, readings: Value) -> (StatusCode, Value) {
    s.post("/v1/readings", readings).await
}

#[tokio::test]
async fn battery_tamper_and_fault_raise_alarms_and_clear_them_once() {
    let s = TestServer::start().await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("door");
    let (code, body) = s
        .post(
            "/v1/sensors",
            json!({"id": id, "address": "front door", "battery_low_pct": 30,
                   "labels": {"0": "closed", "1": "open"}}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    assert_eq!(body["battery_low_pct"], 30);
    assert_eq!(body["labels"], json!({"0": "closed", "1": "open"}));
    s.link(&client, &id).await;

    let t0 = now_ms() - 60_000;
    let at = |k: i64| format(t0 + k * 1_000);
    let reading = |k: i64, data: u8, extra: Value| {
        let mut r = json!({"sensor_id": id, "data": data, "ts": at(k)});
        r.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        r
    };
    s.readings(reading(1, 1, json!({"battery": 80, "tamper": false})))
        .await;
    let got = r.bodies_of(&id, None, 1).await;
    assert_eq!(types(&got), ["sensor.state_changed"]);
    assert_eq!(got[0]["label"], "open");
    assert!(got[0].get("previous_label").is_none(), "{}", got[0]);

    // At the threshold: one alarm; hovering just above it: nothing more.
    s.readings(reading(2, 1, json!({"battery": 30}))).await;
    s.readings(reading(3, 1, json!({"battery": 32}))).await;
    s.readings(reading(4, 1, json!({"battery": 29}))).await;
    let got = r.bodies_of(&id, None, 2).await;
    assert_eq!(got[1]["type"], "sensor.battery_low");
    assert_eq!(
        (&got[1]["battery"], &got[1]["threshold"]),
        (&json!(30), &json!(30))
    );
    assert!(got[1].get("data").is_none(), "{}", got[1]);

    // A change of state with everything at once, in that order.
    s.readings(reading(
        5,
        0,
        json!({"battery": 35, "tamper": true, "fault": "lock_jam"}),
    ))
    .await;
    let got = r.bodies_of(&id, None, 6).await;
    assert_eq!(
        types(&got[2..]),
        [
            "sensor.state_changed",
            "sensor.battery_ok",
            "sensor.tamper",
            "sensor.fault"
        ]
    );
    assert_eq!(
        (&got[2]["label"], &got[2]["previous_label"]),
        (&json!("closed"), &json!("open"))
    );
    assert_eq!(got[3]["battery"], 35);
    assert_eq!(got[5]["fault"], "lock_jam");

    // A late reading changes none of them; a reading without them leaves them.
    s.readings(reading(
        0,
        0,
        json!({"tamper": false, "fault": null, "battery": 1}),
    ))
    .await;
    s.readings(reading(6, 0, json!({}))).await;
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    let st = &sensor["status"];
    assert_eq!(
        (&st["battery"], &st["tamper"], &st["fault"]),
        (&json!(35), &json!(true), &json!("lock_jam")),
        "{sensor}"
    );
    // The list filters on them: a battery strictly below, the tamper flag.
    let listed = |q: &'static str| {
        let s = &s;
        async move {
            let (code, body) = s.get(&format!("/v1/sensors?{q}")).await;
            assert_eq!(code, StatusCode::OK, "{body}");
            body["items"].as_array().unwrap().len()
        }
    };
    assert_eq!(listed("battery_below=36&tamper=true").await, 1);
    assert_eq!(listed("battery_below=35").await, 0, "strictly below");
    assert_eq!(listed("tamper=false").await, 0);
    assert_eq!(
        listed("battery_low=false&held=false&flapping=false").await,
        1
    );
    // With the search too: its id is found with the filters, and not without them.
    let found = format!("q={id}&battery_below=36&tamper=true").leak();
    assert_eq!(listed(found).await, 1);
    let gone = format!("q={id}&battery_low=true").leak();
    assert_eq!(listed(gone).await, 0);
    let (code, _) = s.get("/v1/sensors?battery_below=500").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    // History keeps what each reading said, the late one's too.
    let (_, history) = s.get(&format!("/v1/sensors/{id}/readings")).await;
    let items = history["items"].as_array().unwrap();
    let late = items.iter().find(|r| r["late"] == true).unwrap();
    assert_eq!(
        (&late["battery"], &late["tamper"], &late["fault"]),
        (&json!(1), &json!(false), &Value::Null),
        "{late}"
    );
    let plain = items.last().unwrap();
    assert!(
        plain.get("battery").is_none() && plain.get("fault").is_none(),
        "{plain}"
    );

    // A new code is a new fault; then both clear, once.
    s.readings(reading(7, 0, json!({"fault": "motor_2"}))).await;
    s.readings(reading(8, 0, json!({"tamper": false, "fault": null})))
        .await;
    s.readings(reading(9, 0, json!({"tamper": false, "fault": null})))
        .await;
    let got = r.bodies_of(&id, None, 9).await;
    assert_eq!(
        types(&got[6..]),
        [
            "sensor.fault",
            "sensor.tamper_cleared",
            "sensor.fault_cleared"
        ]
    );
    assert_eq!(got[6]["fault"], "motor_2");
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    let st = &sensor["status"];
    assert_eq!((&st["tamper"], &st["fault"]), (&json!(false), &Value::Null));
    assert_eq!(r.received().len(), 9, "nothing else came");
    s.stop().await;
}

#[tokio::test]
async fn bad_signals_are_refused_per_reading_and_types_can_be_chosen() {
    let s = TestServer::start().await;
    let (all, tamper_only) = (Receiver::start().await, Receiver::start().await);
    let everything = s.client(&all.url).await;
    let (code, body) = s
        .post(
            "/v1/clients",
            json!({"name": "guard", "url": tamper_only.url, "events": ["sensor.tamper"]}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let guard = body["id"].as_str().unwrap().to_string();
    let id = unique("door");
    s.sensor(&id).await;
    s.link(&everything, &id).await;
    s.link(&guard, &id).await;

    let (code, body) = post_readings(
        &s,
        json!([
            {"sensor_id": id, "data": 1, "battery": 101},
            {"sensor_id": id, "data": 1, "tamper": "yes"},
            {"sensor_id": id, "data": 1, "fault": "Lock Jam"},
            {"sensor_id": id, "data": 1, "batery": 50},
            {"sensor_id": id, "data": 1, "battery": 10, "tamper": true},
        ]),
    )
    .await;
    assert_eq!(code, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["accepted"], 1, "{body}");
    let codes: Vec<&str> = body["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        [
            "invalid_battery",
            "invalid_tamper",
            "invalid_fault",
            "unknown_field"
        ]
    );
    let got = all.bodies_of(&id, None, 3).await;
    assert_eq!(
        types(&got),
        [
            "sensor.state_changed",
            "sensor.battery_low",
            "sensor.tamper"
        ]
    );
    assert_eq!(got[1]["threshold"], 20, "the default threshold");
    let only = tamper_only.bodies_of(&id, None, 1).await;
    assert_eq!(types(&only), ["sensor.tamper"]);
    assert!(got[0].get("label").is_none(), "no labels, none carried");

    // Settings are checked, and a patch merges labels.
    for bad in [
        json!({"address": "x", "battery_low_pct": 101}),
        json!({"address": "x", "labels": {"0": "x".repeat(33)}}),
        json!({"address": "x", "labels": {"2": "ajar"}}),
    ] {
        let (code, body) = s.put(&format!("/v1/sensors/{id}"), bad).await;
        assert!(code.is_client_error(), "{body}");
    }
    let site = unique("bldg");
    let (code, body) = s.post("/v1/sites", json!({"id": site})).await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let (code, body) = s
        .put(
            &format!("/v1/sensors/{id}"),
            json!({"address": "x", "battery_low_pct": 0, "labels": {"1": "open"}, "site_id": site}),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["battery_low_pct"], &body["labels"]),
        (&json!(0), &json!({"1": "open"}))
    );
    // A site's sensors filter the same way.
    for (q, n) in [("battery_below=11&tamper=true", 1), ("battery_below=10", 0)] {
        let (code, body) = s.get(&format!("/v1/sensors?site_id={site}&{q}")).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(body["items"].as_array().unwrap().len(), n, "{q}: {body}");
    }
    s.stop().await;
}

#[tokio::test]
async fn a_battery_over_mqtt_raises_its_alarm() {
    if !crate::mqtt::broker_up().await {
        return;
    }
    let prefix = unique("d");
    let s = crate::mqtt::start_in(None, &prefix, &unique("latch")).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("mq");
    s.sensor(&id).await;
    s.link(&client, &id).await;
    let payload = json!({"data": 1, "battery": 12}).to_string().into_bytes();
    assert!(crate::mqtt::publish(&[(format!("{prefix}/{id}/state"), payload)]).await);
    let got = r.bodies_of(&id, None, 2).await;
    assert_eq!(types(&got), ["sensor.state_changed", "sensor.battery_low"]);
    assert_eq!(got[1]["battery"], 12);
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(sensor["status"]["battery"], 12, "{sensor}");
    s.stop().await;
}

/// ClickHouse keeps what each reading said, in a table an older latch made too: the
/// columns it lacks are added when latch starts.
#[tokio::test]
async fn clickhouse_keeps_the_signals_and_widens_an_older_table() {
    use latch_bench::clickhouse_server::query;
    let url =
        std::env::var("TEST_CLICKHOUSE_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into());
    if let Err(e) = query(&url, "SELECT 1").await {
        crate::utils::service_missing("ClickHouse", e);
        return;
    }
    let db = unique("latch_ds_");
    // The readings table as latch made it before the signals.
    for ddl in [
        format!("CREATE DATABASE {db}"),
        format!(
            "CREATE TABLE {db}.readings (id Int64, sensor_id String, ts Int64, \
             received_at Int64, data UInt8, late UInt8) ENGINE = ReplacingMergeTree() \
             PARTITION BY toYYYYMM(toDateTime(intDiv(ts, 1000))) ORDER BY (sensor_id, ts, id)"
        ),
    ] {
        query(&url, &ddl).await.unwrap();
    }
    let s = TestServer::start_with(|c| {
        c.clickhouse_url = Some(url.clone());
        c.clickhouse_database = db.clone();
        c.clickhouse_flush = std::time::Duration::from_millis(100);
    })
    .await;
    let id = unique("ch");
    s.sensor(&id).await;
    s.readings(json!([
        {"sensor_id": id, "data": 1, "battery": 42, "tamper": true, "fault": "lock_jam"},
        {"sensor_id": id, "data": 1, "fault": null},
    ]))
    .await;
    let sql = format!(
        "SELECT concat(ifNull(toString(battery), '-'), '/', ifNull(toString(tamper), '-'), \
         '/', ifNull(fault, '-')) \
         FROM {db}.readings WHERE sensor_id = '{id}' ORDER BY id"
    );
    let rows = eventually(20, "two readings in ClickHouse", || async {
        let text = query(&url, &sql).await.ok()?;
        (text.lines().count() == 2).then_some(text)
    })
    .await;
    let rows: Vec<&str> = rows.lines().collect();
    assert_eq!(rows, ["42/1/lock_jam", "-/-/"], "{rows:?}");
    let (_, history) = s.get(&format!("/v1/sensors/{id}/readings")).await;
    let items = history["items"].as_array().unwrap();
    assert_eq!(items[0]["battery"], 42, "{history}");
    assert_eq!(items[1]["fault"], Value::Null, "{history}");
    assert!(items[1].get("battery").is_none(), "{history}");
    s.stop().await;
    query(&url, &format!("DROP DATABASE {db}")).await.unwrap();
}

/// Over RabbitMQ: a reading's battery and tamper flag raise their alarms, and a bad battery
/// is dead-lettered with its own reason while the good readings around it apply.
#[tokio::test]
async fn battery_and_tamper_over_amqp_raise_alarms_and_a_bad_battery_is_dead_lettered() {
    use lapin::options::BasicGetOptions;
    use lapin::types::AMQPValue;
    let Some((_conn, ch)) = crate::amqp::broker().await else {
        return;
    };
    let queue = unique("q");
    let s = crate::amqp::start(&queue).await;
    let r = Receiver::start().await;
    let client = s.client(&r.url).await;
    let id = unique("am");
    s.sensor(&id).await;
    s.link(&client, &id).await;
    let bodies = [
        json!({"sensor_id": id, "data": 1, "battery": 15, "tamper": true}),
        json!({"sensor_id": id, "data": 1, "battery": 101}),
    ];
    for b in &bodies {
        crate::amqp::publish(&ch, &queue, b.to_string().as_bytes(), None).await;
    }
    let got = r.bodies_of(&id, None, 3).await;
    assert_eq!(
        types(&got),
        [
            "sensor.state_changed",
            "sensor.battery_low",
            "sensor.tamper"
        ]
    );
    assert_eq!(got[1]["battery"], 15);
    let dlq = format!("{queue}.dlq");
    let m = crate::utils::eventually(10, "the bad battery dead-lettered", || async {
        ch.basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    })
    .await;
    let headers = m.properties.headers().clone().unwrap_or_default();
    match headers.inner().get("x-latch-reason") {
        Some(AMQPValue::LongString(reason)) => assert_eq!(reason.to_string(), "invalid_battery"),
        other => panic!("no reason header: {other:?}"),
    }
    let (_, sensor) = s.get(&format!("/v1/sensors/{id}")).await;
    assert_eq!(
        (&sensor["status"]["battery"], &sensor["status"]["tamper"]),
        (&json!(15), &json!(true)),
        "the bad one changed nothing"
    );
    s.stop().await;
}
