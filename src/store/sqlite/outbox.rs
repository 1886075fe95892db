//! The outbox: pending notifications loaded, claimed, their attempts recorded, listed and
//! retried.

use async_trait::async_trait;

use super::SqliteStore;
use std::collections::HashMap;

use crate::store::rules::claim::{Found, Retold};
use crate::store::{Outbox, ReplayFilter, rules};
use rusqlite::{OptionalExtension, params};

use super::super::listing;
use super::super::rows::{self as row, ATTEMPT_COLS, CLAIM_COLS, CLAIM_FROM, NOTIF_COLS, REF_COLS};
use super::super::{
    Claim, ClaimBatch, Error, NotificationFilter, NotificationRef, Outcome, Page, PageRequest,
    Result, limit_plus_one, notification_ref,
};
use crate::domain::client::Disabled;
use crate::domain::{Attempt, Millis, Notification};

/// How SQLite writes the console's lists ([`listing`]).
pub(super) const DIALECT: listing::Dialect = listing::Dialect {
    placeholder: |n| format!("?{n}"),
    by_created: " INDEXED BY notifications_by_created",
};

/// [`listing::Arg`]s as SQLite values.
pub(super) fn args(args: Vec<listing::Arg>) -> Vec<rusqlite::types::Value> {
    args.into_iter()
        .map(|a| match a {
            listing::Arg::Text(t) => rusqlite::types::Value::Text(t),
            listing::Arg::Int(i) => rusqlite::types::Value::Integer(i),
        })
        .collect()
}

/// A claim's tables on SQLite ([`rules::claim`]): one writer, so no row is ever another
/// node's at the moment, and every statement from the connection's cache.
struct ClaimTables<'a>(&'a rusqlite::Transaction<'a>);

impl rules::claim::ClaimTables for ClaimTables<'_> {
    async fn rows(
        &mut self,
        ids: &[String],
        _node: &str,
        _now: Millis,
    ) -> Result<HashMap<String, Found>> {
        let mut select = self.0.prepare_cached(&format!(
            "SELECT {NOTIF_COLS}, {CLAIM_COLS} FROM {CLAIM_FROM} WHERE n.id = ?1"
        ))?;
        let mut found = HashMap::with_capacity(ids.len());
        for id in ids {
            // One node: its lanes hold every lane whole, so the store never finds one
            // behind (`ClaimRow::lane` is left empty).
            if let Some(row) = select.query_row([id], |r| row::claim_row(r)).optional()? {
                found.insert(id.clone(), Found::Row(Box::new(row)));
            }
        }
        Ok(found)
    }

    async fn supersede(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        self.set_status(ids, "superseded", now)
    }

    async fn lease(
        &mut self,
        leased: &[(&str, i64)],
        node: &str,
        lease_until: Millis,
    ) -> Result<()> {
        // By the row the select just read (`seq` is its rowid): no second look-up of the
        // id in its index.
        let mut lease = self.0.prepare_cached(
            "UPDATE notifications SET claimed_by = ?2, lease_until = ?3, batch_id = NULL \
             WHERE seq = ?1",
        )?;
        for (_, seq) in leased {
            lease.execute(params![seq, node, lease_until])?;
        }
        Ok(())
    }

    /// A site's notification's new body over the old, and `notification_sensors` kept to
    /// the sensors it still names.
    async fn retell(&mut self, retold: &[Retold<'_>]) -> Result<()> {
        let tx = self.0;
        for r in retold {
            tx.execute(
                "UPDATE notifications SET body = ?2 WHERE seq = ?1",
                params![r.seq, r.body],
            )?;
            tx.execute("DELETE FROM notification_sensors WHERE seq = ?1", [r.seq])?;
            super::site_rows::name_sensors(tx, r.seq, r.body)?;
        }
        Ok(())
    }

    async fn unmark(&mut self, ids: &[&str]) -> Result<()> {
        let mut unmark = self.0.prepare_cached(
            "UPDATE notifications SET batch_id = NULL WHERE id = ?1 AND batch_id IS NOT NULL",
        )?;
        for id in ids {
            unmark.execute([id])?;
        }
        Ok(())
    }

    async fn cancel(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        self.set_status(ids, "cancelled", now)
    }
}

impl ClaimTables<'_> {
    fn set_status(&self, ids: &[&str], status: &str, now: Millis) -> Result<()> {
        let mut update = self.0.prepare_cached(
            "UPDATE notifications SET status = ?2, updated_at = ?3 WHERE id = ?1",
        )?;
        for id in ids {
            update.execute(params![id, status, now])?;
        }
        Ok(())
    }
}

#[async_trait]
impl Outbox for SqliteStore {
    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>> {
        self.read(move |c| {
            let rows = c
                .prepare(&format!(
                    "SELECT {REF_COLS} FROM notifications n \
                     WHERE n.status = 'pending' AND n.seq > ?1 ORDER BY n.seq"
                ))?
                .query_map([after_seq], |r| row::pending_ref(r))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    async fn claim(
        &self,
        ids: Vec<String>,
        node: String,
        now: Millis,
        lease_until: Millis,
        batch: Option<ClaimBatch>,
    ) -> Result<Vec<Claim>> {
        // Every lease is released at open: a lost one costs nothing.
        let mut claims = self
            .write_relaxed(move |c| {
                let tx = c.transaction()?;
                let out = rules::now_or_never(rules::claim::claim(
                    &mut ClaimTables(&tx),
                    ids,
                    &node,
                    now,
                    lease_until,
                    batch,
                ))?;
                tx.commit()?;
                Ok(out)
            })
            .await?;
        // Off the writer: it is not held for the opening.
        crate::store::sealing::open_claims(&self.inner.keys, &mut claims);
        Ok(claims)
    }

    async fn record(
        &self,
        outcomes: Vec<Outcome>,
        now: Millis,
        disable_after: Millis,
    ) -> Result<Vec<Disabled>> {
        self.write_relaxed(move |c| {
            let tx = c.transaction()?;
            let mut tables = super::lifecycle::OutcomeTables(&tx);
            let disabled = rules::now_or_never(rules::record::record(
                &mut tables,
                &outcomes,
                now,
                disable_after,
            ))?;
            tx.commit()?;
            Ok(disabled)
        })
        .await
    }

    async fn load_client_pending(&self, client_id: String) -> Result<Vec<NotificationRef>> {
        self.read(move |c| {
            let rows = c
                .prepare(&format!(
                    "SELECT {REF_COLS} FROM notifications n \
                     WHERE n.status = 'pending' AND n.client_id = ?1 ORDER BY n.seq"
                ))?
                .query_map([client_id], |r| row::pending_ref(r))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        self.read(move |c| {
            let Some(n) = c
                .prepare_cached(&format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = ?1"
                ))?
                .query_row([&id], |r| row::notification(r))
                .optional()?
            else {
                return Ok(None);
            };
            let attempts = c
                .prepare_cached(&format!(
                    "SELECT {ATTEMPT_COLS} FROM attempts WHERE notification_id = ?1 ORDER BY id"
                ))?
                .query_map([&id], |r| row::attempt(r, 0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some((n, attempts)))
        })
        .await
    }

    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        self.read(move |c| {
            let after: Option<i64> = match &page.after {
                Some(cur) => Some(cur.parse().map_err(|_| Error::BadCursor)?),
                None => None,
            };
            let q = listing::notifications(&DIALECT, &filter, after, limit_plus_one(&page));
            let rows = c
                .prepare_cached(&q.sql)?
                .query_map(rusqlite::params_from_iter(args(q.args)), |r| {
                    row::notification(r)
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |n| n.seq.to_string()))
        })
        .await
    }

    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx
                .prepare_cached(&format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.id = ?1"
                ))?
                .query_row([&id], |r| row::notification(r))
                .optional()?
                .ok_or(Error::NotFound("notification"))?;
            if let Some(e) = super::replay::refused(&tx, &n)? {
                return Err(e);
            }
            super::replay::back_to_pending(&tx, &id, now)?;
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(NotificationRef {
                due_at: now,
                attempts: 0,
                batch_id: None,
                ..notification_ref(&n)
            })
        })
        .await
    }

    /// The bulk replay, in one transaction, oldest first: each one is judged as a single
    /// retry would judge it once the older ones went back to pending.
    async fn retry_notifications(
        &self,
        f: ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            if !super::lifecycle::client_exists(&tx, &f.client_id)? {
                return Err(Error::NotFound("client"));
            }
            let failed = tx
                .prepare(&format!(
                    "SELECT {NOTIF_COLS} FROM notifications n WHERE n.client_id = ?1 \
                     AND n.status = 'failed' AND (?2 IS NULL OR n.sensor_id = ?2) \
                     AND (?3 IS NULL OR n.created_at >= ?3) ORDER BY n.seq"
                ))?
                .query_map(
                    params![f.client_id, f.sensor_id.map(|s| s.to_string()), f.since],
                    |r| row::notification(r),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut out = Vec::new();
            for n in failed {
                if super::replay::refused(&tx, &n)?.is_some() {
                    continue;
                }
                super::replay::back_to_pending(&tx, &n.id, now)?;
                out.push(NotificationRef {
                    due_at: now,
                    attempts: 0,
                    batch_id: None,
                    ..notification_ref(&n)
                });
            }
            let audit = audit.map(|r| r.counted("replayed", out.len()));
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(out)
        })
        .await
    }

    async fn count_pending(&self) -> Result<u64> {
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT COUNT(*) FROM notifications WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }
}
