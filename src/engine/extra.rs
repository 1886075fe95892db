//! What a few sensors carry beyond their 48-byte slot ([`super::fleet`]): an own debounce
//! window, a change waiting one out, and while lost (with reminders on) since when and how
//! many reminders went out; a battery threshold other than the default and the battery,
//! tamper flag and fault of a sensor that reported them; its hold alarms and how far its
//! state held; and the one timer each such sensor may have (the end of its window, its next
//! reminder, its hold's next alarm), in due order.
//!
//! Kept beside the slab rather than in it because most sensors have none of it: a slot
//! stays 48 bytes, and a flag bit in it says whether to look here at all. A lost sensor
//! with reminders on costs about 80 bytes here (its map entry and its timer).

use crate::hashing::FastMap as HashMap;
use std::collections::BTreeSet;

use crate::domain::flap::{self, Flap, FlapState};
use crate::domain::hold::{self, Hold, HoldAlarms};
use crate::domain::sensor::{Debounce, SensorState};
use crate::domain::signals::{DEFAULT_BATTERY_LOW_PCT, SignalState};
use crate::domain::{Connection, Millis};

/// The service-wide settings a fleet's rules read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Policy {
    /// The heartbeat timeout of sensors without their own.
    pub default_timeout_ms: Millis,
    /// The debounce window of sensors without their own (0: none).
    pub default_debounce_ms: Millis,
    /// The interval of `sensor.still_lost` reminders; `None`: no reminders.
    pub reminder_ms: Option<Millis>,
}

impl Policy {
    /// A timeout and nothing else: no debounce, no reminders.
    pub fn timeout(default_timeout_ms: Millis) -> Self {
        Self {
            default_timeout_ms,
            default_debounce_ms: 0,
            reminder_ms: None,
        }
    }

    /// A sensor's debounce window.
    pub fn debounce_ms(&self, s: &SensorState) -> Millis {
        s.debounce_s
            .map_or(self.default_debounce_ms, |d| Millis::from(d) * 1000)
    }

    /// When a sensor in state `s` next needs the shard without a reading: its debounce
    /// window ends, its next reminder is due, or its state has held too long. The rules
    /// ([`super::rules::settle`], [`super::rules::remind`], [`super::rules::hold`]) fire
    /// at exactly these times.
    pub fn timer(&self, s: &SensorState) -> Option<Millis> {
        let window = s.debounce.map(|d| d.since + self.debounce_ms(s));
        let reminder = match (s.connection, s.lost_since, self.reminder_ms) {
            (Connection::Lost, Some(since), Some(every)) => {
                Some(since + (Millis::from(s.reminders.unwrap_or(0)) + 1) * every)
            }
            _ => None,
        };
        let lost = s.connection == Connection::Lost;
        let held = hold::due(&s.hold_alarms, s.data, lost, s.hold);
        let quiet = flap::due(s.flap, s.flapping);
        [window, reminder, held, quiet].into_iter().flatten().min()
    }
}

/// See the module doc. Keys are packed sensor ids.
#[derive(Default)]
pub(super) struct Extras {
    own_debounce: HashMap<u128, u32>,
    pending: HashMap<u128, Debounce>,
    /// A battery threshold other than the default, and the signals of sensors that
    /// reported any (a sensor that never did keeps nothing here).
    signals: HashMap<u128, (u8, SignalState)>,
    /// `(lost_since, reminders)` of lost sensors, only while reminders are on.
    lost: HashMap<u128, (Millis, u32)>,
    /// Hold alarms, and how far the state held, of sensors with either.
    holds: HashMap<u128, (HoldAlarms, Option<Hold>)>,
    /// A `flap`, and the count of changes, of sensors with either.
    flaps: HashMap<u128, (Option<Flap>, Option<FlapState>)>,
    timers: BTreeSet<(Millis, u128)>,
}

impl Extras {
    /// Fills in what `s` (read from a slot whose flag said so) keeps here.
    pub(super) fn read(&self, key: u128, s: &mut SensorState) {
        s.debounce_s = self.own_debounce.get(&key).copied();
        s.debounce = self.pending.get(&key).copied();
        if let Some(&(pct, signals)) = self.signals.get(&key) {
            s.battery_low_pct = pct;
            s.signals = signals;
        }
        if let Some(&(since, sent)) = self.lost.get(&key) {
            s.lost_since = Some(since);
            s.reminders = Some(sent);
        }
        if let Some(&(alarms, hold)) = self.holds.get(&key) {
            s.hold_alarms = alarms;
            s.hold = hold;
        }
        if let Some(&(flap, flapping)) = self.flaps.get(&key) {
            s.flap = flap;
            s.flapping = flapping;
        }
    }

    /// Whether a sensor in state `s` keeps anything here ([`Extras::write`] says the
    /// same; this only looks).
    pub(super) fn wanted(s: &SensorState, policy: &Policy) -> bool {
        s.debounce_s.is_some()
            || s.debounce.is_some()
            || Self::own_signals(s).is_some()
            || Self::own_hold(s).is_some()
            || Self::own_flap(s).is_some()
            || (s.connection == Connection::Lost
                && s.lost_since.is_some()
                && policy.reminder_ms.is_some())
    }

    /// Replaces what sensor `key` keeps here (`old`: its state before, as read) with what
    /// `new` has, and its timer. Returns whether anything is kept for it now.
    pub(super) fn write(
        &mut self,
        key: u128,
        old: Option<&SensorState>,
        new: &SensorState,
        policy: &Policy,
    ) -> bool {
        let before = old.and_then(|o| policy.timer(o));
        let after = policy.timer(new);
        if before != after {
            if let Some(t) = before {
                self.timers.remove(&(t, key));
            }
            if let Some(t) = after {
                self.timers.insert((t, key));
            }
        }
        let mut kept = false;
        kept |= put(&mut self.own_debounce, key, new.debounce_s);
        kept |= put(&mut self.pending, key, new.debounce);
        kept |= put(&mut self.signals, key, Self::own_signals(new));
        // Without reminders nothing reads these in memory: the store keeps them.
        let lost = match (new.connection, new.lost_since, policy.reminder_ms) {
            (Connection::Lost, Some(since), Some(_)) => Some((since, new.reminders.unwrap_or(0))),
            _ => None,
        };
        kept |= put(&mut self.lost, key, lost);
        kept |= put(&mut self.holds, key, Self::own_hold(new));
        kept |= put(&mut self.flaps, key, Self::own_flap(new));
        kept
    }

    /// What a sensor keeps here of its flapping: nothing without a `flap` or a count.
    fn own_flap(s: &SensorState) -> Option<(Option<Flap>, Option<FlapState>)> {
        (s.flap.is_some() || s.flapping.is_some()).then_some((s.flap, s.flapping))
    }

    /// What a sensor keeps here of its hold: nothing without alarms or an open hold.
    fn own_hold(s: &SensorState) -> Option<(HoldAlarms, Option<Hold>)> {
        (!s.hold_alarms.is_empty() || s.hold.is_some()).then_some((s.hold_alarms, s.hold))
    }

    /// What a sensor keeps here of its battery threshold and signals: nothing while both
    /// are as a new sensor's.
    fn own_signals(s: &SensorState) -> Option<(u8, SignalState)> {
        (s.battery_low_pct != DEFAULT_BATTERY_LOW_PCT || s.signals != SignalState::default())
            .then_some((s.battery_low_pct, s.signals))
    }

    /// Forgets sensor `key` (`s`: its state, as read).
    pub(super) fn remove(&mut self, key: u128, s: &SensorState, policy: &Policy) {
        if let Some(t) = policy.timer(s) {
            self.timers.remove(&(t, key));
        }
        self.own_debounce.remove(&key);
        self.pending.remove(&key);
        self.signals.remove(&key);
        self.lost.remove(&key);
        self.holds.remove(&key);
        self.flaps.remove(&key);
    }

    /// The earliest timer.
    pub(super) fn next(&self) -> Option<Millis> {
        self.timers.first().map(|&(t, _)| t)
    }

    /// Calls `f` with each sensor whose timer is at or before `now`, earliest first, until
    /// it returns false.
    pub(super) fn each_due(&self, now: Millis, mut f: impl FnMut(u128) -> bool) {
        for &(t, key) in &self.timers {
            if t > now || !f(key) {
                return;
            }
        }
    }

    #[cfg(test)]
    pub(super) fn timers(&self) -> usize {
        self.timers.len()
    }
}

/// Sets or clears `key` in `map`; whether it is set now.
fn put<V>(map: &mut HashMap<u128, V>, key: u128, value: Option<V>) -> bool {
    match value {
        Some(v) => {
            map.insert(key, v);
            true
        }
        None => {
            map.remove(&key);
            false
        }
    }
}
