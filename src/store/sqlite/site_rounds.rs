//! Sites' decisions on the embedded store: the group commit holds back liveness events of
//! a site's sensors ([`hold_for_sites`]), and a round decides each due site
//! ([`Sites::decide_sites`] through [`decide_sites`]) by the domain's rule
//! (`site::decide`).

use std::collections::HashSet;

use rusqlite::{OptionalExtension, Transaction, params};

use super::super::{Decided, NotificationRef, Result};
use super::site_rows::{SITE_ROW, insert_one, linked, members, site_row, state_of, stored_sensor};
use crate::domain::silence::Match;
use crate::domain::site::decide::{self, HeldEvent, Hold, Rules, SiteState};
use crate::domain::site::{Site, SiteEvent};
use crate::domain::{Detail, Event, EventKind, Millis, SensorId};

/// Which of `events` (their places) make no notification now: liveness events of a
/// site's sensors that the site's decision holds ([`decide::hold`]), written to
/// `site_held`, and reminders it drops. A loss while the site is up starts its grace.
pub(super) fn hold_for_sites(
    tx: &Transaction,
    events: &[&Event],
    now: Millis,
) -> Result<HashSet<usize>> {
    let mut skipped = HashSet::new();
    let liveness = |k: EventKind| {
        matches!(
            k,
            EventKind::ConnectionLost | EventKind::ConnectionRestored | EventKind::StillLost
        )
    };
    if !events.iter().any(|e| liveness(e.kind)) {
        return Ok(skipped);
    }
    let mut site_of = tx.prepare_cached(
        "SELECT si.id, si.down, si.since, si.pending_since, si.told, si.told_clients, \
         si.released, si.retold, EXISTS (SELECT 1 FROM site_held h WHERE h.site_id = si.id AND h.sensor_id = s.id) \
         FROM sensors s JOIN sites si ON si.id = s.site_id WHERE s.id = ?1",
    )?;
    for (k, e) in events.iter().enumerate() {
        if !liveness(e.kind) {
            continue;
        }
        let Some((site, state, held)) = site_of
            .query_row([e.sensor_id.to_string()], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    state_of(r, 1)?,
                    r.get::<_, bool>(8)?,
                ))
            })
            .optional()?
        else {
            continue;
        };
        let hold = decide::hold(e.kind, &state, e.sensor_id, held);
        if decide::asks_decision(e.kind, &state, hold) {
            tx.prepare_cached(
                "UPDATE sites SET pending_since = ?2 WHERE id = ?1 AND pending_since IS NULL",
            )?
            .execute(params![site, now])?;
        }
        match hold {
            Hold::Send => continue,
            Hold::Drop => {}
            Hold::Hold => {
                tx.prepare_cached(
                    "INSERT INTO site_held (site_id, sensor_id, kind, at, data, previous, \
                     last_seen_at, lost_since, reminder) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                )?
                .execute(params![
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
        }
        skipped.insert(k);
    }
    Ok(skipped)
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
    let mut decided = Decided {
        more: due.len() == SITES_PER_CALL,
        ..Decided::default()
    };
    for (site, state) in due {
        let (made, changed) = decide_one(tx, &site, &state, rules, now)?;
        decided.made.extend(made);
        decided.changed.extend(changed);
    }
    Ok(decided)
}

fn decide_one(
    tx: &Transaction,
    site: &Site,
    state: &SiteState,
    rules: Rules,
    now: Millis,
) -> Result<(Vec<NotificationRef>, Option<SiteEvent>)> {
    let members = members(tx, &site.id)?;
    let (held, last_row) = held_rows(tx, &site.id, None)?;
    let clients = linked(tx, &site.id)?;
    let Some(mut d) = decide::decide(site, state, &members, &held, &clients, &rules, now) else {
        return Ok((Vec::new(), None));
    };
    let mut made = Vec::with_capacity(d.made.len());
    for m in &d.made {
        made.push(insert_one(
            tx,
            &m.client_id,
            &m.event,
            m.body.as_deref(),
            now,
        )?);
    }
    // Every row read, those of a kind this version does not know too.
    if let (true, Some(last)) = (d.consumes_held, last_row) {
        tx.prepare_cached("DELETE FROM site_held WHERE site_id = ?1 AND id <= ?2")?
            .execute(params![site.id, last])?;
    }
    let seqs: Vec<i64> = made.iter().map(|n| n.seq).collect();
    let silenced = super::silences::silence_new(tx, &seqs, now)?;
    d.untell(made.iter().filter(|n| silenced.contains(&n.seq)));
    made.retain(|n| !silenced.contains(&n.seq));
    tx.prepare_cached(
        "UPDATE sites SET down = ?2, since = ?3, pending_since = ?4, told = ?5, \
         told_clients = ?6, released = ?7, retold = ?8 WHERE id = ?1",
    )?
    .execute(params![
        site.id,
        d.state.down,
        d.state.since,
        d.state.pending_since,
        Match::listed(&d.state.told),
        Match::listed(&d.state.told_clients),
        d.state.released,
        super::super::rows::retold_listed(&d.state.retold)
    ])?;
    Ok((made, d.changed))
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
