//! Armed sensors (book: Alarms, schedules), as committed: an armed sensor's change to its
//! `armed.data` outside (or inside) the schedule is followed at once, in the same commit,
//! by one `sensor.state_out_of_schedule` of the same time and state, and nothing else
//! makes one; every notification of one names the schedule and was made from such an
//! event.

use std::collections::BTreeSet;

use latch::domain::armed::When;
use latch::domain::{EventKind, Millis, SensorId};

use crate::log::Log;
use crate::model::Tables;
use crate::workload::holds::{ARMED_HOURS, armed_hours};
use crate::world::World;

pub(super) fn armed(world: &World, t: &Tables, log: &Log, start: Millis) {
    let schedule = armed_hours();
    let events = t.audit.events();
    let commits = t.audit.event_commits();
    let mut made: BTreeSet<(SensorId, Millis)> = BTreeSet::new();
    for (k, e) in events.iter().enumerate() {
        let e = &e.row;
        let next = events
            .get(k + 1)
            .filter(|_| commits.get(k + 1).map(|c| c.commit) == commits.get(k).map(|c| c.commit))
            .map(|n| &n.row);
        match e.kind {
            EventKind::StateChanged => {
                // Judged here from the schedule's plain meaning, not by latch's rule.
                let inside = e.at.div_euclid(60_000).rem_euclid(1440) == 17 * 60 + 47;
                let trips = log.armed.get(&e.sensor_id).is_some_and(|a| {
                    e.data == Some(a.data == 1) && inside == (a.when == When::Inside)
                });
                let followed = next.is_some_and(|n| {
                    n.kind == EventKind::StateOutOfSchedule
                        && n.sensor_id == e.sensor_id
                        && n.at == e.at
                        && n.data == e.data
                });
                if trips != followed {
                    world.violate(
                        "an armed sensor's change out of schedule is told beside it",
                        format!(
                            "{} became {:?} at {}: trips {trips}, out-of-schedule after it {followed}",
                            e.sensor_id,
                            e.data,
                            e.at - start
                        ),
                        vec![e.sensor_id.to_string()],
                    );
                }
            }
            EventKind::StateOutOfSchedule => {
                made.insert((e.sensor_id, e.at));
                let after_change = k > 0
                    && events[k - 1].row.kind == EventKind::StateChanged
                    && events[k - 1].row.sensor_id == e.sensor_id;
                if !after_change {
                    world.violate(
                        "an out-of-schedule follows its change",
                        format!("{} at {}", e.sensor_id, e.at - start),
                        vec![e.sensor_id.to_string()],
                    );
                }
            }
            _ => {}
        }
    }
    for n in t.audit.trails() {
        if n.kind != EventKind::StateOutOfSchedule {
            continue;
        }
        let names = n.body.as_deref().is_some_and(|b| {
            serde_json::from_str::<serde_json::Value>(b)
                .is_ok_and(|v| v["id"] == ARMED_HOURS && v["name"] == schedule.name.as_str())
        });
        if !names || !made.contains(&(n.sensor_id, n.occurred_at)) {
            world.violate(
                "an out-of-schedule notification names its schedule and event",
                format!("{} of {} body {:?}", n.id, n.sensor_id, n.body),
                vec![n.sensor_id.to_string(), n.id.clone()],
            );
        }
    }
}
