//! Named tasks whose panics are never dropped.
//!
//! A task that panics in a service that keeps running leaves a part of it dead while the
//! rest answers as if all were well (a stopped committer accepts nothing, a stopped
//! dispatcher sends nothing). So every long-lived task runs under [`Supervisor::watch`]:
//! a panic is logged with the task's name and stops the whole process with an error, and
//! the supervisor of the machine (systemd, a container runtime) starts it again. Whatever
//! was acknowledged is in the store; a restart picks it up.

use crate::telemetry::events::{Emit, TaskPanicked};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Watches the service's tasks; cheap to clone.
#[derive(Clone, Default, Debug)]
pub struct Supervisor {
    failed: CancellationToken,
    /// The first task that panicked. A `std` mutex: held for a copy, never across `.await`.
    first: Arc<Mutex<Option<String>>>,
}

impl Supervisor {
    /// `fut`, watched: when it panics, the panic is logged under `name` and the service
    /// stops with an error.
    pub fn watch<F>(&self, name: &'static str, fut: F) -> impl Future<Output = ()> + Send + use<F>
    where
        F: Future<Output = ()> + Send,
    {
        let this = self.clone();
        async move {
            if let Err(panic) = AssertUnwindSafe(fut).catch_unwind().await {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                TaskPanicked {
                    task: name,
                    panic: &what,
                }
                .emit();
                this.first
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert_with(|| format!("task {name} panicked: {what}"));
                this.failed.cancel();
            }
        }
    }

    /// Spawns `fut` on the runtime, watched.
    pub fn spawn<F>(&self, name: &'static str, fut: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(self.watch(name, fut))
    }

    /// Completes once a watched task has panicked.
    pub async fn failed(&self) {
        self.failed.cancelled().await
    }

    /// What went wrong, if a watched task panicked.
    pub fn failure(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Waits for a watched task to end. Its panic, if any, was reported by the supervisor; a
/// task cancelled by the runtime's shutdown has nothing to report.
pub async fn join(handle: JoinHandle<()>) {
    let _ = handle.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_named_and_fails_the_service() {
        let sup = Supervisor::default();
        join(sup.spawn("shipper", async { panic!("disk on fire") })).await;
        tokio::time::timeout(std::time::Duration::from_secs(5), sup.failed())
            .await
            .expect("the supervisor saw the panic");
        let failure = sup.failure().expect("a failure is recorded");
        assert!(failure.contains("shipper"), "{failure}");
        assert!(failure.contains("disk on fire"), "{failure}");
    }

    #[tokio::test]
    async fn tasks_that_end_normally_fail_nothing() {
        let sup = Supervisor::default();
        join(sup.spawn("quiet", async {})).await;
        assert!(sup.failure().is_none());
    }
}
