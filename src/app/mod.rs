//! The application layer: what a caller (the HTTP API today) does to the service, as the
//! sequences it takes across the store, the engine, the cluster and the dispatcher, in the
//! order that keeps them consistent when a step fails, on the engine's one clock.
//! Handlers parse, call one of these, and map the result; they decide no order of steps.

mod clients;
mod notifications;
pub mod rounds;
mod sensors;
pub mod silences;
pub mod sites;

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
    /// The call names something that does not exist or cannot be (a site, a client, a
    /// sensor a silence matches).
    #[error("{0}")]
    Invalid(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// The service's parts a caller acts through; cheap to clone.
#[derive(Clone)]
pub struct App {
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
    /// The service's clock (the engine's): every time a caller's step stamps.
    pub fn now(&self) -> Millis {
        self.engine.now()
    }
}
