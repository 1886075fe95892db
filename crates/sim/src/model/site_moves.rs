//! A sensor leaving its site — moved, deleted, or its site deleted — as
//! `store/{sqlite,postgres}/site_moves.rs` do it, by the domain's rule (`site::moves`).

use latch::domain::site::decide::{HeldEvent, Linked, Made};
use latch::domain::site::moves;
use latch::domain::{Connection, Event, Millis, NotificationRef, SensorId};
use latch::store::rules;

use super::tables::{Cx, Tables};

impl Tables {
    /// The clients linked to `sensor`, by id, with the types each takes (`clients_of`).
    fn linked_clients(&self, sensor: SensorId) -> Vec<Linked> {
        let mut out: Vec<Linked> = self
            .clients_of(sensor)
            .map(|c| Linked {
                client_id: c.clone(),
                events: self.clients.get(c).and_then(|c| c.client.events.clone()),
                sensors: vec![sensor],
            })
            .collect();
        out.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        out
    }

    /// `sensor` leaves site `site` at `now` (`leave`).
    fn leave_site(
        &mut self,
        site: &str,
        sensor: SensorId,
        clients: &[Linked],
        now: Millis,
    ) -> (Vec<Made>, Vec<Event>) {
        if !self.sites.contains_key(site) {
            return (Vec::new(), Vec::new());
        }
        let state = self.site_states.get(site).cloned().unwrap_or_default();
        let held: Vec<HeldEvent> = self
            .site_held
            .iter()
            .filter(|(_, (s, e))| s == site && e.sensor_id == sensor)
            .map(|(id, (_, event))| HeldEvent {
                id: *id,
                event: event.clone(),
            })
            .collect();
        let data_now = self.states.get(&sensor).and_then(|st| st.data);
        let left = moves::leave(&state, sensor, &held, clients, data_now, now);
        self.site_held
            .retain(|_, (s, e)| !(s == site && e.sensor_id == sensor));
        self.site_states.insert(site.to_string(), left.state);
        (left.made, left.owed)
    }

    /// `sensor`'s site was `from` and is now what its row says (`moved`).
    pub(super) fn sensor_moved(
        &mut self,
        cx: &Cx,
        sensor: SensorId,
        from: Option<&str>,
        now: Millis,
    ) -> Vec<NotificationRef> {
        let clients = self.linked_clients(sensor);
        let (mut made, owed) = match from {
            Some(site) => self.leave_site(site, sensor, &clients, now),
            None => (Vec::new(), Vec::new()),
        };
        let to = self
            .sensors
            .get(&sensor)
            .and_then(|s| s.site_id.clone())
            .filter(|s| self.sites.contains_key(s));
        if let Some(site) = to {
            let lost = self
                .states
                .get(&sensor)
                .is_some_and(|st| st.connection == Connection::Lost);
            let state = self.site_states.get(&site).cloned().unwrap_or_default();
            self.site_states
                .insert(site, moves::join(&state, lost, now));
        }
        let refs: Vec<&Event> = owed.iter().collect();
        let held = rules::now_or_never(rules::sites::hold_for_sites(
            &mut super::silences::SiteTables { t: self, cx },
            &refs,
            now,
        ))
        .expect("the model's site tables never fail");
        for (k, e) in owed.iter().enumerate() {
            if !held.contains(&k) {
                made.extend(moves::fan_out(e, &clients));
            }
        }
        let mut out: Vec<NotificationRef> = made
            .into_iter()
            .map(|m| self.make_pending(cx, m.client_id, &m.event, None, now))
            .collect();
        let seqs: Vec<i64> = out.iter().map(|n| n.seq).collect();
        let silenced = self.silence_new(cx, &seqs, now);
        out.retain(|n| !silenced.contains(&n.seq));
        out
    }

    /// `sensor`, of site `site`, was deleted (`deleted`).
    pub(super) fn sensor_left_sites(&mut self, sensor: SensorId, site: Option<&str>, now: Millis) {
        let mut sites: Vec<String> = self
            .site_held
            .values()
            .filter(|(_, e)| e.sensor_id == sensor)
            .map(|(s, _)| s.clone())
            .collect();
        sites.extend(
            self.site_states
                .iter()
                .filter(|(_, st)| st.down && st.told.contains(&sensor))
                .map(|(s, _)| s.clone()),
        );
        sites.extend(site.map(str::to_string));
        sites.sort();
        sites.dedup();
        for site in &sites {
            self.leave_site(site, sensor, &[], now);
        }
        self.silenced_pairs.retain(|(_, s), _| *s != sensor);
    }
}
