//! Alarms: what a commit reads and writes of them, the API's reads and an
//! acknowledgement, as both backends' statements do (`store/sqlite/alarms.rs`,
//! `store/postgres/alarms.rs`); the acknowledgement's sequence is latch's own
//! (`store::rules::alarms`).

use async_trait::async_trait;

use latch::domain::alarm::{Alarm, AlarmKind, AlarmState, AlarmTotals, Opened, Unresolved};
use latch::domain::client::wants;
use latch::domain::{Event, EventKind, Millis, NotificationRef, SensorId, Status};
use latch::store::rules::{self, alarms::Ack, alarms::Acked, alarms::Told};
use latch::store::{AlarmFilter, Alarms, Page, PageRequest, Result};

use super::node::NodeStore;
use super::registry::page_of;
use super::tables::{Cx, Tables};

impl Tables {
    /// The alarms of `keys` not resolved.
    pub(super) fn unresolved_alarms(&self, keys: &[(SensorId, AlarmKind)]) -> Vec<Unresolved> {
        self.alarms
            .values()
            .filter(|a| a.state != AlarmState::Resolved)
            .filter_map(|a| {
                let sensor = a.sensor_id?;
                keys.contains(&(sensor, a.kind)).then(|| Unresolved {
                    id: a.id.clone(),
                    sensor_id: sensor,
                    kind: a.kind,
                    acknowledged: a.acknowledged_at.is_some(),
                })
            })
            .collect()
    }

    /// Resolves the ones resolved, then inserts the alarms opened, refusing (as the
    /// stores' unique index does) a second unresolved one of a sensor and kind, or an id
    /// taken.
    pub(super) fn write_alarms(
        &mut self,
        opened: &[Opened],
        resolved: &[(String, Millis)],
    ) -> Result<()> {
        for (id, at) in resolved {
            if let Some(a) = self
                .alarms
                .get_mut(id)
                .filter(|a| a.state != AlarmState::Resolved)
            {
                a.state = AlarmState::Resolved;
                a.resolved_at = Some((*at).max(a.opened_at));
            }
        }
        for o in opened {
            let twice = self.alarms.contains_key(&o.id)
                || (o.resolved_at.is_none()
                    && self.alarms.values().any(|a| {
                        a.sensor_id == Some(o.sensor_id)
                            && a.kind == o.kind
                            && a.state != AlarmState::Resolved
                    }));
            if twice {
                return Err(latch::store::Error::Backend(format!(
                    "duplicate key value violates unique constraint (alarm {} of {} {})",
                    o.id,
                    o.sensor_id,
                    o.kind.as_str()
                )));
            }
            self.alarms.insert(
                o.id.clone(),
                Alarm {
                    id: o.id.clone(),
                    kind: o.kind,
                    sensor_id: Some(o.sensor_id),
                    site_id: None,
                    state: match o.resolved_at {
                        Some(_) => AlarmState::Resolved,
                        None => AlarmState::Open,
                    },
                    opened_at: o.at,
                    acknowledged_at: None,
                    acknowledged_by: None,
                    note: None,
                    resolved_at: o.resolved_at,
                },
            );
        }
        Ok(())
    }
}

impl Tables {
    /// The site's `site_down` alarm not resolved.
    pub(super) fn site_alarm(&self, site: &str) -> Option<String> {
        self.alarms
            .values()
            .find(|a| {
                a.site_id.as_deref() == Some(site)
                    && a.kind == AlarmKind::SiteDown
                    && a.state != AlarmState::Resolved
            })
            .map(|a| a.id.clone())
    }

    /// Opens the site's `site_down` alarm.
    pub(super) fn open_site_alarm(&mut self, id: &str, site: &str, at: Millis) {
        self.alarms.insert(
            id.to_string(),
            Alarm {
                id: id.to_string(),
                kind: AlarmKind::SiteDown,
                sensor_id: None,
                site_id: Some(site.to_string()),
                state: AlarmState::Open,
                opened_at: at,
                acknowledged_at: None,
                acknowledged_by: None,
                note: None,
                resolved_at: None,
            },
        );
    }

    /// Names alarm `id` on notification `seq` (and in its trail).
    pub(super) fn name_alarm(&mut self, seq: i64, id: &str) {
        if let Some(r) = self.notifications.get_mut(&seq) {
            r.notification.alarm_id = Some(id.to_string());
        }
        self.audit.named(seq, id);
    }
}

/// The alarms' table for a sequence's tables over the model (`t`, `cx`): the group
/// commit's and a site's decision's.
macro_rules! alarm_tables {
    ($t:ty) => {
        impl latch::store::rules::alarms::AlarmTables for $t {
            fn new_alarm_id(&mut self) -> String {
                self.t.new_notification_id(self.cx.now)
            }

            async fn unresolved_alarms(
                &mut self,
                keys: &[(latch::domain::SensorId, latch::domain::alarm::AlarmKind)],
            ) -> latch::store::Result<Vec<latch::domain::alarm::Unresolved>> {
                Ok(self.t.unresolved_alarms(keys))
            }

            async fn write_alarms(
                &mut self,
                opened: &[latch::domain::alarm::Opened],
                resolved: &[(String, latch::domain::Millis)],
            ) -> latch::store::Result<()> {
                self.t.write_alarms(opened, resolved)
            }

            async fn site_alarm(&mut self, site: &str) -> latch::store::Result<Option<String>> {
                Ok(self.t.site_alarm(site))
            }

            async fn open_site_alarm(
                &mut self,
                id: &str,
                site: &str,
                at: latch::domain::Millis,
            ) -> latch::store::Result<()> {
                self.t.open_site_alarm(id, site, at);
                Ok(())
            }

            async fn name_alarm(&mut self, seq: i64, id: &str) -> latch::store::Result<()> {
                self.t.name_alarm(seq, id);
                Ok(())
            }
        }
    };
}
pub(super) use alarm_tables;

/// An acknowledgement's tables in the model.
struct AckTables<'a> {
    t: &'a mut Tables,
    cx: &'a Cx,
}

impl rules::alarms::AckTables for AckTables<'_> {
    async fn alarm(&mut self, id: &str) -> Result<Option<Alarm>> {
        Ok(self.t.alarms.get(id).cloned())
    }

    async fn acknowledge(&mut self, id: &str, ack: &Ack, now: Millis) -> Result<()> {
        self.t.acks_applied.insert(id.to_string(), self.cx.now);
        if let Some(a) = self.t.alarms.get_mut(id) {
            a.state = AlarmState::Acknowledged;
            a.acknowledged_at = Some(now);
            a.acknowledged_by = Some(ack.by.clone());
            a.note = ack.note.clone();
        }
        Ok(())
    }

    async fn quiet_reminders(&mut self, id: &str, now: Millis) -> Result<()> {
        let quiet: Vec<i64> = self
            .t
            .notifications
            .values()
            .filter(|r| {
                let n = &r.notification;
                n.alarm_id.as_deref() == Some(id)
                    && n.status == Status::Pending
                    && (n.kind == EventKind::StillLost
                        || (n.kind == EventKind::StateHeld && n.detail.reminder.is_some()))
                    && r.lease_until.is_none_or(|until| until < now)
            })
            .map(|r| r.notification.seq)
            .collect();
        for seq in quiet {
            self.t.set_status(self.cx, seq, Status::Superseded, now);
        }
        Ok(())
    }

    async fn told(&mut self, id: &str) -> Result<Vec<Told>> {
        let mut rows: Vec<(String, i64, SensorId)> = self
            .t
            .notifications
            .values()
            .map(|r| &r.notification)
            .filter(|n| {
                n.alarm_id.as_deref() == Some(id)
                    && !matches!(n.status, Status::Silenced | Status::Cancelled)
                    && n.kind != EventKind::AlarmAcknowledged
                    && self.t.clients.contains_key(&n.client_id)
                    && (self.t.links.contains(&(n.sensor_id, n.client_id.clone()))
                        || self.t.reached(n.alarm_id.as_deref(), &n.client_id))
                    && self
                        .t
                        .clients
                        .get(&n.client_id)
                        .is_none_or(|c| wants(&c.client.events, EventKind::AlarmAcknowledged))
            })
            .map(|n| (n.client_id.clone(), n.seq, n.sensor_id))
            .collect();
        rows.sort();
        Ok(rules::alarms::first_of_each(
            rows.into_iter()
                .map(|(c, _, s)| (c, s.to_string()))
                .collect(),
        ))
    }

    async fn silence_new(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> Result<std::collections::HashSet<i64>> {
        self.t.silence_new(self.cx, seqs, now)
    }

    async fn insert_ack(
        &mut self,
        to: &Told,
        id: &str,
        body: &str,
        now: Millis,
    ) -> Result<NotificationRef> {
        let e = Event {
            sensor_id: to.lane,
            kind: EventKind::AlarmAcknowledged,
            at: now,
            data: None,
            previous: None,
            last_seen_at: None,
            detail: Default::default(),
        };
        Ok(self.t.make_pending(
            self.cx,
            to.client_id.clone(),
            &e,
            Some(body.to_string()),
            Some(id.to_string()),
            now,
        ))
    }
}

#[async_trait]
impl Alarms for NodeStore {
    async fn escalate(&self, now: Millis) -> Result<Vec<NotificationRef>> {
        self.run("escalate", true, |t, cx| {
            rules::now_or_never(rules::escalations::escalate(
                &mut super::escalations::EscalationTables { t, cx },
                now,
            ))
        })
        .await
    }

    async fn list_alarms(&self, f: AlarmFilter, page: PageRequest) -> Result<Page<Alarm>> {
        self.run("list_alarms", false, |t, _| {
            let rows = t
                .alarms
                .values()
                .rev()
                .filter(|a| {
                    page.after
                        .as_deref()
                        .is_none_or(|x| x.is_empty() || a.id.as_str() < x)
                })
                .filter(|a| f.state.is_none_or(|s| a.state == s))
                .filter(|a| f.kind.is_none_or(|k| a.kind == k))
                .filter(|a| f.sensor_id.is_none_or(|s| a.sensor_id == Some(s)))
                .filter(|a| {
                    f.site_id
                        .as_ref()
                        .is_none_or(|s| a.site_id.as_ref() == Some(s))
                })
                .cloned();
            Ok(page_of(rows, &page, |a| a.id.clone()))
        })
        .await
    }

    async fn get_alarm(&self, id: String) -> Result<Option<(Alarm, Vec<String>)>> {
        self.run("get_alarm", false, |t, _| {
            Ok(t.alarms.get(&id).cloned().map(|a| {
                let ids = t
                    .notifications
                    .values()
                    .filter(|r| r.notification.alarm_id.as_deref() == Some(id.as_str()))
                    .map(|r| r.notification.id.clone())
                    .collect();
                (a, ids)
            }))
        })
        .await
    }

    async fn alarm_totals(&self) -> Result<AlarmTotals> {
        self.run("alarm_totals", false, |t, _| {
            let mut groups: std::collections::BTreeMap<(&str, &str), (i64, i64)> =
                Default::default();
            for a in t
                .alarms
                .values()
                .filter(|a| a.state != AlarmState::Resolved)
            {
                let g = groups
                    .entry((a.kind.as_str(), a.state.as_str()))
                    .or_insert((0, a.opened_at));
                g.0 += 1;
                g.1 = g.1.min(a.opened_at);
            }
            Ok(AlarmTotals::of(groups.into_iter().map(
                |((k, s), (n, o))| (k.to_string(), s.to_string(), n, o),
            )))
        })
        .await
    }

    async fn ack_alarm(&self, id: String, ack: Ack, now: Millis) -> Result<Acked> {
        self.audited(
            "ack_alarm",
            None,
            |t, cx| {
                rules::now_or_never(rules::alarms::acknowledge(
                    &mut AckTables { t, cx },
                    &id,
                    &ack,
                    now,
                ))
            },
            |a, r| matches!(a, Acked::Taken(..)).then_some(r),
        )
        .await
    }
}
