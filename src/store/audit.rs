//! The audit trail's place in the store: the record of the change a request is making waits
//! in [`scope`] (set by the API around the handler) until the store method that makes the
//! change [`take`]s it and writes it in that change's own transaction. A change is thus
//! never committed without its record, and a refused change (404, 409) leaves none.
//!
//! The record travels beside the call rather than as an argument: two dozen registry writes
//! take one, and the same methods serve imports, rounds and tests, which make no record.

use std::cell::RefCell;

use async_trait::async_trait;

use super::{Page, PageRequest, Result, TimeRange};
use crate::domain::audit::{Entry, Record};

tokio::task_local! {
    static PENDING: RefCell<Option<Record>>;
}

/// Runs `fut` (a request's handler) with `record` waiting for the change it makes. Answers
/// whether a store write took it, with the handler's output.
pub async fn scope<F: std::future::Future>(record: Record, fut: F) -> (F::Output, bool) {
    let cell = RefCell::new(Some(record));
    PENDING
        .scope(cell, async {
            let out = fut.await;
            let taken = PENDING.with(|p| p.borrow().is_none());
            (out, taken)
        })
        .await
}

/// The record waiting for the change about to be made, if the caller is a request through
/// the API; taken, so a second write of the same request (rare) does not repeat it.
pub fn take() -> Option<Record> {
    PENDING.try_with(|p| p.borrow_mut().take()).ok().flatten()
}

/// Which records `GET /v1/audit` lists: every field set must match.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub range: TimeRange,
    pub token_id: Option<String>,
    /// A resource and everything below it: `sensors` is every sensor's change,
    /// `sensors/door1` that sensor's.
    pub resource: Option<String>,
}

/// The audit trail as the API reads it; records are written by the changes themselves.
#[async_trait]
pub trait AuditTrail: Send + Sync {
    /// Newest first.
    async fn list_audit(&self, filter: AuditFilter, page: PageRequest) -> Result<Page<Entry>>;
}

/// Records one retention step deletes: they are kept as long as notifications
/// (`Retention::notifications_before`), oldest first.
pub(crate) const PRUNE_STEP: i64 = 2_000;

/// The columns of a record, in the order the backends' readers take them.
pub(crate) const ENTRY_COLS: &str =
    "id, at, token_id, token_name, method, path, resource, before, after";

/// The query both backends list the trail with; `p(n)` writes parameter `n` (after cursor,
/// limit, from, to, token_id, resource) as the backend's placeholder.
pub(crate) fn list_sql(p: impl Fn(usize) -> String) -> String {
    format!(
        "SELECT {ENTRY_COLS} FROM audit WHERE ({a} IS NULL OR id < {a}) AND ({from} IS NULL OR at >= {from}) \
         AND ({to} IS NULL OR at < {to}) AND ({tok} IS NULL OR token_id = {tok}) \
         AND ({res} IS NULL OR resource = {res} OR substr(resource, 1, length({res}) + 1) = {res} || '/') \
         ORDER BY id DESC LIMIT {lim}",
        a = p(1),
        lim = p(2),
        from = p(3),
        to = p(4),
        tok = p(5),
        res = p(6),
    )
}

/// A page's cursor: the id of its last record.
pub fn cursor_of(after: &Option<String>) -> Result<Option<i64>> {
    after
        .as_deref()
        .map(|a| a.parse().map_err(|_| super::Error::BadCursor))
        .transpose()
}

/// A record's `before` or `after` as a column: JSON text.
pub(crate) fn to_column(v: &Option<serde_json::Value>) -> Option<String> {
    v.as_ref().map(|v| v.to_string())
}

pub(crate) fn from_column(s: Option<String>) -> Option<serde_json::Value> {
    s.and_then(|s| serde_json::from_str(&s).ok())
}
