//! Alarms on PostgreSQL: what a commit reads and writes of them
//! ([`crate::store::rules::commit`]), the API's reads, and an acknowledgement
//! ([`rules::alarms`]).

use async_trait::async_trait;

use super::PgStore;
use super::db::{DB_NOW_MS, Sql, Tx};
use crate::domain::alarm::{Alarm, AlarmKind, AlarmTotals, Opened, Unresolved};
use crate::domain::notification::new_notification_id;
use crate::domain::{EventKind, Millis, NotificationRef, SensorId};
use crate::store::rows::{self, ALARM_COLS};
use crate::store::rules::{self, alarms::Ack, alarms::Acked, alarms::Told};
use crate::store::{AlarmFilter, Alarms, Page, PageRequest, Result, limit_plus_one};

/// The alarms of `keys` not resolved, in one statement.
pub(super) async fn unresolved(
    tx: &Tx<'_>,
    keys: &[(SensorId, AlarmKind)],
) -> Result<Vec<Unresolved>> {
    let sensors: Vec<String> = keys.iter().map(|(s, _)| s.to_string()).collect();
    let kinds: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let rows = tx
        .query(
            &tx.prepare_cached(
                "SELECT a.id, a.sensor_id, a.kind, a.acknowledged_at IS NOT NULL FROM alarms a \
                 JOIN UNNEST($1::text[], $2::text[]) AS u(sensor_id, kind) \
                 ON a.sensor_id = u.sensor_id AND a.kind = u.kind WHERE a.state <> 'resolved' \
                 FOR SHARE OF a",
            )
            .await?,
            &[&sensors, &kinds],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let sensor: String = r.get(1);
        let kind: String = r.get(2);
        if let (Ok(sensor_id), Some(kind)) = (SensorId::parse(&sensor), AlarmKind::parse(&kind)) {
            out.push(Unresolved {
                id: r.get(0),
                sensor_id,
                kind,
                acknowledged: r.get(3),
            });
        }
    }
    Ok(out)
}

/// Resolves the ones resolved, then inserts the alarms opened (one the same events
/// resolved, resolved already): in that order, so the unique index on the unresolved
/// never sees two.
pub(super) async fn write(
    tx: &Tx<'_>,
    opened: &[Opened],
    resolved: &[(String, Millis)],
) -> Result<()> {
    if !resolved.is_empty() {
        let ids: Vec<&str> = resolved.iter().map(|(id, _)| id.as_str()).collect();
        let ats: Vec<i64> = resolved.iter().map(|(_, at)| *at).collect();
        tx.execute(
            &tx.prepare_cached(
                "UPDATE alarms a SET state = 'resolved', resolved_at = GREATEST(a.opened_at, u.at) \
                 FROM UNNEST($1::text[], $2::int8[]) AS u(id, at) \
                 WHERE a.id = u.id AND a.state <> 'resolved'",
            )
            .await?,
            &[&ids, &ats],
        )
        .await?;
    }
    if !opened.is_empty() {
        let ids: Vec<&str> = opened.iter().map(|o| o.id.as_str()).collect();
        let kinds: Vec<&str> = opened.iter().map(|o| o.kind.as_str()).collect();
        let sensors: Vec<String> = opened.iter().map(|o| o.sensor_id.to_string()).collect();
        let ats: Vec<i64> = opened.iter().map(|o| o.at).collect();
        let resolved_ats: Vec<Option<i64>> = opened.iter().map(|o| o.resolved_at).collect();
        tx.execute(
            &tx.prepare_cached(
                "INSERT INTO alarms (id, kind, sensor_id, state, opened_at, resolved_at) \
                 SELECT u.id, u.kind, u.sensor_id, \
                 CASE WHEN u.resolved_at IS NULL THEN 'open' ELSE 'resolved' END, u.at, \
                 u.resolved_at FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], \
                 $5::int8[]) AS u(id, kind, sensor_id, at, resolved_at)",
            )
            .await?,
            &[&ids, &kinds, &sensors, &ats, &resolved_ats],
        )
        .await?;
    }
    Ok(())
}

/// The site's `site_down` alarm not resolved.
pub(super) async fn site_alarm(tx: &Tx<'_>, site: &str) -> Result<Option<String>> {
    Ok(tx
        .query_opt(
            &tx.prepare_cached(
                "SELECT id FROM alarms WHERE site_id = $1 AND kind = 'site_down' \
                 AND state <> 'resolved'",
            )
            .await?,
            &[&site],
        )
        .await?
        .map(|r| r.get(0)))
}

/// Opens the site's `site_down` alarm.
pub(super) async fn open_site_alarm(tx: &Tx<'_>, id: &str, site: &str, at: Millis) -> Result<()> {
    tx.execute(
        &tx.prepare_cached(
            "INSERT INTO alarms (id, kind, site_id, state, opened_at) \
             VALUES ($1, 'site_down', $2, 'open', $3)",
        )
        .await?,
        &[&id, &site, &at],
    )
    .await?;
    Ok(())
}

/// Names alarm `id` on notification `seq`.
pub(super) async fn name_alarm(tx: &Tx<'_>, seq: i64, id: &str) -> Result<()> {
    tx.execute(
        &tx.prepare_cached("UPDATE notifications SET alarm_id = $2 WHERE seq = $1")
            .await?,
        &[&seq, &id],
    )
    .await?;
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
                super::alarms::unresolved(self.tx, keys).await
            }

            async fn write_alarms(
                &mut self,
                opened: &[$crate::domain::alarm::Opened],
                resolved: &[(String, $crate::domain::Millis)],
            ) -> $crate::store::Result<()> {
                super::alarms::write(self.tx, opened, resolved).await
            }

            async fn site_alarm(&mut self, site: &str) -> $crate::store::Result<Option<String>> {
                super::alarms::site_alarm(self.tx, site).await
            }

            async fn open_site_alarm(
                &mut self,
                id: &str,
                site: &str,
                at: $crate::domain::Millis,
            ) -> $crate::store::Result<()> {
                super::alarms::open_site_alarm(self.tx, id, site, at).await
            }

            async fn name_alarm(&mut self, seq: i64, id: &str) -> $crate::store::Result<()> {
                super::alarms::name_alarm(self.tx, seq, id).await
            }
        }
    };
}
pub(super) use alarm_tables;

alarm_tables!(super::tables::Tables<'_>);

/// An acknowledgement's tables, in its transaction.
struct AckTables<'a> {
    tx: &'a Tx<'a>,
}

impl rules::alarms::AckTables for AckTables<'_> {
    async fn alarm(&mut self, id: &str) -> Result<Option<Alarm>> {
        let row = self
            .tx
            .query_opt(
                &format!("SELECT {ALARM_COLS} FROM alarms a WHERE a.id = $1 FOR UPDATE"),
                &[&id],
            )
            .await?;
        row.as_ref().map(rows::alarm).transpose()
    }

    async fn acknowledge(&mut self, id: &str, ack: &Ack, now: Millis) -> Result<()> {
        self.tx
            .execute(
                "UPDATE alarms SET state = 'acknowledged', acknowledged_at = $2, \
                 acknowledged_by = $3, note = $4 WHERE id = $1",
                &[&id, &now, &ack.by, &ack.note],
            )
            .await?;
        Ok(())
    }

    async fn quiet_reminders(&mut self, id: &str, now: Millis) -> Result<()> {
        self.tx
            .execute(
                &format!(
                    "WITH s AS (UPDATE notifications SET status = 'superseded', updated_at = $2 \
                     WHERE alarm_id = $1 AND status = 'pending' \
                     AND (kind = 'sensor.still_lost' \
                          OR (kind = 'sensor.state_held' AND reminder IS NOT NULL)) \
                     AND (lease_until IS NULL OR lease_until < {DB_NOW_MS}) RETURNING seq) \
                     DELETE FROM notifications_pending WHERE seq IN (SELECT seq FROM s)"
                ),
                &[&id, &now],
            )
            .await?;
        Ok(())
    }

    async fn told(&mut self, id: &str) -> Result<Vec<Told>> {
        let rows = self
            .tx
            .query(
                "SELECT n.client_id, n.sensor_id FROM notifications n \
                 LEFT JOIN links l ON l.client_id = n.client_id AND l.sensor_id = n.sensor_id \
                 LEFT JOIN clients c ON c.id = n.client_id \
                 WHERE n.alarm_id = $1 AND n.status NOT IN ('silenced', 'cancelled') \
                 AND c.id IS NOT NULL \
                 AND (l.client_id IS NOT NULL OR EXISTS (SELECT 1 FROM escalations e \
                  WHERE e.alarm_id = n.alarm_id AND e.to_client = n.client_id \
                  AND e.made_at IS NOT NULL)) \
                 AND n.kind <> $2 \
                 AND (c.events IS NULL OR strpos(',' || c.events || ',', ',' || $2 || ',') > 0) \
                 ORDER BY n.client_id, n.seq",
                &[&id, &EventKind::AlarmAcknowledged.as_str()],
            )
            .await?;
        Ok(rules::alarms::first_of_each(
            rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
        ))
    }

    async fn silence_new(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> Result<std::collections::HashSet<i64>> {
        super::silences::silence_new(self.tx, seqs, now).await
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
        let row = self
            .tx
            .query_one(
                "WITH ins AS (INSERT INTO notifications (id, client_id, sensor_id, kind, \
                 occurred_at, status, attempts, next_attempt_at, created_at, updated_at, body, \
                 alarm_id) VALUES ($1, $2, $3, $4, $5, 'pending', 0, $5, $5, $5, $6, $7) \
                 RETURNING seq, sensor_id, client_id), \
                 listed AS (INSERT INTO notifications_pending (seq, sensor_id, client_id) \
                 SELECT seq, sensor_id, client_id FROM ins) \
                 SELECT seq FROM ins",
                &[
                    &nid,
                    &to.client_id,
                    &to.lane.to_string(),
                    &kind.as_str(),
                    &now,
                    &body,
                    &id,
                ],
            )
            .await?;
        Ok(NotificationRef {
            id: nid,
            seq: row.get(0),
            client_id: to.client_id.clone(),
            sensor_id: to.lane,
            kind,
            due_at: now,
            attempts: 0,
            batch_id: None,
        })
    }
}

#[async_trait]
impl Alarms for PgStore {
    async fn list_alarms(&self, f: AlarmFilter, page: PageRequest) -> Result<Page<Alarm>> {
        let c = self.db.get("list_alarms").await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {ALARM_COLS} FROM alarms a WHERE ($1 = '' OR a.id < $1) \
                     AND ($3::text IS NULL OR a.state = $3) AND ($4::text IS NULL OR a.kind = $4) \
                     AND ($5::text IS NULL OR a.sensor_id = $5) \
                     AND ($6::text IS NULL OR a.site_id = $6) ORDER BY a.id DESC LIMIT $2"
                ),
                &[
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                    &f.state.map(|s| s.as_str()),
                    &f.kind.map(|k| k.as_str()),
                    &f.sensor_id.map(|s| s.to_string()),
                    &f.site_id,
                ],
            )
            .await?;
        let rows = rows.iter().map(rows::alarm).collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |a| a.id.clone()))
    }

    async fn get_alarm(&self, id: String) -> Result<Option<(Alarm, Vec<String>)>> {
        let c = self.db.get("get_alarm").await?;
        let Some(row) = c
            .query_opt(
                &format!("SELECT {ALARM_COLS} FROM alarms a WHERE a.id = $1"),
                &[&id],
            )
            .await?
        else {
            return Ok(None);
        };
        let alarm = rows::alarm(&row)?;
        let ids = c
            .query(
                "SELECT id FROM notifications WHERE alarm_id = $1 ORDER BY seq",
                &[&id],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        Ok(Some((alarm, ids)))
    }

    async fn alarm_totals(&self) -> Result<AlarmTotals> {
        let c = self.db.get("alarm_totals").await?;
        let rows = c.query(rows::ALARM_TOTALS, &[]).await?;
        Ok(AlarmTotals::of(
            rows.iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3))),
        ))
    }

    async fn ack_alarm(&self, id: String, ack: Ack, now: Millis) -> Result<Acked> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("ack_alarm").await?;
        let tx = c.transaction().await?;
        let acked = rules::alarms::acknowledge(&mut AckTables { tx: &tx }, &id, &ack, now).await?;
        if let Acked::Taken(..) = acked {
            super::audit::record(&tx, audit.as_ref()).await?;
        }
        tx.commit().await?;
        Ok(acked)
    }

    async fn escalate(&self, now: Millis) -> Result<Vec<NotificationRef>> {
        let mut c = self.db.get("escalate").await?;
        let sql = rules::escalations::ANY.replace("{now}", "$1");
        if !c.query_one(&sql, &[&now]).await?.get::<_, bool>(0) {
            return Ok(Vec::new());
        }
        let tx = c.transaction().await?;
        let made =
            rules::escalations::escalate(&mut super::escalations::Tables { tx: &tx }, now).await?;
        tx.commit().await?;
        Ok(made)
    }
}
