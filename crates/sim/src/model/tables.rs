//! The durable state of the model: one in-memory "table" per table of the backends
//! (`src/store/migrations/*`), kept in ordered maps so every scan runs in one order, the
//! counters that stand for their sequences, and the one place a notification's status
//! changes ([`Tables::set_status`]), which the audit watches.
//!
//! Only what a committed transaction leaves is here: each store call is applied whole
//! under the model's lock, so nothing of a call is ever half written or pending.

use std::collections::{BTreeMap, BTreeSet};

use latch::domain::client::Health;
use latch::domain::partition::Partitioning;
use latch::domain::sensor::{Debounce, SensorState};
use latch::domain::token::ApiToken;
use latch::domain::{
    Attempt, Client, Connection, Event, Millis, Notification, Sensor, SensorId, SensorStatus,
    Source, Status,
};
use latch::store::{ReadingRecord, SensorRuntime, SensorView};

use super::audit::Audit;
pub(crate) use super::audit::Cx;

/// `sensor_state`: what a commit writes of a sensor (`rows::RUNTIME_COLS`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateRow {
    pub data: Option<bool>,
    pub changed_at: Option<Millis>,
    pub last_ts: Option<Millis>,
    pub last_seen_at: Option<Millis>,
    pub connection: Connection,
    pub last_source: Option<Source>,
    pub debounce: Option<Debounce>,
    pub lost_since: Option<Millis>,
    pub reminders: Option<u32>,
    pub signals: latch::domain::signals::SignalState,
    pub hold: Option<latch::domain::hold::Hold>,
    pub flapping: Option<latch::domain::flap::FlapState>,
}

/// `clients`: the client and the running summary of its attempts that health reads and
/// the failure streak that disables it (`OutcomeTables::note_client`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientRow {
    pub client: Client,
    pub failing_since: Option<Millis>,
    pub last_success_at: Option<Millis>,
    pub last_failure_at: Option<Millis>,
    pub last_error: Option<String>,
    pub failures_since_success: u64,
}

/// `notifications`: the row and its lease.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredNotification {
    pub notification: Notification,
    pub lease_until: Option<Millis>,
    pub claimed_by: Option<String>,
}

/// `attempts`: an attempt with the client it was recorded for (health reads by client).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRow {
    pub id: i64,
    pub client_id: String,
    pub attempt: Attempt,
}

/// `latch_partitions`: one partition's lease.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionRow {
    pub partition: u32,
    pub owner: Option<String>,
    pub epoch: i64,
    /// `Millis::MIN` stands for PostgreSQL's `'-infinity'`.
    pub expires_at: Millis,
    pub deadline_floor: Option<Millis>,
    pub released_by: Option<String>,
    pub released_at: Option<Millis>,
}

/// `latch_nodes`: a registered node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    pub address: String,
    pub heartbeat_at: Millis,
    pub secret_fingerprint: Option<String>,
}

/// The cluster's tables (PostgreSQL only).
#[derive(Debug, Default)]
pub(crate) struct ClusterTables {
    /// `latch_cluster`: the partitioning fixed by the first user, and the shared secret.
    pub fixed: Option<Partitioning>,
    pub secret: Option<String>,
    pub partitions: Vec<PartitionRow>,
    pub nodes: BTreeMap<String, NodeEntry>,
    /// `latch_source_links`, by (source, node).
    pub links: BTreeMap<(usize, String), (bool, Millis)>,
    /// `latch_rate_schedule`: where each client's leased request slots end, in µs.
    pub rates: BTreeMap<String, i64>,
}

/// The sequences: each id is the one after the last given, never reused.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub seq: i64,
    pub reading: i64,
    pub event: i64,
    pub attempt: i64,
    pub change: i64,
    pub held: i64,
    /// The last audit record's id (ids are never reused), and the last shipped.
    pub audit: i64,
    pub audit_shipped: i64,
    /// The random part of the notification ids (ULIDs) the model makes.
    pub ulid: u128,
}

/// A silenced pair's row: the sensor's site when noted, what the client knew before (`None`:
/// noted before latch kept it), and the seq it was noted at.
pub(crate) type KeptPair = (Option<String>, Option<latch::domain::silence::View>, i64);

/// A window a silence held: `[starts_at, ends_at)`, written at `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldWindow {
    pub starts_at: Millis,
    pub ends_at: Millis,
    pub since: Millis,
}

/// Every table of the store, as the last applied call left it. The simulation reads it
/// through [`super::ModelStore::read`]; only the store's calls change it.
#[derive(Debug)]
pub struct Tables {
    /// A store several nodes share (PostgreSQL) or one process's (SQLite).
    pub(crate) shared: bool,
    /// Sites one call of `decide_sites` decides on the embedded store (SQLite's 500;
    /// [`super::ModelStore::decide_sites_per_call`]).
    pub(crate) sites_per_call: usize,
    /// The partition count a shared store fixes at its first use (`cluster_partitions`).
    pub(crate) wanted: u32,
    pub(crate) sensors: BTreeMap<SensorId, Sensor>,
    pub(crate) states: BTreeMap<SensorId, StateRow>,
    pub(crate) clients: BTreeMap<String, ClientRow>,
    /// `links`, by sensor then client (the order a commit notifies clients in).
    pub(crate) links: BTreeSet<(SensorId, String)>,
    pub(crate) notifications: BTreeMap<i64, StoredNotification>,
    /// The seqs of each (sensor, client) lane's notifications: an index, as both backends
    /// have one (`notifications_pending`'s, the lane index), so lane reads stay cheap.
    pub(crate) lanes: BTreeMap<(SensorId, String), BTreeSet<i64>>,
    /// Notification id → seq.
    pub(crate) seq_of: BTreeMap<String, i64>,
    pub(crate) attempts: BTreeMap<i64, AttemptRow>,
    /// The last attempt shipped to the history sink (`ship_marks`).
    pub(crate) attempts_shipped: i64,
    pub(crate) readings: BTreeMap<i64, ReadingRecord>,
    pub(crate) events: BTreeMap<i64, Event>,
    /// `sensor_changes` (PostgreSQL): seq → (sensor, when by the database's clock).
    /// The registry's change log (`sensor_changes`): sensor, when, whether a deletion.
    pub(crate) changes: BTreeMap<i64, (SensorId, Millis, bool)>,
    pub(crate) tokens: BTreeMap<String, ApiToken>,
    /// `idempotency_keys`: key → (its row, when made).
    pub(crate) idempotency_keys: BTreeMap<String, (latch::store::KeyRow, Millis)>,
    /// `idempotency_applied`: (key, positions, when applied).
    pub(crate) idempotency_applied: Vec<(String, Vec<u32>, Millis)>,
    /// The id of the key the store says it seals secrets under.
    pub(crate) sealing_key: Option<String>,
    /// Per broker session, its publishes committed but not acknowledged.
    pub(crate) unacked: BTreeMap<String, Vec<latch::store::Unacked>>,
    pub(crate) sites: BTreeMap<String, latch::domain::site::Site>,
    /// Each site's decision state (the backends' columns of `sites`).
    pub(crate) site_states: BTreeMap<String, latch::domain::site::decide::SiteState>,
    /// `site_held`: id → (site, event).
    pub(crate) site_held: BTreeMap<i64, (String, Event)>,
    pub(crate) silences: BTreeMap<String, latch::domain::silence::Silence>,
    /// When each silence was last changed in the store (not a table: for the checks). A
    /// change carries the API node's time, which a slow store can write well after: a
    /// silence ended early stays active for every commit before the end is written.
    pub(crate) silence_written_at: BTreeMap<String, Millis>,
    /// Every window each silence held, in order, each with when ("database now") it was
    /// written (not a table: for the checks): a silence that follows a schedule moves on at
    /// each window's end, and what it kept in a window it left is judged by that window.
    pub(crate) silence_windows: BTreeMap<String, Vec<HeldWindow>>,
    /// The notifications silences' ends made (not a table: for the checks), which no
    /// silence is applied to.
    pub(crate) silence_made: std::collections::BTreeSet<i64>,
    /// `silenced_pairs`: (client, sensor) pairs a silence kept a notification from, each
    /// with the sensor's site when the first was kept, what the client knew before it, and
    /// its seq (`since`).
    pub(crate) silenced_pairs: BTreeMap<(String, SensorId), KeptPair>,
    /// `schedules`, by id.
    pub(crate) schedules: BTreeMap<String, latch::store::StoredSchedule>,
    /// When each alarm's acknowledgement was applied, by the database's clock (not a table:
    /// for the checks; `acknowledged_at` is the caller's time).
    pub(crate) acks_applied: BTreeMap<String, Millis>,
    /// `alarms`, by id.
    pub(crate) alarms: BTreeMap<String, latch::domain::alarm::Alarm>,
    /// `escalations`, by alarm and the client it goes to.
    pub(crate) escalations: BTreeMap<(String, String), super::escalations::EscalationRow>,
    pub(crate) cluster: ClusterTables,
    pub(crate) next: Counters,
    pub(crate) audit: Audit,
    /// `audit` of the backends: the API's changes, oldest first.
    pub(crate) trail: Vec<latch::domain::audit::Entry>,
    /// How many records each path was written with, retention aside (not a table: for the
    /// checks; the simulation's workload names each call by its path).
    pub(crate) trail_written: BTreeMap<String, usize>,
}

impl Tables {
    pub(crate) fn new(shared: bool, wanted: u32) -> Self {
        Self {
            shared,
            sites_per_call: 500,
            wanted,
            sensors: BTreeMap::new(),
            states: BTreeMap::new(),
            clients: BTreeMap::new(),
            links: BTreeSet::new(),
            notifications: BTreeMap::new(),
            lanes: BTreeMap::new(),
            seq_of: BTreeMap::new(),
            attempts: BTreeMap::new(),
            attempts_shipped: 0,
            readings: BTreeMap::new(),
            events: BTreeMap::new(),
            changes: BTreeMap::new(),
            tokens: BTreeMap::new(),
            idempotency_keys: BTreeMap::new(),
            idempotency_applied: Vec::new(),
            unacked: BTreeMap::new(),
            sites: BTreeMap::new(),
            site_states: BTreeMap::new(),
            site_held: BTreeMap::new(),
            silences: BTreeMap::new(),
            silence_written_at: BTreeMap::new(),
            silence_windows: BTreeMap::new(),
            silence_made: Default::default(),
            silenced_pairs: BTreeMap::new(),
            sealing_key: None,
            alarms: BTreeMap::new(),
            escalations: BTreeMap::new(),
            acks_applied: BTreeMap::new(),
            schedules: BTreeMap::new(),
            cluster: ClusterTables::default(),
            next: Counters::default(),
            audit: Audit::default(),
            trail: Vec::new(),
            trail_written: BTreeMap::new(),
        }
    }

    /// A new notification id: a ULID of the database's time and a counter, so a run is
    /// the same on every replay of its seed (the backends use `Ulid::new()`).
    pub(crate) fn new_notification_id(&mut self, now: Millis) -> String {
        self.next.ulid += 1;
        ulid::Ulid::from_parts(now.max(0) as u64, self.next.ulid).to_string()
    }

    /// The one place a notification's status changes: the audit sees every change.
    pub(crate) fn set_status(&mut self, cx: &Cx, seq: i64, to: Status, updated_at: Millis) {
        let Some(row) = self.notifications.get_mut(&seq) else {
            return;
        };
        let from = row.notification.status;
        row.notification.status = to;
        row.notification.updated_at = updated_at;
        if from != to {
            self.audit.changed(cx, &row.notification.id, seq, from, to);
        }
    }

    /// Makes and stores a pending notification of `e` for `client_id` (with a site's
    /// `body`), as every backend's insert does; answers its ref.
    pub(crate) fn make_pending(
        &mut self,
        cx: &Cx,
        client_id: String,
        e: &Event,
        body: Option<String>,
        alarm_id: Option<String>,
        now: Millis,
    ) -> latch::domain::NotificationRef {
        self.next.seq += 1;
        let n = Notification {
            id: self.new_notification_id(cx.now),
            seq: self.next.seq,
            client_id,
            sensor_id: e.sensor_id,
            kind: e.kind,
            data: e.data,
            previous: e.previous,
            occurred_at: e.at,
            last_seen_at: e.last_seen_at,
            detail: e.detail,
            status: Status::Pending,
            attempts: 0,
            next_attempt_at: Some(now),
            created_at: now,
            updated_at: now,
            batch_id: None,
            body,
            alarm_id,
        };
        let r = latch::domain::NotificationRef {
            due_at: now,
            ..latch::domain::NotificationRef::of(&n)
        };
        self.insert_notification(cx, n);
        r
    }

    /// Stores a new notification.
    pub(crate) fn insert_notification(&mut self, cx: &Cx, n: Notification) {
        self.audit.created(cx, &n);
        self.seq_of.insert(n.id.clone(), n.seq);
        self.lanes
            .entry((n.sensor_id, n.client_id.clone()))
            .or_default()
            .insert(n.seq);
        self.notifications.insert(
            n.seq,
            StoredNotification {
                notification: n,
                lease_until: None,
                claimed_by: None,
            },
        );
    }

    /// Deletes notifications and their attempts (retention); returns how many of each.
    pub(crate) fn delete_notifications(&mut self, cx: &Cx, seqs: &[i64]) -> (u64, u64) {
        let mut ids = BTreeSet::new();
        for &seq in seqs {
            let Some(r) = self.notifications.remove(&seq) else {
                continue;
            };
            let n = r.notification;
            self.seq_of.remove(&n.id);
            let key = (n.sensor_id, n.client_id.clone());
            if let Some(lane) = self.lanes.get_mut(&key) {
                lane.remove(&seq);
                if lane.is_empty() {
                    self.lanes.remove(&key);
                }
            }
            self.audit.deleted(cx, &n);
            ids.insert(n.id);
        }
        let before = self.attempts.len();
        self.attempts
            .retain(|_, a| !ids.contains(&a.attempt.notification_id));
        (ids.len() as u64, (before - self.attempts.len()) as u64)
    }

    /// The notifications of `n`'s lane (same sensor and client), in outbox order.
    pub(crate) fn lane_of<'a>(
        &'a self,
        n: &Notification,
    ) -> impl DoubleEndedIterator<Item = &'a Notification> + 'a {
        self.lanes
            .get(&(n.sensor_id, n.client_id.clone()))
            .into_iter()
            .flatten()
            .filter_map(|seq| self.notifications.get(seq))
            .map(|r| &r.notification)
    }

    /// The seq of notification `id`, if it is stored.
    pub(crate) fn seq(&self, id: &str) -> Option<i64> {
        self.seq_of.get(id).copied()
    }

    pub(crate) fn linked(&self, client_id: &str, sensor_id: SensorId) -> bool {
        self.links.contains(&(sensor_id, client_id.to_string()))
    }

    /// Whether `client` was reached by an escalation of alarm `alarm_id` (so its lane
    /// carries the alarm's news though it is not linked).
    pub(crate) fn reached(&self, alarm_id: Option<&str>, client: &str) -> bool {
        alarm_id.is_some_and(|a| {
            self.escalations
                .get(&(a.to_string(), client.to_string()))
                .is_some_and(|e| e.made_at.is_some())
        })
    }

    /// The clients linked to a sensor, by id.
    pub(crate) fn clients_of(&self, sensor_id: SensorId) -> impl Iterator<Item = &String> {
        self.links
            .range((sensor_id, String::new())..)
            .take_while(move |(s, _)| *s == sensor_id)
            .map(|(_, c)| c)
    }

    /// `SENSOR_COLS`: the sensor with its status (unknown without a state row).
    pub(crate) fn sensor_view(&self, id: SensorId) -> Option<SensorView> {
        let sensor = self.sensors.get(&id)?.clone();
        let status = match self.states.get(&id) {
            Some(st) => SensorStatus {
                data: st.data,
                changed_at: st.changed_at,
                last_seen_at: st.last_seen_at,
                connection: st.connection,
                last_source: st.last_source,
                signals: st.signals,
                hold: st.hold,
                flapping: st.flapping.is_some_and(|f| f.flapping()),
            },
            None => SensorStatus::default(),
        };
        Some((sensor, status))
    }

    /// `RUNTIME_COLS`: what the engine keeps of a registered sensor.
    pub(crate) fn runtime(&self, id: SensorId) -> Option<SensorRuntime> {
        let sensor = self.sensors.get(&id)?;
        let mut state = SensorState::new(sensor.heartbeat_timeout_s);
        state.debounce_s = sensor.debounce_s;
        state.battery_low_pct = sensor.battery_low_pct;
        state.hold_alarms = sensor.hold_alarms;
        state.flap = sensor.flap;
        if let Some(st) = self.states.get(&id) {
            state.data = st.data;
            state.changed_at = st.changed_at;
            state.last_ts = st.last_ts;
            state.last_seen_at = st.last_seen_at;
            state.connection = st.connection;
            state.last_source = st.last_source;
            state.debounce = st.debounce;
            state.lost_since = st.lost_since;
            state.reminders = st.reminders;
            state.signals = st.signals;
            state.hold = st.hold;
            state.flapping = st.flapping;
        }
        Some((id, state))
    }

    /// A shared store's partitioning, fixed at its first use: `wanted` partitions of the
    /// exchange's function on an empty database, MD5 ranges when sensors are there
    /// already (`cluster::fix_partitioning`).
    pub(crate) fn fix_partitioning(&mut self, wanted: u32) -> Partitioning {
        if let Some(p) = self.cluster.fixed {
            return p;
        }
        let p = if self.sensors.is_empty() {
            Partitioning::exchange(wanted)
        } else {
            Partitioning::md5(wanted)
        };
        self.cluster.fixed = Some(p);
        self.cluster.partitions = (0..p.count)
            .map(|partition| PartitionRow {
                partition,
                owner: None,
                epoch: 0,
                expires_at: Millis::MIN,
                deadline_floor: None,
                released_by: None,
                released_at: None,
            })
            .collect();
        p
    }

    /// Records a registry change other nodes follow (`sensor_changes`, shared stores only).
    pub(crate) fn note_change(&mut self, cx: &Cx, id: SensorId) {
        self.note_change_of(cx, id, false);
    }

    /// A change to the registry's log; `deleted`: the sensor's deletion.
    pub(crate) fn note_change_of(&mut self, cx: &Cx, id: SensorId, deleted: bool) {
        if self.shared {
            self.next.change += 1;
            self.changes.insert(self.next.change, (id, cx.now, deleted));
        }
    }

    /// Cancels the pending notifications `which` selects, releasing their leases
    /// (`registry::cancel_pending`).
    pub(crate) fn cancel_pending(
        &mut self,
        cx: &Cx,
        now: Millis,
        which: impl Fn(&Notification) -> bool,
    ) {
        let doomed: Vec<i64> = self
            .notifications
            .iter()
            .filter(|(_, r)| r.notification.status == Status::Pending && which(&r.notification))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in doomed {
            self.set_status(cx, seq, Status::Cancelled, now);
            if let Some(r) = self.notifications.get_mut(&seq) {
                r.lease_until = None;
                r.claimed_by = None;
            }
        }
    }

    /// The client health a backend builds from its summary and the attempts of the last
    /// hour (`Registry::client_health` in both backends' `registry.rs`).
    pub(crate) fn health(&self, id: &str, now: Millis) -> Option<Health> {
        let row = self.clients.get(id)?;
        let mut h = Health {
            last_success_at: row.last_success_at,
            last_failure_at: row.last_failure_at,
            last_error: row.last_error.clone(),
            consecutive_failures: row.failures_since_success,
            ..Health::default()
        };
        let since = now - latch::domain::client::HEALTH_WINDOW_MS;
        let window: Vec<(Millis, bool, u32)> = self
            .attempts
            .values()
            .filter(|a| a.client_id == id && a.attempt.at >= since)
            .map(|a| (a.attempt.at, a.attempt.delivered(), a.attempt.duration_ms))
            .collect();
        h.set_window(&window, now);
        for r in self.notifications.values() {
            if r.notification.client_id == id {
                match r.notification.status {
                    Status::Pending => h.pending += 1,
                    Status::Failed => h.failed += 1,
                    _ => {}
                }
            }
        }
        Some(h)
    }
}

/// Read access for the simulation's checks: every table as the store holds it now.
impl Tables {
    /// Whether the store is shared by several nodes (PostgreSQL's semantics).
    pub fn is_shared(&self) -> bool {
        self.shared
    }

    /// Every notification in outbox order, with its lease.
    pub fn notifications(&self) -> impl Iterator<Item = &StoredNotification> {
        self.notifications.values()
    }

    pub fn notification(&self, id: &str) -> Option<&StoredNotification> {
        self.notifications.get(&self.seq(id)?)
    }

    /// The recorded attempts of a notification, in the order they were recorded.
    pub fn attempts_of(&self, id: &str) -> impl Iterator<Item = &AttemptRow> {
        let id = id.to_string();
        self.attempts
            .values()
            .filter(move |a| a.attempt.notification_id == id)
    }

    pub fn sensors(&self) -> impl Iterator<Item = &Sensor> {
        self.sensors.values()
    }

    /// Each registered sensor's committed state, as the engine would load it.
    pub fn states(&self) -> Vec<SensorRuntime> {
        self.sensors
            .keys()
            .filter_map(|&id| self.runtime(id))
            .collect()
    }

    pub fn state(&self, id: SensorId) -> Option<&StateRow> {
        self.states.get(&id)
    }

    pub fn clients(&self) -> impl Iterator<Item = &ClientRow> {
        self.clients.values()
    }

    /// `(client, sensor)` links.
    pub fn links(&self) -> impl Iterator<Item = (&str, SensorId)> {
        self.links.iter().map(|(s, c)| (c.as_str(), *s))
    }

    /// The readings the store holds now (shipping, retention and sensor deletes take
    /// theirs away; the audit keeps every one committed), by id.
    pub fn readings(&self) -> impl Iterator<Item = (i64, &ReadingRecord)> {
        self.readings.iter().map(|(&id, r)| (id, r))
    }

    /// The events the store holds now, by id.
    pub fn events(&self) -> impl Iterator<Item = (i64, &Event)> {
        self.events.iter().map(|(&id, e)| (id, e))
    }

    /// The partition leases of a shared store.
    pub fn partitions(&self) -> &[PartitionRow] {
        &self.cluster.partitions
    }

    pub fn partitioning(&self) -> Option<Partitioning> {
        self.cluster.fixed
    }

    pub fn nodes(&self) -> impl Iterator<Item = (&str, &NodeEntry)> {
        self.cluster.nodes.iter().map(|(id, n)| (id.as_str(), n))
    }

    /// What the store ever did to notifications, readings and events.
    pub fn audit(&self) -> &Audit {
        &self.audit
    }
}
