//! Starting the configured broker sources: on one node all of them; in a cluster the plain
//! AMQP queue and MQTT on the node that holds partition 0 ([`lead`]), and the AMQP
//! exchange's partition queues on every node, each its own partitions' ([`exchange`]).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Ingest, Sources};
use crate::config::Config;
use crate::store::Sessions;

/// Starts the configured broker sources on `tracker`, stopping at `stop`. `store` keeps
/// what the MQTT session leaves unacknowledged at a stop.
pub fn start(
    config: &Config,
    ingest: &Ingest,
    sources: &Sources,
    store: &Arc<dyn Sessions>,
    stop: &CancellationToken,
    tracker: &TaskTracker,
) {
    // Each source is down from here until its task says otherwise, not from when the task
    // first runs: `/readyz` must not answer ready while a source has yet to subscribe, or
    // what is published meanwhile to a new MQTT session (or a queue not yet declared) is lost.
    if let Some(url) = &config.amqp_url {
        sources.set(super::amqp::SOURCE, false);
        let settings = super::amqp::Settings {
            url: url.clone(),
            queue: config.amqp_queue.clone(),
        };
        tracker.spawn(super::amqp::run(
            ingest.clone(),
            settings,
            sources.clone(),
            stop.clone(),
        ));
    }
    if let Some(url) = &config.mqtt_url {
        sources.set(super::mqtt::SOURCE, false);
        let settings = super::mqtt::Settings {
            url: url.clone(),
            topic: config.mqtt_topic.clone(),
        };
        let (ingest, sources, stop) = (ingest.clone(), sources.clone(), stop.clone());
        let store = store.clone();
        tracker.spawn(async move {
            if let Err(e) = super::mqtt::run(ingest, settings, sources, store, stop).await {
                tracing::error!(error = %e, "MQTT ingest failed.");
            }
        });
    }
}

/// Cluster mode: runs the plain queue and MQTT while this node holds partition 0, so they
/// are consumed by one node, in order. Handing them over finishes and acknowledges
/// what they hold first; the broker keeps the rest for the next holder (the MQTT session
/// is the cluster's, under one client id).
pub async fn lead(
    follower: crate::cluster::lead::Follower,
    config: Arc<Config>,
    ingest: Ingest,
    sources: Sources,
    store: Arc<dyn Sessions>,
    stop: CancellationToken,
) {
    if config.amqp_url.is_none() && config.mqtt_url.is_none() {
        return;
    }
    let crate::cluster::lead::Follower {
        want: mut leads,
        running: said,
    } = follower;
    loop {
        while !*leads.borrow_and_update() {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                changed = leads.changed() => if changed.is_err() { return },
            }
        }
        let running = stop.child_token();
        let tasks = TaskTracker::new();
        start(&config, &ingest, &sources, &store, &running, &tasks);
        tasks.close();
        said.send_replace(true);
        tracing::info!("This node holds partition 0: running the broker sources.");
        loop {
            tokio::select! {
                biased;
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
        said.send_replace(false);
        if stop.is_cancelled() {
            return;
        }
        sources.forget(&[super::amqp::SOURCE, super::mqtt::SOURCE]);
        tracing::info!("Partition 0 moved to another node: broker sources stopped here.");
    }
}

/// Cluster mode: when AMQP ingest and the exchange are configured, consumes the queues of
/// the partitions this node serves (`served`) until `stop`.
pub fn exchange(
    config: &Config,
    partitions: crate::domain::partition::Partitioning,
    served: super::amqp::exchange::Served,
    ingest: &Ingest,
    sources: &Sources,
    stop: &CancellationToken,
    tracker: &TaskTracker,
) {
    let Some(url) = &config.amqp_url else {
        return;
    };
    if config.amqp_exchange.is_empty() {
        return;
    }
    sources.set(super::amqp::exchange::SOURCE, false);
    let settings = super::amqp::exchange::Settings {
        url: url.clone(),
        exchange: config.amqp_exchange.clone(),
        dlq: format!("{}.dlq", config.amqp_queue),
        partitions,
    };
    tracker.spawn(super::amqp::exchange::run(
        ingest.clone(),
        settings,
        served,
        sources.clone(),
        stop.clone(),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session store with nothing kept (the test's sources never connect).
    struct Nothing;

    #[async_trait::async_trait]
    impl Sessions for Nothing {
        async fn keep_unacked(
            &self,
            _: String,
            _: Vec<crate::store::Unacked>,
        ) -> crate::store::Result<()> {
            Ok(())
        }
        async fn take_unacked(
            &self,
            _: String,
        ) -> crate::store::Result<Vec<crate::store::Unacked>> {
            Ok(Vec::new())
        }
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
        let tuning = crate::engine::Tuning {
            shards: 1,
            batch_max: 16,
            default_timeout: std::time::Duration::from_secs(10),
            default_debounce: std::time::Duration::ZERO,
            lost_reminder: None,
            clock: crate::clock::Clock::wall(),
            partitions: crate::domain::partition::Partitioning::md5(1),
            supervisor: Default::default(),
        };
        let engine =
            crate::engine::Engine::launch(tuning, [], commits, stop.clone(), &TaskTracker::new());
        let (sources, tasks) = (Sources::default(), TaskTracker::new());
        let store: Arc<dyn Sessions> = Arc::new(Nothing);
        start(&c, &Ingest::new(engine), &sources, &store, &stop, &tasks);
        assert_eq!(sources.down(), vec!["amqp", "mqtt"]);
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
