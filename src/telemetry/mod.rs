//! Logs and metrics setup; every metric family is named in [`families`].
//!
//! Every `latch_*` family is registered when latch starts — counters and gauges at 0,
//! histograms empty — with the label values known in advance, so a dashboard has its
//! series and an `absent()` alert its family from the first scrape, not from the first
//! event. Families of parts that are not configured (a broker source, ClickHouse) stay
//! out: a `latch_clickhouse_up 0` without ClickHouse would be a false alarm.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub mod families;

use crate::config::{Config, LogFormat};
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

/// Sets up `tracing` with `filter` (EnvFilter syntax; `RUST_LOG` wins when set) and
/// `format`. Text has colour codes only when stdout is a terminal: in a file or a journal
/// they are noise.
pub fn init_tracing(filter: &str, format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stdout().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
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
    use families as f;
    let mut sources = vec!["http"];
    let mut brokers = Vec::new();
    if config.amqp_url.is_some() {
        brokers.push("amqp");
    }
    if config.mqtt_url.is_some() {
        brokers.push("mqtt");
    }
    sources.extend(&brokers);

    for family in [&f::READINGS_ACCEPTED, &f::READINGS_REJECTED] {
        family.describe();
    }
    for &source in &sources {
        f::READINGS_ACCEPTED
            .counter_with(&[("source", source)])
            .increment(0);
        for code in REJECT_CODES {
            f::READINGS_REJECTED
                .counter_with(&[("source", source), ("reason", code.as_str())])
                .increment(0);
        }
    }
    f::DELIVERY_ATTEMPTS.describe();
    for outcome in crate::domain::outbox::outcome::ALL {
        f::DELIVERY_ATTEMPTS
            .counter_with(&[("outcome", outcome)])
            .increment(0);
    }
    f::NOTIFICATIONS.describe();
    for status in ENDINGS {
        f::NOTIFICATIONS
            .counter_with(&[("status", status.as_str())])
            .increment(0);
    }
    // Families without labels, on every store and with every source.
    for family in [
        &f::NOTIFICATIONS_PENDING,
        &f::CLIENTS_DISABLED,
        &f::DELIVERY_LATENCY,
        &f::DELIVERY_ATTEMPT_SECONDS,
        &f::COMMIT_SECONDS,
        &f::COMMIT_READINGS,
        &f::COMMIT_FAILURES,
        &f::SENSORS_LOST,
        &f::SENSORS_LOST_TOTAL,
        &f::TASK_PANICS,
    ] {
        show(family);
    }

    if !brokers.is_empty() {
        f::SOURCE_UP.describe();
        f::SOURCE_RECONNECTS.describe();
    }
    for &broker in &brokers {
        f::SOURCE_UP
            .gauge_with(&[("source", broker)])
            .increment(0.0);
        f::SOURCE_RECONNECTS
            .counter_with(&[("source", broker)])
            .increment(0);
    }
    if config.amqp_url.is_some() {
        f::AMQP_DEAD_LETTERED.describe();
        for code in REJECT_CODES.into_iter().filter(|c| !c.is_transient()) {
            f::AMQP_DEAD_LETTERED
                .counter_with(&[("reason", code.as_str())])
                .increment(0);
        }
        show(&f::AMQP_DUPLICATES);
    }
    if config.mqtt_url.is_some() {
        show(&f::MQTT_RETAINED_IGNORED);
    }
    if config.database_url.is_some() {
        f::STORE_TIMEOUTS.describe();
        // The calls on the paths that matter most; others appear when they first time out.
        for call in ["commit", "claim", "record", "ping"] {
            f::STORE_TIMEOUTS
                .counter_with(&[("call", call)])
                .increment(0);
        }
        // PostgreSQL means cluster mode (a cluster of one when alone).
        for family in [
            &f::CLUSTER_PARTITIONS_OWNED,
            &f::CLUSTER_TAKEOVERS,
            &f::CLUSTER_FORWARDED,
            &f::CLUSTER_FORWARD_FAILURES,
            &f::CLUSTER_FENCED_COMMITS,
        ] {
            show(family);
        }
    }
    if config.clickhouse_url.is_some() {
        for family in [
            &f::HISTORY_SPOOL_ROWS,
            &f::HISTORY_SHIPPED,
            &f::HISTORY_SHIP_FAILURES,
            &f::HISTORY_SHIP_SECONDS,
            &f::CLICKHOUSE_UP,
        ] {
            show(family);
        }
    }
    if config.rate_limit.is_some() {
        f::HTTP_RATE_LIMIT.describe();
        for outcome in ["allowed", "limited"] {
            f::HTTP_RATE_LIMIT
                .counter_with(&[("outcome", outcome)])
                .increment(0);
        }
    }
}

/// Describes a family without labels and shows it at its zero (a histogram: empty).
fn show(family: &families::Family) {
    family.describe();
    match family.kind {
        families::Kind::Counter => family.counter().increment(0),
        families::Kind::Gauge => family.gauge().increment(0.0),
        families::Kind::Histogram => drop(family.histogram()),
    }
}
