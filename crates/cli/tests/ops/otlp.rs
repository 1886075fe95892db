//! Traces over OTLP: a latch given `LATCH_OTLP_ENDPOINT` sends the spans of a reading's
//! path to a local OTLP/HTTP receiver the test runs (protobuf, as a collector takes it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;

use crate::utils::{self, Latch, Receiver, eventually};

/// One span as received: its name, attributes (as text), status code, and the service
/// name of its resource.
#[derive(Debug, Clone)]
struct Got {
    name: String,
    attributes: BTreeMap<String, String>,
    error: bool,
    service: String,
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn map(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| (kv.key.clone(), text(&kv.value)))
        .collect()
}

/// An OTLP/HTTP traces receiver on `127.0.0.1:0`.
async fn receiver() -> (String, Arc<Mutex<Vec<Got>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let keep = keep.clone();
            async move {
                let Ok(req) = ExportTraceServiceRequest::decode(body) else {
                    return (axum::http::StatusCode::BAD_REQUEST, Vec::new());
                };
                let mut kept = keep.lock().expect("spans");
                for rs in req.resource_spans {
                    let resource = rs.resource.map(|r| map(&r.attributes)).unwrap_or_default();
                    let service = resource.get("service.name").cloned().unwrap_or_default();
                    for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        kept.push(Got {
                            name: span.name,
                            attributes: map(&span.attributes),
                            error: span.status.is_some_and(|s| s.code == 2),
                            service: service.clone(),
                        });
                    }
                }
                // An empty ExportTraceServiceResponse: everything taken.
                (axum::http::StatusCode::OK, Vec::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

#[tokio::test]
async fn the_spans_of_a_readings_path_reach_an_otlp_receiver() {
    let (endpoint, spans) = receiver().await;
    let hook = Receiver::start().await;
    // The first attempt is answered 500, so the change is sent twice.
    hook.script([latch_testkit::Answer::status(500)]);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let latch = Latch::start(
        &utils::latch_binary(),
        dir.path(),
        &[
            ("LATCH_OTLP_ENDPOINT", endpoint),
            ("LATCH_RETRY_BASE", "100ms".into()),
            // The SDK's batch delay (5 s by default), so the test waits less.
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ],
    );
    let http = reqwest::Client::new();
    latch.ready(&http).await;
    let walk = utils::walk_through(&http, &latch.base, &hook.url).await;
    let id = utils::delivered(&http, &latch.base, &walk, &hook).await;

    let attempts = eventually(60, "both attempt spans of the notification", || async {
        let got = spans.lock().expect("spans").clone();
        let attempts: Vec<Got> = got
            .into_iter()
            .filter(|s| s.name == "delivery.attempt" && s.attributes["notification_id"] == id)
            .collect();
        (attempts.len() >= 2).then_some(attempts)
    })
    .await;
    let by_number = |n: &str| {
        attempts
            .iter()
            .find(|s| s.attributes["attempt"] == n)
            .unwrap_or_else(|| panic!("attempt {n} in {attempts:?}"))
    };
    let (first, second) = (by_number("1"), by_number("2"));
    assert_eq!(first.attributes["outcome"], "http_error");
    assert_eq!(first.attributes["http.response.status_code"], "500");
    assert!(first.error, "a failed attempt is an error span");
    assert_eq!(second.attributes["outcome"], "delivered");
    assert_eq!(second.attributes["http.response.status_code"], "200");
    assert!(!second.error);
    for s in [first, second] {
        assert_eq!(s.attributes["client_id"], walk.client);
        assert_eq!(s.attributes["sensor_id"], walk.sensor);
        assert_eq!(s.attributes["event"], "sensor.state_changed");
        assert_eq!(s.service, "latch");
    }

    let got = spans.lock().expect("spans").clone();
    let accepted = got
        .iter()
        .find(|s| s.name == "readings.accept" && s.attributes["readings"] == "2")
        .unwrap_or_else(|| panic!("the request's span in {got:?}"));
    assert_eq!(accepted.attributes["accepted"], "2");
    assert_eq!(accepted.attributes["rejected"], "0");
    assert_eq!(accepted.attributes["source"], "http");
    let committed: u64 = got
        .iter()
        .filter(|s| s.name == "commit")
        .map(|s| s.attributes["readings"].parse::<u64>().expect("a count"))
        .sum();
    assert!(committed >= 2, "commit spans hold the readings: {got:?}");
    assert!(
        got.iter()
            .any(|s| s.name == "commit"
                && s.attributes.get("notifications").is_some_and(|n| n != "0")),
        "a commit made the notifications: {got:?}"
    );
    assert!(latch.proc.terminate(), "SIGTERM stops it cleanly");
}

#[tokio::test]
async fn a_bad_otlp_endpoint_stops_latch_at_start_naming_the_setting() {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let out = std::process::Command::new(utils::latch_binary())
        .arg("serve")
        .env("LATCH_OTLP_ENDPOINT", "collector:4318")
        .env("LATCH_LISTEN", "127.0.0.1:0")
        .env("LATCH_DATA_DIR", dir.path())
        .output()
        .expect("latch runs");
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("otlp_endpoint"), "{said}");
}
