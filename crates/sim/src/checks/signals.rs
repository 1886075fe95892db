//! A sensor's battery, tamper and fault alarms as committed (issue #72): per sensor, its
//! battery alarms alternate low and ok, its tamper alarms alternate raised and cleared, a
//! fault is told once per code, and a clearing only ever follows its alarm. Each client
//! gets a sensor's events in the order they were made (the lanes' own checks), so this
//! holds for what every client is told too.

use std::collections::BTreeMap;

use latch::domain::signals::Fault;
use latch::domain::{EventKind, Millis, SensorId};

use crate::log::Log;
use crate::model::Tables;
use crate::world::World;

/// What the events so far said of a sensor's signals.
#[derive(Default)]
struct Told {
    battery_low: bool,
    tamper: bool,
    fault: Option<Fault>,
}

pub(super) fn alarms_alternate(world: &World, t: &Tables, log: &Log, start: Millis) {
    let mut told: BTreeMap<SensorId, Told> = BTreeMap::new();
    for (e, by) in t.audit.events().iter().zip(t.audit.event_commits()) {
        let e = &e.row;
        if !e.kind.is_signal() || log.forgotten_after(e.sensor_id, by.at) {
            continue;
        }
        let s = told.entry(e.sensor_id).or_default();
        let wrong = match e.kind {
            EventKind::BatteryLow => std::mem::replace(&mut s.battery_low, true),
            EventKind::BatteryOk => !std::mem::replace(&mut s.battery_low, false),
            EventKind::Tamper => std::mem::replace(&mut s.tamper, true),
            EventKind::TamperCleared => !std::mem::replace(&mut s.tamper, false),
            EventKind::Fault => {
                e.detail.fault.is_none()
                    || std::mem::replace(&mut s.fault, e.detail.fault) == e.detail.fault
            }
            EventKind::FaultCleared => s.fault.take().is_none(),
            _ => false,
        };
        if wrong {
            world.violate(
                "a sensor's alarms alternate with their clearings",
                format!(
                    "{}: {} at {} repeats its alarm or clears none",
                    e.sensor_id,
                    e.kind.as_str(),
                    e.at - start
                ),
                vec![e.sensor_id.to_string()],
            );
        }
    }
}
