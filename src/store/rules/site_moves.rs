//! A sensor leaving its site — moved, deleted, or its site deleted — by the domain's rule
//! (`site::moves`): what the site held of it is made for the clients owed it, or held again
//! where the sensor now is, in the same transaction as the change.

use std::future::Future;

use super::sites::{SiteTables, hold_for_sites};
use crate::domain::site::decide::{HeldEvent, Linked, Made, SiteState};
use crate::domain::site::moves;
use crate::domain::{Event, Millis, NotificationRef, SensorId};
use crate::store::Result;

/// The tables a move reads and writes beside a site's, within one transaction.
pub trait MoveTables: SiteTables {
    /// The clients linked to `sensor`, by id, with the types each takes.
    fn sensor_clients(&mut self, sensor: SensorId) -> impl Future<Output = Result<Vec<Linked>>>;
    /// The state of site `id`, held against a round deciding it, if the site exists.
    fn site_state(&mut self, id: &str) -> impl Future<Output = Result<Option<SiteState>>>;
    /// What site `site` holds of `sensor`, in the order held.
    fn held_of(
        &mut self,
        site: &str,
        sensor: SensorId,
    ) -> impl Future<Output = Result<Vec<HeldEvent>>>;
    /// The sensor's data now.
    fn sensor_data(&mut self, sensor: SensorId) -> impl Future<Output = Result<Option<bool>>>;
    /// Takes out what site `site` holds of `sensor`.
    fn forget_held(&mut self, site: &str, sensor: SensorId) -> impl Future<Output = Result<()>>;
    /// Writes the fields of a site's state a move changes: `pending_since` and `told`.
    fn write_moved(&mut self, site: &str, state: &SiteState) -> impl Future<Output = Result<()>>;
    /// The sensor's site now, if it has one, and whether the sensor is lost.
    fn site_now(
        &mut self,
        sensor: SensorId,
    ) -> impl Future<Output = Result<Option<(String, bool)>>>;
    /// The sites that hold events of `sensor` or whose loss told of it.
    fn sites_with(&mut self, sensor: SensorId) -> impl Future<Output = Result<Vec<String>>>;
    /// Takes out the silenced pairs of `sensor`.
    fn forget_pairs(&mut self, sensor: SensorId) -> impl Future<Output = Result<()>>;
}

/// `sensor` leaves site `site` at `now` (`clients` empty when it was deleted, with its
/// links and pending notifications, so nothing is owed): the site forgets it, and what it
/// held of it is answered — made for the clients only its loss told (first), and owed to
/// every client.
async fn leave<T: MoveTables>(
    t: &mut T,
    site: &str,
    sensor: SensorId,
    clients: &[Linked],
    now: Millis,
) -> Result<(Vec<Made>, Vec<Event>)> {
    let Some(state) = t.site_state(site).await? else {
        return Ok((Vec::new(), Vec::new()));
    };
    let held = t.held_of(site, sensor).await?;
    let data_now = t.sensor_data(sensor).await?;
    let left = moves::leave(&state, sensor, &held, clients, data_now, now);
    t.forget_held(site, sensor).await?;
    t.write_moved(site, &left.state).await?;
    Ok((left.made, left.owed))
}

/// `sensor`'s site was `from` and is now what its row says (written already): the old site
/// answers what it held of it, the new one is decided again when it must be
/// (`moves::join`), and what every client is owed goes through the new site's hold as a
/// commit's events would, or is made now. Answers the notifications made, pending (those a
/// silence matched are not among them).
pub async fn moved<T: MoveTables>(
    t: &mut T,
    sensor: SensorId,
    from: Option<&str>,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let clients = t.sensor_clients(sensor).await?;
    let (mut made, owed) = match from {
        Some(site) => leave(t, site, sensor, &clients, now).await?,
        None => (Vec::new(), Vec::new()),
    };
    if let Some((site, lost)) = t.site_now(sensor).await?
        && let Some(state) = t.site_state(&site).await?
    {
        t.write_moved(&site, &moves::join(&state, lost, now))
            .await?;
    }
    let refs: Vec<&Event> = owed.iter().collect();
    let held = hold_for_sites(t, &refs, now).await?;
    for (k, e) in owed.iter().enumerate() {
        if !held.contains(&k) {
            made.extend(moves::fan_out(e, &clients));
        }
    }
    // A loss the site held is the sensor's own alarm once it leaves.
    let events: Vec<&Event> = made.iter().map(|m| &m.event).collect();
    let alarm_ids = super::alarms::of_events(t, &events).await?;
    let mut out = Vec::with_capacity(made.len());
    for (m, alarm_id) in made.iter().zip(alarm_ids) {
        let n = t.insert_one(&m.client_id, &m.event, None, now).await?;
        if let Some(id) = alarm_id {
            t.name_alarm(n.seq, &id).await?;
        }
        out.push(n);
    }
    let seqs: Vec<i64> = out.iter().map(|n| n.seq).collect();
    let silenced = t.silence_new(&seqs, now).await?;
    out.retain(|n| !silenced.contains(&n.seq));
    Ok(out)
}

/// `sensor`, of site `site`, is deleted at `now` (its row gone already, its links and
/// pending notifications with it): no site holds anything of it any more, and a site that
/// had it or whose loss named it is decided again when it must be.
pub async fn deleted<T: MoveTables>(
    t: &mut T,
    sensor: SensorId,
    site: Option<&str>,
    now: Millis,
) -> Result<()> {
    let mut sites = t.sites_with(sensor).await?;
    sites.extend(site.map(str::to_string));
    sites.sort();
    sites.dedup();
    for site in &sites {
        leave(t, site, sensor, &[], now).await?;
    }
    t.forget_pairs(sensor).await
}
