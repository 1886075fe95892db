//! Silences: kept as rows, applied by the group commit to the notifications it makes and
//! reconciled once at their end ([`rules::silences`], over `rules::silences::SilenceTables`).

use std::collections::HashSet;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use super::super::{
    Error, NotificationRef, Page, PageRequest, Result, Silences, StoredSchedule, limit_plus_one,
};
use super::SqliteStore;
use super::tables::Tables;
use crate::domain::client::events_from_column;
use crate::domain::schedule::Schedule;
use crate::domain::silence::{self, Match, Silence, SilenceState, View};
use crate::domain::{Connection as Conn, Event, EventKind, Millis, SensorId};
use crate::store::rules;
use crate::store::rules::commit::Newer;
use crate::store::rules::silences::{LinkedSensor, Pair, Silenced};
use crate::store::rules::sites::SiteRetold;

/// A silence's columns as [`silence_row`] reads them; its sensors (`silence_sensors`) as
/// one list in the order given, NULL when it names none.
const SILENCE_COLS: &str = "id, site_id, CASE WHEN named_sensors IS NULL THEN NULL ELSE \
     coalesce((SELECT group_concat(x.sensor_id, ',' ORDER BY x.pos) FROM silence_sensors x \
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
/// found by `silences_any_sensor`, those that name this one by `silence_sensors_by_sensor`
/// (`CROSS JOIN` keeps that order), never a pass over every active silence's sensors.
fn active_match(now: &str, client: &str, sensor: &str, also: &str) -> String {
    let (active, m) = (active("o", now), matches_client_site("o", client, sensor));
    format!(
        "(EXISTS (SELECT 1 FROM silences o INDEXED BY silences_any_sensor \
           WHERE o.named_sensors IS NULL AND {active} AND {m} AND {also}) \
         OR EXISTS (SELECT 1 FROM silence_sensors y CROSS JOIN silences o \
           ON o.id = y.silence_id WHERE y.sensor_id = {sensor} AND {active} AND {m} \
           AND {also}))"
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

/// Whether silence `s` is active at `?now` (the parameter's name given).
fn active(s: &str, now: &str) -> String {
    format!("{s}.starts_at <= {now} AND {s}.ends_at > {now}")
}

/// `?state=pending` as of `?3`: not begun, or between a schedule's windows
/// (`Silence::state`).
const PENDING: &str =
    "(starts_at > ?3 OR (ends_at <= ?3 AND schedule_id IS NOT NULL AND ended_at IS NULL))";
/// `?state=ended` as of `?3`.
const ENDED: &str = "ends_at <= ?3 AND (schedule_id IS NULL OR ended_at IS NOT NULL)";
/// The rest of `update_silence`'s statement: a silence reconciled already takes no change,
/// unless it follows a schedule (one whose schedule had no window to come is placed again
/// so); a window moved to end later is reconciled at its end again.
const UPDATE_RECONCILED: &str = "reconciled_at = CASE WHEN ?3 > ends_at THEN NULL \
     ELSE reconciled_at END WHERE id = ?1 AND (reconciled_at IS NULL \
     OR (schedule_id IS NOT NULL AND ended_at IS NULL))";

fn silence_row(r: &Row) -> rusqlite::Result<Silence> {
    let sensors: Option<String> = r.get(2)?;
    let types: Option<String> = r.get(4)?;
    Ok(Silence {
        id: r.get(0)?,
        matcher: Match {
            site_id: r.get(1)?,
            sensor_ids: sensors.map(|s| Match::unlisted(&s, |p| SensorId::parse(p).ok())),
            client_id: r.get(3)?,
            types: types.map(|t| Match::unlisted(&t, EventKind::parse)),
        },
        starts_at: r.get(5)?,
        ends_at: r.get(6)?,
        comment: r.get(7)?,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
        reconciled_at: r.get(10)?,
        schedule_id: r.get(11)?,
        ended_at: r.get(12)?,
    })
}

/// Marks silenced the new notifications (`seqs`) a silence active at `now` matches and
/// notes their pairs ([`rules::silences::apply`]); answers their seqs.
pub(super) fn silence_new(tx: &Transaction, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
    rules::now_or_never(rules::silences::apply(&mut Tables { tx }, seqs, now))
}

/// A stored sensor id, or the store's error.
fn sensor_id(s: &str) -> Result<SensorId> {
    SensorId::parse(s).map_err(|e| Error::Backend(format!("stored sensor id: {e}")))
}

impl rules::silences::SilenceTables for Tables<'_> {
    /// Reads nothing of the outbox when no silence is active.
    async fn mark_silenced(&mut self, seqs: &[i64], now: Millis) -> Result<Vec<Silenced>> {
        let tx = self.tx;
        let any: bool = tx
            .prepare_cached(&format!(
                "SELECT EXISTS (SELECT 1 FROM silences s WHERE {})",
                active("s", "?1")
            ))?
            .query_row([now], |r| r.get(0))?;
        let Some(first) = seqs.first().filter(|_| any) else {
            return Ok(Vec::new());
        };
        // The new notifications are the outbox's last: those past the first.
        let rows = tx
            .prepare_cached(&format!(
                "UPDATE notifications AS n SET status = 'silenced' WHERE n.seq >= ?1 \
                 AND n.status = 'pending' AND {} \
                 RETURNING seq, client_id, sensor_id, kind, body, data, previous",
                active_match(
                    "?2",
                    "n.client_id",
                    "n.sensor_id",
                    "(o.types IS NULL OR instr(o.types, ',' || n.kind || ',') > 0)"
                )
            ))?
            .query_map(params![first, now], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, Option<String>>(4)?,
                    r.get::<_, Option<bool>>(5)?,
                    r.get::<_, Option<bool>>(6)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut silenced = Vec::with_capacity(rows.len());
        for (seq, client_id, sensor, kind, body, data, previous) in rows {
            silenced.push(Silenced {
                seq,
                client_id,
                sensor_id: sensor_id(&sensor)?,
                kind: EventKind::parse(&kind)
                    .ok_or_else(|| Error::Backend(format!("stored kind {kind}")))?,
                body,
                data,
                previous,
            });
        }
        Ok(silenced)
    }

    async fn note_pairs(&mut self, pairs: &[Pair]) -> Result<()> {
        let mut pair = self.tx.prepare_cached(
            "INSERT INTO silenced_pairs (client_id, sensor_id, site_id, lost, data, since) \
             VALUES (?1, ?2, (SELECT site_id FROM sensors WHERE id = ?2), ?3, ?4, ?5) \
             ON CONFLICT DO NOTHING",
        )?;
        for p in pairs {
            pair.execute(params![
                p.client_id,
                p.sensor_id.to_string(),
                p.before.map(|b| b.lost),
                p.before.and_then(|b| b.data),
                p.since
            ])?;
        }
        Ok(())
    }

    async fn take_ended(&mut self, ended_by: Millis, now: Millis) -> Result<Vec<String>> {
        Ok(self
            .tx
            .prepare_cached(
                "UPDATE silences SET reconciled_at = ?1 \
                 WHERE ends_at <= ?2 AND reconciled_at IS NULL RETURNING id",
            )?
            .query_map([now, ended_by], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }

    async fn follows(&mut self, id: &str) -> Result<Option<(Schedule, Millis)>> {
        let row = self
            .tx
            .prepare_cached(
                "SELECT sc.body, s.ends_at FROM silences s JOIN schedules sc \
                 ON sc.id = s.schedule_id WHERE s.id = ?1 AND s.ended_at IS NULL",
            )?
            .query_row([id], |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, Millis>(1)?))
            })
            .optional()?;
        row.map(|(body, ends_at)| Ok((StoredSchedule::of(&body, 0, 0)?.schedule, ends_at)))
            .transpose()
    }

    async fn move_window(&mut self, id: &str, starts_at: Millis, ends_at: Millis) -> Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE silences SET starts_at = ?2, ends_at = ?3, reconciled_at = NULL \
                 WHERE id = ?1",
            )?
            .execute(params![id, starts_at, ends_at])?;
        Ok(())
    }

    async fn take_pairs(&mut self, id: &str, now: Millis) -> Result<Vec<Pair>> {
        let rows = self
            .tx
            .prepare_cached(&format!(
                "SELECT p.client_id, p.sensor_id, p.lost, p.data, p.since \
                 FROM silenced_pairs p, silences s \
                 WHERE s.id = ?1 AND {} AND NOT {}",
                matched_pair("s"),
                active_match("?2", "p.client_id", "p.sensor_id", "o.id <> s.id")
            ))?
            .query_map(params![id, now], |r| {
                let lost: Option<bool> = r.get(2)?;
                let before = lost.map(|lost| View {
                    lost,
                    data: r.get(3).ok().flatten(),
                });
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    before,
                    r.get(4)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut forget = self
            .tx
            .prepare_cached("DELETE FROM silenced_pairs WHERE client_id = ?1 AND sensor_id = ?2")?;
        let mut pairs = Vec::with_capacity(rows.len());
        for (client_id, sensor, before, since) in rows {
            forget.execute(params![client_id, sensor])?;
            pairs.push(Pair {
                client_id,
                sensor_id: sensor_id(&sensor)?,
                before,
                since,
            });
        }
        Ok(pairs)
    }

    async fn site_of(&mut self, sensor: SensorId) -> Result<Option<String>> {
        Ok(self
            .tx
            .prepare_cached("SELECT site_id FROM sensors WHERE id = ?1")?
            .query_row([sensor.to_string()], |r| r.get(0))
            .optional()?
            .flatten())
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
            .prepare_cached(
                "UPDATE sites SET told_clients = told_clients || ?2 || ',', \
                 retold = retold || ?2 || '@' || released || ',' \
                 WHERE id = ?1 AND instr(told_clients, ',' || ?2 || ',') = 0",
            )?
            .execute(params![r.site, r.client])?;
        Ok(())
    }

    async fn site_will_tell(&mut self, client: &str, sensor: SensorId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached(&format!("SELECT {SITE_WILL_TELL}"))?
            .query_row(params![client, sensor.to_string()], |r| r.get(0))?)
    }

    async fn view(&mut self, client: &str, sensor: SensorId, since: i64) -> Result<Option<View>> {
        view(self.tx, client, sensor, since)
    }

    async fn told_by_site(&mut self, client: &str, sensor: SensorId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM sensors s JOIN sites si ON si.id = s.site_id \
                 WHERE s.id = ?2 AND si.down AND instr(si.told, ',' || s.id || ',') > 0 \
                 AND instr(si.told_clients, ',' || ?1 || ',') > 0)",
            )?
            .query_row(params![client, sensor.to_string()], |r| r.get(0))?)
    }

    async fn linked(&mut self, client: &str, sensor: SensorId) -> Result<Option<LinkedSensor>> {
        let row = self
            .tx
            .prepare_cached(
                "SELECT st.data, st.connection, st.last_seen_at, c.events FROM links l \
                 JOIN clients c ON c.id = l.client_id \
                 LEFT JOIN sensor_state st ON st.sensor_id = l.sensor_id \
                 WHERE l.client_id = ?1 AND l.sensor_id = ?2",
            )?
            .query_row(params![client, sensor.to_string()], |r| {
                Ok((
                    r.get::<_, Option<bool>>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, Option<Millis>>(2)?,
                    r.get::<_, Option<String>>(3)?,
                ))
            })
            .optional()?;
        Ok(
            row.map(|(data, connection, last_seen_at, events)| LinkedSensor {
                data,
                connection: connection
                    .as_deref()
                    .and_then(Conn::parse)
                    .unwrap_or(Conn::Unknown),
                last_seen_at,
                events: events_from_column(events),
            }),
        )
    }

    async fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        now: Millis,
    ) -> Result<NotificationRef> {
        super::site_rows::insert_one(self.tx, client, e, None, now)
    }

    async fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> Result<()> {
        super::supersede::older(self.tx, newer, now)
    }
}

/// Whether the site of sensor `?2` holds events of it that its decision will release to
/// client `?1`: every one while the site is up (its grace runs), those not released yet
/// while it is down, and all to a client its loss told of the sensor.
const SITE_WILL_TELL: &str = "EXISTS (SELECT 1 FROM sensors s JOIN sites si ON si.id = s.site_id \
     JOIN site_held h ON h.site_id = si.id AND h.sensor_id = s.id WHERE s.id = ?2 \
     AND (NOT si.down OR h.id > si.released OR (instr(si.told, ',' || s.id || ',') > 0 \
          AND instr(si.told_clients, ',' || ?1 || ',') > 0)))";

/// What `client` knows of `sensor` from its newest notification about it past `since`
/// delivered or waiting to be: of the sensor's own kinds in its lane, or a site's event
/// that named it (which travels in the lane of the first sensor it names,
/// `silence::site_view`); `None`: nothing (the caller takes the view the pair kept,
/// `silence::kept`).
fn view(c: &Connection, client: &str, id: SensorId, since: i64) -> Result<Option<View>> {
    let sensor = id.to_string();
    let sensor = sensor.as_str();
    let own = c
        .prepare_cached(
            "SELECT seq, kind, data FROM notifications WHERE sensor_id = ?2 AND client_id = ?1 \
             AND status IN ('delivered', 'pending') AND kind IN ('sensor.state_changed', \
             'sensor.connection_lost', 'sensor.connection_restored', 'sensor.still_lost') \
             AND seq > ?3 ORDER BY seq DESC LIMIT 1",
        )?
        .query_row(params![client, sensor, since], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, Option<bool>>(2)?,
            ))
        })
        .optional()?;
    let after = own.as_ref().map_or(since, |o| o.0);
    let sites = c
        .prepare_cached(
            "SELECT kind, body FROM notifications WHERE client_id = ?1 AND seq > ?3 \
             AND status IN ('delivered', 'pending') \
             AND kind IN ('site.connection_lost', 'site.connection_restored') \
             AND instr(body, ?2) > 0 ORDER BY seq DESC",
        )?
        .query_map(
            params![client, silence::names_in_body(sensor), after],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<String>>(1)?)),
        )?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let by_site = sites
        .iter()
        .find_map(|(k, body)| silence::site_view(EventKind::parse(k)?, body.as_deref(), id));
    Ok(by_site.or_else(|| {
        own.and_then(|(_, kind, data)| EventKind::parse(&kind).map(|k| View::after(k, data)))
    }))
}

#[async_trait]
impl Silences for SqliteStore {
    async fn create_silence(&self, s: Silence) -> Result<()> {
        // Its sensors as one JSON array, made rows (in the order given) by one statement.
        let sensors = s.matcher.sensor_ids.as_ref().map(|ids| {
            serde_json::to_string(&ids.iter().map(|i| i.to_string()).collect::<Vec<_>>())
                .expect("strings serialize")
        });
        let audit = crate::store::audit::take().map(|r| r.created(&s.id));
        self.write(move |c| {
            let m = &s.matcher;
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO silences (id, site_id, named_sensors, client_id, types, \
                 starts_at, ends_at, comment, created_at, updated_at, schedule_id, ended_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    s.id,
                    m.site_id,
                    m.sensor_ids.as_ref().map(|ids| ids.len() as i64),
                    m.client_id,
                    m.types
                        .as_ref()
                        .map(|t| Match::listed(&t.iter().map(|k| k.as_str()).collect::<Vec<_>>())),
                    s.starts_at,
                    s.ends_at,
                    s.comment,
                    s.created_at,
                    s.updated_at,
                    s.schedule_id,
                    s.ended_at
                ],
            )?;
            if let Some(sensors) = sensors {
                tx.execute(
                    "INSERT INTO silence_sensors (silence_id, pos, sensor_id) \
                     SELECT ?1, j.key, j.value FROM json_each(?2) j",
                    params![s.id, sensors],
                )?;
            }
            super::audit::record(&tx, audit.as_ref())?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn get_silence(&self, id: String) -> Result<Option<Silence>> {
        self.read(move |c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {SILENCE_COLS} FROM silences WHERE id = ?1"
            ))?
            .query_row([&id], silence_row)
            .optional()?)
        })
        .await
    }

    async fn list_silences(
        &self,
        state: Option<SilenceState>,
        now: Millis,
        page: PageRequest,
    ) -> Result<Page<Silence>> {
        let state = match state {
            None => "?3 IS NOT NULL",
            Some(SilenceState::Pending) => PENDING,
            Some(SilenceState::Active) => "starts_at <= ?3 AND ends_at > ?3",
            Some(SilenceState::Ended) => ENDED,
        };
        self.read(move |c| {
            let rows = c
                .prepare_cached(&format!(
                    "SELECT {SILENCE_COLS} FROM silences WHERE id > ?1 AND {state} \
                     ORDER BY id LIMIT ?2"
                ))?
                .query_map(
                    params![
                        page.after.clone().unwrap_or_default(),
                        limit_plus_one(&page),
                        now
                    ],
                    silence_row,
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(Page::from_rows(rows, page.limit, |s| s.id.clone()))
        })
        .await
    }

    async fn update_silence(&self, s: Silence) -> Result<bool> {
        let audit = crate::store::audit::take();
        self.write(move |c| {
            let tx = c.transaction()?;
            let n = tx.execute(
                &format!(
                    "UPDATE silences SET starts_at = ?2, ends_at = ?3, comment = ?4, \
                     updated_at = ?5, schedule_id = ?6, ended_at = ?7, {UPDATE_RECONCILED}"
                ),
                params![
                    s.id,
                    s.starts_at,
                    s.ends_at,
                    s.comment,
                    s.updated_at,
                    s.schedule_id,
                    s.ended_at
                ],
            )?;
            if n > 0 {
                super::audit::record(&tx, audit.as_ref())?;
            }
            tx.commit()?;
            Ok(n > 0)
        })
        .await
    }

    async fn silences_following(&self, schedule_id: String) -> Result<Vec<Silence>> {
        self.read(move |c| {
            Ok(c.prepare_cached(&format!(
                "SELECT {SILENCE_COLS} FROM silences WHERE schedule_id = ?1 \
                 AND ended_at IS NULL ORDER BY id"
            ))?
            .query_map([&schedule_id], silence_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    async fn reconcile_silences(
        &self,
        ended_by: Millis,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        // Looked for on a reader first, as a site's round: no write when none ended.
        let ended: bool = self
            .read(move |c| {
                Ok(c.prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM silences \
                     WHERE ends_at <= ?1 AND reconciled_at IS NULL)",
                )?
                .query_row([ended_by], |r| r.get(0))?)
            })
            .await?;
        if !ended {
            return Ok(Vec::new());
        }
        // Its SQL reads the sensors' `last_seen_at`: the kept times are written first.
        let seen = self.inner.seen.clone();
        self.write(move |c| {
            super::seen::flushed(&seen, c, |tx| {
                rules::now_or_never(rules::silences::reconcile_ended(
                    &mut Tables { tx },
                    ended_by,
                    now,
                ))
            })
        })
        .await
    }
}
