//! The change rule: what one reading does to a sensor's state, and what time alone does
//! to it (a silence that reaches its deadline, a debounce window that ends, a reminder
//! that is due). Pure, so it is tested hard
//! without any I/O, on times given by hand.
//!
//! **Debounce.** With a window (`debounce_ms > 0`) the state (`data`, what the API shows)
//! follows every reading at once, but a change is notified only once it has held for the
//! window: a reading that changes the value opens the window, or restarts it if open, and
//! counts as a flip ([`Debounce::flips`]). When the window ends with a value other than the
//! one last notified ([`Debounce::from`]), one `state_changed` goes out carrying the flips
//! within the window but itself (`1, 0, 1, 0, 1` after `0`: one change to `1`, 4
//! suppressed); when it ends on the value last notified, nothing does. The window counts
//! on our clock (`received_at`), like liveness: a device's clock can be off, and a backfill
//! would otherwise end every window at once. With no window, a change is notified at once,
//! as it always was.
//!
//! **Reminders.** While a sensor stays lost, reminder `n` is due `n` intervals after it was
//! declared lost; each one that fires records `n`, so no interval is reminded twice, and
//! after a pause longer than an interval (latch stopped) the next one carries the number of
//! intervals passed instead of a burst of the missed ones.

use crate::domain::flap::{self, Counted};
use crate::domain::sensor::{Debounce, SensorState};
use crate::domain::signals::Signals;
use crate::domain::{Connection, Detail, Event, EventKind, Millis, SensorId, Source};
use crate::domain::{alarms, hold};

/// What a reading did to the state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Same data as now: nobody is notified.
    Same,
    /// New data (or the first ever): a state change.
    Changed { previous: Option<bool> },
    /// New data, notified only if it holds for the debounce window.
    Held,
    /// Device time older than the last applied reading: history only.
    Late,
}

/// One reading, as the rule takes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Input {
    pub data: bool,
    /// The device time, or `received_at` when the device sent none.
    pub ts: Millis,
    /// Our clock when it arrived.
    pub received_at: Millis,
    pub source: Source,
    /// Its battery, tamper flag and fault, where it reported them.
    pub signals: Signals,
}

/// Applies one reading. Returns what changed and appends the events it caused to
/// `events` (a `connection_restored` when the sensor was lost, then a `state_changed`
/// unless `debounce_ms` holds it back, then a `state_held_cleared` when a change ends a
/// state held too long ([`hold::changed`]), then what its battery, tamper flag and fault
/// raise: [`alarms::apply`]). A late reading changes none of them.
pub fn apply(
    id: SensorId,
    state: &mut SensorState,
    r: Input,
    debounce_ms: Millis,
    events: &mut Vec<Event>,
) -> Change {
    let previous = state.data;
    let from = events.len();
    let change = apply_data(id, state, r, debounce_ms, events);
    flaps(id, state, events, from, r.received_at);
    if matches!(change, Change::Changed { .. } | Change::Held)
        && let Some(detail) = hold::changed(&state.hold_alarms, &mut state.hold, r.received_at)
    {
        events.push(Event {
            sensor_id: id,
            kind: EventKind::StateHeldCleared,
            at: r.received_at,
            data: state.data,
            previous,
            last_seen_at: None,
            detail,
        });
    }
    if change != Change::Late && !r.signals.is_empty() {
        alarms::apply(
            &mut state.signals,
            r.signals,
            state.battery_low_pct,
            |(kind, detail)| {
                events.push(Event {
                    sensor_id: id,
                    kind,
                    at: r.ts,
                    data: None,
                    previous: None,
                    last_seen_at: None,
                    detail,
                })
            },
        );
    }
    change
}

/// [`apply`]'s rule for the reading's state.
fn apply_data(
    id: SensorId,
    state: &mut SensorState,
    r: Input,
    debounce_ms: Millis,
    events: &mut Vec<Event>,
) -> Change {
    let previous_seen = state.last_seen_at;
    state.last_seen_at = Some(previous_seen.map_or(r.received_at, |s| s.max(r.received_at)));
    state.last_source = Some(r.source);
    match state.connection {
        Connection::Lost => {
            events.push(Event {
                sensor_id: id,
                kind: EventKind::ConnectionRestored,
                at: r.received_at,
                data: state.data,
                previous: None,
                last_seen_at: previous_seen,
                detail: Detail::default(),
            });
            state.connection = Connection::Online;
            state.lost_since = None;
            state.reminders = None;
        }
        Connection::Unknown => state.connection = Connection::Online,
        Connection::Online => {}
    }
    if state.last_ts.is_some_and(|last| r.ts < last) {
        return Change::Late;
    }
    state.last_ts = Some(r.ts);
    if state.data == Some(r.data) {
        return Change::Same;
    }
    let previous = state.data;
    state.data = Some(r.data);
    state.changed_at = Some(r.ts);
    if debounce_ms > 0 || state.debounce.is_some() {
        let window = state.debounce.get_or_insert(Debounce {
            from: previous,
            at: r.ts,
            since: r.received_at,
            flips: 0,
        });
        window.at = r.ts;
        window.since = r.received_at;
        window.flips += 1;
        return Change::Held;
    }
    events.push(Event {
        sensor_id: id,
        kind: EventKind::StateChanged,
        at: r.ts,
        data: Some(r.data),
        previous,
        last_seen_at: None,
        detail: Detail::default(),
    });
    Change::Changed { previous }
}

/// Ends the debounce window if it has passed at `now`: the value held, and is notified
/// unless it is the one notified before. Returns whether a window ended.
pub fn settle(
    id: SensorId,
    state: &mut SensorState,
    now: Millis,
    debounce_ms: Millis,
    events: &mut Vec<Event>,
) -> bool {
    let Some(window) = state.debounce else {
        return false;
    };
    if now < window.since + debounce_ms {
        return false;
    }
    state.debounce = None;
    if state.data != window.from {
        let from = events.len();
        events.push(Event {
            sensor_id: id,
            kind: EventKind::StateChanged,
            at: window.at,
            data: state.data,
            previous: window.from,
            last_seen_at: None,
            detail: Detail {
                flips_suppressed: Some(window.flips.saturating_sub(1)),
                ..Detail::default()
            },
        });
        flaps(id, state, events, from, now);
    }
    true
}

/// Declares a silent sensor lost at its `deadline`: one `connection_lost`, carrying the last
/// known data and when it was last heard; its reminders count from the deadline.
pub fn lose(id: SensorId, state: &mut SensorState, deadline: Millis, events: &mut Vec<Event>) {
    state.connection = Connection::Lost;
    state.lost_since = Some(deadline);
    state.reminders = Some(0);
    let from = events.len();
    events.push(Event {
        sensor_id: id,
        kind: EventKind::ConnectionLost,
        at: deadline,
        data: state.data,
        previous: None,
        last_seen_at: state.last_seen_at,
        detail: Detail::default(),
    });
    flaps(id, state, events, from, deadline);
}

/// Counts the changes among `events[from..]` (this sensor's, just made, at `at` on
/// latch's clock) toward its `flap` ([`flap::count`]): the state change that crosses the
/// threshold becomes a `sensor.flapping`, a loss or restore that does is followed by one,
/// and while the sensor flaps its state changes are dropped.
fn flaps(id: SensorId, state: &mut SensorState, events: &mut Vec<Event>, from: usize, at: Millis) {
    let Some(config) = state.flap else {
        return;
    };
    let mut i = from;
    while i < events.len() {
        let e = &events[i];
        let counts = e.sensor_id == id
            && match e.kind {
                // A sensor's first value is no change.
                EventKind::StateChanged => e.previous.is_some(),
                EventKind::ConnectionLost | EventKind::ConnectionRestored => true,
                _ => false,
            };
        if !counts {
            i += 1;
            continue;
        }
        let is_state = e.kind == EventKind::StateChanged;
        let flapping = Event {
            sensor_id: id,
            kind: EventKind::Flapping,
            at: e.at,
            data: state.data,
            previous: None,
            last_seen_at: None,
            detail: Detail {
                threshold: Some(u8::try_from(config.changes).unwrap_or(u8::MAX)),
                window_s: Some(config.window_s),
                ..Detail::default()
            },
        };
        match (
            flap::count(config, &mut state.flapping, at, state.data),
            is_state,
        ) {
            (Counted::Pass, _) | (Counted::Flapping, false) => i += 1,
            (Counted::Crossed, true) => {
                events[i] = flapping;
                i += 1;
            }
            (Counted::Crossed, false) => {
                events.insert(i + 1, flapping);
                i += 2;
            }
            (Counted::Flapping, true) => {
                events.remove(i);
            }
        }
    }
}

/// Ends a flapping that has been quiet for its window at `now`: one
/// `sensor.flapping_stopped` with the state now and the state last told
/// ([`flap::stop`]). Returns whether it ended.
pub fn unflap(id: SensorId, state: &mut SensorState, now: Millis, events: &mut Vec<Event>) -> bool {
    let Some((told, at)) = flap::stop(state.flap, &mut state.flapping, now) else {
        return false;
    };
    events.push(Event {
        sensor_id: id,
        kind: EventKind::FlappingStopped,
        at,
        data: state.data,
        previous: told,
        last_seen_at: None,
        detail: Detail::default(),
    });
    true
}

/// Sends the reminder due at `now` for a sensor that stays lost, reminders going out every
/// `every_ms`. Returns whether one went out.
pub fn remind(
    id: SensorId,
    state: &mut SensorState,
    now: Millis,
    every_ms: Millis,
    events: &mut Vec<Event>,
) -> bool {
    let (Connection::Lost, Some(since)) = (state.connection, state.lost_since) else {
        return false;
    };
    let passed = u32::try_from((now - since).max(0) / every_ms.max(1)).unwrap_or(u32::MAX);
    if passed <= state.reminders.unwrap_or(0) {
        return false;
    }
    state.reminders = Some(passed);
    events.push(Event {
        sensor_id: id,
        kind: EventKind::StillLost,
        at: since + Millis::from(passed) * every_ms,
        data: state.data,
        previous: None,
        last_seen_at: state.last_seen_at,
        detail: Detail {
            lost_since: Some(since),
            reminder: Some(passed),
            ..Detail::default()
        },
    });
    true
}

/// Makes what a sensor's held state owes at `now`: its `sensor.state_held`, or a
/// reminder ([`hold::fire`]). Returns whether one was made.
pub fn hold(id: SensorId, state: &mut SensorState, now: Millis, events: &mut Vec<Event>) -> bool {
    let lost = state.connection == Connection::Lost;
    let Some((at, detail)) = hold::fire(&state.hold_alarms, state.data, lost, &mut state.hold, now)
    else {
        return false;
    };
    events.push(Event {
        sensor_id: id,
        kind: EventKind::StateHeld,
        at,
        data: state.data,
        previous: None,
        last_seen_at: None,
        detail,
    });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SensorId {
        SensorId::parse("TestSensor").unwrap()
    }

    /// A reading over HTTP.
    fn at(data: bool, ts: Millis, received_at: Millis) -> Input {
        Input {
            data,
            ts,
            received_at,
            source: Source::Http,
            signals: Signals::default(),
        }
    }

    #[test]
    fn first_value_is_a_change_from_nothing() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        assert_eq!(
            apply(id(), &mut s, at(true, 10, 10), 0, &mut ev),
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
            .map(|(i, d)| apply(id(), &mut s, at(*d == 1, i as i64, i as i64), 0, &mut ev))
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
        apply(id(), &mut s, at(true, 100, 100), 0, &mut ev);
        assert_eq!(
            apply(id(), &mut s, at(false, 50, 200), 0, &mut ev),
            Change::Late
        );
        assert_eq!(s.data, Some(true));
        assert_eq!(s.last_ts, Some(100));
        assert_eq!(s.last_seen_at, Some(200));
        assert_eq!(ev.len(), 1);
        // Equal device time is not older: it applies.
        assert_eq!(
            apply(id(), &mut s, at(false, 100, 300), 0, &mut ev),
            Change::Changed {
                previous: Some(true)
            }
        );
    }

    #[test]
    fn a_lost_sensor_is_restored_before_its_change() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        apply(id(), &mut s, at(true, 100, 100), 0, &mut ev);
        s.connection = Connection::Lost;
        ev.clear();
        apply(id(), &mut s, at(false, 5000, 5000), 0, &mut ev);
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
        apply(id(), &mut s, at(true, 100, 1000), 0, &mut ev);
        apply(id(), &mut s, at(true, 200, 900), 0, &mut ev);
        assert_eq!(s.last_seen_at, Some(1000));
    }

    /// A sensor notified at `0`, online.
    fn notified_zero() -> SensorState {
        let mut s = SensorState::new(None);
        apply(id(), &mut s, at(false, 0, 0), 0, &mut vec![]);
        s
    }

    #[test]
    fn debounce_1_0_1_0_1_is_one_change_of_1_with_four_suppressed() {
        let mut s = notified_zero();
        let mut ev = vec![];
        for (i, d) in [1, 0, 1, 0, 1].into_iter().enumerate() {
            let t = 1_000 * (i as Millis + 1);
            assert_eq!(
                apply(id(), &mut s, at(d == 1, t, t), 10_000, &mut ev),
                Change::Held
            );
            assert_eq!(s.data, Some(d == 1), "the state shows each reading at once");
        }
        assert!(ev.is_empty(), "nothing notified within the window");
        // The window restarted at the last flip (received at 5 000).
        assert!(!settle(id(), &mut s, 14_999, 10_000, &mut ev));
        assert!(ev.is_empty());
        assert!(settle(id(), &mut s, 15_000, 10_000, &mut ev));
        assert_eq!(ev.len(), 1);
        let e = &ev[0];
        assert_eq!(e.kind, EventKind::StateChanged);
        assert_eq!((e.data, e.previous), (Some(true), Some(false)));
        assert_eq!(e.detail.flips_suppressed, Some(4));
        assert_eq!(e.at, 5_000, "when the held state began, by the device");
        assert_eq!(s.debounce, None);
        assert!(!settle(id(), &mut s, 99_000, 10_000, &mut ev), "once");
    }

    #[test]
    fn a_flip_back_within_the_window_notifies_nobody() {
        let mut s = notified_zero();
        let mut ev = vec![];
        apply(id(), &mut s, at(true, 1_000, 1_000), 10_000, &mut ev);
        apply(id(), &mut s, at(false, 2_000, 2_000), 10_000, &mut ev);
        assert!(settle(id(), &mut s, 12_000, 10_000, &mut ev));
        assert!(ev.is_empty());
        assert_eq!((s.data, s.debounce), (Some(false), None));
        // The next change opens a window of its own, counted afresh.
        apply(id(), &mut s, at(true, 20_000, 20_000), 10_000, &mut ev);
        assert!(settle(id(), &mut s, 30_000, 10_000, &mut ev));
        assert_eq!(ev[0].detail.flips_suppressed, Some(0));
    }

    #[test]
    fn repeats_and_late_readings_leave_the_window_alone() {
        let mut s = notified_zero();
        let mut ev = vec![];
        apply(id(), &mut s, at(true, 1_000, 1_000), 10_000, &mut ev);
        assert_eq!(
            apply(id(), &mut s, at(true, 5_000, 5_000), 10_000, &mut ev),
            Change::Same
        );
        assert_eq!(
            apply(id(), &mut s, at(false, 500, 6_000), 10_000, &mut ev),
            Change::Late
        );
        assert!(
            settle(id(), &mut s, 11_000, 10_000, &mut ev),
            "from the flip"
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].detail.flips_suppressed, Some(0));
    }

    #[test]
    fn the_first_value_ever_waits_out_the_window_too() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        assert_eq!(
            apply(id(), &mut s, at(true, 7, 7), 1_000, &mut ev),
            Change::Held
        );
        assert_eq!(s.connection, Connection::Online);
        assert!(settle(id(), &mut s, 1_007, 1_000, &mut ev));
        assert_eq!((ev[0].data, ev[0].previous), (Some(true), None));
    }

    #[test]
    fn without_a_window_nothing_is_held_and_nothing_settles() {
        let mut s = notified_zero();
        let mut ev = vec![];
        assert!(matches!(
            apply(id(), &mut s, at(true, 1, 1), 0, &mut ev),
            Change::Changed { .. }
        ));
        assert_eq!(ev[0].detail, Detail::default(), "no flips field of its own");
        assert!(!settle(id(), &mut s, 1_000_000, 0, &mut ev));
    }

    /// Lost at 1 000, reminded every 100.
    fn lost() -> SensorState {
        let mut s = notified_zero();
        s.connection = Connection::Lost;
        s.lost_since = Some(1_000);
        s.reminders = Some(0);
        s
    }

    #[test]
    fn reminders_come_once_per_interval_numbered_by_the_intervals_passed() {
        let mut s = lost();
        let mut ev = vec![];
        assert!(!remind(id(), &mut s, 1_099, 100, &mut ev));
        assert!(remind(id(), &mut s, 1_100, 100, &mut ev));
        assert!(
            !remind(id(), &mut s, 1_150, 100, &mut ev),
            "never two for one interval"
        );
        assert!(remind(id(), &mut s, 1_200, 100, &mut ev));
        // latch was away for three intervals: one reminder, numbered by the time lost.
        assert!(remind(id(), &mut s, 1_550, 100, &mut ev));
        let got: Vec<(Option<u32>, Millis)> =
            ev.iter().map(|e| (e.detail.reminder, e.at)).collect();
        assert_eq!(got, [(Some(1), 1_100), (Some(2), 1_200), (Some(5), 1_500)]);
        assert!(ev.iter().all(|e| e.kind == EventKind::StillLost
            && e.detail.lost_since == Some(1_000)
            && e.data == Some(false)));
        assert_eq!(s.reminders, Some(5));
    }

    #[test]
    fn a_silence_is_lost_at_its_deadline_and_the_next_reading_restores_it() {
        let mut s = SensorState::new(None);
        let mut ev = vec![];
        apply(id(), &mut s, at(true, 500, 500), 0, &mut ev);
        ev.clear();
        lose(id(), &mut s, 3_600_500, &mut ev);
        assert_eq!(s.connection, Connection::Lost);
        assert_eq!((s.lost_since, s.reminders), (Some(3_600_500), Some(0)));
        assert_eq!(ev.len(), 1);
        let e = &ev[0];
        assert_eq!(
            (e.kind, e.at, e.data, e.last_seen_at),
            (EventKind::ConnectionLost, 3_600_500, Some(true), Some(500))
        );
        apply(id(), &mut s, at(true, 3_700_000, 3_700_000), 0, &mut ev);
        let kinds: Vec<EventKind> = ev.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [EventKind::ConnectionLost, EventKind::ConnectionRestored],
            "the same data again restores, and changes nothing"
        );
        assert_eq!(s.connection, Connection::Online);
    }

    #[test]
    fn signals_follow_applied_readings_only() {
        let mut s = notified_zero();
        let mut ev = vec![];
        let with = |data, ts, battery, tamper| Input {
            signals: Signals {
                battery: Some(battery),
                tamper: Some(tamper),
                fault: None,
            },
            ..at(data, ts, ts)
        };
        apply(id(), &mut s, with(true, 100, 15, true), 0, &mut ev);
        let kinds: Vec<EventKind> = ev.iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                EventKind::StateChanged,
                EventKind::BatteryLow,
                EventKind::Tamper
            ]
        );
        assert_eq!(ev[1].detail.threshold, Some(20));
        assert_eq!((ev[1].at, ev[1].data), (100, None));
        ev.clear();
        // Late: history only, whatever it says.
        assert_eq!(
            apply(id(), &mut s, with(true, 50, 90, false), 0, &mut ev),
            Change::Late
        );
        assert!(ev.is_empty());
        assert_eq!(
            (s.signals.battery, s.signals.tamper),
            (Some(15), Some(true))
        );
        // A repeat of the state still carries its signals.
        assert_eq!(
            apply(id(), &mut s, with(true, 200, 90, false), 0, &mut ev),
            Change::Same
        );
        let kinds: Vec<EventKind> = ev.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventKind::BatteryOk, EventKind::TamperCleared]);
    }

    /// A sensor that flaps at 3 changes within 10 s.
    fn flappy() -> SensorState {
        SensorState {
            flap: Some(flap::Flap {
                changes: 3,
                window_s: 10,
            }),
            ..SensorState::new(None)
        }
    }

    fn kinds(ev: &[Event]) -> Vec<EventKind> {
        ev.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn the_change_that_crosses_the_flap_is_sent_as_flapping_and_the_rest_not_at_all() {
        let mut s = flappy();
        let mut ev = vec![];
        // The first value is no change; then two changes, and the third crosses.
        for (i, d) in [1, 0, 1, 0, 1, 0].into_iter().enumerate() {
            let t = 1_000 * i as Millis;
            apply(id(), &mut s, at(d == 1, t, t), 0, &mut ev);
        }
        assert_eq!(
            kinds(&ev),
            [
                EventKind::StateChanged,
                EventKind::StateChanged,
                EventKind::StateChanged,
                EventKind::Flapping
            ]
        );
        let f = &ev[3];
        assert_eq!(
            (f.data, f.at, f.detail.threshold, f.detail.window_s),
            (Some(false), 3_000, Some(3), Some(10))
        );
        assert_eq!(s.data, Some(false), "the state follows every reading");
        ev.clear();
        // Quiet for its window after the last change (5 s): stopped, the state now and
        // the state the flapping told.
        assert!(!unflap(id(), &mut s, 14_999, &mut ev));
        assert!(unflap(id(), &mut s, 15_000, &mut ev));
        let e = &ev[0];
        assert_eq!(
            (e.kind, e.at, e.data, e.previous),
            (EventKind::FlappingStopped, 15_000, Some(false), Some(false))
        );
        ev.clear();
        apply(id(), &mut s, at(true, 20_000, 20_000), 0, &mut ev);
        assert_eq!(kinds(&ev), [EventKind::StateChanged], "counted afresh");
    }

    #[test]
    fn losses_and_restores_count_and_still_go_out_while_flapping() {
        let mut s = flappy();
        let mut ev = vec![];
        apply(id(), &mut s, at(true, 0, 0), 0, &mut ev);
        lose(id(), &mut s, 1_000, &mut ev);
        apply(id(), &mut s, at(true, 2_000, 2_000), 0, &mut ev);
        lose(id(), &mut s, 3_000, &mut ev);
        apply(id(), &mut s, at(false, 4_000, 4_000), 0, &mut ev);
        assert_eq!(
            kinds(&ev),
            [
                EventKind::StateChanged,
                EventKind::ConnectionLost,
                EventKind::ConnectionRestored,
                EventKind::ConnectionLost,
                EventKind::Flapping,
                EventKind::ConnectionRestored,
            ],
            "the loss that crosses is sent, then the flapping; the change while flapping is not"
        );
    }

    #[test]
    fn debounce_hides_flips_before_they_count() {
        let mut s = flappy();
        let mut ev = vec![];
        apply(id(), &mut s, at(false, 0, 0), 0, &mut ev);
        for (i, d) in [1, 0, 1, 0, 1].into_iter().enumerate() {
            let t = 100 * (i as Millis + 1);
            apply(id(), &mut s, at(d == 1, t, t), 1_000, &mut ev);
        }
        assert!(settle(id(), &mut s, 1_500, 1_000, &mut ev));
        assert_eq!(
            kinds(&ev),
            [EventKind::StateChanged, EventKind::StateChanged],
            "five flips within the window are one change"
        );
        assert_eq!(s.flapping.map(|f| f.count), Some(1));
    }

    #[test]
    fn a_reading_ends_the_reminders() {
        let mut s = lost();
        let mut ev = vec![];
        apply(id(), &mut s, at(false, 2_000, 2_000), 0, &mut ev);
        assert_eq!((s.lost_since, s.reminders), (None, None));
        assert!(!remind(id(), &mut s, 9_000, 100, &mut ev));
        assert_eq!(s.last_source, Some(Source::Http));
    }
}
