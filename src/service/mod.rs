//! Start-up and shutdown as stages. Each stage's `start` returns a handle whose `stop`
//! ends what it started; [`run_with_clock`] starts them in order, waits for the signal (or
//! for a task to panic), and stops them in reverse:
//!
//! 1. [`Base`]: the store, this node's id and, on PostgreSQL, its cluster membership.
//! 2. [`Delivery`]: the dispatcher with the pending notifications.
//! 3. [`Archive`]: the history shipper (ClickHouse) or archiver (SQLite), and the store's
//!    upkeep with retention.
//! 4. [`Core`]: the committer and the engine's shards, with the registry follower.
//! 5. [`Leases`]: the cluster's lease rounds (cluster mode).
//! 6. [`Sources`]: the broker sources.
//! 7. [`Followers`]: API tokens followed across nodes.
//! 8. [`Http`]: the API.
//!
//! Stopping in reverse is what makes the shutdown lose nothing: the API and the sources
//! stop taking readings first, the engine flushes, its partitions are handed over, the
//! last history ships, and the dispatcher finishes in-flight attempts within the grace.

mod http;
mod node;
mod stages;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::clock::Clock;
use crate::config::Config;
use crate::tasks::Supervisor;
use crate::telemetry;
use http::Http;
pub use http::exposed_without_token;
pub use node::{Node, Parts};
use stages::{Base, Followers, Sources};

/// Runs latch on `listener` until `shutdown` completes, then stops gracefully. Fails when
/// a start stage fails or a task of the service panicked.
pub async fn run_with_clock(
    config: Arc<Config>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
    clock: Clock,
) -> anyhow::Result<()> {
    let sup = Supervisor::default();
    // The recorder first: families registered before it exists would go nowhere.
    let metrics = telemetry::metrics_handle();
    telemetry::register_families(&config);
    let base = Base::open(&config, &listener).await?;
    let node = Node::start_on(&config, &clock, base, None, sup.clone(), true).await?;
    let sources = Sources::start(&config, &node.base, &node.core, &sup);
    let followers = Followers::start(&node.base, &sup).await?;
    let http = Http::start(
        &config, listener, &node, &sources, &followers, metrics, &sup,
    )?;

    tokio::select! {
        biased;
        _ = shutdown => {}
        _ = sup.failed() => {}
        _ = http.ended() => {}
    }
    // The API and the sources stop taking readings at the same moment; from then on
    // silence is latch's downtime, not the sensors'.
    node.engine().stop_hearing();
    sources.stopping();
    // An API that ended in an error still leaves the rest to stop: the engine to flush,
    // the partitions to hand over, the attempts in flight to finish.
    let served = http.stop().await;
    followers.stop().await;
    sources.stop().await;
    node.stop(config.shutdown_grace).await;
    tracing::info!("latch stopped.");
    served?;
    match sup.failure() {
        Some(failure) => anyhow::bail!("{failure}"),
        None => Ok(()),
    }
}
