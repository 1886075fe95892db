//! Alarms on the embedded store: what a commit reads and writes of them
//! ([`crate::store::rules::commit`]), the API's reads, and an acknowledgement
//! ([`rules::alarms`]).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::SqliteStore;
use crate::domain::alarm::{Alarm, AlarmKind, AlarmTotals, Opened, Unresolved};
use crate::domain::notification::new_notification_id;
use crate::domain::{EventKind, Millis, NotificationRef, SensorId};
use crate::store::rows::{self, ALARM_COLS};
use crate::store::rules;
use crate::store::rules::alarms::{Ack, Acked, Told};
use crate::store::{AlarmFilter, Alarms, Page, PageRequest, Result, limit_plus_one};

/// The alarms of `keys` not resolved.
pub(super) fn unresolved(
    tx: &Transaction,
    keys: &[(SensorId, AlarmKind)],
) -> Result<Vec<Unresolved>> {
    let mut st = tx.prepare_cached(
        "SELECT id, acknowledged_at IS NOT NULL FROM alarms \
         WHERE sensor_id = ?1 AND kind = ?2 AND state <> 'resolved'",
    )?;
    let mut out = Vec::new();
    for (sensor, kind) in keys {
        let found = st
            .query_row(params![sensor.to_string(), kind.as_str()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, bool>(1)?))
            })
            .optional()?;
        if let Some((id, acknowledged)) = found {
            out.push(Unresolved {
                id,
                sensor_id: *sensor,
                kind: *kind,
                acknowledged,
            });
        }
    }
    Ok(out)
}

/// Resolves the ones resolved, then inserts the alarms opened (one the same events
/// resolved, resolved already): the unique index on the unresolved never sees two.
pub(super) fn write(
    tx: &Transaction,
    opened: &[Opened],
    resolved: &[(String, Millis)],
) -> Result<()> {
    if !resolved.is_empty() {
        let mut st = tx.prepare_cached(
            "UPDATE alarms SET state = 'resolved', resolved_at = MAX(opened_at, ?2) \
             WHERE id = ?1 AND state <> 'resolved'",
        )?;
        for (id, at) in resolved {
            st.execute(params![id, at])?;
        }
    }
    if !opened.is_empty() {
        let mut st = tx.prepare_cached(
            "INSERT INTO alarms (id, kind, sensor_id, state, opened_at, resolved_at) \
             VALUES (?1, ?2, ?3, CASE WHEN ?5 IS NULL THEN 'open' ELSE 'resolved' END, ?4, ?5)",
        )?;
        for o in opened {
            st.execute(params![
                o.id,
                o.kind.as_str(),
                o.sensor_id.to_string(),
                o.at,
                o.resolved_at
            ])?;
        }
    }
    Ok(())
}

/// The site's `site_down` alarm not resolved.
pub(super) fn site_alarm(tx: &Transaction, site: &str) -> Result<Option<String>> {
    Ok(tx
        .prepare_cached(
            "SELECT id FROM alarms WHERE site_id = ?1 AND kind = 'site_down' \
             AND state <> 'resolved'",
        )?
        .query_row([site], |r| r.get(0))
        .optional()?)
}

/// Opens the site's `site_down` alarm.
pub(super) fn open_site_alarm(tx: &Transaction, id: &str, site: &str, at: Millis) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO alarms (id, kind, site_id, state, opened_at) \
         VALUES (?1, 'site_down', ?2, 'open', ?3)",
    )?
    .execute(params![id, site, at])?;
    Ok(())
}

/// Names alarm `id` on notification `seq`.
pub(super) fn name_alarm(tx: &Transaction, seq: i64, id: &str) -> Result<()> {
    tx.prepare_cached("UPDATE notifications SET alarm_id = ?2 WHERE seq = ?1")?
        .execute(params![seq, id])?;
    Ok(())
}

/// The alarms' table over a transaction `tx`: the group commit's tables, and those of the
/// rounds, moves and silences.
macro_rules! alarm_tables {
    ($t:ty) => {
        impl $crate::store::rules::alarms::AlarmTables for $t {
            async fn unresolved_alarms(
                &mut self,
                keys: &[($crate::domain::SensorId, $crate::domain::alarm::AlarmKind)],
            ) -> $crate::store::Result<Vec<$crate::domain::alarm::Unresolved>> {
                super::alarms::unresolved(self.tx, keys)
            }

            async fn write_alarms(
                &mut self,
                opened: &[$crate::domain::alarm::Opened],
                resolved: &[(String, $crate::domain::Millis)],
            ) -> $crate::store::Result<()> {
                super::alarms::write(self.tx, opened, resolved)
            }

            async fn site_alarm(&mut self, site: &str) -> $crate::store::Result<Option<String>> {
                super::alarms::site_alarm(self.tx, site)
            }

            async fn open_site_alarm(
                &mut self,
                id: &str,
                site: &str,
                at: $crate::domain::Millis,
            ) -> $crate::store::Result<()> {
                super::alarms::open_site_alarm(self.tx, id, site, at)
            }

            async fn name_alarm(&mut self, seq: i64, id: &str) -> $crate::store::Result<()> {
                super::alarms::name_alarm(self.tx, seq, id)
            }
        }
    };
}
pub(super) use alarm_tables;

alarm_tables!(super::tables::Tables<'_>);

/// An acknowledgement's tables on the writer.
struct AckTables<'a> {
    tx: &'a Transaction<'a>,
}

impl rules::alarms::AckTables for AckTables<'_> {
    async fn alarm(&mut self, id: &str) -> Result<Option<Alarm>> {
        one(self.tx, id)
    }

    async fn acknowledge(&mut self, id: &str, ack: &Ack, now: Millis) -> Result<()> {
        self.tx.execute(
            "UPDATE alarms SET state = 'acknowledged', acknowledged_at = ?2, \
             acknowledged_by = ?3, note = ?4 WHERE id = ?1",
            params![id, now, ack.by, ack.note],
        )?;
        Ok(())
    }

    async fn quiet_reminders(&mut self, id: &str, now: Millis) -> Result<()> {
        self.tx.execute(
            "UPDATE notifications SET status = 'superseded', updated_at = ?2 \
             WHERE alarm_id = ?1 AND status = 'pending' \
             AND (kind = 'sensor.still_lost' OR (kind = 'sensor.state_held' AND reminder IS NOT NULL)) \
             AND (lease_until IS NULL OR lease_until < ?2)",
            params![id, now],
        )?;
        Ok(())
    }

    async fn told(&mut self, id: &str) -> Result<Vec<Told>> {
        let rows = self
            .tx
            .prepare_cached(
                "SELECT n.client_id, n.sensor_id FROM notifications n \
                 LEFT JOIN links l ON l.client_id = n.client_id AND l.sensor_id = n.sensor_id \
                 LEFT JOIN clients c ON c.id = n.client_id \
                 WHERE n.alarm_id = ?1 AND n.status NOT IN ('silenced', 'cancelled') \
                 AND c.id IS NOT NULL \
                 AND (l.client_id IS NOT NULL OR EXISTS (SELECT 1 FROM escalations e \
                  WHERE e.alarm_id = n.alarm_id AND e.to_client = n.client_id \
                  AND e.made_at IS NOT NULL)) \
                 AND n.kind <> ?2 \
                 AND (c.events IS NULL OR instr(',' || c.events || ',', ',' || ?2 || ',') > 0) \
                 ORDER BY n.client_id, n.seq",
            )?
            .query_map(params![id, EventKind::AlarmAcknowledged.as_str()], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rules::alarms::first_of_each(rows))
    }

    async fn silence_new(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> Result<std::collections::HashSet<i64>> {
        super::silences::silence_new(self.tx, seqs, now)
    }

    async fn insert_ack(
        &mut self,
        to: &Told,
        id: &str,
        body: &str,
        now: Millis,
    ) -> Result<NotificationRef> {
        let nid = new_notification_id();
        let kind = EventKind::AlarmAcknowledged;
        let seq: i64 = self
            .tx
            .prepare_cached(
                "INSERT INTO notifications (id, client_id, sensor_id, kind, occurred_at, status, \
                 attempts, next_attempt_at, created_at, updated_at, body, alarm_id) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, ?5, ?5, ?5, ?6, ?7) RETURNING seq",
            )?
            .query_row(
                params![
                    nid,
                    to.client_id,
                    to.lane.to_string(),
                    kind.as_str(),
                    now,
                    body,
                    id
                ],
                |r| r.get(0),
            )?;
        Ok(NotificationRef {
            id: nid,
            seq,
            client_id: to.client_id.clone(),
            sensor_id: to.lane,
            kind,
            due_at: now,
            attempts: 0,
            batch_id: None,
        })
    }
}

pub(super) fn one(c: &Connection, id: &str) -> Result<Option<Alarm>> {
    Ok(c.prepare_cached(&format!(
        "SELECT {ALARM_COLS} FROM alarms a WHERE a.id = ?1"
    ))?
    .query_row([id], |r| rows::alarm(r))
    .optional()?)
}

#[async_trait]
impl Alarms for SqliteStore {
    async fn list_alarms(&self, f: AlarmFilter, page: PageRequest) -> Result<Page<Alarm>> {
        self.read(move |c| {
            let rows = c
                .prepare_cached(&format!(
                    "SELECT {ALARM_COLS} FROM alarms a WHERE (?1 = '' OR a.id < ?1) \
                     AND (?3 IS NULL OR a.state = ?3) AND (?4 IS NULL OR a.kind = ?4) \
                     AND (?5 IS NULL OR a.sensor_id = ?5) AND (?6 IS NULL OR a.site_id = ?6) \
                     ORDER BY a.id DESC LIMIT ?2"
                ))?
                .query_map(
                    params![
                        page.after.clone().unwrap_or_default(),
                        limit_plus_one(&page),
                        f.state.map(|s| s.as_str()),
                        f.kind.map(|k| k.as_str()),
                        f.sensor_id.map(|s| s.to_string()),
                        f.site_id
                    ],
                    |r| rows::alarm(r),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |a| a.id.clone()))
        })
        .await
    }

    async fn get_alarm(&self, id: String) -> Result<Option<(Alarm, Vec<String>)>> {
        self.read(move |c| {
            let Some(alarm) = one(c, &id)? else {
                return Ok(None);
            };
            let ids = c
                .prepare_cached("SELECT id FROM notifications WHERE alarm_id = ?1 ORDER BY seq")?
                .query_map([&id], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Some((alarm, ids)))
        })
        .await
    }

    async fn alarm_totals(&self) -> Result<AlarmTotals> {
        self.read(|c| {
            let rows = c
                .prepare_cached(rows::ALARM_TOTALS)?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(AlarmTotals::of(rows))
        })
        .await
    }

    async fn ack_alarm(&self, id: String, ack: Ack, now: Millis) -> Result<Acked> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let acked = rules::now_or_never(rules::alarms::acknowledge(
                &mut AckTables { tx: &tx },
                &id,
                &ack,
                now,
            ))?;
            if let Acked::Taken(..) = acked {
                super::audit::record(&tx, audit.as_ref())?;
            }
            tx.commit()?;
            Ok(acked)
        })
        .await
    }

    async fn escalate(&self, now: Millis) -> Result<Vec<NotificationRef>> {
        let any: bool = self
            .read(move |c| {
                let sql = rules::escalations::ANY.replace("{now}", "?1");
                Ok(c.prepare_cached(&sql)?.query_row([now], |r| r.get(0))?)
            })
            .await?;
        if !any {
            return Ok(Vec::new());
        }
        self.write(move |c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let made = rules::now_or_never(rules::escalations::escalate(
                &mut super::escalations::Tables { tx: &tx },
                now,
            ))?;
            tx.commit()?;
            Ok(made)
        })
        .await
    }
}
