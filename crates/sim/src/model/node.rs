//! One node's process as the store sees it: every store trait, each call forwarded to the
//! shared tables with the node's name, through the fault hooks and the process's gate
//! ([`super::faults`] says the steps). The traits are implemented in the file of each
//! concern (`registry.rs`, `outbox.rs`, …), as the backends do, over [`NodeStore::run`].

use std::sync::Arc;

use latch::store::{Error, Result};

use super::ModelStore;
use super::faults::{Call, Fault, Gate, Life};
use super::tables::{Cx, Tables};

/// The store as one node's process reaches it. `Arc<NodeStore>` coerces to
/// `Arc<dyn Store>` and `Arc<dyn ClusterStore>`.
pub struct NodeStore {
    model: ModelStore,
    name: Arc<str>,
    gate: Gate,
}

impl NodeStore {
    pub(super) fn new(model: ModelStore, name: Arc<str>) -> Self {
        Self {
            model,
            name,
            gate: Gate::default(),
        }
    }

    /// The node's name, as the fault hooks see it.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn model(&self) -> &ModelStore {
        &self.model
    }

    pub fn life(&self) -> Life {
        self.gate.life()
    }

    /// The process is killed: none of its calls goes on or is answered again.
    pub fn kill(&self) {
        self.gate.kill();
    }

    /// The process is stopped (SIGSTOP): its calls wait until [`NodeStore::thaw`].
    pub fn freeze(&self) {
        self.gate.freeze();
    }

    pub fn thaw(&self) {
        self.gate.thaw();
    }

    /// One call: through the gate and the fault hooks, then applied whole by `f` (or not
    /// at all), its answer held back as the hooks say.
    pub(super) async fn run<T>(
        &self,
        op: &'static str,
        writes: bool,
        f: impl FnOnce(&mut Tables, &Cx) -> Result<T> + Send,
    ) -> Result<T> {
        let (call, fault) = self.begin_call(op, writes).await;
        let result = match refusal(&call, fault) {
            None => self.model.apply(&call, f),
            Some(e) => {
                if fault == (Fault::InDoubt { applied: true }) {
                    // Applied whole, but its answer never comes: the caller cannot tell.
                    let _ = self.model.apply(&call, f);
                }
                Err(e)
            }
        };
        self.end_call(&call).await;
        result
    }

    /// Steps 1 to 3 of a call: the process runs, and the hooks said what becomes of it.
    pub(super) async fn begin_call(&self, op: &'static str, writes: bool) -> (Call, Fault) {
        let call = Call {
            node: self.name.clone(),
            op,
            writes,
        };
        self.gate.pass().await;
        let fault = self.model.faults().before(&call).await;
        self.gate.pass().await;
        (call, fault)
    }

    /// Step 4: the answer, held back as the hooks say, never given to a killed process.
    pub(super) async fn end_call(&self, call: &Call) {
        self.model.faults().after(call).await;
        self.gate.pass().await;
    }
}

/// The error a call answers with instead of its own, if the fault makes one.
pub(super) fn refusal(call: &Call, fault: Fault) -> Option<Error> {
    let op = call.op;
    match fault {
        Fault::None => None,
        Fault::Unavailable => Some(Error::Backend(format!("{op}: the store is unavailable"))),
        Fault::Full => Some(Error::Full(format!(
            "{op}: no space left on the store's disk"
        ))),
        Fault::InDoubt { .. } => Some(Error::Indeterminate(format!(
            "{op}: no answer from the store"
        ))),
    }
}
