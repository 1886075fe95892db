//! Registry changes as faults (issue #68): sensors moved into, out of and between sites,
//! sites created, deleted with their sensors lost or held, and their gateways changed,
//! while readings, silences and the other faults go on. Each is made as the API makes it
//! (`App::replace_sensor`, `App::delete_site`): the store, then what the store made goes
//! to the entry node's dispatcher. A call whose answer never came may have landed: what
//! the run knows is what the store holds after it.

use latch::domain::site::Site;
use latch::domain::{Millis, SensorId};
use latch::store::{Registry, Sites};

use super::{SITE, Workload};

/// The sites a run may hold: the first is made at the start; each may be deleted and made
/// again under its id.
pub const SITES: [&str; 2] = [SITE, "bldg-2"];

impl Workload {
    /// One registry change, drawn.
    pub(super) async fn registry(&mut self) {
        match self.world.between(0, 10) {
            0..6 => self.move_sensor().await,
            6..8 => self.add_site().await,
            8 => self.delete_site().await,
            _ => self.gateway().await,
        }
    }

    fn site_of(&self, sensor: SensorId) -> Option<String> {
        self.model
            .read(|t| t.sensors.get(&sensor).and_then(|s| s.site_id.clone()))
    }

    fn sites(&self) -> Vec<String> {
        self.model.read(|t| t.sites.keys().cloned().collect())
    }

    /// A site the store holds, drawn; `None`: it holds none.
    pub(super) fn drawn_site(&self) -> Option<String> {
        let sites = self.sites();
        if sites.is_empty() {
            return None;
        }
        Some(sites[self.world.between(0, sites.len() as u64) as usize].clone())
    }

    /// The sensors the store holds in `site`.
    pub(super) fn members(&self, site: &str) -> Vec<SensorId> {
        self.model.read(|t| {
            t.sensors
                .values()
                .filter(|s| s.site_id.as_deref() == Some(site))
                .map(|s| s.id)
                .collect()
        })
    }

    /// Notes `sensors`' sites as the store holds them after a call that began at `began`.
    fn note_sites(&self, sensors: &[SensorId], began: Millis) {
        let ended = self.world.now();
        let now: Vec<(SensorId, Option<String>)> =
            sensors.iter().map(|s| (*s, self.site_of(*s))).collect();
        let mut log = self.log.lock().unwrap();
        for (s, site) in now {
            log.memberships.push((s, site, began, ended));
        }
    }

    /// A sensor moves to another site, or to none.
    async fn move_sensor(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let i = self.world.between(0, self.sensors.len() as u64) as usize;
        let id = self.sensors[i].id;
        let Some(sensor) = self.model.read(|t| t.sensors.get(&id).cloned()) else {
            return;
        };
        let mut choices: Vec<Option<String>> = self.sites().into_iter().map(Some).collect();
        choices.push(None);
        choices.retain(|c| *c != sensor.site_id);
        if choices.is_empty() {
            return;
        }
        let to = choices[self.world.between(0, choices.len() as u64) as usize].clone();
        let began = self.world.now();
        let result = store
            .replace_sensor(
                id,
                sensor.address.clone(),
                sensor.heartbeat_timeout_s,
                sensor.debounce_s,
                to.clone(),
                engine.now(),
            )
            .await;
        let made = match result {
            Ok(Some((_, made))) => {
                let n = made.len();
                dispatcher.deliver_served(made);
                format!("{n} made")
            }
            Ok(None) => "no such sensor".into(),
            Err(e) => {
                if e.maybe_written() {
                    dispatcher.look_for_pending(i64::MIN);
                }
                e.to_string()
            }
        };
        self.world.trace(format!(
            "move {id} from {:?} to {to:?} via {node}: {made}",
            sensor.site_id
        ));
        self.note_sites(&[id], began);
    }

    /// A site of [`SITES`] the store lacks is made (again), its gateway drawn among the
    /// sensors.
    async fn add_site(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, _)) = self.nodes.entry(&node) else {
            return;
        };
        let have = self.sites();
        let Some(id) = SITES.iter().find(|s| !have.iter().any(|h| h == *s)) else {
            return;
        };
        let now = engine.now();
        let gateway = self
            .world
            .chance(0.3)
            .then(|| self.sensors[self.world.between(0, self.sensors.len() as u64) as usize].id);
        let site = Site {
            id: id.to_string(),
            name: Some(format!("building {id}")),
            address: None,
            gateway_sensor_id: gateway,
            created_at: now,
            updated_at: now,
        };
        let result = store.create_site(site).await;
        self.world.trace(format!(
            "create site {id} via {node} (gateway {gateway:?}): {:?}",
            result.err().map(|e| e.to_string())
        ));
    }

    /// A site is deleted with its sensors, lost, held or not: they stay, in no site.
    async fn delete_site(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let Some(id) = self.drawn_site() else { return };
        let members = self.members(&id);
        let began = self.world.now();
        let result = store.delete_site(id.clone(), engine.now()).await;
        match &result {
            Ok(Some(made)) => dispatcher.deliver_served(made.clone()),
            Err(e) if e.maybe_written() => dispatcher.look_for_pending(i64::MIN),
            _ => {}
        }
        let gone = !self.sites().contains(&id);
        self.world.trace(format!(
            "delete site {id} via {node} with {} sensors: {}{}",
            members.len(),
            match &result {
                Ok(Some(made)) => format!("{} made", made.len()),
                Ok(None) => "no such site".into(),
                Err(e) => e.to_string(),
            },
            if gone { "" } else { ", still there" }
        ));
        if gone {
            self.log
                .lock()
                .unwrap()
                .sites_deleted
                .push((id, began, self.world.now()));
        }
        self.note_sites(&members, began);
    }

    /// A site's gateway changes: to one of the sensors, or none.
    async fn gateway(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, _)) = self.nodes.entry(&node) else {
            return;
        };
        let Some(id) = self.drawn_site() else { return };
        let Some(mut site) = self.model.read(|t| t.sites.get(&id).cloned()) else {
            return;
        };
        site.gateway_sensor_id = self
            .world
            .chance(0.5)
            .then(|| self.sensors[self.world.between(0, self.sensors.len() as u64) as usize].id);
        site.updated_at = engine.now();
        let gateway = site.gateway_sensor_id;
        let result = store.replace_site(site).await;
        self.world.trace(format!(
            "site {id} gateway {gateway:?} via {node}: {result:?}"
        ));
    }
}
