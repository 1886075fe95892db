//! Liveness (book: Liveness): lost exactly at the timeout, restored only after lost,
//! reminders on their interval, and the broker link's outages not taken for the sensors'.

use std::collections::BTreeMap;

use latch::domain::{EventKind, Millis, SensorId, Source};

use super::{Bounds, troubled};
use crate::log::Log;
use crate::world::World;

/// Lost exactly when a sensor's silence reaches its timeout (never before; within a
/// second after it in quiet time); restored only after lost; reminders on their interval.
pub(super) fn liveness(
    world: &World,
    t: &crate::model::Tables,
    log: &Log,
    bounds: &Bounds,
    start: Millis,
    now: Millis,
) {
    let seen = readings_by_sensor(t, log);
    let mut by_sensor: BTreeMap<SensorId, Vec<(EventKind, Millis, Option<Millis>)>> =
        BTreeMap::new();
    // When each loss was committed: a timeout shortened while a sensor was silent past it
    // is judged then, its loss dated at the deadline it had passed.
    let mut committed: BTreeMap<(SensorId, Millis), Millis> = BTreeMap::new();
    for (e, by) in t.audit.events().iter().zip(t.audit.event_commits()) {
        // A sensor's life a deletion ended is not its life since (issue #68).
        if log.forgotten_after(e.row.sensor_id, by.at) {
            continue;
        }
        by_sensor.entry(e.row.sensor_id).or_default().push((
            e.row.kind,
            e.row.at,
            e.row.detail.lost_since,
        ));
        if e.row.kind == EventKind::ConnectionLost {
            committed.insert((e.row.sensor_id, e.row.at), by.at);
        }
    }
    for (sensor, events) in &by_sensor {
        let readings = seen.get(sensor).map(Vec::as_slice).unwrap_or(&[]);
        let last_before = |at: Millis| readings.iter().rev().find(|&&r| r <= at).copied();
        let mut lost_since: Option<Millis> = None;
        for &(kind, at, since) in events {
            match kind {
                EventKind::ConnectionLost => {
                    if lost_since.is_some() {
                        world.violate(
                            "lost once per silence",
                            format!("{sensor} lost again at {} while lost", at - start),
                            vec![sensor.to_string()],
                        );
                    }
                    // A reading at the deadline's very millisecond that came after it
                    // was judged: it restores the sensor at that instant.
                    let restored_then = events
                        .iter()
                        .any(|&(k, a, _)| k == EventKind::ConnectionRestored && a == at);
                    let seen = match restored_then {
                        true => last_before(at - 1),
                        false => last_before(at),
                    };
                    if let Some(seen) = seen
                        && at - seen
                            < timeouts(
                                log,
                                bounds,
                                *sensor,
                                seen,
                                committed.get(&(*sensor, at)).copied().unwrap_or(at),
                            )
                            .0
                    {
                        world.violate(
                            "lost only when the silence reaches the timeout",
                            format!(
                                "{sensor} lost at {} though heard at {} ({} ms before)",
                                at - start,
                                seen - start,
                                at - seen
                            ),
                            vec![sensor.to_string()],
                        );
                    }
                    lost_since = Some(at);
                }
                EventKind::ConnectionRestored => {
                    if lost_since.is_none() {
                        world.violate(
                            "restored only after lost",
                            format!("{sensor} restored at {} while not lost", at - start),
                            vec![sensor.to_string()],
                        );
                    }
                    lost_since = None;
                }
                EventKind::StillLost => match (lost_since, bounds.reminder) {
                    (Some(from), Some(every)) => {
                        let due = since.unwrap_or(from);
                        if at < due + every {
                            world.violate(
                                "reminders on their interval",
                                format!("{sensor} reminded at {} before its interval", at - start),
                                vec![sensor.to_string()],
                            );
                        }
                    }
                    _ => world.violate(
                        "reminders only while lost",
                        format!("{sensor} reminded at {} while not lost", at - start),
                        vec![sensor.to_string()],
                    ),
                },
                // Sites' events are not sensors' history (no site runs in the workload).
                EventKind::StateChanged
                | EventKind::SiteConnectionLost
                | EventKind::SiteConnectionRestored
                | EventKind::BatteryLow
                | EventKind::BatteryOk
                | EventKind::Tamper
                | EventKind::TamperCleared
                | EventKind::Fault
                | EventKind::FaultCleared
                | EventKind::StateHeld
                | EventKind::StateHeldCleared
                | EventKind::Flapping
                | EventKind::FlappingStopped
                | EventKind::AlarmAcknowledged
                | EventKind::StateOutOfSchedule
                | EventKind::AlarmEscalated => {}
            }
        }
    }
    // Never late: a sensor silent past its deadline in quiet time is lost within the slack.
    for (sensor, readings) in &seen {
        let Some(&last) = readings.last() else {
            continue;
        };
        let (least, most) = timeouts(log, bounds, *sensor, last, now);
        let deadline = last + least;
        // A timeout changed after the last reading is judged from when the node serving
        // the sensor took it: a shortened one past already, then.
        let retimed = log
            .settings
            .iter()
            .filter(|c| c.sensor == *sensor && c.ended > last)
            .map(|c| c.ended)
            .max();
        if retimed == Some(Millis::MAX) {
            continue;
        }
        let late_by = (last + most).max(retimed.unwrap_or(0)) + bounds.lost_slack;
        if late_by > now || troubled(log, last, late_by) {
            continue;
        }
        let lost = by_sensor.get(sensor).is_some_and(|ev| {
            ev.iter().any(|&(k, at, _)| {
                k == EventKind::ConnectionLost && at >= deadline && at <= late_by
            })
        });
        if !lost {
            world.violate(
                "lost within a second of the deadline",
                format!(
                    "{sensor} last heard at {}, not lost by {}",
                    last - start,
                    late_by - start
                ),
                vec![sensor.to_string()],
            );
        }
    }
}

/// Each sensor's stored readings' receive times, in order, of its life now (a deletion
/// takes the history of the life it ends).
fn readings_by_sensor(t: &crate::model::Tables, log: &Log) -> BTreeMap<SensorId, Vec<Millis>> {
    let mut seen: BTreeMap<SensorId, Vec<Millis>> = BTreeMap::new();
    for (r, by) in t.audit.readings().iter().zip(t.audit.reading_commits()) {
        if log.deleted_after(r.row.sensor_id, by.at) {
            continue;
        }
        seen.entry(r.row.sensor_id)
            .or_default()
            .push(r.row.received_at);
    }
    for v in seen.values_mut() {
        v.sort_unstable();
    }
    seen
}

/// The least and the greatest timeout `sensor` may have had in `[from, to]` (its changes
/// in the workload, `Log::settings`).
fn timeouts(
    log: &Log,
    bounds: &Bounds,
    sensor: SensorId,
    from: Millis,
    to: Millis,
) -> (Millis, Millis) {
    log.settings_within(sensor, (bounds.timeout, 0), from, to).0
}

/// Our broker link is not the sensors' silence: a sensor last heard through AMQP is not
/// declared lost while the link is down, and once it is back not before
/// `max(last_seen, reconnected_at) + timeout`.
pub(super) fn broker_link(
    world: &World,
    t: &crate::model::Tables,
    log: &Log,
    bounds: &Bounds,
    start: Millis,
) {
    let links = &log.links;
    let by_sensor = |list: &[(SensorId, Source, Millis)]| {
        let mut m: BTreeMap<SensorId, Vec<(Millis, Source)>> = BTreeMap::new();
        for &(sensor, source, at) in list {
            m.entry(sensor).or_default().push((at, source));
        }
        for v in m.values_mut() {
            v.sort_unstable_by_key(|h| h.0);
        }
        m
    };
    let (heard, sent) = (by_sensor(&log.heard), by_sensor(&log.sent));
    let seen = readings_by_sensor(t, log);
    let up_at = |at: Millis| {
        links
            .iter()
            .rev()
            .find(|l| l.0 <= at)
            .is_none_or(|&(_, up)| up)
    };
    for (e, by) in t.audit.events().iter().zip(t.audit.event_commits()) {
        if e.row.kind != EventKind::ConnectionLost || log.forgotten_after(e.row.sensor_id, by.at) {
            continue;
        }
        let (sensor, at) = (e.row.sensor_id, e.row.at);
        let Some(&last) = seen
            .get(&sensor)
            .and_then(|r| r.iter().rev().find(|&&r| r <= at))
        else {
            continue;
        };
        let source = source_of(
            heard.get(&sensor).map_or(&[][..], Vec::as_slice),
            sent.get(&sensor).map_or(&[][..], Vec::as_slice),
            last,
        );
        if source != Some(Source::Amqp) {
            continue;
        }
        let keys = vec![sensor.to_string()];
        if !up_at(at) {
            world.violate(
                "not lost while its broker link is down",
                format!(
                    "{sensor}, last heard through AMQP at {}, lost at {} while the link was down",
                    last - start,
                    at - start
                ),
                keys,
            );
            continue;
        }
        if let Some(&(back, _)) = links
            .iter()
            .rev()
            .find(|&&(when, up)| up && when > last && when <= at)
            && at - back < timeouts(log, bounds, sensor, back, by.at.max(at)).0
        {
            world.violate(
                "not lost while its broker link is down",
                format!(
                    "{sensor}, last heard through AMQP at {}, lost at {}, {} ms after the link came back",
                    last - start,
                    at - start,
                    at - back
                ),
                keys,
            );
        }
    }
}

/// How the stored reading received at `last` came in, when the workload's sends tell it
/// for sure: the way of the sends taken at that very time (an entry node takes a reading
/// at its `received_at`); else (forwarded to an owner that took it later) the way of the
/// last answered send by then, unless a send not answered since (stored all the same when
/// its commit was in doubt) came another way. `None` when the sends leave it open.
fn source_of(
    heard: &[(Millis, Source)],
    sent: &[(Millis, Source)],
    last: Millis,
) -> Option<Source> {
    // The way `way` for sure: every send in `range` came that way.
    let all_by = |range: &dyn Fn(Millis) -> bool, way: Source| {
        sent.iter()
            .filter(|h| range(h.0))
            .all(|h| h.1 == way)
            .then_some(way)
    };
    if let Some(&(_, way)) = sent.iter().find(|h| h.0 == last) {
        return all_by(&|at| at == last, way);
    }
    let &(answered, way) = heard.iter().rev().find(|h| h.0 <= last)?;
    all_by(&|at| at > answered && at <= last, way)
}
