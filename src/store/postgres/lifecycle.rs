//! Recording's tables on PostgreSQL ([`rules::record`]): the attempts and the results in
//! one `UNNEST` statement each, the notifications held `FOR UPDATE`, and each client's
//! failure streak kept by increments where the row is (other nodes' recorders add to the
//! same client at once).

use std::collections::HashMap;

use super::super::{Outcome, Result};
use super::db::{DB_NOW_MS, Sql, Tx};
use crate::domain::Millis;
use crate::domain::client::DisabledReason;
use crate::domain::policy::ClientAttempts;
use crate::store::rules::{self, record::Held, record::Recorded};

pub(super) struct OutcomeTables<'a, 'b>(pub &'a Tx<'b>);

impl rules::record::OutcomeTables for OutcomeTables<'_, '_> {
    async fn held(&mut self, ids: &[&str], now: Millis) -> Result<(HashMap<String, Held>, Millis)> {
        let tx = self.0;
        // By id: the order every writer of several notifications locks them in.
        let rows = tx
            .query(
                &tx.prepare_cached(&format!(
                    "SELECT id, status = 'pending', claimed_by, lease_until, {DB_NOW_MS}, \
                     alarm_id IS NOT NULL \
                     FROM notifications WHERE id = ANY($1) ORDER BY id FOR UPDATE"
                ))
                .await?,
                &[&ids],
            )
            .await?;
        // Leases are judged by the database's clock, as claims take them.
        let lease_now = rows.first().map_or(now, |r| r.get(4));
        let held = rows
            .into_iter()
            .map(|r| {
                (
                    r.get::<_, String>(0),
                    Held {
                        pending: r.get(1),
                        claimed_by: r.get(2),
                        lease_until: r.get(3),
                        alarm: r.get(5),
                    },
                )
            })
            .collect();
        Ok((held, lease_now))
    }

    async fn start_escalations(&mut self, ids: &[&str], now: Millis) -> Result<()> {
        let tx = self.0;
        tx.execute(
            "INSERT INTO escalations (alarm_id, to_client, from_client, level, sensor_id, due_at) \
             SELECT * FROM (SELECT n.alarm_id, (c.escalation::jsonb ->> 'to') AS to_client, \
             n.client_id, COALESCE((SELECT e.level FROM escalations e \
             WHERE e.alarm_id = n.alarm_id AND e.to_client = n.client_id), 0) + 1 AS level, \
             n.sensor_id, $2 + (c.escalation::jsonb ->> 'after_s')::bigint * 1000 \
             FROM notifications n JOIN clients c ON c.id = n.client_id \
             JOIN alarms a ON a.id = n.alarm_id \
             WHERE n.id = ANY($1) AND c.escalation IS NOT NULL AND a.state = 'open') s \
             WHERE s.level <= $3 AND EXISTS (SELECT 1 FROM clients t WHERE t.id = s.to_client) \
             ON CONFLICT (alarm_id, to_client) DO NOTHING",
            &[&ids, &now, &(crate::domain::escalation::MAX_LEVELS as i32)],
        )
        .await?;
        Ok(())
    }

    async fn insert_attempts(&mut self, attempted: &[&Outcome]) -> Result<()> {
        let (mut id, mut at, mut code, mut err, mut dur, mut client) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for o in attempted {
            let Some(a) = &o.attempt else { continue };
            id.push(o.notification_id.as_str());
            at.push(a.at);
            code.push(a.status_code.map(i32::from));
            err.push(a.error.as_deref());
            dur.push(a.duration_ms as i64);
            client.push(o.client_id.as_str());
        }
        let tx = self.0;
        tx.execute(
            &tx.prepare_cached(
                "INSERT INTO attempts (notification_id, at, status_code, error, duration_ms, \
                 client_id) SELECT u.n, u.a, u.c, u.e, u.d, u.k FROM UNNEST($1::text[], $2::int8[], \
                 $3::int4[], $4::text[], $5::int8[], $6::text[]) \
                 WITH ORDINALITY AS u(n, a, c, e, d, k, o) ORDER BY u.o",
            )
            .await?,
            &[&id, &at, &code, &err, &dur, &client],
        )
        .await?;
        Ok(())
    }

    async fn write_results(&mut self, results: &[Recorded<'_>], now: Millis) -> Result<()> {
        let (mut id, mut status, mut attempts, mut next, mut batch) =
            (vec![], vec![], vec![], vec![], vec![]);
        for r in results {
            id.push(r.id);
            status.push(r.status.as_str());
            attempts.push(r.attempts as i32);
            next.push(r.next_attempt_at);
            batch.push(r.batch_id);
        }
        let tx = self.0;
        // A retry stays pending, and listed; a final result leaves the list.
        tx.execute(
            &tx.prepare_cached(
                "WITH r AS (UPDATE notifications n SET status = u.status, attempts = u.attempts, \
                 next_attempt_at = u.next, updated_at = $5, claimed_by = NULL, lease_until = NULL, \
                 batch_id = u.batch \
                 FROM UNNEST($1::text[], $2::text[], $3::int4[], $4::int8[], $6::text[]) \
                 AS u(id, status, attempts, next, batch) WHERE n.id = u.id \
                 RETURNING n.seq, n.status) \
                 DELETE FROM notifications_pending WHERE seq IN \
                 (SELECT seq FROM r WHERE status <> 'pending')",
            )
            .await?,
            &[&id, &status, &attempts, &next, &now, &batch],
        )
        .await?;
        Ok(())
    }

    async fn note_client(&mut self, c: &ClientAttempts) -> Result<Option<Millis>> {
        let tx = self.0;
        // The running summary health reads, instead of every attempt the client had.
        let (failed_at, error) = c.last_failure.clone().unzip();
        tx.execute(
            "UPDATE clients SET last_success_at = COALESCE($2, last_success_at), \
             failures_since_success = CASE WHEN $2::int8 IS NULL \
               THEN failures_since_success + $3 ELSE $3 END, \
             last_failure_at = COALESCE($4, last_failure_at), \
             last_error = CASE WHEN $4::int8 IS NULL THEN last_error ELSE $5 END WHERE id = $1",
            &[
                &c.client_id,
                &c.last_success_at,
                &(c.failures_after as i64),
                &failed_at,
                &error.flatten(),
            ],
        )
        .await?;
        let Some(failed_at) = c.failing_since else {
            // Delivered last: the streak ends. A write (and a row lock other nodes'
            // recorders would wait for) only when there was one.
            tx.execute(
                "UPDATE clients SET failing_since = NULL \
                 WHERE id = $1 AND failing_since IS NOT NULL",
                &[&c.client_id],
            )
            .await?;
            return Ok(None);
        };
        let found = tx
            .query_opt(
                "UPDATE clients SET failing_since = \
                 CASE WHEN $2 THEN $3::int8 ELSE COALESCE(failing_since, $3::int8) END \
                 WHERE id = $1 AND disabled_at IS NULL RETURNING failing_since",
                &[&c.client_id, &c.succeeded, &failed_at],
            )
            .await?;
        Ok(found.and_then(|r| r.get(0)))
    }

    async fn disable_client(
        &mut self,
        client_id: &str,
        now: Millis,
        reason: DisabledReason,
    ) -> Result<()> {
        self.0
            .execute(
                "UPDATE clients SET disabled_at = $2, disabled_reason = $3 WHERE id = $1",
                &[&client_id, &now, &reason.as_str()],
            )
            .await?;
        Ok(())
    }
}
