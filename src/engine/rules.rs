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
            // Counted on latch's clock: a change sent late (its device time behind) is
            // timed when counted, so a flapping never begins before the last one stopped.
            at: e.at.max(at),
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
mod tests;
