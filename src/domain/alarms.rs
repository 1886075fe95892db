//! The rule that turns what a door sensor reports ([`super::signals`]) into alarms and
//! their clearings.
//!
//! It is written once here and called by the engine for every applied reading
//! ([`crate::engine::rules::apply`]), so every store and the simulation's model see the
//! same events. It is pure: a sensor's alarm state in, the reading's reports in, events out.
//!
//! **Battery.** A sensor's `battery_low_pct` (default
//! [`DEFAULT_BATTERY_LOW_PCT`](super::signals::DEFAULT_BATTERY_LOW_PCT), 0 off)
//! is the threshold: a battery at or below it raises `sensor.battery_low` once, and only a
//! battery at least [`BATTERY_OK_MARGIN`] above it clears it with `sensor.battery_ok`, so a
//! battery hovering at the threshold alarms once, not at every reading.
//!
//! **Tamper, fault.** `sensor.tamper` when the flag goes up, `sensor.tamper_cleared` when it
//! goes down after that; `sensor.fault` for a code (a different code while one is set is a
//! new fault), `sensor.fault_cleared` for `null` after one. A clearing only ever follows its
//! alarm, and a reading that says nothing of a signal leaves it as it was.

use super::notification::{Detail, EventKind};
use super::signals::{BATTERY_OK_MARGIN, SignalState, Signals};

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
    use crate::domain::signals::Fault;

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
