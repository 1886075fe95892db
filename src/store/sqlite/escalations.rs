//! The escalation round's tables ([`rules::escalations`]).

use std::collections::HashSet;

use rusqlite::{OptionalExtension, Transaction, params};

use crate::domain::alarm::Alarm;
use crate::domain::notification::new_notification_id;
use crate::domain::{EventKind, Millis, NotificationRef, SensorId};
use crate::store::Result;
use crate::store::rules::escalations::{EscalationTables, RESOLVING, Timer};

/// The writer's transaction (SQLite has one writer: what it reads is taken).
pub(super) struct Tables<'a> {
    pub tx: &'a Transaction<'a>,
}

fn timers(tx: &Transaction, sql: &str, p: impl rusqlite::Params) -> Result<Vec<Timer>> {
    let rows = tx
        .prepare_cached(sql)?
        .query_map(p, |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, u32>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows
        .into_iter()
        .filter_map(|(alarm_id, to, from, level, sensor)| {
            Some(Timer {
                alarm_id,
                to,
                from,
                level,
                sensor: SensorId::parse(&sensor).ok()?,
            })
        })
        .collect())
}

/// The notification inserted by `sql` (`RETURNING seq`), as a reference.
fn made(
    seq: Option<i64>,
    id: String,
    timer: &Timer,
    kind: EventKind,
    now: Millis,
) -> Option<NotificationRef> {
    Some(NotificationRef {
        id,
        seq: seq?,
        client_id: timer.to.clone(),
        sensor_id: timer.sensor,
        kind,
        due_at: now,
        attempts: 0,
        batch_id: None,
    })
}

impl EscalationTables for Tables<'_> {
    async fn due(&mut self, now: Millis, limit: u32) -> Result<Vec<Timer>> {
        timers(
            self.tx,
            "SELECT alarm_id, to_client, from_client, level, sensor_id FROM escalations \
             WHERE made_at IS NULL AND due_at <= ?1 ORDER BY due_at, alarm_id LIMIT ?2",
            params![now, limit],
        )
    }

    async fn resolved(&mut self, limit: u32) -> Result<Vec<Timer>> {
        timers(
            self.tx,
            "SELECT e.alarm_id, e.to_client, e.from_client, e.level, e.sensor_id \
             FROM escalations e JOIN alarms a ON a.id = e.alarm_id \
             WHERE e.made_at IS NOT NULL AND e.closed_at IS NULL AND a.state = 'resolved' \
             ORDER BY e.alarm_id, e.to_client LIMIT ?1",
            params![limit],
        )
    }

    async fn alarm(&mut self, id: &str) -> Result<Option<Alarm>> {
        super::alarms::one(self.tx, id)
    }

    async fn mark(&mut self, timer: &Timer, closed: bool, now: Millis) -> Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE escalations SET made_at = COALESCE(made_at, ?3), \
                 closed_at = CASE WHEN ?4 THEN ?3 END WHERE alarm_id = ?1 AND to_client = ?2",
            )?
            .execute(params![timer.alarm_id, timer.to, now, closed])?;
        Ok(())
    }

    async fn insert_escalated(
        &mut self,
        timer: &Timer,
        body: &str,
        now: Millis,
    ) -> Result<Option<NotificationRef>> {
        let id = new_notification_id();
        let kind = EventKind::AlarmEscalated;
        let seq: Option<i64> = self
            .tx
            .prepare_cached(
                "INSERT INTO notifications (id, client_id, sensor_id, kind, occurred_at, status, \
                 attempts, next_attempt_at, created_at, updated_at, body, alarm_id) \
                 SELECT ?1, c.id, ?3, ?4, ?5, 'pending', 0, ?5, ?5, ?5, ?6, ?7 FROM clients c \
                 WHERE c.id = ?2 \
                 AND (c.events IS NULL OR instr(',' || c.events || ',', ',' || ?4 || ',') > 0) \
                 RETURNING seq",
            )?
            .query_row(
                params![
                    id,
                    timer.to,
                    timer.sensor.to_string(),
                    kind.as_str(),
                    now,
                    body,
                    timer.alarm_id
                ],
                |r| r.get(0),
            )
            .optional()?;
        Ok(made(seq, id, timer, kind, now))
    }

    async fn tell_resolved(
        &mut self,
        timer: &Timer,
        _alarm: &Alarm,
        now: Millis,
    ) -> Result<Option<NotificationRef>> {
        let id = new_notification_id();
        let row: Option<(i64, String, String)> = self
            .tx
            .prepare_cached(&format!(
                "INSERT INTO notifications (id, client_id, sensor_id, kind, data, previous, \
                 occurred_at, last_seen_at, status, attempts, next_attempt_at, created_at, \
                 updated_at, lost_since, reminder, flips_suppressed, battery, threshold, fault, \
                 window_s, body, alarm_id) \
                 SELECT ?1, c.id, n.sensor_id, n.kind, n.data, n.previous, n.occurred_at, \
                 n.last_seen_at, 'pending', 0, ?4, ?4, ?4, n.lost_since, n.reminder, \
                 n.flips_suppressed, n.battery, n.threshold, n.fault, n.window_s, n.body, \
                 n.alarm_id FROM notifications n JOIN clients c ON c.id = ?2 \
                 WHERE n.alarm_id = ?3 AND n.kind IN ({resolving}) AND n.site_id IS NULL \
                 AND n.kind NOT IN ('alarm.acknowledged', 'alarm.escalated') \
                 AND NOT EXISTS (SELECT 1 FROM links l \
                  WHERE l.client_id = c.id AND l.sensor_id = n.sensor_id) \
                 AND NOT EXISTS (SELECT 1 FROM notifications m \
                  WHERE m.alarm_id = n.alarm_id AND m.client_id = c.id AND m.kind = n.kind \
                  AND m.occurred_at = n.occurred_at) \
                 AND (c.events IS NULL OR instr(',' || c.events || ',', ',' || n.kind || ',') > 0) \
                 ORDER BY n.seq DESC LIMIT 1 RETURNING seq, sensor_id, kind",
                resolving = *RESOLVING
            ))?
            .query_row(params![id, timer.to, timer.alarm_id, now], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()?;
        Ok(row.and_then(|(seq, sensor, kind)| {
            Some(NotificationRef {
                id,
                seq,
                client_id: timer.to.clone(),
                sensor_id: SensorId::parse(&sensor).ok()?,
                kind: EventKind::parse(&kind)?,
                due_at: now,
                attempts: 0,
                batch_id: None,
            })
        }))
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        super::silences::silence_new(self.tx, seqs, now)
    }
}
