//! Logs and metrics setup.

use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// The process-wide Prometheus recorder, installed on first use. Metrics are global by
/// nature (the `metrics` facade has one recorder), so every server in one process — as in
/// the integration tests — shares it.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            PrometheusBuilder::new()
                .install_recorder()
                .expect("no other metrics recorder is installed")
        })
        .clone()
}

/// Sets up `tracing` with `filter` (EnvFilter syntax); `RUST_LOG` wins when set.
pub fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).try_init();
}
