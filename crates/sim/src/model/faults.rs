//! Store faults the simulation injects, call by call, and the life of a node's process as
//! its calls see it.
//!
//! Every call of a [`super::NodeStore`] goes through the same steps (`NodeStore::run`):
//!
//! 1. its process must be running ([`Gate`]): a frozen one (SIGSTOP) waits until thawed,
//!    a killed one never goes on;
//! 2. [`Faults::before`] decides what becomes of it, and may wait first (a slow store, on
//!    the simulation's clock);
//! 3. the gate again (the process may have been stopped meanwhile), then the call is
//!    applied whole, or not at all, as the fault says;
//! 4. [`Faults::after`] may hold the answer back (applied, but slow to come back), and the
//!    gate once more: a process killed now never learns that its write landed.
//!
//! The errors are the ones the backends give: [`Fault::Unavailable`] is what a refused or
//! unreachable store gives (`Error::Backend`: nothing written), [`Fault::Full`] a full disk
//! (`Error::Full`: nothing written), [`Fault::InDoubt`] an answer that never came
//! (`Error::Indeterminate`: applied or not, as the harness chose).

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

/// One store call as the fault hooks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The node (process) making it.
    pub node: Arc<str>,
    /// The trait method: `commit`, `claim`, `record`, `acquire`, …
    pub op: &'static str,
    /// Whether it may write (a read is never `Full`, on either backend).
    pub writes: bool,
}

/// What becomes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Applied, answered.
    #[default]
    None,
    /// Refused before anything was written: `Error::Backend` (the store is down or
    /// unreachable, `store_unavailable`).
    Unavailable,
    /// The disk is full: nothing written, `Error::Full`.
    Full,
    /// The answer never came: `Error::Indeterminate`, with the call applied whole
    /// (`applied`) or not at all.
    InDoubt { applied: bool },
}

/// The harness's say over each store call.
#[async_trait]
pub trait Faults: Send + Sync + 'static {
    /// Before the call touches the store: what becomes of it. May wait (on the
    /// simulation's clock) to make the store slow.
    async fn before(&self, call: &Call) -> Fault;

    /// After the call was applied (or refused), before its answer reaches the caller: may
    /// wait, so an applied write is slow to be answered.
    async fn after(&self, call: &Call) {
        let _ = call;
    }
}

/// No faults: every call is applied and answered at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFaults;

#[async_trait]
impl Faults for NoFaults {
    async fn before(&self, _call: &Call) -> Fault {
        Fault::None
    }
}

/// The life of a node's process, as its store calls see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    Running,
    /// Stopped (SIGSTOP): its calls wait until it is thawed.
    Frozen,
    /// Killed: its calls never go on, and it never comes back (a restart is a new
    /// [`super::NodeStore`]).
    Killed,
}

/// Where a node's calls wait while its process is frozen, or for ever once it is killed.
/// A mutex and a `Notify`, not a `watch` channel: a channel's receivers wake in an order
/// Tokio draws at random, and a seed must replay the same run; `Notify` wakes its waiters
/// in the order they came.
#[derive(Debug)]
pub struct Gate {
    life: std::sync::Mutex<Life>,
    changed: Notify,
}

impl Default for Gate {
    fn default() -> Self {
        Self {
            life: std::sync::Mutex::new(Life::Running),
            changed: Notify::new(),
        }
    }
}

impl Gate {
    pub fn life(&self) -> Life {
        *self.life.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the life from `from` to `to` (`None`: from any) and wakes the waiters.
    fn set(&self, from: Option<Life>, to: Life) {
        let mut life = self.life.lock().unwrap_or_else(|p| p.into_inner());
        if from.is_none_or(|f| *life == f) {
            *life = to;
            drop(life);
            self.changed.notify_waiters();
        }
    }

    /// Stops the process: its calls wait (a killed one stays killed).
    pub fn freeze(&self) {
        self.set(Some(Life::Running), Life::Frozen);
    }

    /// Lets a frozen process go on.
    pub fn thaw(&self) {
        self.set(Some(Life::Frozen), Life::Running);
    }

    /// Kills the process: none of its calls goes on or is answered again.
    pub fn kill(&self) {
        self.set(None, Life::Killed);
    }

    /// Returns once the process is running; never, once it is killed.
    pub async fn pass(&self) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            match self.life() {
                Life::Running => return,
                Life::Killed => std::future::pending::<()>().await,
                Life::Frozen => changed.await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_frozen_process_waits_until_thawed_and_a_killed_one_for_ever() {
        let gate = Arc::new(Gate::default());
        gate.pass().await;
        gate.freeze();
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.pass().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "frozen");
        gate.thaw();
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("thawed")
            .unwrap();
        gate.kill();
        gate.thaw();
        assert_eq!(gate.life(), Life::Killed, "a killed process stays dead");
        let never = tokio::time::timeout(Duration::from_secs(60), gate.pass()).await;
        assert!(never.is_err());
    }
}
