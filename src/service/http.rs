//! The HTTP API stage of a node: the API's state built from the node's parts, served until
//! stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::stages::{Followers, Sources};
use crate::api;
use crate::config::Config;
use crate::tasks::Supervisor;

/// The HTTP API, serving until stopped.
pub(super) struct Http {
    stop: CancellationToken,
    streams_stop: CancellationToken,
    /// Cancelled when the server ends by itself (its listener failed).
    ended: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Http {
    pub(super) fn start(
        config: &Arc<Config>,
        listener: TcpListener,
        node: &super::Node,
        sources: &Sources,
        followers: &Followers,
        metrics: metrics_exporter_prometheus::PrometheusHandle,
        sup: &Supervisor,
    ) -> anyhow::Result<Self> {
        let (base, delivery, core) = (&node.base, &node.delivery, &node.core);
        let history = match &node.archive {
            Some(a) => a.history.clone(),
            None => crate::history::History::new(base.store.clone(), None),
        };
        let accepting = Arc::new(AtomicBool::new(true));
        let streams_stop = CancellationToken::new();
        let state = api::AppState {
            config: config.clone(),
            app: crate::app::App::new(crate::app::Parts {
                store: base.store.clone(),
                engine: core.engine.clone(),
                dispatcher: delivery.dispatcher.clone(),
                history,
                cluster: base.membership.clone(),
                follow: core.follow.clone(),
            }),
            peers: base.membership.clone(),
            ingest: sources.ingest.clone(),
            sources: sources.sources.clone(),
            metrics,
            accepting: accepting.clone(),
            tokens: followers.tokens.clone(),
            limiter: config
                .rate_limit
                .map(|limit| Arc::new(api::limits::Limiter::new(limit))),
            failures: config
                .auth_failure_limit
                .map(|limit| Arc::new(api::limits::Limiter::new(limit))),
            node: base.node.clone(),
            address: base
                .address
                .clone()
                .unwrap_or_else(|| format!("http://{}", base.bound)),
            live: core.live.clone(),
            streams_stop: streams_stop.clone(),
            recent: base.recent.clone(),
        };
        let addr = listener.local_addr()?;
        match (core.sensors, &base.membership) {
            (Some(sensors), _) => tracing::info!(%addr, sensors, "latch is serving."),
            (None, Some(m)) => tracing::info!(%addr, node = m.node(), partitions = m.partitions(),
                partitioning = m.partitioning().scheme.as_str(),
                "latch is serving as a cluster node."),
            (None, None) => {}
        }
        if exposed_without_token(config, followers.tokens.any(), addr) {
            tracing::warn!(
                %addr,
                "Listening beyond loopback without an API token: anyone who reaches this \
                 address can read and change everything. Set LATCH_API_TOKEN."
            );
        }
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        // With each connection's peer address: the rate limit of an open API is per address.
        let serve = axum::serve(
            listener,
            api::router(state).into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            stopped.cancelled().await;
            accepting.store(false, Ordering::Relaxed);
            tracing::info!("Shutting down: no new requests.");
        });
        let sup = sup.clone();
        let ended = CancellationToken::new();
        let done = ended.clone();
        let task = tokio::spawn(async move {
            let mut result = Ok(());
            sup.watch("http", async { result = serve.await }).await;
            done.cancel();
            result
        });
        Ok(Self {
            stop,
            streams_stop,
            ended,
            task,
        })
    }

    /// Completes if the server ends without being stopped.
    pub(super) async fn ended(&self) {
        self.ended.cancelled().await
    }

    /// Stops taking requests and waits for those in progress.
    pub(super) async fn stop(self) -> anyhow::Result<()> {
        // Open event streams never end by themselves; the graceful stop waits for them.
        self.streams_stop.cancel();
        self.stop.cancel();
        match self.task.await {
            Ok(result) => Ok(result?),
            // The supervisor has logged the panic and fails the run.
            Err(_) => Ok(()),
        }
    }
}

/// Whether the API is open to other machines: a non-loopback address, no bootstrap token
/// and no token made.
pub fn exposed_without_token(
    config: &Config,
    tokens_exist: bool,
    addr: std::net::SocketAddr,
) -> bool {
    config.api_token.is_none() && !tokens_exist && !addr.ip().is_loopback()
}
