//! The storage layer's one error type.

/// Errors of the storage layer. A failure says whether the write may have happened
/// ([`Error::Indeterminate`]) or surely did not (every other variant).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("invalid cursor")]
    BadCursor,
    /// The store refused or failed the call before anything of it was written (a
    /// statement the server rejected, no connection): trying again is safe.
    #[error("database error: {0}")]
    Backend(String),
    /// The store may or may not have written the call: the answer to a commit (or to a
    /// write outside a transaction) did not come back, because the connection broke or
    /// the call ran out of time after the statement was sent. A caller that keeps state
    /// beside the store must read it back instead of assuming the write was refused.
    #[error("database error, the write may have landed: {0}")]
    Indeterminate(String),
    /// Cluster mode: the batch names partitions this node no longer holds at those epochs
    /// (another node took them over); nothing of it was written.
    #[error("partitions {0:?} are no longer held by this node (fenced); nothing written")]
    Fenced(Vec<u32>),
    /// The history sink refused a batch; it stays in the spool.
    #[error("history sink: {0}")]
    Sink(String),
    /// The store's disk is full (SQLite's `SQLITE_FULL`, PostgreSQL's `disk_full`): nothing
    /// of the call was written, and a write succeeds again once space is freed.
    #[error("the store's disk is full: {0}")]
    Full(String),
}

impl Error {
    /// Whether a write that failed with this error may have landed all the same.
    pub fn maybe_written(&self) -> bool {
        matches!(self, Error::Indeterminate(_))
    }

    /// Whether the store could not be reached or answer (as opposed to refusing the call
    /// for what it asked): readiness and the API's 503.
    pub fn unavailable(&self) -> bool {
        matches!(
            self,
            Error::Backend(_) | Error::Indeterminate(_) | Error::Full(_)
        )
    }

    /// Whether the call failed for want of disk space.
    pub fn is_full(&self) -> bool {
        matches!(self, Error::Full(_))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
