//! A sensor leaving its site on PostgreSQL — moved, deleted, or its site deleted — by the
//! domain's rule (`site::moves`): what the site held of it is made for the clients owed
//! it, or held again where the sensor now is, in the same transaction as the change.
//!
//! The caller holds the delete lock exclusive ([`super::DELETE_LOCK`]), so no group commit
//! holds an event of the sensor meanwhile; the sites' rows are locked here, so a round
//! deciding one is waited for.

use super::super::{NotificationRef, Result};
use super::db::{Sql, Tx};
use crate::domain::client;
use crate::domain::silence::Match;
use crate::domain::site::decide::{Linked, Made, SiteState};
use crate::domain::site::moves;
use crate::domain::{Connection, Event, Millis, SensorId};

/// Takes the delete lock exclusive: group commits in flight end first, and the next wait
/// for this transaction (a sensor's site or existence changes under none of them).
pub(super) async fn lock_commits(tx: &Tx<'_>) -> Result<()> {
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext(current_schema()))",
        &[&super::DELETE_LOCK],
    )
    .await?;
    Ok(())
}

/// The stored state of site `id`, its row locked, if there is one.
async fn site_state(tx: &Tx<'_>, id: &str) -> Result<Option<SiteState>> {
    Ok(tx
        .query_opt(
            "SELECT down, since, pending_since, told, told_clients, released, retold \
             FROM sites WHERE id = $1 FOR UPDATE",
            &[&id],
        )
        .await?
        .map(|r| super::site_rows::state_of(&r, 0)))
}

/// Writes the fields of a site's state that moves change.
async fn write_state(tx: &Tx<'_>, id: &str, s: &SiteState) -> Result<()> {
    tx.execute(
        "UPDATE sites SET pending_since = $2, told = $3 WHERE id = $1",
        &[&id, &s.pending_since, &Match::listed(&s.told)],
    )
    .await?;
    Ok(())
}

/// The clients linked to `sensor`, by id, with the types each takes.
async fn clients_of(tx: &Tx<'_>, sensor: SensorId) -> Result<Vec<Linked>> {
    Ok(tx
        .query(
            "SELECT l.client_id, c.events FROM links l LEFT JOIN clients c \
             ON c.id = l.client_id WHERE l.sensor_id = $1 ORDER BY l.client_id",
            &[&sensor.to_string()],
        )
        .await?
        .iter()
        .map(|r| Linked {
            client_id: r.get(0),
            events: client::events_from_column(r.get(1)),
            sensors: vec![sensor],
        })
        .collect())
}

/// `sensor` leaves site `site` at `now`: the site forgets it, and what it held of it is
/// answered — made for the clients only its loss told (first), and owed to every client.
async fn leave(
    tx: &Tx<'_>,
    site: &str,
    sensor: SensorId,
    clients: &[Linked],
    now: Millis,
) -> Result<(Vec<Made>, Vec<Event>)> {
    let Some(state) = site_state(tx, site).await? else {
        return Ok((Vec::new(), Vec::new()));
    };
    let (held, _) = super::site_rounds::held_rows(tx, site, Some(sensor)).await?;
    let data_now: Option<bool> = tx
        .query_opt(
            "SELECT data FROM sensor_state WHERE sensor_id = $1",
            &[&sensor.to_string()],
        )
        .await?
        .and_then(|r| r.get(0));
    let left = moves::leave(&state, sensor, &held, clients, data_now, now);
    tx.execute(
        "DELETE FROM site_held WHERE site_id = $1 AND sensor_id = $2",
        &[&site, &sensor.to_string()],
    )
    .await?;
    write_state(tx, site, &left.state).await?;
    Ok((left.made, left.owed))
}

/// `sensor`'s site was `from` and is now what its row says (written already in `tx`):
/// the old site answers what it held of it ([`leave`]), the new one is decided again when
/// it must be (`moves::join`), and what every client is owed goes through the new site's
/// hold as a commit's events would, or is made now. Answers the notifications made,
/// pending (those a silence matched are not among them).
pub(super) async fn moved(
    tx: &Tx<'_>,
    sensor: SensorId,
    from: Option<&str>,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let clients = clients_of(tx, sensor).await?;
    let (mut made, owed) = match from {
        Some(site) => leave(tx, site, sensor, &clients, now).await?,
        None => (Vec::new(), Vec::new()),
    };
    let to = tx
        .query_opt(
            "SELECT s.site_id, COALESCE(st.connection, 'unknown') FROM sensors s \
             LEFT JOIN sensor_state st ON st.sensor_id = s.id WHERE s.id = $1",
            &[&sensor.to_string()],
        )
        .await?;
    if let Some(r) = &to
        && let Some(site) = r.get::<_, Option<String>>(0)
        && let Some(state) = site_state(tx, &site).await?
    {
        let lost = Connection::parse(r.get(1)) == Some(Connection::Lost);
        write_state(tx, &site, &moves::join(&state, lost, now)).await?;
    }
    let refs: Vec<&Event> = owed.iter().collect();
    let held = super::site_rounds::hold_for_sites(tx, &refs, now).await?;
    for (k, e) in owed.iter().enumerate() {
        if !held.contains(&k) {
            made.extend(moves::fan_out(e, &clients));
        }
    }
    let mut out = Vec::with_capacity(made.len());
    for m in &made {
        out.push(super::site_rows::insert_one(tx, &m.client_id, &m.event, None, now).await?);
    }
    let seqs: Vec<i64> = out.iter().map(|n| n.seq).collect();
    let silenced = super::silences::silence_new(tx, &seqs, now).await?;
    out.retain(|n| !silenced.contains(&n.seq));
    Ok(out)
}

/// `sensor`, of site `site`, is deleted at `now` (its row gone already in `tx`, its links
/// and pending notifications with it): no site holds anything of it any more, and a site
/// that had it or whose loss named it is decided again when it must be.
pub(super) async fn deleted(
    tx: &Tx<'_>,
    sensor: SensorId,
    site: Option<&str>,
    now: Millis,
) -> Result<()> {
    let mut sites: Vec<String> = tx
        .query(
            "SELECT site_id FROM site_held WHERE sensor_id = $1 \
             UNION SELECT id FROM sites WHERE down AND strpos(told, ',' || $1 || ',') > 0",
            &[&sensor.to_string()],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    sites.extend(site.map(str::to_string));
    sites.sort();
    sites.dedup();
    for site in &sites {
        leave(tx, site, sensor, &[], now).await?;
    }
    tx.execute(
        "DELETE FROM silenced_pairs WHERE sensor_id = $1",
        &[&sensor.to_string()],
    )
    .await?;
    Ok(())
}
