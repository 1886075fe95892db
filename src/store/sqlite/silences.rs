//! Silences: kept as rows, applied by the group commit to the notifications it makes
//! ([`silence_new`]), and reconciled once at their end ([`Silences::reconcile_silences`]).

use std::collections::HashSet;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use super::super::{NotificationRef, Page, PageRequest, Result, Silences, limit_plus_one};
use super::SqliteStore;
use crate::domain::silence::{self, Match, Silence, SilenceState, View};
use crate::domain::{Connection as Conn, Detail, Event, EventKind, Millis, SensorId};
use crate::store::rules::commit::Newer;

/// A silence's columns as [`silence_row`] reads them; its sensors (`silence_sensors`) as
/// one list in the order given, NULL when it names none.
const SILENCE_COLS: &str = "id, site_id, CASE WHEN named_sensors IS NULL THEN NULL ELSE \
     coalesce((SELECT group_concat(x.sensor_id, ',' ORDER BY x.pos) FROM silence_sensors x \
     WHERE x.silence_id = silences.id), '') END, client_id, types, starts_at, ends_at, \
     comment, created_at, updated_at, reconciled_at";

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
    })
}

/// Marks `silenced` the notifications of seq above `after` that a silence active at `now`
/// matches, and notes their pairs for the silence's end; answers their seqs. Called by
/// the group commit right after it inserted them.
pub(super) fn silence_new(tx: &Transaction, after: i64, now: Millis) -> Result<HashSet<i64>> {
    let any: bool = tx
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM silences s WHERE {})",
            active("s", "?1")
        ))?
        .query_row([now], |r| r.get(0))?;
    if !any {
        return Ok(HashSet::new());
    }
    let silenced = tx
        .prepare_cached(&format!(
            "UPDATE notifications AS n SET status = 'silenced' WHERE n.seq > ?1 \
             AND n.status = 'pending' AND {} \
             RETURNING seq, client_id, sensor_id, kind, body, data, previous",
            active_match(
                "?2",
                "n.client_id",
                "n.sensor_id",
                "(o.types IS NULL OR instr(o.types, ',' || n.kind || ',') > 0)"
            )
        ))?
        .query_map(params![after, now], |r| {
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
    let mut pair = tx.prepare_cached(
        "INSERT INTO silenced_pairs (client_id, sensor_id, site_id, lost, data, since) \
         VALUES (?1, ?2, (SELECT site_id FROM sensors WHERE id = ?2), ?3, ?4, ?5) \
         ON CONFLICT DO NOTHING",
    )?;
    super::super::count_silenced(silenced.len());
    let mut seqs = HashSet::with_capacity(silenced.len());
    for (seq, client, sensor, kind, body, data, previous) in silenced {
        if let (Some(kind), Ok(anchor)) = (EventKind::parse(&kind), SensorId::parse(&sensor)) {
            let k = silence::Kept {
                kind,
                anchor,
                data,
                previous,
                body: body.as_deref(),
            };
            for (kept, before) in silence::kept(k) {
                pair.execute(params![
                    client,
                    kept.to_string(),
                    before.lost,
                    before.data,
                    seq
                ])?;
            }
        }
        seqs.insert(seq);
    }
    Ok(seqs)
}

/// Reconciles silence `id`: each pair it kept something from, that no other active
/// silence holds, gets one notification if its client's view is wrong.
fn reconcile(tx: &Transaction, id: &str, now: Millis) -> Result<Vec<NotificationRef>> {
    let pairs = tx
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
            let kept = Kept {
                before,
                since: r.get(4)?,
            };
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, kept))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    // A site still down whose loss the silence kept from a client: one site loss for it
    // (`site::retell`), not a loss per sensor; the sensors it names are up to date then.
    let mut retold = Vec::new();
    let mut asked = HashSet::new();
    for (client, sensor, _) in &pairs {
        let site: Option<String> = tx
            .prepare_cached("SELECT site_id FROM sensors WHERE id = ?1")?
            .query_row([sensor], |r| r.get(0))
            .optional()?
            .flatten();
        if let Some(site) = site
            && asked.insert((client.clone(), site.clone()))
            && let Some(r) = super::site_retell::retell(tx, &site, client, now)?
        {
            retold.push((client.clone(), r));
        }
    }
    let mut made: Vec<NotificationRef> = retold.iter().map(|(_, r)| r.made.clone()).collect();
    for (client, sensor, kept) in pairs {
        tx.prepare_cached("DELETE FROM silenced_pairs WHERE client_id = ?1 AND sensor_id = ?2")?
            .execute(params![client, sensor])?;
        let named = retold
            .iter()
            .any(|(c, r)| *c == client && r.named.iter().any(|s| s.to_string() == sensor));
        if named {
            continue;
        }
        if let Some(r) = bring_up_to_date(tx, &client, &sensor, kept, now)? {
            made.push(r);
        }
    }
    for (_, r) in &retold {
        super::site_retell::told(tx, r)?;
    }
    Ok(made)
}

/// What a pair keeps for its reconciliation: what the client knew of the sensor before the
/// first notification the silence kept (`None`: a pair noted before latch kept it), and that
/// notification's seq: what was told after it is read from the outbox (retention keeps it
/// while the pair waits), what came before only through this view.
#[derive(Debug, Clone, Copy)]
struct Kept {
    before: Option<View>,
    since: i64,
}

/// Whether the site of sensor `?2` holds events of it that its decision will release to
/// client `?1`: every one while the site is up (its grace runs), those not released yet
/// while it is down, and all to a client its loss told of the sensor.
const SITE_WILL_TELL: &str = "EXISTS (SELECT 1 FROM sensors s JOIN sites si ON si.id = s.site_id \
     JOIN site_held h ON h.site_id = si.id AND h.sensor_id = s.id WHERE s.id = ?2 \
     AND (NOT si.down OR h.id > si.released OR (instr(si.told, ',' || s.id || ',') > 0 \
          AND instr(si.told_clients, ',' || ?1 || ',') > 0)))";

/// The notification that brings `client`'s view of `sensor` up to date, made pending,
/// if it is linked, wants that type, and its view is wrong.
fn bring_up_to_date(
    tx: &Transaction,
    client: &str,
    sensor: &str,
    kept: Kept,
    now: Millis,
) -> Result<Option<NotificationRef>> {
    // What its site holds of the sensor and will tell this client: the site's decision
    // brings its view up to date (a return with the data at release), and a notification
    // here would tell the same loss or return twice, with different ids (issue #68).
    let site_tells: bool = tx
        .prepare_cached(&format!("SELECT {SITE_WILL_TELL}"))?
        .query_row(params![client, sensor], |r| r.get(0))?;
    if site_tells {
        return Ok(None);
    }
    let view = view(tx, client, sensor, kept.since)?.or(kept.before);
    let told: bool = tx
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM sensors s JOIN sites si ON si.id = s.site_id \
             WHERE s.id = ?2 AND si.down AND instr(si.told, ',' || s.id || ',') > 0 \
             AND instr(si.told_clients, ',' || ?1 || ',') > 0)",
        )?
        .query_row(params![client, sensor], |r| r.get(0))?;
    let state = tx
        .prepare_cached(
            "SELECT st.data, st.connection, st.last_seen_at, c.events FROM links l \
             JOIN clients c ON c.id = l.client_id \
             LEFT JOIN sensor_state st ON st.sensor_id = l.sensor_id \
             WHERE l.client_id = ?1 AND l.sensor_id = ?2",
        )?
        .query_row(params![client, sensor], |r| {
            Ok((
                r.get::<_, Option<bool>>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, Option<Millis>>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })
        .optional()?;
    let Some((data, connection, last_seen_at, events)) = state else {
        return Ok(None);
    };
    let connection = connection
        .as_deref()
        .and_then(Conn::parse)
        .unwrap_or(Conn::Unknown);
    let view = silence::told_by_site(view.unwrap_or(View::unseen(data)), told);
    let Some((kind, data, previous)) = silence::reconcile(view, connection, data) else {
        return Ok(None);
    };
    if let Some(events) = events
        && !events.split(',').any(|e| e == kind.as_str())
    {
        return Ok(None);
    }
    let sensor_id = SensorId::parse(sensor)
        .map_err(|e| super::super::Error::Backend(format!("stored sensor id: {e}")))?;
    let e = Event {
        sensor_id,
        kind,
        at: now,
        data,
        previous,
        last_seen_at,
        detail: Detail::default(),
    };
    let made = super::site_rows::insert_one(tx, client, &e, None, now)?;
    if kind == EventKind::StateChanged {
        // A newer state, as a commit's: the lane's older pending states no attempt holds
        // are superseded (README: Supersede).
        let newer = Newer {
            sensor: sensor_id,
            client: Some(client),
            seq: made.seq,
        };
        super::supersede::older(tx, &[newer], now)?;
    }
    Ok(Some(made))
}

/// What `client` knows of `sensor` from its newest notification about it past `since`
/// delivered or waiting to be: of the sensor's own kinds in its lane, or a site's event
/// that named it (which travels in the lane of the first sensor it names,
/// `silence::site_view`); `None`: nothing (the caller takes the view the pair kept,
/// `silence::kept`).
fn view(c: &Connection, client: &str, sensor: &str, since: i64) -> Result<Option<View>> {
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
    let id = SensorId::parse(sensor)
        .map_err(|e| super::super::Error::Backend(format!("stored sensor id: {e}")))?;
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
        self.write(move |c| {
            let m = &s.matcher;
            let tx = c.transaction()?;
            tx.execute(
                "INSERT INTO silences (id, site_id, named_sensors, client_id, types, \
                 starts_at, ends_at, comment, created_at, updated_at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
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
                    s.updated_at
                ],
            )?;
            if let Some(sensors) = sensors {
                tx.execute(
                    "INSERT INTO silence_sensors (silence_id, pos, sensor_id) \
                     SELECT ?1, j.key, j.value FROM json_each(?2) j",
                    params![s.id, sensors],
                )?;
            }
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
            Some(SilenceState::Pending) => "starts_at > ?3",
            Some(SilenceState::Active) => "starts_at <= ?3 AND ends_at > ?3",
            Some(SilenceState::Ended) => "ends_at <= ?3",
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
        self.write(move |c| {
            Ok(c.execute(
                "UPDATE silences SET starts_at = ?2, ends_at = ?3, comment = ?4, \
                 updated_at = ?5 WHERE id = ?1 AND reconciled_at IS NULL",
                params![s.id, s.starts_at, s.ends_at, s.comment, s.updated_at],
            )? > 0)
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
                let ended = tx
                    .prepare_cached(
                        "UPDATE silences SET reconciled_at = ?1 \
                     WHERE ends_at <= ?2 AND reconciled_at IS NULL RETURNING id",
                    )?
                    .query_map([now, ended_by], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let mut made = Vec::new();
                for id in ended {
                    made.extend(reconcile(tx, &id, now)?);
                }
                made.sort_by_key(|r| r.seq);
                Ok(made)
            })
        })
        .await
    }
}
