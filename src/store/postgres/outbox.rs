//! The outbox: pending notifications loaded, claimed under `FOR UPDATE SKIP LOCKED`,
//! their attempts recorded, listed and retried.

use async_trait::async_trait;

use super::PgStore;
use super::db::{Bound, DB_NOW_MS, Sql, Tx};
use crate::store::rules::claim::{Found, Retold};
use crate::store::{Outbox, ReplayFilter, rules};
use std::collections::HashMap;

use super::super::listing;
use super::super::rows::{
    self as row, ATTEMPT_COLS, CLAIM_COLS, CLAIM_FROM, CLAIM_LANE_COLS, CLAIM_LANE_FROM,
    NOTIF_COLS, REF_COLS,
};
use super::super::{
    Claim, ClaimBatch, Error, NotificationFilter, NotificationRef, Outcome, Page, PageRequest,
    Result, limit_plus_one, notification_ref,
};
use crate::domain::client::Disabled;
use crate::domain::{Attempt, Millis, Notification};

/// Commits the transaction without waiting for its WAL to reach the disk: for claims and
/// recorded attempts, which a crash of the database may lose without harm. A lost lease
/// lets the notification be claimed again, a lost result sends it again (at least once,
/// same `webhook-id`); WAL order still holds, so a later result is never kept without an
/// earlier one. The notifications themselves are committed durably before any is sent.
/// Each wait for the disk took a claim or a record batch's whole round; without them the
/// dispatcher's writes share the flushes the ingest commits make anyway.
async fn relaxed(tx: &Tx<'_>) -> Result<()> {
    tx.batch_execute("SET LOCAL synchronous_commit = off")
        .await?;
    Ok(())
}

/// A claim's tables on PostgreSQL ([`rules::claim`]). Rows another node is claiming
/// right now are skipped, not waited for. Times are the database's: `offset` (learnt from
/// the rows read) puts them on the claiming node's clock, and a lease back on the
/// database's.
struct ClaimTables<'a, 'b> {
    tx: &'a Tx<'b>,
    /// The node's clock minus the database's.
    offset: Millis,
}

impl rules::claim::ClaimTables for ClaimTables<'_, '_> {
    async fn rows(
        &mut self,
        ids: &[String],
        node: &str,
        now: Millis,
    ) -> Result<HashMap<String, Found>> {
        let tx = self.tx;
        let rows = tx
            .query(
                &tx.prepare_cached(&format!(
                    "SELECT {NOTIF_COLS}, {CLAIM_COLS}, {CLAIM_LANE_COLS}, {DB_NOW_MS} FROM \
                     {CLAIM_FROM} {CLAIM_LANE_FROM} WHERE n.id = ANY($1) FOR UPDATE OF n SKIP LOCKED"
                ))
                .await?,
                &[&ids, &node],
            )
            .await?;
        // The node's clock minus the database's (the last column).
        self.offset = rows
            .first()
            .map_or(0, |r| now - r.get::<_, i64>(r.len() - 1));
        let offset = self.offset;
        let mut found = HashMap::with_capacity(ids.len());
        for r in &rows {
            let mut c = row::claim_row(r)?;
            c.lane = row::claim_lane(r)?;
            c.lease_until = c.lease_until.map(|u| u + offset);
            c.lane.older_lease_until = c.lane.older_lease_until.map(|u| u + offset);
            c.lane.newer_lease_until = c.lane.newer_lease_until.map(|u| u + offset);
            found.insert(r.get::<_, String>(0), Found::Row(Box::new(c)));
        }
        if found.len() < ids.len() {
            // Absent from the locked rows: either gone or locked by another node.
            let missing: Vec<&String> = ids.iter().filter(|i| !found.contains_key(*i)).collect();
            let locked = tx
                .query(
                    &tx.prepare_cached("SELECT id FROM notifications WHERE id = ANY($1)")
                        .await?,
                    &[&missing],
                )
                .await?;
            for r in locked {
                found.insert(r.get(0), Found::Locked);
            }
        }
        Ok(found)
    }

    async fn supersede(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        self.set_status(ids, "status = 'superseded', updated_at = $2", now)
            .await
    }

    async fn lease(
        &mut self,
        leased: &[(&str, i64)],
        node: &str,
        lease_until: Millis,
    ) -> Result<()> {
        let ids: Vec<&str> = leased.iter().map(|(id, _)| *id).collect();
        let tx = self.tx;
        tx.execute(
            &tx.prepare_cached(
                "UPDATE notifications SET claimed_by = $2, lease_until = $3, batch_id = NULL \
                 WHERE id = ANY($1)",
            )
            .await?,
            &[&ids, &node, &(lease_until - self.offset)],
        )
        .await?;
        Ok(())
    }

    async fn retell(&mut self, retold: &[Retold<'_>]) -> Result<()> {
        let tx = self.tx;
        for r in retold {
            tx.execute(
                &tx.prepare_cached("UPDATE notifications SET body = $2 WHERE seq = $1")
                    .await?,
                &[&r.seq, &r.body],
            )
            .await?;
            let named: Vec<String> = crate::domain::site::sensors_named_in(r.body)
                .iter()
                .map(|s| s.to_string())
                .collect();
            tx.execute(
                &tx.prepare_cached(
                    "DELETE FROM notification_sensors WHERE seq = $1 AND NOT sensor_id = ANY($2)",
                )
                .await?,
                &[&r.seq, &named],
            )
            .await?;
        }
        Ok(())
    }

    async fn unmark(&mut self, ids: &[&str]) -> Result<()> {
        let tx = self.tx;
        tx.execute(
            &tx.prepare_cached(
                "UPDATE notifications SET batch_id = NULL \
                 WHERE id = ANY($1) AND batch_id IS NOT NULL",
            )
            .await?,
            &[&ids],
        )
        .await?;
        Ok(())
    }

    async fn cancel(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        self.set_status(ids, "status = 'cancelled', updated_at = $2", now)
            .await
    }
}

impl ClaimTables<'_, '_> {
    async fn set_status(&self, ids: &[&str], set: &str, now: Millis) -> Result<()> {
        let tx = self.tx;
        tx.execute(
            &tx.prepare_cached(&unlist(set, "id = ANY($1)")).await?,
            &[&ids, &now],
        )
        .await?;
        Ok(())
    }
}

/// How PostgreSQL writes the console's lists ([`listing`]): its planner weighs the
/// `created_at` range against the walk by `seq` itself.
pub(super) const DIALECT: listing::Dialect = listing::Dialect {
    placeholder: |n| format!("${n}"),
    by_created: "",
};

/// [`listing::Arg`]s as PostgreSQL values ([`refs`] borrows them for a statement).
pub(super) fn args(
    args: Vec<listing::Arg>,
) -> Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> {
    args.into_iter()
        .map(|a| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
            match a {
                listing::Arg::Text(t) => Box::new(t),
                listing::Arg::Int(i) => Box::new(i),
            }
        })
        .collect()
}

pub(super) fn refs(
    args: &[Box<dyn tokio_postgres::types::ToSql + Sync + Send>],
) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
    args.iter()
        .map(|a| a.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect()
}

/// An `UPDATE` of the notifications `filter` selects that ends their pending state
/// (`set` gives the new status), taking them off `notifications_pending` in the same
/// statement, as every change of status out of pending must (migration 0011).
pub(super) fn unlist(set: &str, filter: &str) -> String {
    format!(
        "WITH done AS (UPDATE notifications SET {set} WHERE {filter} RETURNING seq) \
         DELETE FROM notifications_pending WHERE seq IN (SELECT seq FROM done)"
    )
}

#[async_trait]
impl Outbox for PgStore {
    /// Two reads on one connection: the pending seqs from the narrow pending list, then
    /// the notifications of the unknown ones by seq. One pending before the second read
    /// and finished meanwhile is left out by its status, as in [`Outbox::load_pending`].
    /// Nothing known: one read, the join (a full sweep of a large backlog would bind
    /// every pending seq into the second read).
    async fn load_pending_unknown(
        &self,
        after_seq: i64,
        known: std::sync::Arc<std::collections::BTreeSet<i64>>,
    ) -> Result<Vec<NotificationRef>> {
        if known.is_empty() {
            return self.load_pending(after_seq).await;
        }
        let c = self.db.get_for("load_pending_unknown", Bound::Bulk).await?;
        let unknown: Vec<i64> = c
            .query(
                "SELECT seq FROM notifications_pending WHERE seq > $1",
                &[&after_seq],
            )
            .await?
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .filter(|s| !known.contains(s))
            .collect();
        if unknown.is_empty() {
            return Ok(Vec::new());
        }
        let rows = c
            .query(
                &format!(
                    "SELECT {REF_COLS} FROM notifications n \
                     WHERE n.seq = ANY($1) AND n.status = 'pending' ORDER BY n.seq"
                ),
                &[&unknown],
            )
            .await?;
        rows.iter().map(row::pending_ref).collect()
    }

    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>> {
        let c = self.db.get_for("load_pending", Bound::Bulk).await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {REF_COLS} FROM notifications_pending p \
                     JOIN notifications n ON n.seq = p.seq \
                     WHERE n.status = 'pending' AND p.seq > $1 ORDER BY p.seq"
                ),
                &[&after_seq],
            )
            .await?;
        rows.iter().map(row::pending_ref).collect()
    }

    /// Claims on the database's clock: a lease is written as the database's time plus the
    /// lease's length (`lease_until - now`), and the leases read are judged against the
    /// database's time, translated to the claiming node's clock for the policy (which judges
    /// due times and grace periods, written on the nodes' clocks, by `now`). A node whose clock
    /// runs ahead of another's by more than a lease's margin would otherwise take over that
    /// node's attempt in flight.
    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
        batch: Option<ClaimBatch>,
    ) -> Result<Vec<Claim>> {
        let mut c = self.db.get("claim").await?;
        let tx = c.transaction().await?;
        relaxed(&tx).await?;
        let mut tables = ClaimTables { tx: &tx, offset: 0 };
        let mut claims =
            rules::claim::claim(&mut tables, ids, &node, now, lease_until, batch).await?;
        tx.commit().await?;
        crate::store::sealing::open_claims(&self.keys, &mut claims);
        Ok(claims)
    }

    async fn record(
        &self,
        outcomes: Vec<Outcome>,
        now: Millis,
        disable_after: Millis,
    ) -> Result<Vec<Disabled>> {
        let mut c = self.db.get("record").await?;
        let tx = c.transaction().await?;
        relaxed(&tx).await?;
        let disabled = rules::record::record(
            &mut super::lifecycle::OutcomeTables(&tx),
            &outcomes,
            now,
            disable_after,
        )
        .await?;
        tx.commit().await?;
        Ok(disabled)
    }

    async fn load_client_pending(&self, client_id: String) -> Result<Vec<NotificationRef>> {
        let c = self.db.get_for("load_client_pending", Bound::Bulk).await?;
        c.query(
            &format!(
                "SELECT {REF_COLS} FROM notifications_pending p \
                 JOIN notifications n ON n.seq = p.seq \
                 WHERE n.status = 'pending' AND p.client_id = $1 ORDER BY p.seq"
            ),
            &[&client_id],
        )
        .await?
        .iter()
        .map(row::pending_ref)
        .collect()
    }

    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        let c = self.db.get("get_notification").await?;
        let Some(found) = c
            .query_opt(
                &format!("SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = $1"),
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        let n = row::notification(&found)?;
        let attempts = c
            .query(
                &format!(
                    "SELECT {ATTEMPT_COLS} FROM attempts WHERE notification_id = $1 ORDER BY id"
                ),
                &[&id],
            )
            .await?
            .iter()
            .map(|r| row::attempt(r, 0))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((n, attempts)))
    }

    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        let after: Option<i64> = match &page.after {
            Some(cur) => Some(cur.parse().map_err(|_| Error::BadCursor)?),
            None => None,
        };
        let q = listing::notifications(&DIALECT, &filter, after, limit_plus_one(&page));
        let c = self.db.get("list_notifications").await?;
        let args = args(q.args);
        let rows = c.query(&q.sql, &refs(&args)).await?;
        let rows = rows
            .iter()
            .map(row::notification)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |n| n.seq.to_string()))
    }

    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("retry_notification").await?;
        let tx = c.transaction().await?;
        let found = tx
            .query_opt(
                &format!("SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = $1 FOR UPDATE"),
                &[&id],
            )
            .await?
            .ok_or(Error::NotFound("notification"))?;
        let n = row::notification(&found)?;
        if let Some(e) = super::replay::refused(&tx, &n).await? {
            return Err(e);
        }
        super::replay::back_to_pending(&tx, &id, now).await?;
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await?;
        Ok(NotificationRef {
            due_at: now,
            attempts: 0,
            batch_id: None,
            ..notification_ref(&n)
        })
    }

    /// The bulk replay, in one transaction, oldest first: each one is judged as a single
    /// retry would judge it once the older ones went back to pending.
    async fn retry_notifications(
        &self,
        f: ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get_for("retry_notifications", Bound::Bulk).await?;
        let tx = c.transaction().await?;
        if tx
            .query_opt("SELECT 1 FROM clients WHERE id = $1", &[&f.client_id])
            .await?
            .is_none()
        {
            return Err(Error::NotFound("client"));
        }
        let failed = tx
            .query(
                &format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.client_id = $1 \
                     AND n.status = 'failed' AND ($2::text IS NULL OR n.sensor_id = $2) \
                     AND ($3::int8 IS NULL OR n.created_at >= $3) ORDER BY n.seq FOR UPDATE"
                ),
                &[&f.client_id, &f.sensor_id.map(|s| s.to_string()), &f.since],
            )
            .await?
            .iter()
            .map(row::notification)
            .collect::<Result<Vec<_>>>()?;
        let mut out = Vec::new();
        for n in failed {
            if super::replay::refused(&tx, &n).await?.is_some() {
                continue;
            }
            super::replay::back_to_pending(&tx, &n.id, now).await?;
            out.push(NotificationRef {
                due_at: now,
                attempts: 0,
                batch_id: None,
                ..notification_ref(&n)
            });
        }
        let audit = audit.map(|r| r.counted("replayed", out.len()));
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await?;
        Ok(out)
    }

    async fn count_pending(&self) -> Result<u64> {
        let c = self.db.get("count_pending").await?;
        let n: i64 = c
            .query_one("SELECT COUNT(*) FROM notifications_pending", &[])
            .await?
            .get(0);
        Ok(n as u64)
    }
}
