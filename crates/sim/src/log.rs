//! What the checks read of a run beside the store: the clients as the workload drives
//! them and the run's log (acknowledged readings, troubled periods, broker links).

use std::collections::{BTreeMap, BTreeSet};

use latch::domain::hold::HoldAlarms;
use latch::domain::{Millis, SensorId, Source};

/// A client as the workload drives it.
#[derive(Debug, Clone)]
pub struct SimClient {
    pub id: String,
    pub healthy: bool,
    /// When each sensor was last linked to it (linked now).
    pub links: BTreeMap<SensorId, Millis>,
}

/// What the checks need of the run beside the store: acknowledged readings, when faults
/// were active, and the broker links' changes.
#[derive(Default)]
pub struct Log {
    /// Readings answered accepted: sensor and data, in the order acknowledged.
    pub acked: Vec<(SensorId, bool, Millis)>,
    /// Readings answered accepted: sensor, how it came in, and when the entry node took it
    /// (its `received_at`, unless forwarded to an owner that took it later).
    pub heard: Vec<(SensorId, Source, Millis)>,
    /// Every reading the workload sent, answered or not, as `heard`: one whose answer was
    /// lost (a commit in doubt, a node killed) may be stored all the same.
    pub sent: Vec<(SensorId, Source, Millis)>,
    /// Each change of the AMQP broker link: when, and whether it came up (filled in from
    /// the nodes' record once the run has healed).
    pub links: Vec<(Millis, bool)>,
    /// Each stop: the node, its SIGTERM, and when its process ended (filled in as
    /// `links`).
    pub stops: Vec<(String, Millis, Millis)>,
    /// Periods in which something beyond the endpoints was faulted (a node, the store, a
    /// link): isolation and prompt liveness are only asked of the quiet time between.
    pub troubled: Vec<(Millis, Millis)>,
    /// Lives of processes that were killed or frozen after they answered: their
    /// outcomes may be lost or come too late.
    pub unsure_lives: BTreeSet<String>,
    /// Links removed: client, sensor, when (a site's return goes only to a client still
    /// linked to what its loss named).
    pub unlinked: Vec<(String, SensorId, Millis)>,
    /// Subscriptions changed: client, from when, and whether it takes site events after
    /// (a site's loss told it of sensors; one that stopped learns of them by their own).
    pub subscriptions: Vec<(String, Millis, bool)>,
    /// Each sensor's site over the run, as the store held it after each call that could
    /// change it: sensor, its site, and when that call began and ended (the registration:
    /// both at the start).
    pub memberships: Vec<(SensorId, Option<String>, Millis, Millis)>,
    /// Sites deleted: which, and when the call began and ended.
    pub sites_deleted: Vec<(String, Millis, Millis)>,
    /// Sensors' timeouts (ms) and debounce windows (ms, 0: none) changed: sensor, the new
    /// values, and from when to when the change may have taken effect (its call's start,
    /// and its end plus the time a node serving the sensor may take to follow it;
    /// `Millis::MAX` when the call failed and may still have been written).
    pub settings: Vec<Setting>,
    /// Each client's escalation set at registration (the door alarms workload): fixed for
    /// the run, so the checks judge each `alarm.escalated` by it.
    pub escalations: BTreeMap<String, latch::domain::escalation::Escalation>,
    /// Each armed sensor's arming: fixed by the sensor, so one made again is armed alike.
    pub armed: BTreeMap<SensorId, latch::domain::armed::Armed>,
    /// Sensors deleted, with their links, state and history.
    pub sensors_deleted: Vec<Deleted>,
    /// Sensors' hold alarms as each call wrote them (issue #72): at registration, when
    /// made again, and by each change of a sensor that carried them.
    pub holds: Vec<HoldSetting>,
    /// Registry changes made with an audit record (`workload/audited.rs`): the record's
    /// path, which names the call, and how many records the answer says it left.
    pub audited: Vec<(String, Audited)>,
}

/// How many audit records a change left, as its answer says ([`Log::audited`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audited {
    /// Made: its record is stored.
    One,
    /// Refused, or nothing to change: no record.
    None,
    /// No answer came: made with its record, or neither.
    AtMostOne,
}

/// A sensor's hold alarms written ([`Log::holds`]): the alarms, and from when to when
/// the call ran (`ended`: `Millis::MAX` when it failed and may have been written).
#[derive(Debug, Clone, Copy)]
pub struct HoldSetting {
    pub sensor: SensorId,
    pub alarms: HoldAlarms,
    pub began: Millis,
    pub ended: Millis,
}

/// How long after a registry change a node serving its sensor elsewhere has surely
/// followed it (the change log is read each second, `engine::follow`).
pub const FOLLOW_MS: Millis = 2_000;

/// A sensor deleted ([`Log::sensors_deleted`]): from when to when its call ran, and the
/// clients it was linked to.
#[derive(Debug, Clone)]
pub struct Deleted {
    pub sensor: SensorId,
    pub began: Millis,
    pub ended: Millis,
    pub linked: Vec<String>,
}

/// A sensor's settings changed ([`Log::settings`]).
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub sensor: SensorId,
    pub timeout: Millis,
    pub debounce: Millis,
    pub began: Millis,
    pub ended: Millis,
}

impl Log {
    /// The least and the greatest of `sensor`'s timeout and debounce window that may have
    /// been in force at some time in `[from, to]`, from `initial` (the registration's):
    /// `((least timeout, greatest timeout), (least window, greatest window))`.
    pub fn settings_within(
        &self,
        sensor: SensorId,
        initial: (Millis, Millis),
        from: Millis,
        to: Millis,
    ) -> ((Millis, Millis), (Millis, Millis)) {
        let mine: Vec<&Setting> = self
            .settings
            .iter()
            .filter(|s| s.sensor == sensor)
            .collect();
        // In force at `from`: the last change surely in effect by then, or the initial.
        let settled = mine
            .iter()
            .filter(|s| s.ended <= from)
            .max_by_key(|s| s.ended)
            .map_or(initial, |s| (s.timeout, s.debounce));
        let mut t = (settled.0, settled.0);
        let mut d = (settled.1, settled.1);
        // And each change that may have taken effect during it.
        for s in mine.iter().filter(|s| s.ended > from && s.began <= to) {
            t = (t.0.min(s.timeout), t.1.max(s.timeout));
            d = (d.0.min(s.debounce), d.1.max(s.debounce));
        }
        // A change under way at `from` may not have taken effect yet: what came before it
        // holds meanwhile.
        for s in mine.iter().filter(|s| s.began <= from && s.ended > from) {
            let before = mine
                .iter()
                .filter(|o| o.ended <= s.began)
                .max_by_key(|o| o.ended)
                .map_or(initial, |o| (o.timeout, o.debounce));
            t = (t.0.min(before.0), t.1.max(before.0));
            d = (d.0.min(before.1), d.1.max(before.1));
        }
        (t, d)
    }

    /// Whether a reading of `sensor` committed at `at` may belong to a life of it a later
    /// deletion ended (its history went with it; a sensor made again starts afresh; no
    /// reading of a deleted sensor is stored once its deletion ended).
    pub fn deleted_after(&self, sensor: SensorId, at: Millis) -> bool {
        self.sensors_deleted
            .iter()
            .any(|d| d.sensor == sensor && d.ended >= at)
    }

    /// Whether an event of `sensor` committed at `at` may belong to a life of it a later
    /// deletion ended: as [`Log::deleted_after`], and until a node serving it elsewhere
    /// followed the deletion (its engine judged the old life till then).
    pub fn forgotten_after(&self, sensor: SensorId, at: Millis) -> bool {
        self.sensors_deleted
            .iter()
            .any(|d| d.sensor == sensor && d.ended + FOLLOW_MS >= at)
    }

    /// Whether `sensor`'s settings may have changed in `[from, to]`.
    pub fn retimed_between(&self, sensor: SensorId, from: Millis, to: Millis) -> bool {
        self.settings
            .iter()
            .any(|s| s.sensor == sensor && s.ended > from && s.began <= to)
    }
}

impl Log {
    /// The sites `sensor` may have been in at `at`: the one the last call ended by then left
    /// it in, and those of calls under way then (the store applied each at some instant
    /// between its start and its end).
    pub fn sites_at(&self, sensor: SensorId, at: Millis) -> Vec<Option<String>> {
        let mine = self.memberships.iter().filter(|m| m.0 == sensor);
        let settled = mine
            .clone()
            .filter(|m| m.3 <= at)
            .max_by_key(|m| m.3)
            .map(|m| m.1.clone());
        let mut out: Vec<Option<String>> = settled.into_iter().collect();
        out.extend(mine.filter(|m| m.2 <= at && at < m.3).map(|m| m.1.clone()));
        if out.is_empty() {
            out.push(None);
        }
        out
    }

    /// Whether `sensor` may have been in `site` at `at`.
    pub fn in_site_at(&self, sensor: SensorId, site: &str, at: Millis) -> bool {
        self.sites_at(sensor, at)
            .iter()
            .any(|s| s.as_deref() == Some(site))
    }

    /// Whether `sensor`'s site may have changed, or a site been deleted, in `(from, to]`:
    /// what a site held of it went where it then was.
    pub fn moved_between(&self, sensor: SensorId, from: Millis, to: Millis) -> bool {
        let calls = self
            .memberships
            .iter()
            .filter(|m| m.0 == sensor)
            .map(|m| (m.2, m.3))
            .chain(self.sites_deleted.iter().map(|d| (d.1, d.2)));
        calls
            .into_iter()
            .any(|(began, ended)| ended > from && began <= to)
    }
}
