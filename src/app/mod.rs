//! The application layer: what a caller (the HTTP API today) does to the service, as the
//! sequences it takes across the store, the engine, the cluster and the dispatcher, in the
//! order that keeps them consistent when a step fails, on the engine's one clock.
//! Handlers parse, call one of these, and map the result; they decide no order of steps.

mod alarms;
mod clients;
mod keys;
mod notifications;
pub mod reads;
pub mod rounds;
mod schedules;
mod sensors;
pub mod silences;
pub mod sites;
mod tokens;

use std::sync::Arc;

use crate::cluster::Membership;
use crate::delivery::Dispatcher;
use crate::domain::Millis;
use crate::engine::{self, Engine, follow::Pokes};
use crate::history::{self, History};
use crate::store::{self, Store};

/// Why an application step failed: the layer's error, one variant per part it drives.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Engine(#[from] engine::Error),
    #[error(transparent)]
    History(#[from] history::Error),
    #[error(transparent)]
    Cluster(#[from] crate::cluster::Error),
    /// The call names something that does not exist or cannot be (a site, a client, a
    /// sensor a silence matches).
    #[error("{0}")]
    Invalid(String),
    /// A silence names a schedule that does not exist (`unknown_schedule`, 422).
    #[error("{0}")]
    UnknownSchedule(String),
    /// A schedule to delete is named by what follows it (`schedule_in_use`, 409).
    #[error("{0}")]
    ScheduleInUse(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The service's parts a caller acts through; cheap to clone. Its handles are private: a
/// handler reads and changes the service only through the steps below, so the order of
/// steps across the parts is decided here alone.
#[derive(Clone)]
pub struct App(Parts);

/// What [`App::new`] is made of: the service's parts as the node started them.
#[derive(Clone)]
pub struct Parts {
    pub store: Arc<dyn Store>,
    pub engine: Engine,
    pub dispatcher: Dispatcher,
    /// History reads and deletions: the store, or ClickHouse plus the store's spool.
    pub history: History,
    /// Cluster mode (PostgreSQL): this node's membership.
    pub cluster: Option<Arc<Membership>>,
    /// Asks the engine's registry follower for a round now (on a shared store).
    pub follow: Option<Pokes>,
}

impl App {
    pub fn new(parts: Parts) -> Self {
        Self(parts)
    }

    /// Has the engine read the registry's changes now (on a shared store, where another
    /// node made them); waits up to 3 s for the round.
    pub async fn follow_now(&self) {
        let Some(pokes) = &self.0.follow else {
            return;
        };
        let (done, wait) = tokio::sync::oneshot::channel();
        if pokes.send(done).await.is_ok() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(3), wait).await;
        }
    }

    /// The service's clock (the engine's): every time a caller's step stamps.
    pub fn now(&self) -> Millis {
        self.0.engine.now()
    }
}
