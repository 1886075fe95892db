//! The operations kit, tested: the Debian package (`scripts/package`), the container
//! image (`scripts/image`, run with podman), the Prometheus alert rules (promtool unit
//! tests, and a live Prometheus scraping a latch), the Grafana dashboard's metric names,
//! and traces over OTLP. Each starts the real `latch` binary as a child process, so the
//! process-wide metrics and tracing setup are the real ones.
//!
//! A tool these tests need (dpkg-deb, systemd-analyze, promtool, prometheus, podman) or
//! PostgreSQL missing: SKIPPED locally, a failure under `CI=true` (`.ci/run` installs them).

mod alerts;
mod container;
mod dashboard;
mod otlp;
mod package;
mod utils;
