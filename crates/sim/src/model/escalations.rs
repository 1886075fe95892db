//! Escalation timers, as both backends keep them (`store/sqlite/escalations.rs`,
//! `store/postgres/escalations.rs`): started with an outcome, taken once by a round.

use std::collections::HashSet;

use latch::domain::alarm::{Alarm, AlarmState};
use latch::domain::client::wants;
use latch::domain::{Event, EventKind, Millis, NotificationRef};
use latch::store::Result;
use latch::store::rules::escalations::Timer;

use super::tables::{Cx, Tables};

/// A row of `escalations`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscalationRow {
    pub from: String,
    pub level: u32,
    pub sensor: latch::domain::SensorId,
    pub due_at: Millis,
    pub made_at: Option<Millis>,
    pub closed_at: Option<Millis>,
}

impl Tables {
    /// As the backends' `start_escalations` for one notification.
    pub(crate) fn start_escalation(&mut self, id: &str, now: Millis) {
        let Some(seq) = self.seq(id) else { return };
        let n = &self.notifications[&seq].notification;
        let Some(alarm_id) = n.alarm_id.clone() else {
            return;
        };
        if self
            .alarms
            .get(&alarm_id)
            .is_none_or(|a| a.state != AlarmState::Open)
        {
            return;
        }
        let Some(e) = self
            .clients
            .get(&n.client_id)
            .and_then(|c| c.client.escalation.clone())
        else {
            return;
        };
        if !self.clients.contains_key(&e.to) {
            return;
        }
        let level = self
            .escalations
            .get(&(alarm_id.clone(), n.client_id.clone()))
            .map_or(0, |r| r.level)
            + 1;
        if level > latch::domain::escalation::MAX_LEVELS {
            return;
        }
        let row = EscalationRow {
            from: n.client_id.clone(),
            level,
            sensor: n.sensor_id,
            due_at: now + Millis::from(e.after_s) * 1000,
            made_at: None,
            closed_at: None,
        };
        self.escalations.entry((alarm_id, e.to)).or_insert(row);
    }

    fn timer(&self, key: &(String, String)) -> Timer {
        let r = &self.escalations[key];
        Timer {
            alarm_id: key.0.clone(),
            to: key.1.clone(),
            from: r.from.clone(),
            level: r.level,
            sensor: r.sensor,
        }
    }

    fn wants(&self, client: &str, kind: EventKind) -> Option<bool> {
        self.clients
            .get(client)
            .map(|c| wants(&c.client.events, kind))
    }
}

/// The round's tables in the model ([`latch::store::rules::escalations`]).
pub(super) struct EscalationTables<'a> {
    pub t: &'a mut Tables,
    pub cx: &'a Cx,
}

impl latch::store::rules::escalations::EscalationTables for EscalationTables<'_> {
    async fn due(&mut self, now: Millis, limit: u32) -> Result<Vec<Timer>> {
        let mut keys: Vec<(Millis, (String, String))> = self
            .t
            .escalations
            .iter()
            .filter(|(_, r)| r.made_at.is_none() && r.due_at <= now)
            .map(|(k, r)| (r.due_at, k.clone()))
            .collect();
        keys.sort();
        Ok(keys
            .into_iter()
            .take(limit as usize)
            .map(|(_, k)| self.t.timer(&k))
            .collect())
    }

    async fn resolved(&mut self, limit: u32) -> Result<Vec<Timer>> {
        let t = &*self.t;
        Ok(t.escalations
            .iter()
            .filter(|(k, r)| {
                r.made_at.is_some()
                    && r.closed_at.is_none()
                    && t.alarms
                        .get(&k.0)
                        .is_some_and(|a| a.state == AlarmState::Resolved)
            })
            .take(limit as usize)
            .map(|(k, _)| t.timer(k))
            .collect())
    }

    async fn alarm(&mut self, id: &str) -> Result<Option<Alarm>> {
        Ok(self.t.alarms.get(id).cloned())
    }

    async fn mark(&mut self, timer: &Timer, closed: bool, now: Millis) -> Result<()> {
        if let Some(r) = self
            .t
            .escalations
            .get_mut(&(timer.alarm_id.clone(), timer.to.clone()))
        {
            r.made_at = Some(r.made_at.unwrap_or(now));
            r.closed_at = closed.then_some(now);
        }
        Ok(())
    }

    async fn insert_escalated(
        &mut self,
        timer: &Timer,
        body: &str,
        now: Millis,
    ) -> Result<Option<NotificationRef>> {
        if self.t.wants(&timer.to, EventKind::AlarmEscalated) != Some(true) {
            return Ok(None);
        }
        let e = Event {
            sensor_id: timer.sensor,
            kind: EventKind::AlarmEscalated,
            at: now,
            data: None,
            previous: None,
            last_seen_at: None,
            detail: Default::default(),
        };
        Ok(Some(self.t.make_pending(
            self.cx,
            timer.to.clone(),
            &e,
            Some(body.to_string()),
            Some(timer.alarm_id.clone()),
            now,
        )))
    }

    async fn tell_resolved(
        &mut self,
        timer: &Timer,
        alarm: &Alarm,
        now: Millis,
    ) -> Result<Option<NotificationRef>> {
        let t = &*self.t;
        let resolving = &*latch::store::rules::escalations::RESOLVING;
        let source = t
            .notifications
            .values()
            .rev()
            .map(|r| &r.notification)
            .find(|n| {
                n.alarm_id.as_deref() == Some(alarm.id.as_str())
                    && resolving.contains(&format!("'{}'", n.kind.as_str()))
                    && !n.kind.is_site()
            })
            .cloned();
        let Some(n) = source else { return Ok(None) };
        let told = t.notifications.values().any(|r| {
            let m = &r.notification;
            m.alarm_id == n.alarm_id
                && m.client_id == timer.to
                && m.kind == n.kind
                && m.occurred_at == n.occurred_at
        });
        if told || t.linked(&timer.to, n.sensor_id) || t.wants(&timer.to, n.kind) != Some(true) {
            return Ok(None);
        }
        let e = Event {
            sensor_id: n.sensor_id,
            kind: n.kind,
            at: n.occurred_at,
            data: n.data,
            previous: n.previous,
            last_seen_at: n.last_seen_at,
            detail: n.detail,
        };
        Ok(Some(self.t.make_pending(
            self.cx,
            timer.to.clone(),
            &e,
            n.body.clone(),
            n.alarm_id.clone(),
            now,
        )))
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        self.t.silence_new(self.cx, seqs, now)
    }
}
