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
//! - [`bench`]: the load generator behind `latch bench`.
//!
//! A reading flows `ingest → engine shard → committer → store`, and a state change it causes
//! flows on `committer → dispatcher → client URL`. [`run`] wires them together and takes
//! them down in the reverse order: sources first, then the engine flushes, then the
//! dispatcher finishes its in-flight attempts.

pub mod api;
pub mod bench;
pub mod clock;
pub mod cluster;
pub mod committer;
pub mod config;
pub mod delivery;
pub mod domain;
pub mod engine;
pub mod history;
pub mod ingest;
pub mod store;
pub mod telemetry;
pub mod testkit;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use config::Config;

/// Runs latch on `listener` until `shutdown` completes, then stops gracefully.
pub async fn run(
    config: Arc<Config>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    run_with_clock(config, listener, shutdown, clock::Clock::wall()).await
}

/// [`run`] on a given clock: tests move a manual one to cross liveness deadlines and retry
/// delays without waiting for them.
pub async fn run_with_clock(
    config: Arc<Config>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    clock: clock::Clock,
) -> anyhow::Result<()> {
    let metrics = telemetry::metrics_handle();
    telemetry::register_families(&config);
    let (store, cluster_store) = store::connect_cluster(&config).await?;
    let node = store::node_id(&config.data_dir)?;
    let bound = listener.local_addr()?;
    let address = config.advertise(bound);
    // PostgreSQL: this node is one of a cluster (perhaps of one) and serves the partitions
    // it leases; the embedded store is one node serving them all.
    let membership = match cluster_store.clone() {
        Some(cs) => {
            Some(cluster::Membership::join(cs, node.clone(), address.clone(), &config).await?)
        }
        None => None,
    };
    let partitions = membership
        .as_ref()
        .map_or(config.partitions(), |m| m.partitions());

    let tasks = TaskTracker::new();
    let dispatcher_stop = CancellationToken::new();
    let dispatcher = delivery::Dispatcher::start(
        store.clone(),
        delivery::Settings {
            node: node.clone(),
            clock: clock.clone(),
            serves: membership.as_ref().map(|m| m.serves()),
            rate_grants: cluster_store.map(delivery::RateGrants),
            ..delivery::Settings::from_config(&config)
        },
        dispatcher_stop.clone(),
        config.shutdown_grace,
        &tasks,
    )
    .await?;

    // With ClickHouse, the store's history tables are a spool the shipper drains.
    let clickhouse = match &config.clickhouse_url {
        Some(url) => Some(history::clickhouse::ClickHouse::new(
            &history::clickhouse::Target::parse(url, &config.clickhouse_database)?,
        )),
        None => None,
    };
    let history = history::History::new(store.clone(), clickhouse.clone());
    // The committer counts history rows, so a full batch moves before the next tick.
    let spooled = Arc::new(history::shipper::Spooled::default());
    let shipper_stop = CancellationToken::new();
    let shipper = match &clickhouse {
        Some(ch) => tokio::spawn(history::shipper::run(
            store.clone(),
            ch.clone(),
            config.clickhouse_flush,
            spooled.clone(),
            history.shipping(),
            shipper_stop.clone(),
        )),
        None => tokio::spawn(history::archiver::run(
            store.clone(),
            spooled.clone(),
            shipper_stop.clone(),
        )),
    };

    let (commit_tx, commit_rx) = mpsc::channel(64);
    let live = api::stream::channel();
    let (fenced_tx, fenced_rx) = mpsc::unbounded_channel();
    let committer = tokio::spawn(committer::run(
        store.clone(),
        dispatcher.clone(),
        commit_rx,
        spooled,
        clock.clone(),
        membership.is_some().then_some(fenced_tx),
        Some(live.clone()),
    ));

    // Where following other nodes' registry changes begins: taken before the load, so a
    // change racing the load is applied again (harmlessly) rather than missed.
    let registry_seen = store.newest_registry_change().await?;
    let engine_stop = CancellationToken::new();
    let engine_tasks = TaskTracker::new();
    let tuning = engine::Tuning {
        shards: config.engine_shards as usize,
        batch_max: config.engine_batch_max as usize,
        default_timeout: config.heartbeat_timeout,
        clock,
        partitions,
    };
    let (engine, sensors) = match &membership {
        // Partitions come with their leases, each with its sensors.
        Some(m) => (
            engine::Engine::launch_leased(
                tuning,
                commit_tx,
                engine_stop.clone(),
                &engine_tasks,
                m.routing(),
            ),
            None,
        ),
        None => {
            let runtime = store.load_runtime().await?;
            let n = runtime.len();
            let engine = engine::Engine::launch(
                tuning,
                runtime,
                commit_tx,
                engine_stop.clone(),
                &engine_tasks,
            );
            (engine, Some(n))
        }
    };
    let follow = store.shared().then(|| {
        let (pokes, rx) = mpsc::channel(64);
        engine_tasks.spawn(engine::follow::run(
            store.clone(),
            engine.clone(),
            registry_seen,
            rx,
            engine_stop.clone(),
        ));
        pokes
    });
    engine_tasks.close();

    // The first lease round before serving: a node that starts alone serves every
    // partition from its first request.
    let cluster_stop = CancellationToken::new();
    let cluster_loop = match &membership {
        Some(m) => {
            m.round(&engine, &dispatcher, true).await?;
            Some(tokio::spawn(m.clone().run(
                engine.clone(),
                dispatcher.clone(),
                fenced_rx,
                cluster_stop.clone(),
            )))
        }
        None => None,
    };

    // Broker sources stop first on shutdown, finishing and acknowledging what they hold.
    // In a cluster they run on the node holding partition 0 only.
    let ingest = ingest::Ingest::new(engine.clone());
    let sources = ingest::Sources::default();
    let sources_stop = CancellationToken::new();
    let source_tasks = TaskTracker::new();
    match &membership {
        Some(m) => {
            source_tasks.spawn(lead_sources(
                m.leads(),
                config.clone(),
                ingest.clone(),
                sources.clone(),
                sources_stop.clone(),
            ));
        }
        None => start_sources(&config, &ingest, &sources, &sources_stop, &source_tasks),
    }
    source_tasks.close();

    // Auth reads the token table from memory; on a shared store it follows other nodes.
    let tokens = api::tokens::Tokens::load(store.as_ref()).await?;
    let tokens_stop = CancellationToken::new();
    let tokens_follower = store.shared().then(|| {
        tokio::spawn(api::tokens::follow(
            store.clone(),
            tokens.clone(),
            tokens_stop.clone(),
        ))
    });

    // A shared store's upkeep (history partitions ahead of time).
    let upkeep_stop = CancellationToken::new();
    let upkeep = store
        .shared()
        .then(|| tokio::spawn(store::upkeep(store.clone(), upkeep_stop.clone())));

    let accepting = Arc::new(AtomicBool::new(true));
    let streams_stop = CancellationToken::new();
    let state = api::AppState {
        config: config.clone(),
        store: store.clone(),
        engine: engine.clone(),
        ingest,
        sources,
        dispatcher,
        history,
        metrics,
        accepting: accepting.clone(),
        tokens: tokens.clone(),
        limiter: config
            .rate_limit
            .map(|limit| Arc::new(api::limits::Limiter::new(limit))),
        cluster: membership.clone(),
        follow,
        node: node.clone(),
        address: address.clone().unwrap_or_else(|| format!("http://{bound}")),
        live,
        streams_stop: streams_stop.clone(),
    };
    let app = api::router(state);
    let addr = listener.local_addr()?;
    match (sensors, &membership) {
        (Some(sensors), _) => tracing::info!(%addr, sensors, "latch is serving."),
        (None, Some(m)) => {
            tracing::info!(%addr, node = m.node(), partitions = m.partitions(), "latch is serving as a cluster node.")
        }
        (None, None) => {}
    }
    if exposed_without_token(&config, tokens.any(), addr) {
        tracing::warn!(
            %addr,
            "Listening beyond loopback without an API token: anyone who reaches this address \
             can read and change everything. Set LATCH_API_TOKEN."
        );
    }

    let stop = CancellationToken::new();
    let stop_http = stop.clone();
    let stop_sources = sources_stop.clone();
    tokio::spawn(async move {
        shutdown.await;
        // Open event streams never end by themselves; the graceful stop waits for them.
        streams_stop.cancel();
        stop_http.cancel();
        stop_sources.cancel();
    });
    let accepting_flag = accepting.clone();
    let stop_signal = stop.clone();
    // With each connection's peer address: the rate limit of an open API is per address.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        stop_signal.cancelled().await;
        accepting_flag.store(false, Ordering::Relaxed);
        tracing::info!("Shutting down: no new requests.");
    })
    .await?;
    tokens_stop.cancel();
    if let Some(follower) = tokens_follower {
        let _ = follower.await;
    }
    upkeep_stop.cancel();
    if let Some(u) = upkeep {
        let _ = u.await;
    }

    sources_stop.cancel();
    source_tasks.wait().await;

    // No lease moves while the engine flushes.
    cluster_stop.cancel();
    if let Some(l) = cluster_loop {
        let _ = l.await;
    }

    // Sources are closed: flush the engine, then let the committer drain.
    drop(engine);
    engine_stop.cancel();
    engine_tasks.wait().await;
    committer.await?;
    tracing::info!("Engine flushed.");
    // Everything of its partitions is durable: hand them over at once.
    if let Some(m) = &membership {
        m.leave().await;
    }

    // Everything committed is in the spool: one last shipment, bounded.
    shipper_stop.cancel();
    let _ = shipper.await;

    dispatcher_stop.cancel();
    tasks.close();
    if tokio::time::timeout(
        config.shutdown_grace + std::time::Duration::from_secs(5),
        tasks.wait(),
    )
    .await
    .is_err()
    {
        tracing::warn!("Delivery did not stop within the grace period.");
    }
    tracing::info!("latch stopped.");
    Ok(())
}

/// Starts the configured broker sources on `tracker`, stopping at `stop`.
fn start_sources(
    config: &Config,
    ingest: &ingest::Ingest,
    sources: &ingest::Sources,
    stop: &CancellationToken,
    tracker: &TaskTracker,
) {
    // Each source is down from here until its task says otherwise, not from when the task
    // first runs: `/readyz` must not answer ready while a source has yet to subscribe, or
    // what is published meanwhile to a new MQTT session (or a queue not yet declared) is lost.
    if let Some(url) = &config.amqp_url {
        sources.set(ingest::amqp::SOURCE, false);
        let settings = ingest::amqp::Settings {
            url: url.clone(),
            queue: config.amqp_queue.clone(),
        };
        tracker.spawn(ingest::amqp::run(
            ingest.clone(),
            settings,
            sources.clone(),
            stop.clone(),
        ));
    }
    if let Some(url) = &config.mqtt_url {
        sources.set(ingest::mqtt::SOURCE, false);
        let settings = ingest::mqtt::Settings {
            url: url.clone(),
            topic: config.mqtt_topic.clone(),
        };
        let (ingest, sources, stop) = (ingest.clone(), sources.clone(), stop.clone());
        tracker.spawn(async move {
            if let Err(e) = ingest::mqtt::run(ingest, settings, sources, stop).await {
                tracing::error!(error = %e, "MQTT ingest failed.");
            }
        });
    }
}

/// Cluster mode: runs the broker sources while this node holds partition 0, so a queue or
/// topic is consumed by one node, in order. Handing them over finishes and acknowledges
/// what they hold first; the broker keeps the rest for the next holder (the MQTT session
/// is the cluster's, under one client id).
async fn lead_sources(
    mut leads: tokio::sync::watch::Receiver<bool>,
    config: Arc<Config>,
    ingest: ingest::Ingest,
    sources: ingest::Sources,
    stop: CancellationToken,
) {
    if config.amqp_url.is_none() && config.mqtt_url.is_none() {
        return;
    }
    loop {
        while !*leads.borrow_and_update() {
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = leads.changed() => if changed.is_err() { return },
            }
        }
        let running = stop.child_token();
        let tasks = TaskTracker::new();
        start_sources(&config, &ingest, &sources, &running, &tasks);
        tasks.close();
        tracing::info!("This node holds partition 0: running the broker sources.");
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                changed = leads.changed() => {
                    if changed.is_err() || !*leads.borrow_and_update() {
                        break;
                    }
                }
            }
        }
        running.cancel();
        tasks.wait().await;
        if stop.is_cancelled() {
            return;
        }
        sources.clear();
        tracing::info!("Partition 0 moved to another node: broker sources stopped here.");
    }
}

/// Loads the settings ([`Config::load`]) and has each adapter check the URL it will use,
/// so a bad or unsupported URL stops the start with a message naming its key.
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
        Ok(())
    };
    // A message may quote a URL with its password.
    check().map_err(|e| anyhow::anyhow!(config.redact(&format!("{e:#}"))))?;
    Ok(config)
}

/// Whether the API is open to other machines: a non-loopback address, no bootstrap token
/// and no token made.
fn exposed_without_token(config: &Config, tokens_exist: bool, addr: std::net::SocketAddr) -> bool {
    config.api_token.is_none() && !tokens_exist && !addr.ip().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// On one thread no spawned task runs before the test awaits: what `/readyz` reads
    /// right after the start is what a probe could see before the sources ever ran.
    #[tokio::test]
    async fn configured_sources_are_down_before_their_tasks_first_run() {
        let mut c = Config::for_data_dir(std::path::Path::new("/tmp"));
        // Closed ports: the tasks never connect.
        c.amqp_url = Some("amqp://127.0.0.1:1/%2f".into());
        c.mqtt_url = Some("mqtt://127.0.0.1:1".into());
        let (commits, _rx) = tokio::sync::mpsc::channel(1);
        let stop = CancellationToken::new();
        let tuning = engine::Tuning {
            shards: 1,
            batch_max: 16,
            default_timeout: std::time::Duration::from_secs(10),
            clock: clock::Clock::wall(),
            partitions: 1,
        };
        let engine = engine::Engine::launch(tuning, [], commits, stop.clone(), &TaskTracker::new());
        let (sources, tasks) = (ingest::Sources::default(), TaskTracker::new());
        start_sources(&c, &ingest::Ingest::new(engine), &sources, &stop, &tasks);
        assert_eq!(sources.down(), vec!["amqp", "mqtt"]);
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
