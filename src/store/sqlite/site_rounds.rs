//! Sites' decisions on the embedded store: the group commit holds back liveness events of
//! a site's sensors ([`hold_for_sites`]), and a round decides each due site
//! ([`decide_sites`]), by [`rules::sites`] over `rules::sites::SiteTables`.

use std::collections::{HashMap, HashSet};

use rusqlite::{OptionalExtension, Transaction, params};

use super::super::{Decided, NotificationRef, Result};
use super::site_rows::{SITE_ROW, insert_one, linked, members, site_row, state_of, stored_sensor};
use super::tables::Tables;
use crate::domain::silence::Match;
use crate::domain::site::Site;
use crate::domain::site::decide::{HeldEvent, Linked, Member, Rules, SiteState};
use crate::domain::{Detail, Event, EventKind, Millis, SensorId};
use crate::store::rules::{self, sites::SiteOf};

/// Which of `events` (their places) make no notification now ([`rules::sites`]).
pub(super) fn hold_for_sites(
    tx: &Transaction,
    events: &[&Event],
    now: Millis,
) -> Result<HashSet<usize>> {
    rules::now_or_never(rules::sites::hold_for_sites(
        &mut Tables { tx },
        events,
        now,
    ))
}

impl rules::sites::SiteTables for Tables<'_> {
    /// One writer: nothing to hold the sites against.
    async fn sites_of(&mut self, sensors: &[SensorId]) -> Result<HashMap<SensorId, SiteOf>> {
        let mut site_of = self.tx.prepare_cached(
            "SELECT si.id, si.down, si.since, si.pending_since, si.told, si.told_clients, \
             si.released, si.retold, EXISTS (SELECT 1 FROM site_held h \
               WHERE h.site_id = si.id AND h.sensor_id = s.id) \
             FROM sensors s JOIN sites si ON si.id = s.site_id WHERE s.id = ?1",
        )?;
        let mut sites = HashMap::new();
        for &sensor in sensors {
            let found = site_of
                .query_row([sensor.to_string()], |r| {
                    Ok(SiteOf {
                        site: r.get(0)?,
                        state: state_of(r, 1)?,
                        held: r.get(8)?,
                    })
                })
                .optional()?;
            if let Some(found) = found {
                sites.insert(sensor, found);
            }
        }
        Ok(sites)
    }

    async fn hold(&mut self, held: &[(&str, &Event)], asked: &[&str], now: Millis) -> Result<()> {
        let mut insert = self.tx.prepare_cached(
            "INSERT INTO site_held (site_id, sensor_id, kind, at, data, previous, \
             last_seen_at, lost_since, reminder) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?;
        for (site, e) in held {
            insert.execute(params![
                site,
                e.sensor_id.to_string(),
                e.kind.as_str(),
                e.at,
                e.data,
                e.previous,
                e.last_seen_at,
                e.detail.lost_since,
                e.detail.reminder
            ])?;
        }
        let mut ask = self.tx.prepare_cached(
            "UPDATE sites SET pending_since = ?2 WHERE id = ?1 AND pending_since IS NULL",
        )?;
        for site in asked {
            ask.execute(params![site, now])?;
        }
        Ok(())
    }

    async fn site(&mut self, id: &str) -> Result<Option<(Site, SiteState)>> {
        Ok(self
            .tx
            .prepare_cached(&format!("SELECT {SITE_ROW} FROM sites WHERE id = ?1"))?
            .query_row([id], site_row)
            .optional()?)
    }

    async fn members(&mut self, site: &str) -> Result<Vec<Member>> {
        members(self.tx, site)
    }

    async fn held_events(&mut self, site: &str) -> Result<(Vec<HeldEvent>, Option<i64>)> {
        held_rows(self.tx, site, None)
    }

    async fn linked(&mut self, site: &str) -> Result<Vec<Linked>> {
        linked(self.tx, site)
    }

    async fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        body: Option<&str>,
        now: Millis,
    ) -> Result<NotificationRef> {
        insert_one(self.tx, client, e, body, now)
    }

    async fn consume_held(&mut self, site: &str, last: i64) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM site_held WHERE site_id = ?1 AND id <= ?2")?
            .execute(params![site, last])?;
        Ok(())
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        rules::silences::apply(self, seqs, now).await
    }

    async fn write_state(&mut self, site: &str, state: &SiteState) -> Result<()> {
        self.tx
            .prepare_cached(
                "UPDATE sites SET down = ?2, since = ?3, pending_since = ?4, told = ?5, \
                 told_clients = ?6, released = ?7, retold = ?8 WHERE id = ?1",
            )?
            .execute(params![
                site,
                state.down,
                state.since,
                state.pending_since,
                Match::listed(&state.told),
                Match::listed(&state.told_clients),
                state.released,
                super::super::rows::retold_listed(&state.retold)
            ])?;
        Ok(())
    }
}

/// The sites a round decides (`?1`: the time a grace that ran out began before), as
/// `decide::due` says: those whose grace ran out, those down that a change of their
/// sensors asks to decide again, and those with held events not released yet and no
/// grace running (down, or up after a race).
pub(super) const DUE: &str = "(pending_since IS NOT NULL AND (down OR pending_since <= ?1)) \
     OR (pending_since IS NULL AND EXISTS (SELECT 1 FROM site_held h \
         WHERE h.site_id = sites.id AND h.id > sites.released))";

/// Most sites one call decides (a round calls again while a call was full).
const SITES_PER_CALL: usize = 500;

/// Decides every due site in one transaction; answers the notifications made.
pub(super) fn decide_sites(tx: &Transaction, rules: Rules, now: Millis) -> Result<Decided> {
    let due = tx
        .prepare_cached(&format!(
            "SELECT {SITE_ROW} FROM sites WHERE {DUE} \
             ORDER BY pending_since IS NULL, id LIMIT ?2"
        ))?
        .query_map(params![now - rules.grace, SITES_PER_CALL as i64], site_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let more = due.len() == SITES_PER_CALL;
    let decided = rules::now_or_never(rules::sites::decide_due(
        &mut Tables { tx },
        due,
        rules,
        now,
    ))?;
    Ok(Decided { more, ..decided })
}

/// The events site `site` holds (of `sensor` only, when given), in the order held, and the
/// id of the last row read (rows of a kind this version does not know are read and left
/// out, so a decision consumes them too).
pub(super) fn held_rows(
    tx: &Transaction,
    site: &str,
    sensor: Option<SensorId>,
) -> Result<(Vec<HeldEvent>, Option<i64>)> {
    let rows = tx
        .prepare_cached(
            "SELECT id, sensor_id, kind, at, data, previous, last_seen_at, lost_since, reminder \
             FROM site_held WHERE site_id = ?1 AND (?2 IS NULL OR sensor_id = ?2) ORDER BY id",
        )?
        .query_map(params![site, sensor.map(|s| s.to_string())], |r| {
            let detail = Detail {
                lost_since: r.get(7)?,
                reminder: r.get(8)?,
                flips_suppressed: None,
                ..Detail::default()
            };
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                (r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, detail),
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let last_row = rows.last().map(|h| h.0);
    let held = rows
        .into_iter()
        .filter_map(|(id, s, k, (at, data, previous, last_seen_at, detail))| {
            let kind = EventKind::parse(&k)?;
            Some(stored_sensor(s).map(|sensor_id| HeldEvent {
                id,
                event: Event {
                    sensor_id,
                    kind,
                    at,
                    data,
                    previous,
                    last_seen_at,
                    detail,
                },
            }))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((held, last_row))
}
