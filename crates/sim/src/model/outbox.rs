//! The outbox: pending notifications loaded, claimed and their attempts recorded, listed:
//! `store/sqlite/outbox.rs` and `store/postgres/outbox.rs`. Replays are in `replay.rs`.
//!
//! A claim reads every row it is asked for first, as PostgreSQL's one `SELECT … FOR
//! UPDATE` does, then lets `policy::claim_step` decide each and writes the decisions. On a
//! shared store each row carries its lane as the store holds it (`rows::CLAIM_LANE_COLS`);
//! on one node it does not (one node's lanes hold every lane whole). `record` writes an
//! outcome only where `policy::recorded` says the backends' `UPDATE … WHERE` would.

use async_trait::async_trait;

use latch::domain::client::Disabled;
use std::collections::HashMap;

use latch::domain::policy::{ClaimRow, LaneInStore};
use latch::domain::{
    Attempt, Claim, ClaimBatch, EventKind, Millis, Notification, NotificationRef, Outcome,
    SensorId, Status,
};
use latch::store::rules::claim::{Found, Retold};
use latch::store::{
    Error, NotificationFilter, Outbox, Page, PageRequest, ReplayFilter, Result, rules,
};

use super::node::NodeStore;
use super::tables::{Cx, Tables};

impl Tables {
    /// Pending notifications after `after_seq`, in outbox order.
    pub(super) fn load_pending(&self, after_seq: i64) -> Vec<NotificationRef> {
        self.notifications
            .range(after_seq.saturating_add(1)..)
            .map(|(_, r)| &r.notification)
            .filter(|n| n.status == Status::Pending)
            .map(NotificationRef::of)
            .collect()
    }

    /// What the store holds of `n`'s lane besides it, as `CLAIM_LANE_COLS` reads it for
    /// `node`: older pending ones not leased by `node` (their latest lease), the latest
    /// lease of newer pending ones not leased by `node`, and whether a newer state was
    /// delivered or waits (for a state only).
    fn lane_in_store(&self, n: &Notification, node: &str) -> LaneInStore {
        let mut lane = LaneInStore::default();
        let Some(seqs) = self.lanes.get(&(n.sensor_id, n.client_id.clone())) else {
            return lane;
        };
        for seq in seqs.range(..n.seq) {
            let r = &self.notifications[seq];
            if r.notification.status == Status::Pending && r.claimed_by.as_deref() != Some(node) {
                lane.older_pending += 1;
                lane.older_lease_until = lane.older_lease_until.max(r.lease_until);
            }
        }
        for seq in seqs.range(n.seq + 1..) {
            let r = &self.notifications[seq];
            if r.notification.status == Status::Pending && r.claimed_by.as_deref() != Some(node) {
                lane.newer_lease_until = lane.newer_lease_until.max(r.lease_until);
            }
        }
        if n.kind == EventKind::StateChanged {
            for seq in seqs.range(n.seq + 1..) {
                let o = &self.notifications[seq].notification;
                if o.kind == EventKind::StateChanged {
                    lane.newer_state_delivered |= o.status == Status::Delivered;
                    lane.newer_state_pending |= o.status == Status::Pending;
                }
            }
        }
        lane
    }

    /// `CLAIM_COLS`' last column: a newer notification of `n`'s site (`site_id`) for its
    /// client reached it or waits.
    fn newer_site_event(&self, n: &Notification) -> bool {
        let Some(site) = latch::domain::site::named_in(n.body.as_deref()) else {
            return false;
        };
        self.notifications
            .range(n.seq + 1..)
            .map(|(_, r)| &r.notification)
            .any(|m| {
                m.client_id == n.client_id
                    && matches!(m.status, Status::Pending | Status::Delivered)
                    && m.kind.is_site()
                    && latch::domain::site::named_in(m.body.as_deref()).as_deref() == Some(&site)
            })
    }

    /// `CLAIM_COLS`' last column: `n` is a sensor's own, and an older site notification
    /// for its client that names the sensor (`notification_sensors`) is still pending.
    fn older_site_event(&self, n: &Notification) -> bool {
        if latch::domain::site::named_in(n.body.as_deref()).is_some() {
            return false;
        }
        self.notifications
            .range(..n.seq)
            .map(|(_, r)| &r.notification)
            .any(|m| {
                m.client_id == n.client_id
                    && m.status == Status::Pending
                    && m.kind.is_site()
                    && latch::domain::site::sensors_named_in(m.body.as_deref())
                        .contains(&n.sensor_id)
            })
    }

    /// `CLAIM_COLS`: `n` is a site's, and an older own notification about the connection
    /// of a sensor it names, for its client, is still pending.
    fn older_own_event(&self, n: &Notification) -> bool {
        if latch::domain::site::named_in(n.body.as_deref()).is_none() {
            return false;
        }
        let named = latch::domain::site::sensors_named_in(n.body.as_deref());
        self.notifications
            .range(..n.seq)
            .map(|(_, r)| &r.notification)
            .any(|m| {
                m.client_id == n.client_id
                    && m.status == Status::Pending
                    && m.kind.is_connection()
                    && named.contains(&m.sensor_id)
            })
    }

    /// Whether a notification newer than `seq` delivered to `client` told it of
    /// `sensor`'s connection: its own, or a site's naming it.
    fn connection_told_after(&self, client: &str, sensor: SensorId, seq: i64) -> bool {
        self.notifications
            .range(seq + 1..)
            .map(|(_, r)| &r.notification)
            .any(|m| {
                m.client_id == client
                    && m.status == Status::Delivered
                    && ((m.kind.is_connection() && m.sensor_id == sensor)
                        || (latch::domain::site::named_in(m.body.as_deref()).is_some()
                            && latch::domain::site::sensors_named_in(m.body.as_deref())
                                .contains(&sensor)))
            })
    }

    /// `CLAIM_COLS`: `n` is a sensor's own about its connection, and a newer one about it
    /// was delivered to the client.
    fn newer_connection_told(&self, n: &Notification) -> bool {
        latch::domain::site::named_in(n.body.as_deref()).is_none()
            && n.kind.is_connection()
            && self.connection_told_after(&n.client_id, n.sensor_id, n.seq)
    }

    /// `CLAIM_COLS`' last column: the sensors site notification `n` names that a newer
    /// delivered notification told its client of.
    fn overtaken(&self, n: &Notification) -> Vec<SensorId> {
        if latch::domain::site::named_in(n.body.as_deref()).is_none() {
            return Vec::new();
        }
        latch::domain::site::sensors_named_in(n.body.as_deref())
            .into_iter()
            .filter(|s| self.connection_told_after(&n.client_id, *s, n.seq))
            .collect()
    }

    /// `CLAIM_COLS` over `CLAIM_FROM`: the row, its lease and the registry now.
    fn claim_row(&self, seq: i64, node: &str) -> ClaimRow {
        let r = &self.notifications[&seq];
        let n = &r.notification;
        let client = self.clients.get(&n.client_id).map(|c| &c.client);
        ClaimRow {
            notification: n.clone(),
            lease_until: r.lease_until,
            claimed_by: r.claimed_by.clone(),
            url: client.map(|c| c.url.clone()),
            secret: client.map(|c| c.secret.clone()),
            address: self.sensors.get(&n.sensor_id).map(|s| s.address.clone()),
            labels: self
                .sensors
                .get(&n.sensor_id)
                .map(|s| s.labels.clone())
                .unwrap_or_default(),
            linked: self.linked(&n.client_id, n.sensor_id)
                || self.reached(n.alarm_id.as_deref(), &n.client_id),
            previous_secret: client.and_then(|c| c.previous_secret.clone()),
            previous_secret_until: client.and_then(|c| c.previous_secret_until),
            disabled: client.is_some_and(|c| c.disabled_at.is_some()),
            rate_limit: client.and_then(|c| c.rate_limit),
            batch: client.and_then(|c| c.batch),
            receiver: client.map(|c| c.receiver.clone()).unwrap_or_default(),
            newer_site_event: self.newer_site_event(n),
            older_site_event: self.older_site_event(n),
            older_own_event: self.older_own_event(n),
            newer_connection_told: self.newer_connection_told(n),
            overtaken: self.overtaken(n),
            lane: if self.shared {
                self.lane_in_store(n, node)
            } else {
                LaneInStore::default()
            },
        }
    }

    pub(super) fn list_notifications(
        &self,
        f: &NotificationFilter,
        page: &PageRequest,
    ) -> Result<Page<Notification>> {
        let after: Option<i64> = match &page.after {
            Some(cur) => Some(cur.parse().map_err(|_| Error::BadCursor)?),
            None => None,
        };
        let matches = |n: &&Notification| {
            after.is_none_or(|a| if f.newest_first { n.seq < a } else { n.seq > a })
                && f.client_id.as_ref().is_none_or(|c| &n.client_id == c)
                && f.sensor_id.is_none_or(|s| {
                    n.sensor_id == s
                        || latch::domain::site::sensors_named_in(n.body.as_deref()).contains(&s)
                })
                && f.status.is_none_or(|s| n.status == s)
                && f.kind.is_none_or(|k| n.kind == k)
                && f.site_id.as_ref().is_none_or(|site| {
                    latch::domain::site::named_in(n.body.as_deref()).as_ref() == Some(site)
                })
                && f.created.from.is_none_or(|from| n.created_at >= from)
                && f.created.to.is_none_or(|to| n.created_at < to)
        };
        let all = self.notifications.values().map(|r| &r.notification);
        let rows: Vec<Notification> = if f.newest_first {
            all.rev()
                .filter(matches)
                .take(page.limit as usize + 1)
                .cloned()
                .collect()
        } else {
            all.filter(matches)
                .take(page.limit as usize + 1)
                .cloned()
                .collect()
        };
        Ok(Page::from_rows(rows, page.limit, |n| n.seq.to_string()))
    }
}

#[async_trait]
impl Outbox for NodeStore {
    async fn load_pending(&self, after_seq: i64) -> Result<Vec<NotificationRef>> {
        self.run("load_pending", false, |t, _| Ok(t.load_pending(after_seq)))
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
        self.run("claim", true, |t, cx| {
            rules::now_or_never(rules::claim::claim(
                &mut ClaimTables { t, cx },
                ids,
                &node,
                now,
                lease_until,
                batch,
            ))
        })
        .await
    }

    async fn record(
        &self,
        outcomes: Vec<Outcome>,
        now: Millis,
        disable_after: Millis,
    ) -> Result<Vec<Disabled>> {
        self.run("record", true, |t, cx| {
            rules::now_or_never(rules::record::record(
                &mut super::lifecycle::OutcomeTables { t, cx },
                &outcomes,
                now,
                disable_after,
            ))
        })
        .await
    }

    async fn load_client_pending(&self, client_id: String) -> Result<Vec<NotificationRef>> {
        self.run("load_client_pending", false, |t, _| {
            Ok(t.notifications
                .values()
                .map(|r| &r.notification)
                .filter(|n| n.status == Status::Pending && n.client_id == client_id)
                .map(NotificationRef::of)
                .collect())
        })
        .await
    }

    async fn get_notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        self.run("get_notification", false, |t, _| {
            Ok(t.notification(&id).map(|r| {
                let attempts = t.attempts_of(&id).map(|a| a.attempt.clone()).collect();
                (r.notification.clone(), attempts)
            }))
        })
        .await
    }

    async fn list_notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        self.run("list_notifications", false, |t, _| {
            t.list_notifications(&filter, &page)
        })
        .await
    }

    async fn retry_notification(&self, id: String, now: Millis) -> Result<NotificationRef> {
        self.audited(
            "retry_notification",
            None,
            |t, cx| t.retry_notification(cx, &id, now),
            |_, r| Some(r),
        )
        .await
    }

    async fn retry_notifications(
        &self,
        filter: ReplayFilter,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        self.audited(
            "retry_notifications",
            None,
            |t, cx| t.retry_notifications(cx, &filter, now),
            |out, r| Some(r.counted("replayed", out.len())),
        )
        .await
    }

    async fn count_pending(&self) -> Result<u64> {
        self.run("count_pending", false, |t, _| {
            Ok(t.notifications
                .values()
                .filter(|r| r.notification.status == Status::Pending)
                .count() as u64)
        })
        .await
    }
}

/// A claim's tables in the model ([`rules::claim`]): the sequence is latch's own; the
/// rows are read as `CLAIM_COLS` reads them (`Tables::claim_row`).
struct ClaimTables<'a> {
    t: &'a mut Tables,
    cx: &'a Cx,
}

impl rules::claim::ClaimTables for ClaimTables<'_> {
    async fn rows(
        &mut self,
        ids: &[String],
        node: &str,
        _now: Millis,
    ) -> Result<HashMap<String, Found>> {
        Ok(ids
            .iter()
            .filter_map(|id| {
                let seq = self.t.seq(id)?;
                Some((
                    id.clone(),
                    Found::Row(Box::new(self.t.claim_row(seq, node))),
                ))
            })
            .collect())
    }

    async fn supersede(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        // The backends write the status alone: a lease the row had stays.
        for id in ids {
            if let Some(seq) = self.t.seq(id) {
                self.t.set_status(self.cx, seq, Status::Superseded, now);
            }
        }
        Ok(())
    }

    async fn lease(
        &mut self,
        leased: &[(&str, i64)],
        node: &str,
        lease_until: Millis,
    ) -> Result<()> {
        for (_, seq) in leased {
            if let Some(r) = self.t.notifications.get_mut(seq) {
                r.claimed_by = Some(node.to_string());
                r.lease_until = Some(lease_until);
                r.notification.batch_id = None;
                self.t.audit.claimed(self.cx, *seq);
            }
        }
        Ok(())
    }

    async fn retell(&mut self, retold: &[Retold<'_>]) -> Result<()> {
        for r in retold {
            let body = r.body.map(str::to_string);
            if let Some(row) = self.t.notifications.get_mut(&r.seq) {
                row.notification.body = body.clone();
                self.t.audit.retold(r.seq, body);
            }
        }
        Ok(())
    }

    async fn unmark(&mut self, ids: &[&str]) -> Result<()> {
        for id in ids {
            if let Some(seq) = self.t.seq(id) {
                self.t
                    .notifications
                    .get_mut(&seq)
                    .expect("indexed")
                    .notification
                    .batch_id = None;
            }
        }
        Ok(())
    }

    async fn cancel(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        for id in ids {
            if let Some(seq) = self.t.seq(id) {
                self.t.set_status(self.cx, seq, Status::Cancelled, now);
            }
        }
        Ok(())
    }
}
