//! The audit trail (`audit.rs` of both backends): a change made through the API keeps its
//! record in the same apply as the change, so the two are stored together or not at all,
//! whatever fault the call meets. (The model's own `audit` is the checks' log of status
//! changes, not this table.)

use async_trait::async_trait;

use latch::domain::audit::{Entry, Record};
use latch::store::audit::AuditFilter;
use latch::store::{AuditTrail, Page, PageRequest, Result};

use super::node::NodeStore;
use super::tables::{Cx, Tables};

impl Tables {
    /// `audit`: the record a change took, with the next id.
    pub(super) fn keep_record(&mut self, record: Record) {
        self.next.audit += 1;
        let id = self.next.audit;
        *self.trail_written.entry(record.path.clone()).or_default() += 1;
        self.trail.push(Entry { id, record });
    }

    /// Retention: records older than `before` go, as notifications of that age do (with
    /// `shipped_only`, only those shipped).
    pub(super) fn prune_trail(&mut self, before: latch::domain::Millis, shipped_only: bool) -> u64 {
        let n = self.trail.len();
        let shipped = self.next.audit_shipped;
        self.trail
            .retain(|e| e.record.at >= before || (shipped_only && e.id > shipped));
        (n - self.trail.len()) as u64
    }
}

impl NodeStore {
    /// A registry write made through the API: `f` applies the change, and the record the
    /// request left waiting ([`latch::store::audit::take`]) is kept with it as `keep` makes
    /// it from the answer (none for a 404's `false` or `None`). `created` names the id of
    /// what a create made.
    pub(super) async fn audited<T>(
        &self,
        op: &'static str,
        created: Option<String>,
        f: impl FnOnce(&mut Tables, &Cx) -> Result<T> + Send,
        keep: impl FnOnce(&T, Record) -> Option<Record> + Send,
    ) -> Result<T> {
        let record = latch::store::audit::take().map(|r| match &created {
            Some(id) => r.created(id),
            None => r,
        });
        self.run(op, true, move |t, cx| {
            let out = f(t, cx)?;
            if let Some(r) = record.and_then(|r| keep(&out, r)) {
                t.keep_record(r);
            }
            Ok(out)
        })
        .await
    }
}

#[async_trait]
impl AuditTrail for NodeStore {
    async fn list_audit(&self, f: AuditFilter, page: PageRequest) -> Result<Page<Entry>> {
        let after = latch::store::audit::cursor_of(&page.after)?;
        self.run("list_audit", false, move |t, _| {
            let under = |r: &str, of: &str| {
                r == of || r.strip_prefix(of).is_some_and(|rest| rest.starts_with('/'))
            };
            let rows: Vec<Entry> = t
                .trail
                .iter()
                .rev()
                .filter(|e| after.is_none_or(|a| e.id < a))
                .filter(|e| f.range.from.is_none_or(|from| e.record.at >= from))
                .filter(|e| f.range.to.is_none_or(|to| e.record.at < to))
                .filter(|e| {
                    f.token_id
                        .as_ref()
                        .is_none_or(|id| e.record.token.as_ref().is_some_and(|t| &t.id == id))
                })
                .filter(|e| {
                    f.resource
                        .as_ref()
                        .is_none_or(|of| under(&e.record.resource, of))
                })
                .take(page.limit as usize + 1)
                .cloned()
                .collect();
            Ok(Page::from_rows(rows, page.limit, |e| e.id.to_string()))
        })
        .await
    }
}
