//! Armed sensors in the group commit ([`crate::domain::armed`]): before the batch's rows
//! are written, the sensors whose state changed are looked up once; an armed one whose
//! change trips its schedule gets a `sensor.state_out_of_schedule` right after the
//! `state_changed` (so it is journaled, fanned out and opens its alarm in lane order), and
//! a change of one that may hold an `out_of_schedule` alarm resolves it.

use std::collections::{HashMap, HashSet};
use std::future::Future;

use crate::domain::armed::{self, Armed};
use crate::domain::schedule::Schedule;
use crate::domain::{Event, EventKind, SensorId};
use crate::store::Result;

/// A sensor the commit must mind: armed (with its schedule, when that still exists), or
/// holding an `out_of_schedule` alarm not resolved (`armed: None`: it was disarmed since).
#[derive(Debug, Clone, PartialEq)]
pub struct ArmedRow {
    pub sensor_id: SensorId,
    pub armed: Option<(Armed, Schedule)>,
}

/// The tables the rule reads and writes, within the commit's transaction.
pub trait ArmedTables {
    /// The sensors among `sensors` (sorted, distinct) that are armed or hold an
    /// `out_of_schedule` alarm not resolved.
    fn armed(&mut self, sensors: &[SensorId]) -> impl Future<Output = Result<Vec<ArmedRow>>>;
    /// Stores each new notification's own fields (by seq): an out-of-schedule's schedule.
    fn describe(&mut self, bodies: &[(i64, String)]) -> impl Future<Output = Result<()>>;
}

/// What the rule decided for a batch.
#[derive(Debug, Default)]
pub struct Decided {
    /// The batch's events with each out-of-schedule after its change; `None`: none added.
    pub events: Option<Vec<Event>>,
    /// The own fields of the added events, by their place in `events`.
    pub bodies: HashMap<usize, String>,
    /// Sensors whose state change resolves their `out_of_schedule` alarm.
    pub resolving: HashSet<SensorId>,
}

/// Reads the armed sensors among those whose state `events` change and decides; reads
/// nothing when no state changed.
pub async fn decide<T: ArmedTables>(t: &mut T, events: &[Event]) -> Result<Decided> {
    let mut changed: Vec<SensorId> = events
        .iter()
        .filter(|e| e.kind == EventKind::StateChanged)
        .map(|e| e.sensor_id)
        .collect();
    if changed.is_empty() {
        return Ok(Decided::default());
    }
    changed.sort_unstable();
    changed.dedup();
    let rows = t.armed(&changed).await?;
    Ok(out_of_schedule(events, rows))
}

/// The rule over what was read: pure.
pub fn out_of_schedule(events: &[Event], rows: Vec<ArmedRow>) -> Decided {
    let resolving: HashSet<SensorId> = rows.iter().map(|r| r.sensor_id).collect();
    let armed: HashMap<SensorId, (Armed, Schedule)> = rows
        .into_iter()
        .filter_map(|r| r.armed.map(|a| (r.sensor_id, a)))
        .collect();
    let mut out: Vec<Event> = Vec::new();
    let mut bodies = HashMap::new();
    let mut added = false;
    for e in events {
        out.push(e.clone());
        if e.kind != EventKind::StateChanged {
            continue;
        }
        let Some((a, schedule)) = armed.get(&e.sensor_id) else {
            continue;
        };
        let Some(data) = e.data else { continue };
        if a.trips(schedule, data, e.at) {
            bodies.insert(out.len(), armed::body(schedule));
            out.push(Event {
                kind: EventKind::StateOutOfSchedule,
                ..e.clone()
            });
            added = true;
        }
    }
    Decided {
        events: added.then_some(out),
        bodies,
        resolving,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Detail;
    use crate::domain::armed::When;

    fn changed(sensor: &str, data: bool, at: i64) -> Event {
        Event {
            sensor_id: SensorId::parse(sensor).unwrap(),
            kind: EventKind::StateChanged,
            at,
            data: Some(data),
            previous: Some(!data),
            last_seen_at: Some(at),
            detail: Detail::default(),
        }
    }

    /// Every day 08:00–18:00 UTC.
    fn day() -> Schedule {
        Schedule::parse(serde_json::json!({
            "id": "day", "name": "Day", "tz": "UTC",
            "weekly": [{"days": ["mon","tue","wed","thu","fri","sat","sun"], "from": "08:00", "to": "18:00"}]
        }))
        .unwrap()
    }

    const H: i64 = 3_600_000;
    /// 2026-12-01 00:00 UTC.
    const MIDNIGHT: i64 = 1_796_083_200_000;

    #[test]
    fn a_door_opened_at_night_gets_its_out_of_schedule_right_after_its_change() {
        let armed = Armed {
            schedule_id: "day".into(),
            data: 1,
            when: When::Outside,
        };
        let rows = vec![
            ArmedRow {
                sensor_id: SensorId::parse("door").unwrap(),
                armed: Some((armed, day())),
            },
            ArmedRow {
                sensor_id: SensorId::parse("gone").unwrap(),
                armed: None,
            },
        ];
        let events = [
            changed("door", true, MIDNIGHT + 2 * H),
            changed("other", true, MIDNIGHT + 2 * H),
            changed("door", false, MIDNIGHT + 3 * H),
            changed("door", true, MIDNIGHT + 10 * H),
        ];
        let d = out_of_schedule(&events, rows);
        let kinds: Vec<(String, EventKind)> = d
            .events
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.sensor_id.to_string(), e.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("door".into(), EventKind::StateChanged),
                ("door".into(), EventKind::StateOutOfSchedule),
                ("other".into(), EventKind::StateChanged),
                ("door".into(), EventKind::StateChanged),
                ("door".into(), EventKind::StateChanged),
            ],
            "only the opening at 02:00 is out of schedule; the one at 10:00 is in hours"
        );
        assert_eq!(d.bodies.len(), 1);
        assert!(d.bodies[&1].contains(r#""name":"Day""#));
        assert!(d.resolving.contains(&SensorId::parse("gone").unwrap()));
        assert!(!d.resolving.contains(&SensorId::parse("other").unwrap()));
    }

    #[test]
    fn a_batch_nothing_trips_keeps_its_events() {
        let d = out_of_schedule(&[changed("door", true, MIDNIGHT + 9 * H)], vec![]);
        assert!(d.events.is_none() && d.bodies.is_empty() && d.resolving.is_empty());
    }
}
