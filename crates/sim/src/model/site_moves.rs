//! A sensor leaving its site — moved, deleted, or its site deleted: the sequence is
//! latch's own (`store::rules::site_moves`); here are its table operations as
//! `store/{sqlite,postgres}/site_moves.rs` write them.

use latch::domain::site::decide::{HeldEvent, Linked, SiteState};
use latch::domain::{Connection, Millis, NotificationRef, SensorId};
use latch::store::{Result, rules};

use super::sites::SiteTables;
use super::tables::{Cx, Tables};

impl Tables {
    /// `sensor`'s site was `from` and is now what its row says (`moved`).
    pub(super) fn sensor_moved(
        &mut self,
        cx: &Cx,
        sensor: SensorId,
        from: Option<&str>,
        now: Millis,
    ) -> Vec<NotificationRef> {
        rules::now_or_never(rules::site_moves::moved(
            &mut SiteTables { t: self, cx },
            sensor,
            from,
            now,
        ))
        .expect("the model's site tables never fail")
    }

    /// `sensor`, of site `site`, was deleted (`deleted`).
    pub(super) fn sensor_left_sites(
        &mut self,
        cx: &Cx,
        sensor: SensorId,
        site: Option<&str>,
        now: Millis,
    ) {
        rules::now_or_never(rules::site_moves::deleted(
            &mut SiteTables { t: self, cx },
            sensor,
            site,
            now,
        ))
        .expect("the model's site tables never fail")
    }
}

impl rules::site_moves::MoveTables for SiteTables<'_> {
    /// As `clients_of`, by client id.
    async fn sensor_clients(&mut self, sensor: SensorId) -> Result<Vec<Linked>> {
        let t = &*self.t;
        let mut out: Vec<Linked> = t
            .clients_of(sensor)
            .map(|c| Linked {
                client_id: c.clone(),
                events: t.clients.get(c).and_then(|c| c.client.events.clone()),
                sensors: vec![sensor],
            })
            .collect();
        out.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        Ok(out)
    }

    async fn site_state(&mut self, id: &str) -> Result<Option<SiteState>> {
        let t = &*self.t;
        Ok(t.sites
            .contains_key(id)
            .then(|| t.site_states.get(id).cloned().unwrap_or_default()))
    }

    async fn held_of(&mut self, site: &str, sensor: SensorId) -> Result<Vec<HeldEvent>> {
        Ok(self
            .t
            .site_held
            .iter()
            .filter(|(_, (s, e))| s == site && e.sensor_id == sensor)
            .map(|(id, (_, event))| HeldEvent {
                id: *id,
                event: event.clone(),
            })
            .collect())
    }

    async fn sensor_data(&mut self, sensor: SensorId) -> Result<Option<bool>> {
        Ok(self.t.states.get(&sensor).and_then(|st| st.data))
    }

    async fn forget_held(&mut self, site: &str, sensor: SensorId) -> Result<()> {
        self.t
            .site_held
            .retain(|_, (s, e)| !(s == site && e.sensor_id == sensor));
        Ok(())
    }

    /// A site row exists for every site the model knows: its state is the default until
    /// written.
    async fn write_moved(&mut self, site: &str, state: &SiteState) -> Result<()> {
        if self.t.sites.contains_key(site) {
            let st = self.t.site_states.entry(site.to_string()).or_default();
            st.pending_since = state.pending_since;
            st.told = state.told.clone();
        }
        Ok(())
    }

    async fn site_now(&mut self, sensor: SensorId) -> Result<Option<(String, bool)>> {
        let t = &*self.t;
        let Some(site) = t.sensors.get(&sensor).and_then(|s| s.site_id.clone()) else {
            return Ok(None);
        };
        let lost = t
            .states
            .get(&sensor)
            .is_some_and(|st| st.connection == Connection::Lost);
        Ok(Some((site, lost)))
    }

    async fn sites_with(&mut self, sensor: SensorId) -> Result<Vec<String>> {
        let t = &*self.t;
        let mut sites: Vec<String> = t
            .site_held
            .values()
            .filter(|(_, e)| e.sensor_id == sensor)
            .map(|(s, _)| s.clone())
            .collect();
        sites.extend(
            t.site_states
                .iter()
                .filter(|(_, st)| st.down && st.told.contains(&sensor))
                .map(|(s, _)| s.clone()),
        );
        Ok(sites)
    }

    async fn forget_pairs(&mut self, sensor: SensorId) -> Result<()> {
        self.t.silenced_pairs.retain(|(_, s), _| *s != sensor);
        Ok(())
    }
}
