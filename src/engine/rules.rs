//! The change rule: what one reading does to a sensor's state. Pure, so it is tested hard
//! without any I/O.

use crate::domain::sensor::SensorState;
use crate::domain::{Connection, Event, EventKind, Millis, SensorId};

/// What a reading did to the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Same data as now: nobody is notified.
    Same,
    /// New data (or the first ever): a state change.
    Changed { previous: Option<bool> },
    /// Device time older than the last applied reading: history only.
    Late,
}

/// Applies one reading. Returns what changed and appends the events it caused to
/// `events` (a `connection_restored` when the sensor was lost, then a `state_changed`).
///
/// `ts` is the device time, or `received_at` when the device sent none.
pub fn apply(
    id: SensorId,
    state: &mut SensorState,
    data: bool,
    ts: Millis,
    received_at: Millis,
    events: &mut Vec<Event>,
) -> Change {
    let previous_seen = state.last_seen_at;
    state.last_seen_at = Some(previous_seen.map_or(received_at, |s| s.max(received_at)));
    match state.connection {
        Connection::Lost => {
            events.push(Event {
                sensor_id: id,
                kind: EventKind::ConnectionRestored,
                at: received_at,
                data: state.data,
                previous: None,
                last_seen_at: previous_seen,
            });
            state.connection = Connection::Online;
        }
        Connection::Unknown => state.connection = Connection::Online,
        Connection::Online => {}
    }
    if state.last_ts.is_some_and(|last| ts < last) {
        return Change::Late;
    }
    state.last_ts = Some(ts);
    if state.data == Some(data) {
        return Change::Same;
    }
    let previous = state.data;
    state.data = Some(data);
    state.changed_at = Some(ts);
    events.push(Event {
        sensor_id: id,
        kind: EventKind::StateChanged,
        at: ts,
        data: Some(data),
        previous,
        last_seen_at: None,
    });
    Change::Changed { previous }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SensorId {
        SensorId::parse("TestSensor").unwrap()
    }

    #[test]
    fn first_value_is_a_change_from_nothing() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        assert_eq!(
            apply(id(), &mut s, true, 10, 10, &mut ev),
            Change::Changed { previous: None }
        );
        assert_eq!(s.data, Some(true));
        assert_eq!(s.connection, Connection::Online);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].kind, EventKind::StateChanged);
        assert_eq!(ev[0].previous, None);
    }

    #[test]
    fn sequence_1_1_1_0_0_1_changes_three_times() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        let changes: Vec<Change> = [1, 1, 1, 0, 0, 1]
            .iter()
            .enumerate()
            .map(|(i, d)| apply(id(), &mut s, *d == 1, i as i64, i as i64, &mut ev))
            .collect();
        assert_eq!(
            changes,
            vec![
                Change::Changed { previous: None },
                Change::Same,
                Change::Same,
                Change::Changed {
                    previous: Some(true)
                },
                Change::Same,
                Change::Changed {
                    previous: Some(false)
                },
            ]
        );
        assert_eq!(ev.len(), 3);
        assert_eq!(s.changed_at, Some(5));
    }

    #[test]
    fn late_readings_never_change_state_but_count_as_seen() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        apply(id(), &mut s, true, 100, 100, &mut ev);
        assert_eq!(apply(id(), &mut s, false, 50, 200, &mut ev), Change::Late);
        assert_eq!(s.data, Some(true));
        assert_eq!(s.last_ts, Some(100));
        assert_eq!(s.last_seen_at, Some(200));
        assert_eq!(ev.len(), 1);
        // Equal device time is not older: it applies.
        assert_eq!(
            apply(id(), &mut s, false, 100, 300, &mut ev),
            Change::Changed {
                previous: Some(true)
            }
        );
    }

    #[test]
    fn a_lost_sensor_is_restored_before_its_change() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        apply(id(), &mut s, true, 100, 100, &mut ev);
        s.connection = Connection::Lost;
        ev.clear();
        apply(id(), &mut s, false, 5000, 5000, &mut ev);
        assert_eq!(s.connection, Connection::Online);
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].kind, EventKind::ConnectionRestored);
        assert_eq!(ev[0].data, Some(true));
        assert_eq!(ev[0].last_seen_at, Some(100));
        assert_eq!(ev[1].kind, EventKind::StateChanged);
    }

    #[test]
    fn our_clock_never_goes_back() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        apply(id(), &mut s, true, 100, 1000, &mut ev);
        apply(id(), &mut s, true, 200, 900, &mut ev);
        assert_eq!(s.last_seen_at, Some(1000));
    }
}
