//! What a door sensor reports beside its state — its battery, its tamper switch, a fault
//! code — and the rule that turns those reports into alarms and their clearings.
//!
//! The rule is written once here and called by the engine for every applied reading
//! ([`crate::engine::rules::apply`]), so every store and the simulation's model see the
//! same events. It is pure: a sensor's alarm state in, the reading's reports in, events out.
//!
//! **Battery.** A sensor's `battery_low_pct` (default [`DEFAULT_BATTERY_LOW_PCT`], 0 off)
//! is the threshold: a battery at or below it raises `sensor.battery_low` once, and only a
//! battery at least [`BATTERY_OK_MARGIN`] above it clears it with `sensor.battery_ok`, so a
//! battery hovering at the threshold alarms once, not at every reading.
//!
//! **Tamper, fault.** `sensor.tamper` when the flag goes up, `sensor.tamper_cleared` when it
//! goes down after that; `sensor.fault` for a code (a different code while one is set is a
//! new fault), `sensor.fault_cleared` for `null` after one. A clearing only ever follows its
//! alarm, and a reading that says nothing of a signal leaves it as it was.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::notification::{Detail, EventKind};

/// A sensor's battery threshold when it sets none.
pub const DEFAULT_BATTERY_LOW_PCT: u8 = 20;
/// How far above the threshold a battery must be for `sensor.battery_ok`.
pub const BATTERY_OK_MARGIN: u8 = 5;
/// Longest fault code.
pub const MAX_FAULT_LEN: usize = 32;

/// A fault code: 1 to 32 of `a-z`, `0-9`, `_`. Held inline (not a `String`) so that a
/// reading and a sensor's state stay `Copy`, as the engine keeps them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fault {
    len: u8,
    bytes: [u8; MAX_FAULT_LEN],
}

impl Fault {
    /// Parses and checks a code.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("fault must not be empty (null clears it)".into());
        }
        if s.len() > MAX_FAULT_LEN {
            return Err(format!(
                "fault must be at most {MAX_FAULT_LEN} characters, got {}",
                s.chars().count()
            ));
        }
        if let Some(bad) = s
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
        {
            return Err(format!("fault may hold only a-z, 0-9 and _, found {bad:?}"));
        }
        let mut bytes = [0; MAX_FAULT_LEN];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(Self {
            len: s.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // ASCII by construction.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fault({})", self.as_str())
    }
}

impl Serialize for Fault {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// What one reading says beside its state; `None` says nothing of that signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Signals {
    /// Battery charge in percent, 0–100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub battery: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tamper: Option<bool>,
    /// `Some(None)`: the reading cleared the fault (`"fault": null`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub fault: Option<Option<Fault>>,
}

/// A field that is present (`null` too) is `Some`; an absent one stays `None` by
/// `#[serde(default)]`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl Signals {
    pub fn is_empty(&self) -> bool {
        *self == Signals::default()
    }

    /// A reading's `fault` as the stores keep it in history: `None` when it said nothing,
    /// `""` for `null` (cleared), else the code.
    pub fn fault_column(&self) -> Option<String> {
        self.fault
            .map(|f| f.map(|c| c.to_string()).unwrap_or_default())
    }

    /// The inverse of [`Signals::fault_column`] (a code that no longer parses reads as
    /// cleared).
    pub fn fault_from_column(text: Option<&str>) -> Option<Option<Fault>> {
        text.map(|t| Fault::parse(t).ok())
    }
}

/// A sensor's signals as latch last took them: what its `status` shows, and the alarm
/// state the rule needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SignalState {
    /// The last battery reported.
    pub battery: Option<u8>,
    /// A `sensor.battery_low` went out and no `sensor.battery_ok` since.
    pub battery_low: bool,
    /// The tamper flag last reported.
    pub tamper: Option<bool>,
    /// The fault set now.
    pub fault: Option<Fault>,
}

/// What the rule made of a reading: an event kind and what it carries.
pub type Raised = (EventKind, Detail);

/// Applies a reading's `report` to a sensor's `state` with its battery threshold
/// (`battery_low_pct`, 0 off); calls `raise` for each event, in the order battery, tamper,
/// fault. Only for applied readings: a late one changes nothing (the caller's rule).
pub fn apply(
    state: &mut SignalState,
    report: Signals,
    battery_low_pct: u8,
    mut raise: impl FnMut(Raised),
) {
    if let Some(battery) = report.battery {
        state.battery = Some(battery);
        if !state.battery_low && battery_low_pct > 0 && battery <= battery_low_pct {
            state.battery_low = true;
            raise((
                EventKind::BatteryLow,
                Detail {
                    battery: Some(battery),
                    threshold: Some(battery_low_pct),
                    ..Detail::default()
                },
            ));
        } else if state.battery_low
            && u16::from(battery) >= u16::from(battery_low_pct) + u16::from(BATTERY_OK_MARGIN)
        {
            state.battery_low = false;
            raise((
                EventKind::BatteryOk,
                Detail {
                    battery: Some(battery),
                    ..Detail::default()
                },
            ));
        }
    }
    if let Some(tamper) = report.tamper {
        let was = state.tamper.unwrap_or(false);
        state.tamper = Some(tamper);
        match (was, tamper) {
            (false, true) => raise((EventKind::Tamper, Detail::default())),
            (true, false) => raise((EventKind::TamperCleared, Detail::default())),
            _ => {}
        }
    }
    if let Some(fault) = report.fault {
        let was = state.fault;
        state.fault = fault;
        match (was, fault) {
            (_, Some(code)) if was != Some(code) => raise((
                EventKind::Fault,
                Detail {
                    fault: Some(code),
                    ..Detail::default()
                },
            )),
            (Some(_), None) => raise((EventKind::FaultCleared, Detail::default())),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &mut SignalState, report: Signals, pct: u8) -> Vec<Raised> {
        let mut out = vec![];
        apply(state, report, pct, |r| out.push(r));
        out
    }

    fn battery(b: u8) -> Signals {
        Signals {
            battery: Some(b),
            ..Signals::default()
        }
    }

    fn kinds(r: &[Raised]) -> Vec<EventKind> {
        r.iter().map(|(k, _)| *k).collect()
    }

    #[test]
    fn a_battery_hovering_at_the_threshold_alarms_once() {
        let mut s = SignalState::default();
        let mut all = vec![];
        for b in [80, 21, 20, 21, 20, 19, 24, 20, 25, 30, 20] {
            all.extend(run(&mut s, battery(b), 20));
        }
        assert_eq!(
            kinds(&all),
            [
                EventKind::BatteryLow,
                EventKind::BatteryOk,
                EventKind::BatteryLow
            ]
        );
        assert_eq!(all[0].1.battery, Some(20));
        assert_eq!(all[0].1.threshold, Some(20));
        assert_eq!((all[1].1.battery, all[1].1.threshold), (Some(25), None));
        assert_eq!(s.battery, Some(20));
    }

    #[test]
    fn a_good_battery_never_says_ok_and_zero_turns_the_alarm_off() {
        let mut s = SignalState::default();
        assert!(run(&mut s, battery(100), 20).is_empty());
        assert!(run(&mut s, battery(0), 0).is_empty());
        assert!(!s.battery_low);
        // A threshold of 100 still works: 100 is low, and nothing is ever ok again.
        assert_eq!(
            kinds(&run(&mut s, battery(100), 100)),
            [EventKind::BatteryLow]
        );
        assert!(run(&mut s, battery(100), 100).is_empty());
    }

    #[test]
    fn tamper_and_fault_follow_their_flag_and_code() {
        let mut s = SignalState::default();
        let report = |tamper, fault| Signals {
            battery: None,
            tamper,
            fault,
        };
        let code = |c: &str| Some(Fault::parse(c).unwrap());
        assert!(run(&mut s, report(Some(false), Some(None)), 20).is_empty());
        let r = run(&mut s, report(Some(true), Some(code("jam"))), 20);
        assert_eq!(kinds(&r), [EventKind::Tamper, EventKind::Fault]);
        assert_eq!(r[1].1.fault, code("jam"));
        // Saying nothing keeps them; the same again is nothing new.
        assert!(run(&mut s, Signals::default(), 20).is_empty());
        assert!(run(&mut s, report(Some(true), Some(code("jam"))), 20).is_empty());
        assert_eq!(s.fault, code("jam"));
        // A new code while one is set is a new fault.
        let r = run(&mut s, report(None, Some(code("motor_2"))), 20);
        assert_eq!(kinds(&r), [EventKind::Fault]);
        let r = run(&mut s, report(Some(false), Some(None)), 20);
        assert_eq!(
            kinds(&r),
            [EventKind::TamperCleared, EventKind::FaultCleared]
        );
        assert!(run(&mut s, report(Some(false), Some(None)), 20).is_empty());
        assert_eq!((s.tamper, s.fault), (Some(false), None));
    }

    #[test]
    fn fault_codes_are_checked() {
        assert_eq!(Fault::parse("lock_jam_2").unwrap().as_str(), "lock_jam_2");
        assert!(Fault::parse(&"a".repeat(32)).is_ok());
        assert!(Fault::parse(&"a".repeat(33)).is_err());
        assert!(Fault::parse("").is_err());
        assert!(Fault::parse("Jam").is_err());
        assert!(Fault::parse("jam-2").is_err());
        assert!(Fault::parse("é").is_err());
    }

    #[test]
    fn a_forwarded_reading_keeps_null_apart_from_absent() {
        let cleared: Signals = serde_json::from_str(r#"{"fault": null}"#).unwrap();
        assert_eq!(cleared.fault, Some(None));
        let none: Signals = serde_json::from_str("{}").unwrap();
        assert_eq!(none.fault, None);
        let back: Signals =
            serde_json::from_str(&serde_json::to_string(&cleared).unwrap()).unwrap();
        assert_eq!(back, cleared);
    }
}
