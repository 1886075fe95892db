//! latch running inside this process, as `latch serve` runs it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use latch::clock::Clock;
use latch::config::Config;

/// A running latch on `127.0.0.1:0`, stopped gracefully by [`Server::stop`].
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Server {
    /// Starts latch and waits until `/readyz` answers 200, for at most `ready_within` (a
    /// bench's import of a million sensors takes minutes, a test's start a moment).
    pub async fn start(config: Config, ready_within: Duration) -> anyhow::Result<Self> {
        Self::start_on(config, ready_within, Clock::wall()).await
    }

    /// [`Server::start`] on `clock` (a manual one lets a test move time).
    pub async fn start_on(
        config: Config,
        ready_within: Duration,
        clock: Clock,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (tx, rx) = oneshot::channel::<()>();
        let shutdown = async {
            let _ = rx.await;
        };
        let task = tokio::spawn(latch::run_with_clock(
            Arc::new(config),
            listener,
            shutdown,
            clock,
        ));
        let http = reqwest::Client::new();
        let deadline = Instant::now() + ready_within;
        loop {
            if let Ok(r) = http.get(format!("{base}/readyz")).send().await
                && r.status().is_success()
            {
                break;
            }
            if task.is_finished() {
                return Err(match task.await {
                    Ok(Err(e)) => e.context("latch stopped during start"),
                    _ => anyhow::anyhow!("latch stopped during start"),
                });
            }
            anyhow::ensure!(Instant::now() < deadline, "latch did not become ready");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Self {
            base,
            shutdown: Some(tx),
            task: Some(task),
        })
    }

    /// Graceful stop: what `SIGTERM` does; returns how `run` ended.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}
