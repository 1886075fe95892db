//! Logs and metrics setup.
//!
//! Every `latch_*` family is registered when latch starts — counters and gauges at 0,
//! histograms empty — with the label values known in advance, so a dashboard has its
//! series and an `absent()` alert its family from the first scrape, not from the first
//! event. Families of parts that are not configured (a broker source, ClickHouse) stay
//! out: a `latch_clickhouse_up 0` without ClickHouse would be a false alarm.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::config::Config;
use crate::domain::{RejectCode, Status};

/// How often histogram samples are folded into their summaries.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process-wide Prometheus recorder, installed on first use. Metrics are global by
/// nature (the `metrics` facade has one recorder), so every server in one process — as in
/// the integration tests — shares it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .install_recorder()
                .expect("no other metrics recorder is installed");
            // The recorder keeps every histogram sample until it is drained, which only a
            // scrape or an upkeep does: a latch nobody scrapes would hold two samples per
            // delivery for ever. A thread and not a Tokio task, because the recorder
            // lives as long as the process, longer than any one runtime (tests start many).
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("latch-metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_EVERY);
                        upkeep.run_upkeep();
                    }
                })
                .expect("a thread can be started at start-up");
            handle
        })
        .clone()
}

/// Sets up `tracing` with `filter` (EnvFilter syntax); `RUST_LOG` wins when set.
pub fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}

/// Every `reason` a reading can be rejected with.
const REJECT_CODES: [RejectCode; 8] = [
    RejectCode::MalformedJson,
    RejectCode::NotAnObject,
    RejectCode::InvalidSensorId,
    RejectCode::InvalidData,
    RejectCode::InvalidTs,
    RejectCode::TsInFuture,
    RejectCode::UnknownSensor,
    RejectCode::StoreUnavailable,
];

/// Every status a notification can end in.
const ENDINGS: [Status; 4] = [
    Status::Delivered,
    Status::Failed,
    Status::Superseded,
    Status::Cancelled,
];

/// Every `outcome` of an attempt (see `AttemptResult::label`).
const OUTCOMES: [&str; 5] = [
    "delivered",
    "http_error",
    "timeout",
    "connection_error",
    crate::delivery::guard::NOT_ALLOWED,
];

/// Fails to build when a reason or a status is added without being listed above.
#[allow(dead_code)]
fn listed(code: RejectCode, status: Status) {
    match code {
        RejectCode::MalformedJson
        | RejectCode::NotAnObject
        | RejectCode::InvalidSensorId
        | RejectCode::InvalidData
        | RejectCode::InvalidTs
        | RejectCode::TsInFuture
        | RejectCode::UnknownSensor
        | RejectCode::StoreUnavailable => {}
    }
    match status {
        Status::Pending
        | Status::Delivered
        | Status::Failed
        | Status::Superseded
        | Status::Cancelled => {}
    }
}

/// Describes and registers every metric family `config` makes use of (see the module
/// docs). Values already recorded are left as they are: counters and gauges get 0 added,
/// and a histogram handle is only taken (registering it is what shows it, empty).
pub fn register_families(config: &Config) {
    let mut sources = vec!["http"];
    let mut brokers = Vec::new();
    if config.amqp_url.is_some() {
        brokers.push("amqp");
    }
    if config.mqtt_url.is_some() {
        brokers.push("mqtt");
    }
    sources.extend(&brokers);

    describe_counter!(
        "latch_readings_accepted_total",
        "Readings accepted and durably committed, by source."
    );
    describe_counter!(
        "latch_readings_rejected_total",
        "Readings rejected, by source and reason."
    );
    for &source in &sources {
        counter!("latch_readings_accepted_total", "source" => source).increment(0);
        for code in REJECT_CODES {
            counter!("latch_readings_rejected_total", "source" => source, "reason" => code.as_str())
                .increment(0);
        }
    }

    describe_counter!(
        "latch_delivery_attempts_total",
        "Webhook attempts, by outcome."
    );
    for outcome in OUTCOMES {
        counter!("latch_delivery_attempts_total", "outcome" => outcome).increment(0);
    }
    describe_counter!(
        "latch_notifications_total",
        "Notifications that ended, by final status."
    );
    for status in ENDINGS {
        counter!("latch_notifications_total", "status" => status.as_str()).increment(0);
    }
    describe_gauge!(
        "latch_notifications_pending",
        "Notifications waiting to be delivered."
    );
    gauge!("latch_notifications_pending").increment(0.0);
    describe_gauge!(
        "latch_clients_disabled",
        "Clients disabled (410 Gone, or failing for endpoint_disable_after)."
    );
    gauge!("latch_clients_disabled").increment(0.0);
    describe_histogram!(
        "latch_delivery_latency_seconds",
        "From a notification's creation to its delivery, in seconds."
    );
    let _ = histogram!("latch_delivery_latency_seconds");
    describe_histogram!(
        "latch_delivery_attempt_seconds",
        "Duration of one webhook attempt, in seconds."
    );
    let _ = histogram!("latch_delivery_attempt_seconds");

    describe_histogram!(
        "latch_commit_seconds",
        "Duration of one group commit, in seconds."
    );
    let _ = histogram!("latch_commit_seconds");
    describe_histogram!("latch_commit_readings", "Readings in one group commit.");
    let _ = histogram!("latch_commit_readings");
    describe_counter!(
        "latch_commit_failures_total",
        "Group commits that failed (their readings were refused)."
    );
    counter!("latch_commit_failures_total").increment(0);

    describe_gauge!(
        "latch_sensors_lost",
        "Sensors whose connection is lost now."
    );
    gauge!("latch_sensors_lost").increment(0.0);
    describe_counter!(
        "latch_sensors_lost_total",
        "Times a sensor went silent past its heartbeat timeout."
    );
    counter!("latch_sensors_lost_total").increment(0);

    if !brokers.is_empty() {
        describe_gauge!(
            "latch_source_up",
            "1 while a broker source is connected and consuming, else 0."
        );
        describe_counter!(
            "latch_source_reconnects_total",
            "Times a broker source lost its connection."
        );
    }
    for &broker in &brokers {
        gauge!("latch_source_up", "source" => broker).increment(0.0);
        counter!("latch_source_reconnects_total", "source" => broker).increment(0);
    }
    if config.amqp_url.is_some() {
        describe_counter!(
            "latch_amqp_dead_lettered_total",
            "AMQP messages moved to the dead-letter queue, by reason."
        );
        for code in REJECT_CODES.into_iter().filter(|c| !c.is_transient()) {
            counter!("latch_amqp_dead_lettered_total", "reason" => code.as_str()).increment(0);
        }
        describe_counter!(
            "latch_amqp_duplicates_total",
            "AMQP messages acknowledged without being applied again (a known id)."
        );
        counter!("latch_amqp_duplicates_total").increment(0);
    }

    if config.mqtt_url.is_some() {
        describe_counter!(
            "latch_mqtt_retained_ignored_total",
            "MQTT publishes ignored because they carried the retain flag (stale, not readings)."
        );
        counter!("latch_mqtt_retained_ignored_total").increment(0);
        describe_counter!(
            "latch_mqtt_duplicates_total",
            "MQTT publishes acknowledged without being applied again (resent by the broker \
             after they had committed)."
        );
        counter!("latch_mqtt_duplicates_total").increment(0);
    }
    if config.database_url.is_some() {
        describe_counter!(
            "latch_store_timeouts_total",
            "Store calls PostgreSQL did not answer within `database_timeout`, by call."
        );
        // The calls on the paths that matter most; others appear when they first time out.
        for call in ["commit", "claim", "record", "ping"] {
            counter!("latch_store_timeouts_total", "call" => call).increment(0);
        }
        // PostgreSQL means cluster mode (a cluster of one when alone).
        describe_gauge!(
            "latch_cluster_partitions_owned",
            "Partitions whose lease this node holds and serves."
        );
        gauge!("latch_cluster_partitions_owned").set(0.0);
        for (name, help) in [
            (
                "latch_cluster_takeovers_total",
                "Partitions this node took over (free, released or expired leases).",
            ),
            (
                "latch_cluster_forwarded_readings_total",
                "Readings handed to the node serving their partition.",
            ),
            (
                "latch_cluster_forward_failures_total",
                "Forwarded requests the owner did not answer (their readings: send again).",
            ),
            (
                "latch_cluster_fenced_commits_total",
                "Commits refused because a partition had moved to another node.",
            ),
        ] {
            describe_counter!(name, help);
            counter!(name).increment(0);
        }
    }

    if config.clickhouse_url.is_some() {
        describe_gauge!(
            "latch_history_spool_rows",
            "History rows waiting in the store for ClickHouse (counted every 5 s)."
        );
        gauge!("latch_history_spool_rows").increment(0.0);
        describe_counter!(
            "latch_history_shipped_rows_total",
            "History rows shipped to ClickHouse."
        );
        counter!("latch_history_shipped_rows_total").increment(0);
        describe_counter!(
            "latch_history_ship_failures_total",
            "History shipments ClickHouse did not take."
        );
        counter!("latch_history_ship_failures_total").increment(0);
        describe_histogram!(
            "latch_history_ship_seconds",
            "Duration of one shipment to ClickHouse, in seconds."
        );
        let _ = histogram!("latch_history_ship_seconds");
        describe_gauge!(
            "latch_clickhouse_up",
            "1 after a shipment ClickHouse took, 0 after one it did not (0 until the first)."
        );
        gauge!("latch_clickhouse_up").increment(0.0);
    }

    if config.rate_limit.is_some() {
        describe_counter!(
            "latch_http_rate_limit_total",
            "Requests to /v1 the rate limit let through (allowed) or answered 429 (limited)."
        );
        for outcome in ["allowed", "limited"] {
            counter!("latch_http_rate_limit_total", "outcome" => outcome).increment(0);
        }
    }
}
