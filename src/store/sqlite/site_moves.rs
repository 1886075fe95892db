//! A sensor leaving its site on the embedded store — moved, deleted, or its site deleted —
//! by the domain's rule (`site::moves`): what the site held of it is made for the clients
//! owed it, or held again where the sensor now is, in the same transaction as the change.

use rusqlite::{OptionalExtension, Transaction, params};

use super::super::{NotificationRef, Result};
use crate::domain::client;
use crate::domain::site::decide::{Linked, Made, SiteState};
use crate::domain::site::moves;
use crate::domain::{Connection, Event, Millis, SensorId};

/// The stored state of site `id`, if there is one.
fn site_state(tx: &Transaction, id: &str) -> Result<Option<SiteState>> {
    Ok(tx
        .prepare_cached(
            "SELECT down, since, pending_since, told, told_clients, released, retold \
             FROM sites WHERE id = ?1",
        )?
        .query_row([id], |r| super::site_rows::state_of(r, 0))
        .optional()?)
}

/// Writes the fields of a site's state that moves change.
fn write_state(tx: &Transaction, id: &str, s: &SiteState) -> Result<()> {
    tx.prepare_cached("UPDATE sites SET pending_since = ?2, told = ?3 WHERE id = ?1")?
        .execute(params![
            id,
            s.pending_since,
            crate::domain::silence::Match::listed(&s.told)
        ])?;
    Ok(())
}

/// The clients linked to `sensor`, by id, with the types each takes.
fn clients_of(tx: &Transaction, sensor: SensorId) -> Result<Vec<Linked>> {
    Ok(tx
        .prepare_cached(
            "SELECT l.client_id, c.events FROM links l LEFT JOIN clients c \
             ON c.id = l.client_id WHERE l.sensor_id = ?1 ORDER BY l.client_id",
        )?
        .query_map([sensor.to_string()], |r| {
            Ok(Linked {
                client_id: r.get(0)?,
                events: client::events_from_column(r.get(1)?),
                sensors: vec![sensor],
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?)
}

/// `sensor` leaves site `site` at `now` (`deleted`: with its links and pending
/// notifications, so nothing is owed): the site forgets it, and what it held of it is
/// answered — made for the clients only its loss told (first), and owed to every client.
fn leave(
    tx: &Transaction,
    site: &str,
    sensor: SensorId,
    clients: &[Linked],
    now: Millis,
) -> Result<(Vec<Made>, Vec<Event>)> {
    let Some(state) = site_state(tx, site)? else {
        return Ok((Vec::new(), Vec::new()));
    };
    let (held, _) = super::site_rounds::held_rows(tx, site, Some(sensor))?;
    let data_now: Option<bool> = tx
        .prepare_cached("SELECT data FROM sensor_state WHERE sensor_id = ?1")?
        .query_row([sensor.to_string()], |r| r.get(0))
        .optional()?
        .flatten();
    let left = moves::leave(&state, sensor, &held, clients, data_now, now);
    tx.prepare_cached("DELETE FROM site_held WHERE site_id = ?1 AND sensor_id = ?2")?
        .execute(params![site, sensor.to_string()])?;
    write_state(tx, site, &left.state)?;
    Ok((left.made, left.owed))
}

/// `sensor`'s site was `from` and is now what its row says (written already in `tx`):
/// the old site answers what it held of it ([`leave`]), the new one is decided again when
/// it must be (`moves::join`), and what every client is owed goes through the new site's
/// hold as a commit's events would, or is made now. Answers the notifications made,
/// pending (those a silence matched are not among them).
pub(super) fn moved(
    tx: &Transaction,
    sensor: SensorId,
    from: Option<&str>,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let clients = clients_of(tx, sensor)?;
    let (mut made, owed) = match from {
        Some(site) => leave(tx, site, sensor, &clients, now)?,
        None => (Vec::new(), Vec::new()),
    };
    let to = tx
        .prepare_cached(
            "SELECT s.site_id, COALESCE(st.connection, 'unknown') FROM sensors s \
             LEFT JOIN sensor_state st ON st.sensor_id = s.id WHERE s.id = ?1",
        )?
        .query_row([sensor.to_string()], |r| {
            Ok((r.get::<_, Option<String>>(0)?, r.get::<_, String>(1)?))
        })
        .optional()?;
    if let Some((Some(site), connection)) = &to
        && let Some(state) = site_state(tx, site)?
    {
        let lost = Connection::parse(connection) == Some(Connection::Lost);
        write_state(tx, site, &moves::join(&state, lost, now))?;
    }
    let refs: Vec<&Event> = owed.iter().collect();
    let held = super::site_rounds::hold_for_sites(tx, &refs, now)?;
    for (k, e) in owed.iter().enumerate() {
        if !held.contains(&k) {
            made.extend(moves::fan_out(e, &clients));
        }
    }
    let mut out = Vec::with_capacity(made.len());
    for m in &made {
        out.push(super::site_rows::insert_one(
            tx,
            &m.client_id,
            &m.event,
            None,
            now,
        )?);
    }
    let seqs: Vec<i64> = out.iter().map(|n| n.seq).collect();
    let silenced = super::silences::silence_new(tx, &seqs, now)?;
    out.retain(|n| !silenced.contains(&n.seq));
    Ok(out)
}

/// `sensor`, of site `site`, is deleted at `now` (its row gone already in `tx`, its links
/// and pending notifications with it): no site holds anything of it any more, and a site
/// that had it or whose loss named it is decided again when it must be.
pub(super) fn deleted(
    tx: &Transaction,
    sensor: SensorId,
    site: Option<&str>,
    now: Millis,
) -> Result<()> {
    let mut sites = tx
        .prepare_cached(
            "SELECT site_id FROM site_held WHERE sensor_id = ?1 \
             UNION SELECT id FROM sites WHERE down AND instr(told, ',' || ?1 || ',') > 0",
        )?
        .query_map([sensor.to_string()], |r| r.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    sites.extend(site.map(str::to_string));
    sites.sort();
    sites.dedup();
    for site in &sites {
        leave(tx, site, sensor, &[], now)?;
    }
    tx.prepare_cached("DELETE FROM silenced_pairs WHERE sensor_id = ?1")?
        .execute([sensor.to_string()])?;
    Ok(())
}
