//! A site's rows on the embedded store as its decision, a move and a silence's end read
//! and write them: the site and its state, its sensors and their clients, and a
//! notification it makes. Below the rounds, the moves and the silences, which all use it
//! (so none of them reads another through it).

use rusqlite::{Transaction, params};

use super::super::{Error, NotificationRef, Result};
use crate::domain::notification::new_notification_id;
use crate::domain::silence::Match;
use crate::domain::site::Site;
use crate::domain::site::decide::{Linked, Member, SiteState};
use crate::domain::{Connection, Event, Millis, SensorId, client};

/// Makes one notification of `event` for `client`, pending, with a site's `body`.
pub(super) fn insert_one(
    tx: &Transaction,
    client: &str,
    e: &Event,
    body: Option<&str>,
    now: Millis,
) -> Result<NotificationRef> {
    let id = new_notification_id();
    let seq: i64 = tx
        .prepare_cached(
            "INSERT INTO notifications (id, client_id, sensor_id, kind, data, previous, \
             occurred_at, last_seen_at, status, attempts, next_attempt_at, created_at, \
             updated_at, lost_since, reminder, flips_suppressed, body, site_id) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'pending', 0, ?9, ?9, ?9, ?10, ?11, ?12, ?13, \
             ?14) \
             RETURNING seq",
        )?
        .query_row(
            params![
                id,
                client,
                e.sensor_id.to_string(),
                e.kind.as_str(),
                e.data,
                e.previous,
                e.at,
                e.last_seen_at,
                now,
                e.detail.lost_since,
                e.detail.reminder,
                e.detail.flips_suppressed,
                body,
                crate::domain::site::named_in(body)
            ],
            |r| r.get(0),
        )?;
    name_sensors(tx, seq, body)?;
    Ok(NotificationRef {
        id,
        seq,
        client_id: client.to_string(),
        sensor_id: e.sensor_id,
        kind: e.kind,
        due_at: now,
        attempts: 0,
        batch_id: None,
    })
}

pub(super) fn state_of(r: &rusqlite::Row, at: usize) -> rusqlite::Result<SiteState> {
    let (told, clients): (String, String) = (r.get(at + 3)?, r.get(at + 4)?);
    Ok(SiteState {
        down: r.get(at)?,
        since: r.get(at + 1)?,
        pending_since: r.get(at + 2)?,
        told: Match::unlisted(&told, |p| SensorId::parse(p).ok()),
        told_clients: Match::unlisted(&clients, |c| Some(c.to_string())),
        released: r.get(at + 5)?,
        retold: super::super::rows::retold_from(&r.get::<_, String>(at + 6)?),
    })
}

pub(super) fn stored_sensor(s: String) -> Result<SensorId> {
    SensorId::parse(&s).map_err(|e| Error::Backend(format!("stored sensor id: {e}")))
}

/// The sensors of site `site`, by id, as its decision reads them.
pub(super) fn members(tx: &Transaction, site: &str) -> Result<Vec<Member>> {
    tx.prepare_cached(
        "SELECT s.id, s.address, COALESCE(st.connection, 'unknown'), st.data, \
         st.last_seen_at FROM sensors s LEFT JOIN sensor_state st ON st.sensor_id = s.id \
         WHERE s.site_id = ?1 ORDER BY s.id",
    )?
    .query_map([site], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get(1)?,
            r.get::<_, String>(2)?,
            r.get(3)?,
            r.get(4)?,
        ))
    })?
    .collect::<rusqlite::Result<Vec<(String, String, String, Option<bool>, Option<Millis>)>>>()?
    .into_iter()
    .map(|(id, address, conn, data, last_seen_at)| {
        Ok(Member {
            id: stored_sensor(id)?,
            address,
            connection: Connection::parse(&conn).unwrap_or(Connection::Unknown),
            data,
            last_seen_at,
        })
    })
    .collect()
}

/// Writes the sensors site notification `seq`'s `body` names (`notification_sensors`).
pub(super) fn name_sensors(tx: &Transaction, seq: i64, body: Option<&str>) -> rusqlite::Result<()> {
    let mut named = tx.prepare_cached(
        "INSERT OR IGNORE INTO notification_sensors (sensor_id, seq) VALUES (?1, ?2)",
    )?;
    for sensor in crate::domain::site::sensors_named_in(body) {
        named.execute(params![sensor.to_string(), seq])?;
    }
    Ok(())
}

/// A site's row as a round reads it: the site and its decision's state.
pub(super) const SITE_ROW: &str = "id, name, address, gateway_sensor_id, created_at, \
     updated_at, down, since, pending_since, told, told_clients, released, retold";

/// [`SITE_ROW`] read.
pub(super) fn site_row(r: &rusqlite::Row) -> rusqlite::Result<(Site, SiteState)> {
    let gateway: Option<String> = r.get(3)?;
    Ok((
        Site {
            id: r.get(0)?,
            name: r.get(1)?,
            address: r.get(2)?,
            gateway_sensor_id: gateway.and_then(|g| SensorId::parse(&g).ok()),
            created_at: r.get(4)?,
            updated_at: r.get(5)?,
        },
        state_of(r, 6)?,
    ))
}

/// The clients linked to the site's sensors, each with its sensors of the site.
pub(super) fn linked(tx: &Transaction, site: &str) -> Result<Vec<Linked>> {
    let rows = tx
        .prepare_cached(
            "SELECT l.client_id, c.events, l.sensor_id FROM links l \
             JOIN sensors s ON s.id = l.sensor_id LEFT JOIN clients c ON c.id = l.client_id \
             WHERE s.site_id = ?1 ORDER BY l.client_id, l.sensor_id",
        )?
        .query_map([site], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, Option<String>>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut out: Vec<Linked> = Vec::new();
    for (client_id, events, sensor) in rows {
        let Ok(sensor) = SensorId::parse(&sensor) else {
            continue;
        };
        match out.last_mut() {
            Some(l) if l.client_id == client_id => l.sensors.push(sensor),
            _ => out.push(Linked {
                client_id,
                events: client::events_from_column(events),
                sensors: vec![sensor],
            }),
        }
    }
    Ok(out)
}
