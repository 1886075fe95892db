//! What the checks read of a run beside the store: the clients as the workload drives
//! them and the run's log (acknowledged readings, troubled periods, broker links).

use std::collections::{BTreeMap, BTreeSet};

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
