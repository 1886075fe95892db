//! The escalation round's tables ([`rules::escalations`]): the timers taken with `FOR
//! UPDATE SKIP LOCKED`, so rounds on several nodes share them and make each once; the
//! alarm read `FOR SHARE`, so an acknowledgement waits for the round or the round for it.

use std::collections::HashSet;

use super::db::{Sql, Tx};
use crate::domain::alarm::Alarm;
use crate::domain::notification::new_notification_id;
use crate::domain::{EventKind, Millis, NotificationRef, SensorId};
use crate::store::Result;
use crate::store::rows::{self, ALARM_COLS};
use crate::store::rules::escalations::{EscalationTables, RESOLVING, Timer};

pub(super) struct Tables<'a, 'b> {
    pub tx: &'a Tx<'b>,
}

fn timers(rows: Vec<tokio_postgres::Row>) -> Vec<Timer> {
    rows.iter()
        .filter_map(|r| {
            Some(Timer {
                alarm_id: r.get(0),
                to: r.get(1),
                from: r.get(2),
                level: r.get::<_, i32>(3).max(0) as u32,
                sensor: SensorId::parse(r.get(4)).ok()?,
            })
        })
        .collect()
}

/// The pending notification `INSERT … RETURNING seq, sensor_id, kind` made, listed as
/// pending in the same statement (migration 0011).
const LISTED: &str = "listed AS (INSERT INTO notifications_pending (seq, sensor_id, client_id) \
     SELECT seq, sensor_id, client_id FROM ins) SELECT seq, sensor_id, kind FROM ins";

fn made(
    row: Option<tokio_postgres::Row>,
    id: String,
    to: &str,
    now: Millis,
) -> Option<NotificationRef> {
    let r = row?;
    Some(NotificationRef {
        id,
        seq: r.get(0),
        client_id: to.to_string(),
        sensor_id: SensorId::parse(r.get(1)).ok()?,
        kind: EventKind::parse(r.get(2))?,
        due_at: now,
        attempts: 0,
        batch_id: None,
    })
}

impl EscalationTables for Tables<'_, '_> {
    async fn due(&mut self, now: Millis, limit: u32) -> Result<Vec<Timer>> {
        let rows = self
            .tx
            .query(
                "SELECT alarm_id, to_client, from_client, level, sensor_id FROM escalations \
                 WHERE made_at IS NULL AND due_at <= $1 ORDER BY due_at, alarm_id LIMIT $2 \
                 FOR UPDATE SKIP LOCKED",
                &[&now, &i64::from(limit)],
            )
            .await?;
        Ok(timers(rows))
    }

    async fn resolved(&mut self, limit: u32) -> Result<Vec<Timer>> {
        let rows = self
            .tx
            .query(
                "SELECT e.alarm_id, e.to_client, e.from_client, e.level, e.sensor_id \
                 FROM escalations e JOIN alarms a ON a.id = e.alarm_id \
                 WHERE e.made_at IS NOT NULL AND e.closed_at IS NULL AND a.state = 'resolved' \
                 ORDER BY e.alarm_id, e.to_client LIMIT $1 FOR UPDATE OF e SKIP LOCKED",
                &[&i64::from(limit)],
            )
            .await?;
        Ok(timers(rows))
    }

    async fn alarm(&mut self, id: &str) -> Result<Option<Alarm>> {
        let row = self
            .tx
            .query_opt(
                &format!("SELECT {ALARM_COLS} FROM alarms a WHERE a.id = $1 FOR SHARE"),
                &[&id],
            )
            .await?;
        row.as_ref().map(rows::alarm).transpose()
    }

    async fn mark(&mut self, timer: &Timer, closed: bool, now: Millis) -> Result<()> {
        self.tx
            .execute(
                "UPDATE escalations SET made_at = COALESCE(made_at, $3), \
                 closed_at = CASE WHEN $4 THEN $3 END WHERE alarm_id = $1 AND to_client = $2",
                &[&timer.alarm_id, &timer.to, &now, &closed],
            )
            .await?;
        Ok(())
    }

    async fn insert_escalated(
        &mut self,
        timer: &Timer,
        body: &str,
        now: Millis,
    ) -> Result<Option<NotificationRef>> {
        let id = new_notification_id();
        let kind = EventKind::AlarmEscalated.as_str();
        let row = self
            .tx
            .query_opt(
                &format!(
                    "WITH ins AS (INSERT INTO notifications (id, client_id, sensor_id, kind, \
                     occurred_at, status, attempts, next_attempt_at, created_at, updated_at, \
                     body, alarm_id) \
                     SELECT $1, c.id, $3, $4, $5, 'pending', 0, $5, $5, $5, $6, $7 \
                     FROM clients c WHERE c.id = $2 \
                     AND (c.events IS NULL OR strpos(',' || c.events || ',', ',' || $4 || ',') > 0) \
                     RETURNING seq, sensor_id, client_id, kind), {LISTED}"
                ),
                &[
                    &id,
                    &timer.to,
                    &timer.sensor.to_string(),
                    &kind,
                    &now,
                    &body,
                    &timer.alarm_id,
                ],
            )
            .await?;
        Ok(made(row, id, &timer.to, now))
    }

    async fn tell_resolved(
        &mut self,
        timer: &Timer,
        _alarm: &Alarm,
        now: Millis,
    ) -> Result<Option<NotificationRef>> {
        let id = new_notification_id();
        let row = self
            .tx
            .query_opt(
                &format!(
                    "WITH ins AS (INSERT INTO notifications (id, client_id, sensor_id, kind, \
                     data, previous, occurred_at, last_seen_at, status, attempts, \
                     next_attempt_at, created_at, updated_at, lost_since, reminder, \
                     flips_suppressed, battery, threshold, fault, window_s, body, alarm_id) \
                     SELECT $1, c.id, n.sensor_id, n.kind, n.data, n.previous, n.occurred_at, \
                     n.last_seen_at, 'pending', 0, $4, $4, $4, n.lost_since, n.reminder, \
                     n.flips_suppressed, n.battery, n.threshold, n.fault, n.window_s, n.body, \
                     n.alarm_id FROM notifications n JOIN clients c ON c.id = $2 \
                     WHERE n.alarm_id = $3 AND n.kind IN ({resolving}) AND n.site_id IS NULL \
                     AND n.kind NOT IN ('alarm.acknowledged', 'alarm.escalated') \
                     AND NOT EXISTS (SELECT 1 FROM links l \
                      WHERE l.client_id = c.id AND l.sensor_id = n.sensor_id) \
                     AND NOT EXISTS (SELECT 1 FROM notifications m \
                      WHERE m.alarm_id = n.alarm_id AND m.client_id = c.id AND m.kind = n.kind \
                      AND m.occurred_at = n.occurred_at) \
                     AND (c.events IS NULL \
                      OR strpos(',' || c.events || ',', ',' || n.kind || ',') > 0) \
                     ORDER BY n.seq DESC LIMIT 1 \
                     RETURNING seq, sensor_id, client_id, kind), {LISTED}",
                    resolving = *RESOLVING
                ),
                &[&id, &timer.to, &timer.alarm_id, &now],
            )
            .await?;
        Ok(made(row, id, &timer.to, now))
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        super::silences::silence_new(self.tx, seqs, now).await
    }
}
