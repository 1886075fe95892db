//! latch watches fleets of binary sensors and tells their owners, reliably, when something
//! changes.
//!
//! # Layout
//!
//! - [`domain`]: pure types — sensor ids, readings, clients, events, notifications.
//! - [`engine`]: change detection on in-memory shards; produces effect batches.
//! - [`committer`]: group-commits the shards' batches to the store, feeds the dispatcher.
//! - [`store`]: the `Store` trait and its backends (SQLite embedded by default).
//! - [`history`]: history reads, and the shipper that moves it to ClickHouse when set.
//! - [`delivery`]: the dispatcher — lanes, retries, signing, webhook sending, the SSRF guard.
//! - [`ingest`]: readings in from every source, acknowledged once durable.
//! - [`api`]: the HTTP API v1, health, metrics, OpenAPI.
//! - [`config`]: layered settings.
//! - [`secrets`]: the keys that seal clients' secrets at rest.
//!
//! The `latch` command is `crates/cli`; `latch bench` and the test kit are crates of their
//! own (`crates/bench`, `crates/testkit`), so nothing of theirs is part of the service.
//!
//! A reading flows `ingest → engine shard → committer → store`, and a state change it causes
//! flows on `committer → dispatcher → client URL`. [`run`] wires them together and takes
//! them down in the reverse order: sources first, then the engine flushes, then the
//! dispatcher finishes its in-flight attempts.

pub mod api;
pub mod app;
pub mod clock;
pub mod cluster;
pub mod committer;
pub mod config;
pub mod delivery;
pub mod domain;
pub mod engine;
pub mod hashing;
pub mod history;
pub mod ingest;
pub mod secrets;
pub mod service;
pub mod store;
pub mod tasks;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use config::Config;
pub use service::run_with_clock;

/// Runs latch on `listener` until `shutdown` completes, then stops gracefully.
pub async fn run(
    config: Arc<Config>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with_clock(config, listener, shutdown, clock::Clock::wall()).await
}

/// Loads the settings ([`Config::load`]) and has each adapter check the URL it will use,
/// so a bad or unsupported URL stops the start with a message naming its key. Every check
/// `latch serve` makes before it touches the network is here: `latch config --check` runs
/// this same function, and passes only what `serve` would take.
pub fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<Config> {
    check_urls(Config::load(path)?)
}

fn check_urls(config: Config) -> anyhow::Result<Config> {
    let check = || -> anyhow::Result<()> {
        match &config.clickhouse_url {
            Some(u) => {
                history::clickhouse::Target::parse(u, &config.clickhouse_database)?;
            }
            None => history::clickhouse::check_database(&config.clickhouse_database)?,
        }
        if let Some(u) = &config.amqp_url {
            ingest::amqp::check_url(u)?;
        }
        if let Some(u) = &config.mqtt_url {
            ingest::mqtt::options(u)?;
        }
        store::check_database_url(&config)?;
        if let Some(e) = &config.otlp_endpoint {
            telemetry::otlp::traces_url(e)?;
        }
        Ok(())
    };
    // A message may quote a URL with its password.
    check().map_err(|e| anyhow::anyhow!(config.redact(&format!("{e:#}"))))?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use service::exposed_without_token;

    #[test]
    fn open_api_beyond_loopback_is_flagged() {
        let mut c = Config::for_data_dir(std::path::Path::new("/tmp"));
        let addr = |s: &str| s.parse().unwrap();
        assert!(!exposed_without_token(&c, false, addr("127.0.0.1:8080")));
        assert!(!exposed_without_token(&c, false, addr("[::1]:8080")));
        assert!(exposed_without_token(&c, false, addr("0.0.0.0:8080")));
        assert!(exposed_without_token(&c, false, addr("10.1.2.3:8080")));
        assert!(!exposed_without_token(&c, true, addr("0.0.0.0:8080")));
        c.api_token = Some("secret-token".into());
        assert!(!exposed_without_token(&c, false, addr("0.0.0.0:8080")));
    }

    #[test]
    fn unsupported_or_bad_source_urls_are_refused_not_ignored() {
        let load = |pairs: &[(&str, &str)]| {
            let env: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Config::load_from(None, &env).and_then(check_urls)
        };
        let e = |k: &str, v: &str| load(&[(k, v)]).unwrap_err().to_string();
        assert!(e("LATCH_CLICKHOUSE_URL", "tcp://127.0.0.1:9000").contains("clickhouse_url"));
        assert!(e("LATCH_CLICKHOUSE_DATABASE", "no-dashes").contains("clickhouse_database"));
        assert!(e("LATCH_AMQP_URL", "http://127.0.0.1").contains("amqp_url"));
        assert!(e("LATCH_MQTT_URL", "http://127.0.0.1").contains("mqtt_url"));
        let c = load(&[("LATCH_AMQP_URL", "amqp://127.0.0.1")]).unwrap();
        assert_eq!(c.amqp_url.as_deref(), Some("amqp://127.0.0.1"));
        // No TLS in this build: a TLS URL is refused, never reached in plain text.
        for (k, v) in [
            ("LATCH_AMQP_URL", "amqps://u:p@127.0.0.1:5671/%2f"),
            ("LATCH_MQTT_URL", "mqtts://127.0.0.1:8883"),
            ("LATCH_MQTT_URL", "ssl://127.0.0.1:8883"),
        ] {
            let msg = e(k, v);
            assert!(msg.contains(&k[6..].to_lowercase()), "{msg}");
            assert!(msg.contains("TLS"), "{msg}");
        }
        let c = load(&[("LATCH_MQTT_URL", "mqtt://127.0.0.1:1883")]).unwrap();
        assert_eq!(c.mqtt_url.as_deref(), Some("mqtt://127.0.0.1:1883"));
        let c = load(&[("LATCH_CLICKHOUSE_URL", "http://u:p@127.0.0.1:8123")]).unwrap();
        assert_eq!(c.clickhouse_flush, std::time::Duration::from_secs(1));
    }
}
