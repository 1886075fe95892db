//! The audit trail on PostgreSQL: records written in the transaction of their change, read
//! newest first, pruned with the notifications.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::PgStore;
use super::db::Sql;
use crate::domain::Millis;
use crate::domain::audit::{Entry, Record, TokenRef};
use crate::store::audit::{self, AuditFilter, AuditTrail, PRUNE_STEP, from_column, to_column};
use crate::store::{Page, PageRequest, Result, limit_plus_one};

/// Writes `record` (if the change came through the API) on `tx`, which must be the
/// change's own transaction.
pub(super) async fn record(tx: &impl Sql, record: Option<&Record>) -> Result<()> {
    let Some(r) = record else { return Ok(()) };
    tx.execute(
        "INSERT INTO audit (at, token_id, token_name, method, path, resource, before, after) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        &[
            &r.at,
            &r.token.as_ref().map(|t| &t.id),
            &r.token.as_ref().map(|t| &t.name),
            &r.method,
            &r.path,
            &r.resource,
            &to_column(&r.before),
            &to_column(&r.after),
        ],
    )
    .await?;
    Ok(())
}

/// Commits a change of `n` rows of one statement, with its record when it changed any:
/// answers whether it did (`false`: no such resource).
pub(super) async fn audited(tx: super::db::Tx<'_>, n: u64, r: Option<&Record>) -> Result<bool> {
    if n > 0 {
        record(&tx, r).await?;
    }
    tx.commit().await?;
    Ok(n > 0)
}

fn entry(r: &Row) -> Entry {
    let token_id: Option<String> = r.get(2);
    let token_name: Option<String> = r.get(3);
    Entry {
        id: r.get(0),
        record: Record {
            at: r.get(1),
            token: token_id.map(|id| TokenRef {
                id,
                name: token_name.unwrap_or_default(),
            }),
            method: r.get(4),
            path: r.get(5),
            resource: r.get(6),
            before: from_column(r.get(7)),
            after: from_column(r.get(8)),
        },
    }
}

/// Marks up to `limit` records not shipped yet as shipped, in `tx` (which commits once the
/// sink has them; other nodes skip the rows it locks), and answers them oldest first.
pub(super) async fn ship(tx: &super::db::Tx<'_>, limit: i64) -> Result<Vec<Entry>> {
    let rows = tx
        .query(
            &format!(
                "UPDATE audit SET shipped = true WHERE id = ANY(ARRAY(\
                   SELECT id FROM audit WHERE NOT shipped ORDER BY id LIMIT $1 \
                   FOR UPDATE SKIP LOCKED)) RETURNING {}",
                audit::ENTRY_COLS
            ),
            &[&limit],
        )
        .await?;
    let mut entries: Vec<Entry> = rows.iter().map(entry).collect();
    entries.sort_by_key(|e| e.id);
    Ok(entries)
}

/// Records not shipped yet, for the spool's depth.
pub(super) const UNSHIPPED: &str = "(SELECT COUNT(*) FROM audit WHERE NOT shipped)";

/// Deletes one step of records older than `before` (`shipped_only`: of those shipped to
/// ClickHouse); answers how many went.
pub(super) async fn prune_step(c: &impl Sql, before: Millis, shipped_only: bool) -> Result<u64> {
    c.execute(
        "DELETE FROM audit WHERE id IN \
         (SELECT id FROM audit WHERE at < $1 AND (NOT $3 OR shipped) ORDER BY id LIMIT $2)",
        &[&before, &PRUNE_STEP, &shipped_only],
    )
    .await
}

#[async_trait]
impl AuditTrail for PgStore {
    async fn list_audit(&self, f: AuditFilter, page: PageRequest) -> Result<Page<Entry>> {
        let after = audit::cursor_of(&page.after)?;
        let c = self.db.get("list").await?;
        let sql = audit::list_sql(|n| match n {
            1..=4 => format!("${n}::BIGINT"),
            _ => format!("${n}::TEXT"),
        });
        let rows = c
            .query(
                &sql,
                &[
                    &after,
                    &limit_plus_one(&page),
                    &f.range.from,
                    &f.range.to,
                    &f.token_id,
                    &f.resource,
                ],
            )
            .await?;
        let rows = rows.iter().map(entry).collect();
        Ok(Page::from_rows(rows, page.limit, |e: &Entry| {
            e.id.to_string()
        }))
    }
}
