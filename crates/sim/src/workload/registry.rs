//! Registry changes as faults (issue #68): sensors moved into, out of and between sites,
//! sites created, deleted with their sensors lost or held, and their gateways changed,
//! while readings, silences and the other faults go on. Each is made as the API makes it
//! (`App::replace_sensor`, `App::delete_site`): the store, then what the store made goes
//! to the entry node's dispatcher. A call whose answer never came may have landed: what
//! the run knows is what the store holds after it.

use latch::domain::site::Site;
use latch::domain::{Millis, SensorId};
use latch::engine::Settings;
use latch::store::{Registry, Sites};

use super::{SITE, Workload};

use crate::log::FOLLOW_MS;

/// The sites a run may hold: the first is made at the start; each may be deleted and made
/// again under its id.
pub const SITES: [&str; 2] = [SITE, "bldg-2"];

impl Workload {
    /// One registry change, drawn.
    pub(super) async fn registry(&mut self) {
        match self.world.between(0, 14) {
            0..6 => self.move_sensor().await,
            6..8 => self.add_site().await,
            8 => self.delete_site().await,
            9 => self.gateway().await,
            10 | 11 => self.retime().await,
            _ => self.delete_or_recreate().await,
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
        let call = store.replace_sensor(
            id,
            sensor.address.clone(),
            sensor.heartbeat_timeout_s,
            sensor.debounce_s,
            to.clone(),
            Self::kept_alarms(&sensor),
            engine.now(),
        );
        let result = self
            .audited("PUT", &format!("sensors/{id}"), call, Option::is_some)
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

    /// A sensor's timeout changes, shortened or lengthened, most often while it is silent
    /// (issue #68), its address now and then, and in runs that debounce its window too; as `App::replace_sensor`
    /// does: the store, then the entry node's engine (a node serving the sensor elsewhere
    /// follows the registry's change log within a second).
    async fn retime(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let silent = self.silent_sensors();
        let id = match silent.is_empty() || self.world.chance(0.2) {
            true => self.sensors[self.world.between(0, self.sensors.len() as u64) as usize].id,
            false => silent[self.world.between(0, silent.len() as u64) as usize],
        };
        let Some(sensor) = self.model.read(|t| t.sensors.get(&id).cloned()) else {
            return;
        };
        let timeout_s = match self.world.between(0, 4) {
            0 => None,
            1 => Some(4),
            2 => Some(8),
            _ => Some(20),
        };
        let debounce_s = match self.debounce {
            true => [None, Some(1), Some(2)][self.world.between(0, 3) as usize],
            false => sensor.debounce_s,
        };
        // Its address too, now and then (what a site's loss names it by).
        let address = match self.world.chance(0.3) {
            true => format!("{id} street, door {}", self.world.between(1, 100)),
            false => sensor.address.clone(),
        };
        let began = self.world.now();
        let alarms = Self::kept_alarms(&sensor);
        let settings = Settings::new(timeout_s, debounce_s, &alarms);
        let call = store.replace_sensor(
            id,
            address,
            timeout_s,
            debounce_s,
            sensor.site_id.clone(),
            alarms,
            engine.now(),
        );
        let result = self
            .audited("PATCH", &format!("sensors/{id}"), call, Option::is_some)
            .await;
        // When the change surely took effect: `None` if it was surely not made.
        let (outcome, ended) = match result {
            Ok(Some((_, made))) => {
                dispatcher.deliver_served(made);
                let applied = engine.upsert_sensor(id, settings).await;
                let ended = match applied {
                    Ok(()) => self.world.now() + FOLLOW_MS,
                    Err(_) => Millis::MAX,
                };
                ("ok".to_string(), Some(ended))
            }
            Ok(None) => ("no such sensor".into(), None),
            Err(e) if e.maybe_written() => (e.to_string(), Some(Millis::MAX)),
            Err(e) => (e.to_string(), None),
        };
        self.world.trace(format!(
            "retime {id} via {node}: timeout {timeout_s:?} debounce {debounce_s:?}: {outcome}"
        ));
        let Some(ended) = ended else { return };
        self.note_holds(id, sensor.hold_alarms, began, ended);
        self.log.lock().unwrap().settings.push(crate::log::Setting {
            sensor: id,
            timeout: timeout_s.map_or(self.timeout, |t| Millis::from(t) * 1000),
            debounce: Millis::from(debounce_s.unwrap_or(0)) * 1000,
            began,
            ended,
        });
    }

    /// A sensor is deleted (with its links, state and history), or one deleted is made
    /// again under its id, in a site or none, and linked again to the clients it had, as
    /// `App::delete_sensor` and `App::create_sensor` do: the store, then the entry node's
    /// engine (a node serving it elsewhere follows the change log).
    async fn delete_or_recreate(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, _)) = self.nodes.entry(&node) else {
            return;
        };
        let gone: Vec<SensorId> = self.model.read(|t| {
            self.sensors
                .iter()
                .map(|s| s.id)
                .filter(|id| !t.sensors.contains_key(id))
                .collect()
        });
        let began = self.world.now();
        if let Some(&id) = gone.first().filter(|_| self.world.chance(0.7)) {
            let mut choices: Vec<Option<String>> = self.sites().into_iter().map(Some).collect();
            choices.push(None);
            let site = choices[self.world.between(0, choices.len() as u64) as usize].clone();
            let i = self
                .sensors
                .iter()
                .position(|s| s.id == id)
                .expect("a run's sensor");
            let debounce_s = (self.debounce && i % 2 == 1).then_some(1);
            let hold_alarms = self.drawn_holds();
            let sensor = latch::domain::sensor::Sensor {
                id,
                address: format!("{id} street"),
                heartbeat_timeout_s: None,
                debounce_s,
                site_id: site.clone(),
                created_at: engine.now(),
                battery_low_pct: latch::domain::signals::DEFAULT_BATTERY_LOW_PCT,
                labels: Default::default(),
                hold_alarms,
                flap: self.flap_of(i),
                armed: self.armed_of(i),
            };
            let settings = Settings::new(None, debounce_s, &Self::kept_alarms(&sensor));
            let result = self
                .audited("POST", "sensors", store.create_sensor(sensor), |_| true)
                .await;
            let made = self.model.read(|t| t.sensors.contains_key(&id));
            if made {
                let _ = engine.upsert_sensor(id, settings).await;
            }
            self.world.trace(format!(
                "create sensor {id} again via {node} in {site:?}{}: {:?}",
                match self.signals {
                    true => format!(" (hold alarms: {})", super::holds::describe(&hold_alarms)),
                    false => String::new(),
                },
                result.err().map(|e| e.to_string())
            ));
            if !made {
                return;
            }
            let ended = self.world.now();
            self.note_holds(id, hold_alarms, began, ended);
            {
                let mut log = self.log.lock().unwrap();
                log.memberships.push((id, site, began, ended));
                log.settings.push(crate::log::Setting {
                    sensor: id,
                    timeout: self.timeout,
                    debounce: Millis::from(debounce_s.unwrap_or(0)) * 1000,
                    began,
                    ended: ended + FOLLOW_MS,
                });
            }
            // Linked again to the clients that had it.
            for ci in 0..self.clients.len() {
                let had = self
                    .log
                    .lock()
                    .unwrap()
                    .sensors_deleted
                    .iter()
                    .any(|d| d.sensor == id && d.linked.contains(&self.clients[ci].id));
                if !had {
                    continue;
                }
                let now = self.world.now();
                let c = self.clients[ci].id.clone();
                let resource = format!("clients/{c}/sensors/{id}");
                let stored = self.model.read(|t| t.links.contains(&(id, c.clone())));
                let call = store.link(c.clone(), id, now);
                let result = self.audited("PUT", &resource, call, |_| !stored).await;
                let linked = self.model.read(|t| t.links.contains(&(id, c.clone())));
                self.world.trace(format!(
                    "link {c}/{id} again: {:?}",
                    result.err().map(|e| e.to_string())
                ));
                if linked {
                    self.clients[ci].links.entry(id).or_insert(now);
                }
            }
            return;
        }
        let i = self.world.between(0, self.sensors.len() as u64) as usize;
        let id = self.sensors[i].id;
        let Some(sensor) = self.model.read(|t| t.sensors.get(&id).cloned()) else {
            return;
        };
        let linked: Vec<String> = self.model.read(|t| {
            t.links
                .iter()
                .filter(|(s, _)| *s == id)
                .map(|(_, c)| c.clone())
                .collect()
        });
        let call = store.delete_sensor(id, engine.now());
        let result = self
            .audited("DELETE", &format!("sensors/{id}"), call, |gone| *gone)
            .await;
        let deleted = self.model.read(|t| !t.sensors.contains_key(&id));
        if deleted {
            let _ = engine.remove_sensor(id).await;
        }
        self.world.trace(format!(
            "delete sensor {id} via {node} (in {:?}, linked to {linked:?}): {:?}{}",
            sensor.site_id,
            result.err().map(|e| e.to_string()),
            if deleted { "" } else { ", still there" }
        ));
        if !deleted {
            return;
        }
        let ended = self.world.now();
        let mut log = self.log.lock().unwrap();
        log.sensors_deleted.push(crate::log::Deleted {
            sensor: id,
            began,
            ended,
            linked: linked.clone(),
        });
        log.memberships.push((id, None, began, ended));
        for c in self.clients.iter_mut() {
            if c.links.remove(&id).is_some() {
                log.unlinked.push((c.id.clone(), id, began));
            }
        }
    }

    /// The sensors the workload keeps silent now (dark, or left quiet).
    fn silent_sensors(&self) -> Vec<SensorId> {
        let now = self.world.now();
        self.sensors
            .iter()
            .filter(|s| s.silent_until > now)
            .map(|s| s.id)
            .collect()
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
        let result = self
            .audited("POST", "sites", store.create_site(site), |_| true)
            .await;
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
        let call = store.delete_site(id.clone(), engine.now());
        let result = self
            .audited("DELETE", &format!("sites/{id}"), call, Option::is_some)
            .await;
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
        let call = store.replace_site(site);
        let result = self
            .audited("PATCH", &format!("sites/{id}"), call, |found| *found)
            .await;
        self.world.trace(format!(
            "site {id} gateway {gateway:?} via {node}: {result:?}"
        ));
    }
}
