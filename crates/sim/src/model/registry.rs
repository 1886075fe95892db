//! Sensors, clients, links and bulk import: `store/sqlite/registry.rs` and
//! `store/postgres/registry.rs`. On a shared store, creating, replacing and deleting a
//! sensor also records a registry change (`sensor_changes`) and the first sensor fixes the
//! partitioning (PostgreSQL writes each sensor's partition hash with it).

use async_trait::async_trait;

use latch::domain::client::Health;
use latch::domain::{Client, Connection, Millis, Sensor, SensorId};
use latch::store::{ConnectionCounts, Error, Page, PageRequest, Registry, Result, SensorView};

use super::node::NodeStore;
use super::tables::{ClientRow, Cx, Tables};

/// A page of rows already in the list's order and after its cursor: up to `limit + 1` of
/// them, the extra one only proving there is a next page (`Page::from_rows`).
pub(super) fn page_of<T>(
    rows: impl Iterator<Item = T>,
    page: &PageRequest,
    key: impl Fn(&T) -> String,
) -> Page<T> {
    let rows: Vec<T> = rows.take(page.limit as usize + 1).collect();
    Page::from_rows(rows, page.limit, key)
}

/// `id > after`, as the SQL compares text.
pub(super) fn after(id: &str, page: &PageRequest) -> bool {
    page.after.as_deref().is_none_or(|a| id > a)
}

impl Tables {
    /// Fixes the partitioning before the first sensor is written (a shared store writes
    /// each sensor's partition hash with it: `PgStore::partitioning`).
    fn before_sensors(&mut self) {
        if self.shared {
            let wanted = self.wanted;
            self.fix_partitioning(wanted);
        }
    }

    pub(super) fn create_sensor(&mut self, cx: &Cx, s: Sensor) -> Result<()> {
        self.before_sensors();
        if self.sensors.contains_key(&s.id) {
            return Err(Error::Conflict(format!(
                "sensor \"{}\" already exists",
                s.id
            )));
        }
        let id = s.id;
        self.sensors.insert(id, s);
        self.note_change(cx, id);
        Ok(())
    }

    pub(super) fn list_sensors(
        &self,
        filter: latch::store::SensorFilter,
        page: &PageRequest,
    ) -> Page<SensorView> {
        let rows = self
            .sensors
            .keys()
            .filter(|id| after(&id.to_string(), page))
            .filter_map(|&id| self.sensor_view(id))
            .filter(|(_, st)| filter.keeps(st));
        page_of(rows, page, |(s, _)| s.id.to_string())
    }

    /// Sensors with a state row counted by connection; the rest never reported.
    pub(super) fn count_sensors(&self) -> ConnectionCounts {
        let mut counts = ConnectionCounts::default();
        for id in self.sensors.keys() {
            if let Some(st) = self.states.get(id) {
                counts.held += u64::from(st.hold.is_some_and(|h| h.sent > 0));
                counts.battery_low += u64::from(st.signals.battery_low);
                counts.flapping += u64::from(st.flapping.is_some_and(|f| f.flapping()));
            }
            match self.states.get(id).map(|s| s.connection) {
                Some(Connection::Online) => counts.online += 1,
                Some(Connection::Lost) => counts.lost += 1,
                _ => counts.unknown += 1,
            }
        }
        counts
    }

    /// Writes `to`'s address, timeout, debounce window, site, battery threshold, labels
    /// and hold alarms (not its `created_at`).
    pub(super) fn replace_sensor(
        &mut self,
        cx: &Cx,
        to: Sensor,
        now: Millis,
    ) -> Option<(SensorView, Vec<latch::domain::NotificationRef>)> {
        let Sensor {
            id,
            address,
            heartbeat_timeout_s: timeout,
            debounce_s: debounce,
            site_id,
            battery_low_pct,
            labels,
            hold_alarms,
            flap,
            armed,
            created_at: _,
        } = to;
        let s = self.sensors.get_mut(&id)?;
        s.address = address;
        s.heartbeat_timeout_s = timeout;
        s.debounce_s = debounce;
        s.battery_low_pct = battery_low_pct;
        s.labels = labels;
        s.hold_alarms = hold_alarms;
        s.flap = flap;
        s.armed = armed;
        let from = std::mem::replace(&mut s.site_id, site_id.clone());
        self.note_change(cx, id);
        let made = match from == site_id {
            true => Vec::new(),
            false => self.sensor_moved(cx, id, from.as_deref(), now),
        };
        self.sensor_view(id).map(|v| (v, made))
    }

    /// Deletes the sensor, its state, links and history, and cancels its pending
    /// notifications.
    pub(super) fn delete_sensor(&mut self, cx: &Cx, id: SensorId, now: Millis) -> bool {
        let Some(sensor) = self.sensors.remove(&id) else {
            return false;
        };
        self.sensor_left_sites(cx, id, sensor.site_id.as_deref(), now);
        self.states.remove(&id);
        self.links.retain(|(s, _)| *s != id);
        self.readings.retain(|_, r| r.sensor_id != id);
        self.events.retain(|_, e| e.sensor_id != id);
        self.cancel_pending(cx, now, |n| n.sensor_id == id);
        // Its alarms end with it, as both backends' delete resolves them.
        for a in self.alarms.values_mut() {
            if a.sensor_id == Some(id) && a.state != latch::domain::alarm::AlarmState::Resolved {
                a.state = latch::domain::alarm::AlarmState::Resolved;
                a.resolved_at = Some(now.max(a.opened_at));
            }
        }
        self.note_change_of(cx, id, true);
        true
    }

    pub(super) fn create_client(&mut self, c: Client) -> Result<()> {
        if self.clients.contains_key(&c.id) {
            return Err(Error::Conflict(format!(
                "client \"{}\" already exists",
                c.id
            )));
        }
        // What the INSERT writes: the registry's columns, none of the lifecycle's.
        let client = Client {
            previous_secret: None,
            previous_secret_until: None,
            disabled_at: None,
            disabled_reason: None,
            ..c
        };
        self.clients.insert(
            client.id.clone(),
            ClientRow {
                client,
                failing_since: None,
                last_success_at: None,
                last_failure_at: None,
                last_error: None,
                failures_since_success: 0,
            },
        );
        Ok(())
    }

    pub(super) fn list_clients(&self, page: &PageRequest, disabled: Option<bool>) -> Page<Client> {
        let rows = self
            .clients
            .values()
            .filter(|c| after(&c.client.id, page))
            .filter(|c| disabled.is_none_or(|d| c.client.disabled_at.is_some() == d))
            .map(|c| c.client.clone());
        page_of(rows, page, |c| c.id.clone())
    }

    /// Replaces name, URL, secret, rate limit, events and batching.
    pub(super) fn replace_client(&mut self, c: Client) -> bool {
        let Some(row) = self.clients.get_mut(&c.id) else {
            return false;
        };
        let stored = &mut row.client;
        stored.name = c.name;
        stored.url = c.url;
        stored.secret = c.secret;
        stored.rate_limit = c.rate_limit;
        stored.events = c.events;
        stored.batch = c.batch;
        stored.receiver = c.receiver;
        // `SITES_TELLING_IT`: the sites down whose loss told it are decided again.
        for st in self.site_states.values_mut() {
            if st.down && st.told_clients.contains(&c.id) {
                st.pending_since.get_or_insert(0);
            }
        }
        true
    }

    /// Deletes the client and its links and cancels its pending notifications (the
    /// backends cancel whether or not the client was there).
    pub(super) fn delete_client(&mut self, cx: &Cx, id: &str, now: Millis) -> bool {
        let found = self.clients.remove(id).is_some();
        if found {
            self.audit.client_deleted(cx, id);
        }
        self.links.retain(|(_, c)| c != id);
        for c in self.clients.values_mut() {
            if c.client.escalation.as_ref().is_some_and(|e| e.to == id) {
                c.client.escalation = None;
            }
        }
        self.cancel_pending(cx, now, |n| n.client_id == id);
        found
    }

    fn check_pair(&self, client_id: &str, sensor_id: SensorId) -> Result<()> {
        if !self.clients.contains_key(client_id) {
            return Err(Error::NotFound("client"));
        }
        if !self.sensors.contains_key(&sensor_id) {
            return Err(Error::NotFound("sensor"));
        }
        Ok(())
    }

    pub(super) fn link(&mut self, cx: &Cx, client_id: String, sensor_id: SensorId) -> Result<()> {
        self.check_pair(&client_id, sensor_id)?;
        self.audit.linked(cx, &client_id, sensor_id, true);
        self.links.insert((sensor_id, client_id));
        Ok(())
    }

    pub(super) fn unlink(&mut self, cx: &Cx, client_id: String, sensor_id: SensorId) -> Result<()> {
        self.check_pair(&client_id, sensor_id)?;
        self.audit.linked(cx, &client_id, sensor_id, false);
        self.links.remove(&(sensor_id, client_id));
        Ok(())
    }

    pub(super) fn list_client_sensors(
        &self,
        client_id: &str,
        page: &PageRequest,
    ) -> Result<Page<SensorView>> {
        if !self.clients.contains_key(client_id) {
            return Err(Error::NotFound("client"));
        }
        let rows = self
            .links
            .iter()
            .filter(|(s, c)| c == client_id && after(&s.to_string(), page))
            .filter_map(|(s, _)| self.sensor_view(*s));
        Ok(page_of(rows, page, |(s, _)| s.id.to_string()))
    }

    pub(super) fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: &PageRequest,
    ) -> Result<Page<Client>> {
        if !self.sensors.contains_key(&sensor_id) {
            return Err(Error::NotFound("sensor"));
        }
        let rows = self
            .clients_of(sensor_id)
            .filter(|c| after(c, page))
            .filter_map(|c| self.clients.get(c))
            .map(|c| c.client.clone());
        Ok(page_of(rows, page, |c| c.id.clone()))
    }

    /// Sensors that exist already and links whose ends are missing are skipped. No
    /// registry change is recorded (as on PostgreSQL: a bulk import is for fleets
    /// prepared before the nodes start).
    pub(super) fn import(&mut self, sensors: Vec<Sensor>, links: Vec<(String, SensorId)>) {
        self.before_sensors();
        for s in sensors {
            self.sensors.entry(s.id).or_insert(s);
        }
        for (client, sensor) in links {
            if self.clients.contains_key(&client) && self.sensors.contains_key(&sensor) {
                self.links.insert((sensor, client));
            }
        }
    }
}

#[async_trait]
impl Registry for NodeStore {
    async fn create_sensor(&self, s: Sensor) -> Result<()> {
        self.audited(
            "create_sensor",
            Some(s.id.to_string()),
            |t, cx| t.create_sensor(cx, s),
            |_, r| Some(r),
        )
        .await
    }

    async fn get_sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        self.run("get_sensor", false, |t, _| Ok(t.sensor_view(id)))
            .await
    }

    async fn first_missing_sensor(&self, ids: Vec<SensorId>) -> Result<Option<SensorId>> {
        self.run("first_missing_sensor", false, |t, _| {
            Ok(ids.into_iter().find(|i| !t.sensors.contains_key(i)))
        })
        .await
    }

    async fn list_sensors(
        &self,
        filter: latch::store::SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.run("list_sensors", false, |t, _| {
            Ok(t.list_sensors(filter, &page))
        })
        .await
    }

    async fn count_sensors(&self) -> Result<ConnectionCounts> {
        self.run("count_sensors", false, |t, _| Ok(t.count_sensors()))
            .await
    }

    async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        heartbeat_timeout_s: Option<u32>,
        debounce_s: Option<u32>,
        site_id: Option<String>,
        alarms: latch::domain::sensor::SensorAlarms,
        now: Millis,
    ) -> Result<Option<(SensorView, Vec<latch::domain::NotificationRef>)>> {
        self.audited(
            "replace_sensor",
            None,
            |t, cx| {
                let to = Sensor {
                    id,
                    address,
                    heartbeat_timeout_s,
                    debounce_s,
                    site_id,
                    created_at: 0,
                    battery_low_pct: alarms.battery_low_pct,
                    labels: alarms.labels,
                    hold_alarms: alarms.hold_alarms,
                    flap: alarms.flap,
                    armed: alarms.armed,
                };
                Ok(t.replace_sensor(cx, to, now))
            },
            |v, r| v.is_some().then_some(r),
        )
        .await
    }

    async fn delete_sensor(&self, id: SensorId, now: Millis) -> Result<bool> {
        self.audited(
            "delete_sensor",
            None,
            |t, cx| Ok(t.delete_sensor(cx, id, now)),
            |ok, r| ok.then_some(r),
        )
        .await
    }

    async fn create_client(&self, client: Client) -> Result<()> {
        self.audited(
            "create_client",
            Some(client.id.clone()),
            |t, _| t.create_client(client),
            |_, r| Some(r),
        )
        .await
    }

    async fn get_client(&self, id: String) -> Result<Option<Client>> {
        self.run("get_client", false, |t, _| {
            Ok(t.clients.get(&id).map(|c| c.client.clone()))
        })
        .await
    }

    async fn list_clients(
        &self,
        page: PageRequest,
        disabled: Option<bool>,
    ) -> Result<Page<Client>> {
        self.run("list_clients", false, |t, _| {
            Ok(t.list_clients(&page, disabled))
        })
        .await
    }

    async fn replace_client(&self, client: Client) -> Result<bool> {
        self.audited(
            "replace_client",
            None,
            |t, _| Ok(t.replace_client(client)),
            |ok, r| ok.then_some(r),
        )
        .await
    }

    async fn delete_client(&self, id: String, now: Millis) -> Result<bool> {
        self.audited(
            "delete_client",
            None,
            |t, cx| Ok(t.delete_client(cx, &id, now)),
            |ok, r| ok.then_some(r),
        )
        .await
    }

    async fn rotate_secret(
        &self,
        id: String,
        secret: String,
        previous_until: Millis,
    ) -> Result<Option<Client>> {
        self.audited(
            "rotate_secret",
            None,
            |t, _| Ok(t.rotate_secret(&id, secret, previous_until)),
            |v, r| v.is_some().then_some(r),
        )
        .await
    }

    async fn enable_client(&self, id: String) -> Result<Option<bool>> {
        self.audited(
            "enable_client",
            None,
            |t, _| Ok(t.enable_client(&id)),
            // Only one that was disabled changed.
            |v, r| (*v == Some(true)).then_some(r),
        )
        .await
    }

    async fn count_disabled_clients(&self) -> Result<u64> {
        self.run("count_disabled_clients", false, |t, _| {
            Ok(t.clients
                .values()
                .filter(|c| c.client.disabled_at.is_some())
                .count() as u64)
        })
        .await
    }

    async fn client_health(&self, id: String, now: Millis) -> Result<Option<Health>> {
        self.run("client_health", false, |t, _| Ok(t.health(&id, now)))
            .await
    }

    async fn link(&self, client_id: String, sensor_id: SensorId, _now: Millis) -> Result<()> {
        self.audited(
            "link",
            None,
            |t, cx| {
                let had = t.links.contains(&(sensor_id, client_id.clone()));
                t.link(cx, client_id, sensor_id).map(|()| !had)
            },
            |made, r| made.then_some(r),
        )
        .await
        .map(|_| ())
    }

    async fn unlink(&self, client_id: String, sensor_id: SensorId) -> Result<()> {
        self.audited(
            "unlink",
            None,
            |t, cx| {
                let had = t.links.contains(&(sensor_id, client_id.clone()));
                t.unlink(cx, client_id, sensor_id).map(|()| had)
            },
            |gone, r| gone.then_some(r),
        )
        .await
        .map(|_| ())
    }

    async fn list_client_sensors(
        &self,
        client_id: String,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.run("list_client_sensors", false, |t, _| {
            t.list_client_sensors(&client_id, &page)
        })
        .await
    }

    async fn list_sensor_clients(
        &self,
        sensor_id: SensorId,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        self.run("list_sensor_clients", false, |t, _| {
            t.list_sensor_clients(sensor_id, &page)
        })
        .await
    }

    async fn import(
        &self,
        sensors: Vec<Sensor>,
        links: Vec<(String, SensorId)>,
        _now: Millis,
    ) -> Result<()> {
        self.run("import", true, |t, _| {
            t.import(sensors, links);
            Ok(())
        })
        .await
    }
}
