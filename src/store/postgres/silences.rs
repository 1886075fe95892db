//! Silences: kept as rows, applied by the group commit to the notifications it makes and
//! reconciled once at their end ([`rules::silences`], over `rules::silences::SilenceTables`).

use std::collections::HashSet;

use async_trait::async_trait;
use tokio_postgres::Row;

use super::super::{
    Error, NotificationRef, Page, PageRequest, Result, Silences, StoredSchedule, limit_plus_one,
};
use super::PgStore;
use super::db::{Sql, Tx};
use super::tables::Tables;
use crate::domain::client::events_from_column;
use crate::domain::schedule::Schedule;
use crate::domain::silence::{self, Match, Silence, SilenceState, View};
use crate::domain::{Connection as Conn, Event, EventKind, Millis, SensorId};
use crate::store::rules::silences::{LinkedSensor, Pair, Silenced};
use crate::store::rules::sites::SiteRetold;
use crate::store::rules::{self, commit::Newer};

/// A silence's columns as [`silence_row`] reads them; its sensors (`silence_sensors`) as
/// one list in the order given, NULL when it names none.
const SILENCE_COLS: &str = "id, site_id, CASE WHEN named_sensors IS NULL THEN NULL ELSE \
     coalesce((SELECT string_agg(x.sensor_id, ',' ORDER BY x.pos) FROM silence_sensors x \
     WHERE x.silence_id = silences.id), '') END, client_id, types, starts_at, ends_at, \
     comment, created_at, updated_at, reconciled_at, schedule_id, ended_at";

/// Whether silence `s` matches the client and, by its site, the sensor named by the SQL
/// expressions `client` and `sensor` (its sensors are matched apart).
fn matches_client_site(s: &str, client: &str, sensor: &str) -> String {
    format!(
        "({s}.client_id IS NULL OR {s}.client_id = {client}) \
         AND ({s}.site_id IS NULL OR {s}.site_id = \
              (SELECT x.site_id FROM sensors x WHERE x.id = {sensor}))"
    )
}

/// Whether a silence `o` active at `now` matches the (client, sensor) named by the SQL
/// expressions `client` and `sensor` (any type), and `also`: those that name no sensor
/// (`silences_any_sensor`), those that name this one (`silence_sensors_by_sensor`), never
/// a pass over every active silence's sensors.
fn active_match(now: &str, client: &str, sensor: &str, also: &str) -> String {
    let (active, m) = (active("o", now), matches_client_site("o", client, sensor));
    format!(
        "(EXISTS (SELECT 1 FROM silences o \
           WHERE o.named_sensors IS NULL AND {active} AND {m} AND {also}) \
         OR EXISTS (SELECT 1 FROM silence_sensors y JOIN silences o ON o.id = y.silence_id \
           WHERE y.sensor_id = {sensor} AND {active} AND {m} AND {also}))"
    )
}

/// Whether silence `s` matched pair `p` (of `silenced_pairs`) when it kept something from
/// it: by the sensor's site then (`p.site_id`) or now, so a sensor moved out of a site keeps
/// the pair that site's silence noted (issue #68).
fn matched_pair(s: &str) -> String {
    format!(
        "({s}.client_id IS NULL OR {s}.client_id = p.client_id) \
         AND ({s}.named_sensors IS NULL OR EXISTS (SELECT 1 FROM silence_sensors z \
              WHERE z.sensor_id = p.sensor_id AND z.silence_id = {s}.id)) \
         AND ({s}.site_id IS NULL OR {s}.site_id = p.site_id OR {s}.site_id = \
              (SELECT x.site_id FROM sensors x WHERE x.id = p.sensor_id))"
    )
}

/// Whether silence `s` is active at `now` (an SQL expression).
fn active(s: &str, now: &str) -> String {
    format!("{s}.starts_at <= {now} AND {s}.ends_at > {now}")
}

fn silence_row(r: &Row) -> Silence {
    let sensors: Option<String> = r.get(2);
    let types: Option<String> = r.get(4);
    Silence {
        id: r.get(0),
        matcher: Match {
            site_id: r.get(1),
            sensor_ids: sensors.map(|s| Match::unlisted(&s, |p| SensorId::parse(p).ok())),
            client_id: r.get(3),
            types: types.map(|t| Match::unlisted(&t, EventKind::parse)),
        },
        starts_at: r.get(5),
        ends_at: r.get(6),
        comment: r.get(7),
        created_at: r.get(8),
        updated_at: r.get(9),
        reconciled_at: r.get(10),
        schedule_id: r.get(11),
        ended_at: r.get(12),
    }
}

/// Marks silenced the new notifications (`seqs`) a silence active at `now` matches and
/// notes their pairs ([`rules::silences::apply`]); answers their seqs.
pub(super) async fn silence_new(tx: &Tx<'_>, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
    rules::silences::apply(&mut Tables { tx }, seqs, now).await
}

/// A stored sensor id, or the store's error.
fn sensor_id(s: &str) -> Result<SensorId> {
    SensorId::parse(s).map_err(|e| Error::Backend(format!("stored sensor id: {e}")))
}

impl rules::silences::SilenceTables for Tables<'_> {
    /// One statement, which reads nothing of the outbox when no silence is active.
    async fn mark_silenced(&mut self, seqs: &[i64], now: Millis) -> Result<Vec<Silenced>> {
        let tx = self.tx;
        let rows = tx
            .query(
                &tx.prepare_cached(&format!(
                    "WITH s AS (UPDATE notifications n SET status = 'silenced' \
                       WHERE EXISTS (SELECT 1 FROM silences a WHERE {}) \
                       AND n.seq = ANY($1) AND n.status = 'pending' AND {} \
                       RETURNING n.seq, n.client_id, n.sensor_id, n.kind, n.body, n.data, \
                       n.previous), \
                     d AS (DELETE FROM notifications_pending WHERE seq IN (SELECT seq FROM s)) \
                     SELECT seq, client_id, sensor_id, kind, body, data, previous FROM s \
                     ORDER BY seq",
                    active("a", "$2"),
                    active_match(
                        "$2",
                        "n.client_id",
                        "n.sensor_id",
                        "(o.types IS NULL OR strpos(o.types, ',' || n.kind || ',') > 0)"
                    )
                ))
                .await?,
                &[&seqs, &now],
            )
            .await?;
        rows.iter()
            .map(|r| {
                let kind: String = r.get(3);
                Ok(Silenced {
                    seq: r.get(0),
                    client_id: r.get(1),
                    sensor_id: sensor_id(r.get(2))?,
                    kind: EventKind::parse(&kind)
                        .ok_or_else(|| Error::Backend(format!("stored kind {kind}")))?,
                    body: r.get(4),
                    data: r.get(5),
                    previous: r.get(6),
                })
            })
            .collect()
    }

    /// The first of a pair gives its view: `ON CONFLICT` keeps an older row, and within
    /// the statement the first of the pair in `UNNEST`'s order.
    async fn note_pairs(&mut self, pairs: &[Pair]) -> Result<()> {
        let clients: Vec<&str> = pairs.iter().map(|p| p.client_id.as_str()).collect();
        let sensors: Vec<String> = pairs.iter().map(|p| p.sensor_id.to_string()).collect();
        let lost: Vec<Option<bool>> = pairs.iter().map(|p| p.before.map(|b| b.lost)).collect();
        let data: Vec<Option<bool>> = pairs
            .iter()
            .map(|p| p.before.and_then(|b| b.data))
            .collect();
        let since: Vec<i64> = pairs.iter().map(|p| p.since).collect();
        self.tx
            .execute(
                "INSERT INTO silenced_pairs (client_id, sensor_id, site_id, lost, data, since) \
                 SELECT DISTINCT ON (u.c, u.s) u.c, u.s, x.site_id, u.lost, u.data, u.since \
                 FROM UNNEST($1::text[], $2::text[], $3::bool[], $4::bool[], $5::int8[]) \
                   WITH ORDINALITY AS u(c, s, lost, data, since, o) \
                 LEFT JOIN sensors x ON x.id = u.s ORDER BY u.c, u.s, u.o ON CONFLICT DO NOTHING",
                &[&clients, &sensors, &lost, &data, &since],
            )
            .await?;
        Ok(())
    }

    /// Taken by the first node to come: the row lock makes another one's update wait and
    /// then find it reconciled.
    async fn take_ended(&mut self, ended_by: Millis, now: Millis) -> Result<Vec<String>> {
        let rows = self
            .tx
            .query(
                "UPDATE silences SET reconciled_at = $1 \
                 WHERE ends_at <= $2 AND reconciled_at IS NULL RETURNING id",
                &[&now, &ended_by],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn follows(&mut self, id: &str) -> Result<Option<(Schedule, Millis)>> {
        let row = self
            .tx
            .query_opt(
                "SELECT sc.body, s.ends_at FROM silences s JOIN schedules sc \
                 ON sc.id = s.schedule_id WHERE s.id = $1 AND s.ended_at IS NULL",
                &[&id],
            )
            .await?;
        row.map(|r| Ok((StoredSchedule::of(r.get(0), 0, 0)?.schedule, r.get(1))))
            .transpose()
    }

    async fn move_window(&mut self, id: &str, starts_at: Millis, ends_at: Millis) -> Result<()> {
        self.tx
            .execute(
                "UPDATE silences SET starts_at = $2, ends_at = $3, reconciled_at = NULL \
                 WHERE id = $1",
                &[&id, &starts_at, &ends_at],
            )
            .await?;
        Ok(())
    }

    async fn take_pairs(&mut self, id: &str, now: Millis) -> Result<Vec<Pair>> {
        let rows = self
            .tx
            .query(
                &format!(
                    "DELETE FROM silenced_pairs p USING silences s WHERE s.id = $1 AND {} \
                     AND NOT {} RETURNING p.client_id, p.sensor_id, p.lost, p.data, p.since",
                    matched_pair("s"),
                    active_match("$2", "p.client_id", "p.sensor_id", "o.id <> s.id")
                ),
                &[&id, &now],
            )
            .await?;
        rows.iter()
            .map(|p| {
                Ok(Pair {
                    client_id: p.get(0),
                    sensor_id: sensor_id(p.get(1))?,
                    before: p.get::<_, Option<bool>>(2).map(|lost| View {
                        lost,
                        data: p.get(3),
                    }),
                    since: p.get(4),
                })
            })
            .collect()
    }

    async fn site_of(&mut self, sensor: SensorId) -> Result<Option<String>> {
        Ok(self
            .tx
            .query_opt(
                "SELECT site_id FROM sensors WHERE id = $1",
                &[&sensor.to_string()],
            )
            .await?
            .and_then(|r| r.get(0)))
    }

    async fn retell_site(
        &mut self,
        site: &str,
        client: &str,
        now: Millis,
    ) -> Result<Option<SiteRetold>> {
        rules::sites::retell(self, site, client, now).await
    }

    async fn site_told(&mut self, r: &SiteRetold) -> Result<()> {
        // Added to the list as it is now: another client may have been told meanwhile.
        self.tx
            .execute(
                "UPDATE sites SET told_clients = told_clients || $2 || ',', \
                 retold = retold || $2 || '@' || released || ',' \
                 WHERE id = $1 AND strpos(told_clients, ',' || $2 || ',') = 0",
                &[&r.site, &r.client],
            )
            .await?;
        Ok(())
    }

    async fn site_will_tell(&mut self, client: &str, sensor: SensorId) -> Result<bool> {
        Ok(self
            .tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM sensors s JOIN sites si ON si.id = s.site_id \
                 JOIN site_held h ON h.site_id = si.id AND h.sensor_id = s.id WHERE s.id = $2 \
                 AND (NOT si.down OR h.id > si.released \
                   OR (strpos(si.told, ',' || s.id || ',') > 0 \
                   AND strpos(si.told_clients, ',' || $1 || ',') > 0)))",
                &[&client, &sensor.to_string()],
            )
            .await?
            .get(0))
    }

    async fn view(&mut self, client: &str, sensor: SensorId, since: i64) -> Result<Option<View>> {
        view(self.tx, client, sensor, since).await
    }

    async fn told_by_site(&mut self, client: &str, sensor: SensorId) -> Result<bool> {
        Ok(self
            .tx
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM sensors s JOIN sites si ON si.id = s.site_id \
                 WHERE s.id = $2 AND si.down AND strpos(si.told, ',' || s.id || ',') > 0 \
                 AND strpos(si.told_clients, ',' || $1 || ',') > 0)",
                &[&client, &sensor.to_string()],
            )
            .await?
            .get(0))
    }

    async fn linked(&mut self, client: &str, sensor: SensorId) -> Result<Option<LinkedSensor>> {
        let row = self
            .tx
            .query_opt(
                "SELECT st.data, st.connection, st.last_seen_at, c.events FROM links l \
                 JOIN clients c ON c.id = l.client_id \
                 LEFT JOIN sensor_state st ON st.sensor_id = l.sensor_id \
                 WHERE l.client_id = $1 AND l.sensor_id = $2",
                &[&client, &sensor.to_string()],
            )
            .await?;
        Ok(row.map(|r| LinkedSensor {
            data: r.get(0),
            connection: r
                .get::<_, Option<String>>(1)
                .as_deref()
                .and_then(Conn::parse)
                .unwrap_or(Conn::Unknown),
            last_seen_at: r.get(2),
            events: events_from_column(r.get(3)),
        }))
    }

    async fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        now: Millis,
    ) -> Result<NotificationRef> {
        super::site_rows::insert_one(self.tx, client, e, None, now).await
    }

    async fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> Result<()> {
        super::supersede::Older::of(newer).send(self.tx, now).await
    }
}

/// What `client` knows of `sensor` from its newest notification about it past `since`
/// delivered or waiting to be: of the sensor's own kinds in its lane, or a site's event
/// that named it (which travels in the lane of the first sensor it names,
/// `silence::site_view`); `None`: nothing (the caller takes the view the pair kept,
/// `silence::kept`).
async fn view(tx: &Tx<'_>, client: &str, id: SensorId, since: i64) -> Result<Option<View>> {
    let sensor = id.to_string();
    let sensor = sensor.as_str();
    let own = tx
        .query_opt(
            "SELECT seq, kind, data FROM notifications WHERE sensor_id = $2 AND client_id = $1 \
             AND status IN ('delivered', 'pending') AND kind IN ('sensor.state_changed', \
             'sensor.connection_lost', 'sensor.connection_restored', 'sensor.still_lost') \
             AND seq > $3 ORDER BY seq DESC LIMIT 1",
            &[&client, &sensor, &since],
        )
        .await?;
    let after: i64 = own.as_ref().map_or(since, |o| o.get(0));
    let id =
        SensorId::parse(sensor).map_err(|e| Error::Backend(format!("stored sensor id: {e}")))?;
    let sites = tx
        .query(
            "SELECT kind, body FROM notifications WHERE client_id = $1 AND seq > $3 \
             AND status IN ('delivered', 'pending') \
             AND kind IN ('site.connection_lost', 'site.connection_restored') \
             AND strpos(body, $2) > 0 ORDER BY seq DESC",
            &[&client, &silence::names_in_body(sensor), &after],
        )
        .await?;
    let by_site = sites
        .iter()
        .find_map(|r| silence::site_view(EventKind::parse(r.get(0))?, r.get(1), id));
    Ok(by_site
        .or_else(|| own.and_then(|r| EventKind::parse(r.get(1)).map(|k| View::after(k, r.get(2))))))
}

#[async_trait]
impl Silences for PgStore {
    async fn create_silence(&self, s: Silence) -> Result<()> {
        let audit = crate::store::audit::take().map(|r| r.created(&s.id));
        let mut c = self.db.get("create_silence").await?;
        let m = &s.matcher;
        let types = m
            .types
            .as_ref()
            .map(|t| Match::listed(&t.iter().map(|k| k.as_str()).collect::<Vec<_>>()));
        let tx = c.transaction().await?;
        tx.execute(
            "INSERT INTO silences (id, site_id, named_sensors, client_id, types, starts_at, \
             ends_at, comment, created_at, updated_at, schedule_id, ended_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            &[
                &s.id,
                &m.site_id,
                &m.sensor_ids.as_ref().map(|ids| ids.len() as i32),
                &m.client_id,
                &types,
                &s.starts_at,
                &s.ends_at,
                &s.comment,
                &s.created_at,
                &s.updated_at,
                &s.schedule_id,
                &s.ended_at,
            ],
        )
        .await?;
        if let Some(ids) = &m.sensor_ids {
            // Its sensors made rows (in the order given) by one statement.
            let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
            tx.execute(
                "INSERT INTO silence_sensors (silence_id, pos, sensor_id) \
                 SELECT $1, u.o, u.x FROM UNNEST($2::text[]) WITH ORDINALITY u(x, o)",
                &[&s.id, &ids],
            )
            .await?;
        }
        super::audit::record(&tx, audit.as_ref()).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn get_silence(&self, id: String) -> Result<Option<Silence>> {
        let c = self.db.get("get_silence").await?;
        let row = c
            .query_opt(
                &format!("SELECT {SILENCE_COLS} FROM silences WHERE id = $1"),
                &[&id],
            )
            .await?;
        Ok(row.as_ref().map(silence_row))
    }

    async fn list_silences(
        &self,
        state: Option<SilenceState>,
        now: Millis,
        page: PageRequest,
    ) -> Result<Page<Silence>> {
        let state = match state {
            None => "true",
            Some(SilenceState::Pending) => {
                "(starts_at > $3 OR (ends_at <= $3 AND schedule_id IS NOT NULL \
                 AND ended_at IS NULL))"
            }
            Some(SilenceState::Active) => "starts_at <= $3 AND ends_at > $3",
            Some(SilenceState::Ended) => {
                "ends_at <= $3 AND (schedule_id IS NULL OR ended_at IS NOT NULL)"
            }
        };
        let c = self.db.get("list_silences").await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {SILENCE_COLS} FROM silences WHERE id > $1 AND {state} \
                     AND $3::int8 IS NOT NULL ORDER BY id LIMIT $2"
                ),
                &[
                    &page.after.clone().unwrap_or_default(),
                    &limit_plus_one(&page),
                    &now,
                ],
            )
            .await?;
        let rows = rows.iter().map(silence_row).collect();
        Ok(Page::from_rows(rows, page.limit, |s| s.id.clone()))
    }

    async fn update_silence(&self, s: Silence) -> Result<bool> {
        let audit = crate::store::audit::take();
        let mut c = self.db.get("update_silence").await?;
        let tx = c.transaction().await?;
        let n = tx
            .execute(
                // As the embedded store's `UPDATE_RECONCILED`.
                "UPDATE silences SET starts_at = $2, ends_at = $3, comment = $4, \
                 updated_at = $5, schedule_id = $6, ended_at = $7, \
                 reconciled_at = CASE WHEN $3 > ends_at THEN NULL ELSE reconciled_at END \
                 WHERE id = $1 AND (reconciled_at IS NULL \
                 OR (schedule_id IS NOT NULL AND ended_at IS NULL))",
                &[
                    &s.id,
                    &s.starts_at,
                    &s.ends_at,
                    &s.comment,
                    &s.updated_at,
                    &s.schedule_id,
                    &s.ended_at,
                ],
            )
            .await?;
        super::audit::audited(tx, n, audit.as_ref()).await
    }

    async fn silences_following(&self, schedule_id: String) -> Result<Vec<Silence>> {
        let c = self.db.get("silences_following").await?;
        let rows = c
            .query(
                &format!(
                    "SELECT {SILENCE_COLS} FROM silences WHERE schedule_id = $1 \
                     AND ended_at IS NULL ORDER BY id"
                ),
                &[&schedule_id],
            )
            .await?;
        Ok(rows.iter().map(silence_row).collect())
    }

    async fn reconcile_silences(
        &self,
        ended_by: Millis,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        let mut c = self.db.get("reconcile_silences").await?;
        // A round every second on every node: no transaction when none ended.
        let ended: bool = c
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM silences \
                 WHERE ends_at <= $1 AND reconciled_at IS NULL)",
                &[&ended_by],
            )
            .await?
            .get(0);
        if !ended {
            return Ok(Vec::new());
        }
        let tx = c.transaction().await?;
        let made = rules::silences::reconcile_ended(&mut Tables { tx: &tx }, ended_by, now).await?;
        tx.commit().await?;
        Ok(made)
    }
}
