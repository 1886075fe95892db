//! Recording's tables: the attempts, the notifications' results, and each client's failure
//! streak, kept as attempts are recorded (the sequence and the disabling are
//! `store::rules::record`'s).

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::super::{Outcome, Result};
use crate::domain::Millis;
use crate::domain::client::DisabledReason;
use crate::domain::policy::ClientAttempts;
use crate::store::rules::{self, record::Held, record::Recorded};

/// Whether the client exists.
pub(super) fn client_exists(c: &Connection, id: &str) -> Result<bool> {
    Ok(c.query_row(
        "SELECT EXISTS (SELECT 1 FROM clients WHERE id = ?1)",
        [id],
        |r| r.get(0),
    )?)
}

/// Recording's tables on SQLite ([`rules::record`]), in the recording transaction. Every
/// statement comes from the connection's cache: this runs with every batch of recorded
/// outcomes, and parsing the streak's update anew each time was ~1.3 % of delivery's CPU
/// (BENCHMARKS.md, #53).
pub(super) struct OutcomeTables<'a>(pub &'a Transaction<'a>);

impl rules::record::OutcomeTables for OutcomeTables<'_> {
    async fn held(&mut self, ids: &[&str], now: Millis) -> Result<(HashMap<String, Held>, Millis)> {
        let mut q = self.0.prepare_cached(
            "SELECT status = 'pending', claimed_by, lease_until, alarm_id IS NOT NULL \
             FROM notifications WHERE id = ?1",
        )?;
        let mut held = HashMap::with_capacity(ids.len());
        for id in ids {
            let row = q
                .query_row([id], |r| {
                    Ok(Held {
                        pending: r.get(0)?,
                        claimed_by: r.get(1)?,
                        lease_until: r.get(2)?,
                        alarm: r.get(3)?,
                    })
                })
                .optional()?;
            if let Some(h) = row {
                held.insert(id.to_string(), h);
            }
        }
        Ok((held, now))
    }

    async fn start_escalations(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        let mut st = self.0.prepare_cached(
            "INSERT INTO escalations (alarm_id, to_client, from_client, level, sensor_id, due_at) \
             SELECT * FROM (SELECT n.alarm_id, json_extract(c.escalation, '$.to') AS to_client, \
             n.client_id, COALESCE((SELECT e.level FROM escalations e \
             WHERE e.alarm_id = n.alarm_id AND e.to_client = n.client_id), 0) + 1 AS level, \
             n.sensor_id, ?2 + json_extract(c.escalation, '$.after_s') * 1000 \
             FROM notifications n JOIN clients c ON c.id = n.client_id \
             JOIN alarms a ON a.id = n.alarm_id \
             WHERE n.id = ?1 AND c.escalation IS NOT NULL AND a.state = 'open') s \
             WHERE s.level <= ?3 AND EXISTS (SELECT 1 FROM clients t WHERE t.id = s.to_client) \
             ON CONFLICT (alarm_id, to_client) DO NOTHING",
        )?;
        for id in ids {
            st.execute(params![id, now, crate::domain::escalation::MAX_LEVELS])?;
        }
        Ok(())
    }

    async fn insert_attempts(&mut self, attempted: &[&Outcome]) -> Result<()> {
        let mut insert = self.0.prepare_cached(
            "INSERT INTO attempts (notification_id, at, status_code, error, duration_ms, \
             client_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?;
        for o in attempted {
            let Some(a) = &o.attempt else { continue };
            insert.execute(params![
                o.notification_id,
                a.at,
                a.status_code,
                a.error,
                a.duration_ms,
                o.client_id
            ])?;
        }
        Ok(())
    }

    async fn write_results(&mut self, results: &[Recorded<'_>], now: Millis) -> Result<()> {
        let mut update = self.0.prepare_cached(
            "UPDATE notifications SET status = ?2, attempts = ?3, next_attempt_at = ?4, \
             updated_at = ?5, claimed_by = NULL, lease_until = NULL, batch_id = ?6 WHERE id = ?1",
        )?;
        for r in results {
            update.execute(params![
                r.id,
                r.status.as_str(),
                r.attempts,
                r.next_attempt_at,
                now,
                r.batch_id
            ])?;
        }
        Ok(())
    }

    async fn note_client(&mut self, c: &ClientAttempts) -> Result<Option<Millis>> {
        let tx = self.0;
        // The running summary health reads, instead of every attempt the client had.
        let (failed_at, error) = c.last_failure.clone().unzip();
        tx.prepare_cached(
            "UPDATE clients SET last_success_at = COALESCE(?2, last_success_at), \
             failures_since_success = CASE WHEN ?2 IS NULL THEN failures_since_success + ?3 \
               ELSE ?3 END, \
             last_failure_at = COALESCE(?4, last_failure_at), \
             last_error = CASE WHEN ?4 IS NULL THEN last_error ELSE ?5 END WHERE id = ?1",
        )?
        .execute(params![
            c.client_id,
            c.last_success_at,
            c.failures_after,
            failed_at,
            error.flatten()
        ])?;
        let Some(failed_at) = c.failing_since else {
            // Delivered last: the streak ends (a write only when there was one).
            tx.prepare_cached(
                "UPDATE clients SET failing_since = NULL \
                 WHERE id = ?1 AND failing_since IS NOT NULL",
            )?
            .execute([&c.client_id])?;
            return Ok(None);
        };
        Ok(tx
            .prepare_cached(
                "UPDATE clients SET failing_since = \
                 CASE WHEN ?2 THEN ?3 ELSE COALESCE(failing_since, ?3) END \
                 WHERE id = ?1 AND disabled_at IS NULL RETURNING failing_since",
            )?
            .query_row(params![c.client_id, c.succeeded, failed_at], |r| {
                r.get::<_, Option<i64>>(0)
            })
            .optional()?
            .flatten())
    }

    async fn disable_client(
        &mut self,
        client_id: &str,
        now: Millis,
        reason: DisabledReason,
    ) -> Result<()> {
        self.0
            .prepare_cached(
                "UPDATE clients SET disabled_at = ?2, disabled_reason = ?3 WHERE id = ?1",
            )?
            .execute(params![client_id, now, reason.as_str()])?;
        Ok(())
    }
}
