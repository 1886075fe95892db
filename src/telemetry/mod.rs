//! Logs, traces and metrics setup; every metric family is named in [`families`].
//!
//! Logs go to stdout, as text or JSON. The spans of a reading's path — `readings.accept`
//! (an HTTP request of readings, until they are durable), `commit` (one group commit),
//! `delivery.attempt` (one webhook request, a `debug` span naming its notification,
//! client, sensor and attempt number) — are `tracing` spans of target [`SPANS`]: the log
//! shows them around its lines when its level takes them in, and traces are optional
//! ([`otlp`]), exported only when an OTLP endpoint is set. A span no layer wants is never
//! built: it costs a check of its callsite's cached interest.
//!
//! Every `latch_*` family is registered when latch starts — counters and gauges at 0,
//! histograms empty — with the label values known in advance, so a dashboard has its
//! series and an `absent()` alert its family from the first scrape, not from the first
//! event. Families of parts that are not configured (a broker source, ClickHouse) stay
//! out: a `latch_clickhouse_up 0` without ClickHouse would be a false alarm.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub mod events;
pub mod families;
pub mod otlp;
pub mod recent;

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

/// The target of the spans of a reading's path (see the module docs).
pub const SPANS: &str = "latch::spans";

/// Sets up logs with `filter` (EnvFilter syntax; `RUST_LOG` wins when set) in `format`,
/// without traces.
pub fn init_tracing(filter: &str, format: LogFormat) {
    use tracing_subscriber::util::SubscriberInitExt;
    let _ = subscriber(filter, format, None).try_init();
}

/// Sets up logs and, with `otlp_endpoint`, traces over OTLP. Call it before starting a
/// Tokio runtime, and keep the answer until the end: dropping it sends the spans still
/// waiting in the batch.
pub fn init(
    filter: &str,
    format: LogFormat,
    otlp_endpoint: Option<&str>,
) -> Result<Traces, otlp::Error> {
    let Some(endpoint) = otlp_endpoint else {
        init_tracing(filter, format);
        return Ok(Traces(None));
    };
    use tracing_subscriber::util::SubscriberInitExt;
    let (provider, tracer) = otlp::provider(endpoint)?;
    let _ = subscriber(filter, format, Some(tracer)).try_init();
    tracing::info!(endpoint, "Sending traces over OTLP.");
    Ok(Traces(Some(provider)))
}

/// The log layer, filtered by `filter`, and with a tracer the OTLP layer, which takes only
/// [`SPANS`]. Per-layer filters: each layer sees only what it asked for, so a span is
/// built only when the log's level or the OTLP layer wants it. Text has colour codes only
/// when stdout is a terminal: in a file or a journal they are noise. Two subscriber types
/// rather than an `Option` layer: a `None` layer counts as one that wants everything, and
/// would have every span built.
fn subscriber(
    filter: &str,
    format: LogFormat,
    tracer: Option<opentelemetry_sdk::trace::Tracer>,
) -> Box<dyn tracing::Subscriber + Send + Sync> {
    use std::io::IsTerminal;
    use tracing_subscriber::prelude::*;
    let filter = quiet_returns(
        tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
    );
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stdout().is_terminal())
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed(),
    };
    match tracer {
        None => Box::new(tracing_subscriber::registry().with(logs)),
        Some(tracer) => Box::new(
            tracing_subscriber::registry().with(logs).with(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(
                        tracing_subscriber::filter::Targets::new()
                            .with_target(SPANS, tracing::Level::TRACE),
                    ),
            ),
        ),
    }
}

/// lapin warns of every message a broker returns, with the whole message: for an AMQP
/// destination nothing is bound for, one line per attempt carrying its body and signature.
/// The attempt's recorded error already says it; unless the filter names lapin itself,
/// those lines stay out of the log.
fn quiet_returns(filter: tracing_subscriber::EnvFilter) -> tracing_subscriber::EnvFilter {
    if filter.to_string().contains("lapin") {
        return filter;
    }
    match "lapin::returned_messages=error".parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    }
}

/// The trace exporter, flushed and stopped when dropped.
pub struct Traces(Option<opentelemetry_sdk::trace::SdkTracerProvider>);

impl Drop for Traces {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("Sending the last traces failed: {e}");
        }
    }
}

/// What retention deletes, the `what` of `latch_retention_deleted_total`.
pub const RETAINED: [&str; 5] = [
    "readings",
    "events",
    "notifications",
    "attempts",
    "partitions",
];

/// Every `reason` a reading can be rejected with.
const REJECT_CODES: [RejectCode; 13] = [
    RejectCode::MalformedJson,
    RejectCode::NotAnObject,
    RejectCode::InvalidSensorId,
    RejectCode::InvalidData,
    RejectCode::InvalidTs,
    RejectCode::TsInFuture,
    RejectCode::InvalidBattery,
    RejectCode::InvalidTamper,
    RejectCode::InvalidFault,
    RejectCode::UnknownField,
    RejectCode::UnknownSensor,
    RejectCode::StoreUnavailable,
    RejectCode::StorageFull,
];

/// Every status a notification can end in.
const ENDINGS: [Status; 5] = [
    Status::Delivered,
    Status::Failed,
    Status::Superseded,
    Status::Cancelled,
    Status::Silenced,
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
        | RejectCode::InvalidBattery
        | RejectCode::InvalidTamper
        | RejectCode::InvalidFault
        | RejectCode::UnknownField
        | RejectCode::UnknownSensor
        | RejectCode::StoreUnavailable
        | RejectCode::StorageFull => {}
    }
    match status {
        Status::Pending
        | Status::Delivered
        | Status::Failed
        | Status::Superseded
        | Status::Cancelled
        | Status::Silenced => {}
    }
}

/// Describes and registers every metric family `config` makes use of (see the module
/// docs). Values already recorded are left as they are: counters and gauges get 0 added,
/// and a histogram handle is only taken (registering it is what shows it, empty).
pub fn register_families(config: &Config) {
    let mut brokers = Vec::new();
    if config.amqp_url.is_some() {
        brokers.push("amqp");
    }
    if config.mqtt_url.is_some() {
        brokers.push("mqtt");
    }
    register_ingest(config, &brokers);
    register_delivery();
    match config.database_url {
        Some(_) => register_postgres(),
        None => register_embedded(),
    }
    use families as f;
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
        show_by(&f::HTTP_RATE_LIMIT, "outcome", ["allowed", "limited"]);
    }
    // `api::AuthFailure`'s reasons, and the requests refused unseen while throttled.
    let reasons = [
        "missing_token",
        "unknown_token",
        "cluster_secret",
        "throttled",
    ];
    show_by(&f::AUTH_FAILURES, "reason", reasons);
}

/// Readings by source (HTTP and the configured `brokers`) and reason, the brokers' links.
fn register_ingest(config: &Config, brokers: &[&'static str]) {
    use families as f;
    let sources: Vec<&'static str> = std::iter::once("http")
        .chain(brokers.iter().copied())
        .collect();
    show_by(&f::READINGS_ACCEPTED, "source", sources.iter().copied());
    f::READINGS_REJECTED.describe();
    for &source in &sources {
        for code in REJECT_CODES {
            f::READINGS_REJECTED
                .counter_with(&[("source", source), ("reason", code.as_str())])
                .increment(0);
        }
    }
    if !brokers.is_empty() {
        f::SOURCE_UP.describe();
        f::SOURCE_RECONNECTS.describe();
    }
    for &broker in brokers {
        f::SOURCE_UP
            .gauge_with(&[("source", broker)])
            .increment(0.0);
        f::SOURCE_RECONNECTS
            .counter_with(&[("source", broker)])
            .increment(0);
    }
    if config.amqp_url.is_some() {
        let dead = REJECT_CODES.into_iter().filter(|c| !c.is_transient());
        show_by(&f::AMQP_DEAD_LETTERED, "reason", dead.map(|c| c.as_str()));
        show(&f::AMQP_DUPLICATES);
    }
    if config.mqtt_url.is_some() {
        show(&f::MQTT_RETAINED_IGNORED);
        show(&f::MQTT_DUPLICATES);
    }
}

/// Attempts and notifications by how they ended, and the families every store and source
/// has.
fn register_delivery() {
    use families as f;
    show_by(
        &f::DELIVERY_ATTEMPTS,
        "outcome",
        crate::domain::outbox::outcome::ALL,
    );
    show_by(&f::NOTIFICATIONS, "status", ENDINGS.map(|s| s.as_str()));
    // Families without labels, on every store and with every source.
    for family in [
        &f::NOTIFICATIONS_PENDING,
        &f::CLIENTS_DISABLED,
        &f::DELIVERY_LATENCY,
        &f::DELIVERY_ATTEMPT_SECONDS,
        &f::COMMIT_SECONDS,
        &f::COMMIT_READINGS,
        &f::COMMIT_FAILURES,
        &f::COMMIT_QUEUE_SECONDS,
        &f::SENSORS_LOST,
        &f::SENSORS_LOST_TOTAL,
        &f::SITES_DOWN,
        &f::SITE_HELD_EVENTS,
        &f::SITE_GRACE_OLDEST_SECONDS,
        &f::ALARM_OLDEST_UNACKNOWLEDGED_SECONDS,
        &f::TASK_PANICS,
        &f::STORAGE_FULL,
        &f::STORAGE_FULL_EPISODES,
    ] {
        show(family);
    }
    show_by(&f::RETENTION_DELETED, "what", RETAINED);
    show_by(
        &f::DOOR_ALARMS,
        "type",
        crate::domain::EventKind::DOOR_ALARMS.map(|k| k.as_str()),
    );
    // Every kind in both states at zero until the first round counts them.
    f::ALARMS_OPEN.describe();
    for kind in crate::domain::alarm::AlarmKind::ALL {
        for state in ["open", "acknowledged"] {
            f::ALARMS_OPEN
                .gauge_with(&[("kind", kind.as_str()), ("state", state)])
                .increment(0.0);
        }
    }
}

/// PostgreSQL: its timeouts and commits in doubt, and the cluster (a cluster of one when
/// alone).
fn register_postgres() {
    use families as f;
    // The calls on the paths that matter most; others appear when they first time out.
    show_by(
        &f::STORE_TIMEOUTS,
        "call",
        ["commit", "claim", "record", "ping"],
    );
    show_by(
        &f::COMMITS_IN_DOUBT,
        "outcome",
        ["committed", "rolled_back", "unknown"],
    );
    for family in [
        &f::CLUSTER_PARTITIONS_OWNED,
        &f::CLUSTER_PARTITIONS,
        &f::CLUSTER_TAKEOVERS,
        &f::CLUSTER_FORWARD_FAILURES,
        &f::CLUSTER_FENCED_COMMITS,
    ] {
        show(family);
    }
    show_by(&f::CLUSTER_FORWARDED, "source", ["http", "amqp", "mqtt"]);
}

/// The embedded store's one writer, its write-ahead log and its archive (empty when
/// ClickHouse takes history instead).
fn register_embedded() {
    use families as f;
    for family in [
        &f::STORE_WRITER_WAIT_SECONDS,
        &f::WAL_CHECKPOINT_SECONDS,
        &f::HISTORY_ARCHIVE_SECONDS,
    ] {
        show(family);
    }
}

/// Describes a counter family with one label and shows each of `values` at its zero.
fn show_by(
    family: &families::Family,
    label: &'static str,
    values: impl IntoIterator<Item = &'static str>,
) {
    family.describe();
    for value in values {
        family.counter_with(&[(label, value)]).increment(0);
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

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;

    use super::*;

    /// One test, not two: `tracing` caches each callsite's interest over every subscriber
    /// alive, so subscribers set up at once on two test threads could see each other's.
    #[test]
    fn an_attempts_span_is_built_only_for_a_layer_that_wants_it() {
        let attempt = || tracing::debug_span!(target: SPANS, "delivery.attempt", attempt = 1);
        tracing::subscriber::with_default(subscriber("info", LogFormat::Text, None), || {
            assert!(attempt().is_disabled(), "log at info, no OTLP: never built");
            assert!(
                !tracing::info_span!("other").is_disabled(),
                "the log's own spans"
            );
        });
        let debug = subscriber("latch=debug", LogFormat::Json, None);
        tracing::subscriber::with_default(debug, || {
            assert!(
                !attempt().is_disabled(),
                "the log at debug names each attempt"
            );
        });
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let both = subscriber("warn", LogFormat::Text, Some(provider.tracer("latch")));
        tracing::subscriber::with_default(both, || {
            assert!(!attempt().is_disabled(), "with OTLP, below the log's level");
        });
    }
}
