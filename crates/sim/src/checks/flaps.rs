//! A flapping contact (book: Door alarms), as committed: per sensor, a `sensor.flapping`
//! only for a sensor with a `flap`, after as many changes since it last stopped flapping
//! as its threshold counts (the crossing one stands in the `flapping` itself when it is a
//! change of state); `flapping` and `flapping_stopped` alternate, starting with a
//! `flapping`; no `state_changed` while it flaps; and the stop tells the state the
//! `flapping` told as `previous`, and the sensor's state then as `data`.

use std::collections::BTreeMap;

use latch::domain::{EventKind, Millis, SensorId};

use crate::log::Log;
use crate::model::Tables;
use crate::world::World;

/// A sensor's flapping as its committed events told it.
#[derive(Debug, Default)]
struct Flap {
    /// While it flaps: the state its `flapping` told.
    told: Option<Option<bool>>,
    /// Changes counted since it last stopped flapping (or since its life began).
    counted: u32,
}

pub(super) fn flaps(world: &World, t: &Tables, log: &Log, start: Millis) {
    // Each sensor's state as of each commit: its applied readings in commit order.
    let mut data_at: BTreeMap<SensorId, Vec<(u64, bool)>> = BTreeMap::new();
    for (r, c) in t.audit.readings().iter().zip(t.audit.reading_commits()) {
        let r = &r.row;
        if !r.late && !log.deleted_after(r.sensor_id, c.at) {
            data_at
                .entry(r.sensor_id)
                .or_default()
                .push((c.commit, r.data));
        }
    }
    let mut flaps: BTreeMap<SensorId, Flap> = BTreeMap::new();
    for (e, by) in t.audit.events().iter().zip(t.audit.event_commits()) {
        let e = &e.row;
        let x = e.sensor_id;
        if log.forgotten_after(x, by.at) {
            continue;
        }
        let v = |invariant: &'static str, why: String| {
            world.violate(
                invariant,
                format!("{x}: {} at {}: {why}", e.kind.as_str(), e.at - start),
                vec![x.to_string()],
            )
        };
        let f = flaps.entry(x).or_default();
        match e.kind {
            EventKind::StateChanged if e.previous.is_some() => {
                if f.told.is_some() {
                    v(
                        "no state_changed while a sensor flaps",
                        "its flapping has not stopped".into(),
                    );
                }
                f.counted += 1;
            }
            EventKind::ConnectionLost | EventKind::ConnectionRestored => f.counted += 1,
            EventKind::Flapping => {
                let threshold = t
                    .sensors
                    .get(&x)
                    .and_then(|s| s.flap)
                    .map(|flap| flap.changes);
                let Some(threshold) = threshold else {
                    v("a sensor flaps only with a flap", "it has none".into());
                    continue;
                };
                if f.told.is_some() {
                    v(
                        "flapping and its stop alternate",
                        "a second flapping before the first stopped".into(),
                    );
                }
                if f.counted + 1 < threshold {
                    v(
                        "a sensor flaps only after as many changes as its flap counts",
                        format!(
                            "{} change(s) since it last stopped, its threshold {threshold}",
                            f.counted
                        ),
                    );
                }
                f.told = Some(e.data);
            }
            EventKind::FlappingStopped => {
                let Some(told) = f.told.take() else {
                    v(
                        "flapping and its stop alternate",
                        "a stop without a flapping".into(),
                    );
                    continue;
                };
                f.counted = 0;
                if e.previous != told {
                    v(
                        "a flapping's stop tells the state the flapping told",
                        format!("previous {:?}, the flapping told {told:?}", e.previous),
                    );
                }
                let now = data_at
                    .get(&x)
                    .and_then(|d| d.iter().rev().find(|(c, _)| *c <= by.commit))
                    .map(|&(_, data)| data);
                if now.is_some() && e.data != now {
                    v(
                        "a flapping's stop tells the state now",
                        format!("data {:?}, the sensor's {now:?}", e.data),
                    );
                }
            }
            _ => {}
        }
    }
}

/// How many `flapping` and `flapping_stopped` events a run committed: the trace's last
/// line says so, so a workload that never flaps shows.
pub fn summary(t: &Tables) -> String {
    let count = |kind| {
        t.audit
            .events()
            .iter()
            .filter(|e| e.row.kind == kind)
            .count()
    };
    format!(
        "{} flapping, {} flapping_stopped",
        count(EventKind::Flapping),
        count(EventKind::FlappingStopped)
    )
}
