//! The audit trail on SQLite: records written in the transaction of their change, read
//! newest first, pruned with the notifications.

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::SqliteStore;
use crate::domain::Millis;
use crate::domain::audit::{Entry, Record, TokenRef};
use crate::store::audit::{self, AuditFilter, AuditTrail, PRUNE_STEP, from_column, to_column};
use crate::store::{Page, PageRequest, Result, limit_plus_one};

/// Writes `record` (if the change came through the API) on `c`, which must be the change's
/// own transaction.
pub(super) fn record(c: &Connection, record: Option<&Record>) -> rusqlite::Result<()> {
    let Some(r) = record else { return Ok(()) };
    c.prepare_cached(
        "INSERT INTO audit (at, token_id, token_name, method, path, resource, before, after) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?
    .execute(params![
        r.at,
        r.token.as_ref().map(|t| &t.id),
        r.token.as_ref().map(|t| &t.name),
        r.method,
        r.path,
        r.resource,
        to_column(&r.before),
        to_column(&r.after)
    ])?;
    Ok(())
}

fn entry(r: &rusqlite::Row) -> rusqlite::Result<Entry> {
    let token_id: Option<String> = r.get(2)?;
    let token_name: Option<String> = r.get(3)?;
    Ok(Entry {
        id: r.get(0)?,
        record: Record {
            at: r.get(1)?,
            token: token_id.map(|id| TokenRef {
                id,
                name: token_name.unwrap_or_default(),
            }),
            method: r.get(4)?,
            path: r.get(5)?,
            resource: r.get(6)?,
            before: from_column(r.get(7)?),
            after: from_column(r.get(8)?),
        },
    })
}

/// Up to `limit` records not shipped to ClickHouse yet, oldest first.
pub(super) fn spooled(c: &Connection, limit: i64) -> rusqlite::Result<Vec<Entry>> {
    c.prepare_cached(&format!(
        "SELECT {} FROM audit WHERE id > (SELECT last_id FROM ship_marks WHERE what = 'audit') \
         ORDER BY id LIMIT ?1",
        audit::ENTRY_COLS
    ))?
    .query_map([limit], entry)?
    .collect()
}

/// What shipped: the mark moves to the last record of the shipment.
pub(super) fn shipped(c: &Connection, last: i64) -> rusqlite::Result<()> {
    c.execute(
        "UPDATE ship_marks SET last_id = ?1 WHERE what = 'audit' AND last_id < ?1",
        [last],
    )?;
    Ok(())
}

/// Records not shipped yet, for the spool's depth.
pub(super) const UNSHIPPED: &str =
    "(SELECT COUNT(*) FROM audit WHERE id > (SELECT last_id FROM ship_marks WHERE what = 'audit'))";

/// Deletes one step of records older than `before` (`shipped_only`: of those shipped to
/// ClickHouse); answers how many went.
pub(super) fn prune_step(c: &Connection, before: Millis, shipped_only: bool) -> Result<u64> {
    let n = c
        .prepare_cached(
            "DELETE FROM audit WHERE id IN \
             (SELECT id FROM audit WHERE at < ?1 AND (NOT ?3 OR id <= \
               (SELECT last_id FROM ship_marks WHERE what = 'audit')) ORDER BY id LIMIT ?2)",
        )?
        .execute(params![before, PRUNE_STEP, shipped_only])?;
    Ok(n as u64)
}

#[async_trait]
impl AuditTrail for SqliteStore {
    async fn list_audit(&self, f: AuditFilter, page: PageRequest) -> Result<Page<Entry>> {
        let after = audit::cursor_of(&page.after)?;
        self.read(move |c| {
            let rows = c
                .prepare_cached(&audit::list_sql(|n| format!("?{n}")))?
                .query_map(
                    params![
                        after,
                        limit_plus_one(&page),
                        f.range.from,
                        f.range.to,
                        f.token_id,
                        f.resource
                    ],
                    entry,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |e| e.id.to_string()))
        })
        .await
    }
}

/// Commits a change of `n` rows of one statement, with its record when it changed any:
/// answers whether it did (`false`: no such resource).
pub(super) fn audited(
    tx: rusqlite::Transaction,
    n: usize,
    record: Option<&Record>,
) -> Result<bool> {
    if n > 0 {
        self::record(&tx, record)?;
    }
    tx.commit()?;
    Ok(n > 0)
}
