//! A state held too long (issue #72, part 1): a door left open, a lock left unlocked.
//!
//! A sensor's `hold_alarms` name, for each value at most once, how long a state may hold
//! (`after_s`) before latch makes `sensor.state_held`, and how often it reminds while the
//! state holds on (`remind_every_s`). The rule is written once here, pure, and the engine
//! runs it on the sensor's timer ([`crate::engine::rules`]), so every store and the
//! simulation's model see the same events.
//!
//! **Timed on latch's clock** from the reading that began the state (its `received_at`):
//! a device's clock may be off, and a backfill would otherwise make every hold due at
//! once. A repeated or late reading changes nothing here. A sensor that is lost makes no
//! `state_held` (its state is not known) and no reminder; one already made stays open until
//! a reading changes the state, and the next reading that brings it back with the same
//! state lets its timer run on from where the state began.
//!
//! **Made once.** The hold's progress (`sent`) is part of the sensor's state, committed
//! with the event it made, so a restart, a `kill -9` or a partition move neither repeats
//! nor loses one; a timer that fell due while latch was down fires once at start, numbered
//! by the intervals that passed, as `sensor.still_lost` reminders are.
//!
//! **Cleared only after held.** A change of state after a `state_held` makes
//! `sensor.state_held_cleared` (the value held, the state now, how long it held); a change
//! before one makes nothing of its own.

use serde::{Deserialize, Serialize};

use super::notification::Detail;
use super::time::Millis;

/// Longest `after_s` and `remind_every_s`: a week.
pub const MAX_HOLD_S: u32 = 604_800;

/// One value's alarm, as the API takes it: `{data, after_s, remind_every_s?}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HoldAlarm {
    /// The state held: 0 or 1.
    #[schema(minimum = 0, maximum = 1)]
    pub data: u8,
    /// Seconds the state must hold before `sensor.state_held`.
    #[schema(minimum = 1, maximum = 604800)]
    pub after_s: u32,
    /// Seconds between reminders while it holds on; none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 604800)]
    pub remind_every_s: Option<u32>,
}

/// A sensor's hold alarms, one slot per value (`[0]` for 0, `[1]` for 1): `Copy`, so a
/// sensor's state stays a plain value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HoldAlarms([Option<HoldAlarm>; 2]);

impl HoldAlarms {
    /// From the API's list: at most one per value, each within its bounds.
    pub fn from_list(list: &[HoldAlarm]) -> Result<Self, String> {
        let mut out = Self::default();
        for (i, a) in list.iter().enumerate() {
            if a.data > 1 {
                return Err(format!("hold_alarms[{i}].data must be 0 or 1"));
            }
            if !(1..=MAX_HOLD_S).contains(&a.after_s) {
                return Err(format!(
                    "hold_alarms[{i}].after_s must be from 1 to {MAX_HOLD_S}"
                ));
            }
            if a.remind_every_s
                .is_some_and(|r| !(1..=MAX_HOLD_S).contains(&r))
            {
                return Err(format!(
                    "hold_alarms[{i}].remind_every_s must be from 1 to {MAX_HOLD_S}"
                ));
            }
            let slot = &mut out.0[usize::from(a.data)];
            if slot.is_some() {
                return Err(format!(
                    "hold_alarms has two alarms for data {}: at most one per value",
                    a.data
                ));
            }
            *slot = Some(*a);
        }
        Ok(out)
    }

    /// The API's list, 0's alarm first.
    pub fn to_list(&self) -> Vec<HoldAlarm> {
        self.0.iter().flatten().copied().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    /// The alarm of state `data`, if it has one.
    pub fn of(&self, data: bool) -> Option<HoldAlarm> {
        self.0[usize::from(data)]
    }

    /// As the stores keep it: JSON text, `None` for none.
    pub fn to_column(&self) -> Option<String> {
        (!self.is_empty())
            .then(|| serde_json::to_string(&self.to_list()).expect("hold alarms serialize"))
    }

    /// From [`HoldAlarms::to_column`]'s text (what cannot be read is none).
    pub fn from_column(text: Option<&str>) -> Self {
        text.and_then(|t| serde_json::from_str::<Vec<HoldAlarm>>(t).ok())
            .and_then(|list| Self::from_list(&list).ok())
            .unwrap_or_default()
    }
}

/// How far a sensor's current state has held, kept while it has hold alarms (or a
/// `state_held` of it is open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// Latch's clock when the state began (or when its alarm was set, for a state that
    /// began before).
    pub since: Millis,
    /// 0: no `state_held` made yet; 1: the `state_held` made; `n + 1`: reminder `n` made
    /// (reminders are numbered by the intervals that passed).
    pub sent: u32,
}

impl Hold {
    pub fn new(since: Millis) -> Self {
        Self { since, sent: 0 }
    }
}

/// When the hold of a sensor in `data` (lost or not) next makes something: `None` when it
/// has no alarm for its state, is lost, or has made all it will.
pub fn due(
    alarms: &HoldAlarms,
    data: Option<bool>,
    lost: bool,
    hold: Option<Hold>,
) -> Option<Millis> {
    let alarm = alarms.of(data?)?;
    let hold = hold?;
    if lost {
        return None;
    }
    let first = hold.since + Millis::from(alarm.after_s) * 1000;
    match (hold.sent, alarm.remind_every_s) {
        (0, _) => Some(first),
        (sent, Some(every)) => Some(first + Millis::from(sent) * Millis::from(every) * 1000),
        (_, None) => None,
    }
}

/// Makes what the hold owes at `now` (see [`due`]): the `state_held`, or the reminder of
/// the intervals passed — one event however long latch was away. Returns it (kind `at`,
/// detail) and moves `hold` on; `None` when nothing is due.
pub fn fire(
    alarms: &HoldAlarms,
    data: Option<bool>,
    lost: bool,
    hold: &mut Option<Hold>,
    now: Millis,
) -> Option<(Millis, Detail)> {
    let at = due(alarms, data, lost, *hold)?;
    if now < at {
        return None;
    }
    let alarm = alarms.of(data?)?;
    let h = hold.as_mut()?;
    let first = h.since + Millis::from(alarm.after_s) * 1000;
    // Intervals passed since the first was due; 0 without reminders.
    let passed = alarm.remind_every_s.map_or(0, |every| {
        u32::try_from((now - first) / (Millis::from(every) * 1000)).unwrap_or(u32::MAX - 1)
    });
    let (at, reminder) = if h.sent == 0 {
        (first, None)
    } else {
        let every = Millis::from(alarm.remind_every_s?) * 1000;
        (first + Millis::from(passed) * every, Some(passed))
    };
    h.sent = passed + 1;
    Some((
        at,
        Detail {
            lost_since: Some(h.since),
            reminder,
            ..Detail::default()
        },
    ))
}

/// What a reading that changed a sensor's state (to something else, received at
/// `received_at`) does to its hold: a `state_held_cleared` when a `state_held` of the
/// state it left is open (its detail), and a fresh hold when the sensor has alarms.
pub fn changed(
    alarms: &HoldAlarms,
    hold: &mut Option<Hold>,
    received_at: Millis,
) -> Option<Detail> {
    let cleared = hold.filter(|h| h.sent > 0).map(|h| Detail {
        lost_since: Some(h.since),
        ..Detail::default()
    });
    *hold = (!alarms.is_empty()).then(|| Hold::new(received_at));
    cleared
}

/// What setting a sensor's alarms (from `before` to `alarms`, at `now`) does to its hold: a
/// state that began before is timed from now (when it began is not known to the minute
/// here: the store keeps the device's time of it, not latch's); without alarms only an
/// open `state_held` is kept, so its clearing still follows. A held state already told of
/// under other settings is reminded of from now on: intervals of the new settings that
/// ended before now are taken as passed (their reminders would carry a time from before
/// what was told, when its alarm may not have been open yet), and the next comes at the
/// end of the interval `now` is in.
pub fn configured(
    before: &HoldAlarms,
    alarms: &HoldAlarms,
    hold: &mut Option<Hold>,
    data: Option<bool>,
    now: Millis,
) {
    if alarms.is_empty() {
        *hold = hold.filter(|h| h.sent > 0);
    } else if hold.is_none() && data.is_some() {
        *hold = Some(Hold::new(now));
    } else if let (Some(h), Some(d)) = (hold.as_mut(), data)
        && h.sent > 0
        && before.of(d) != alarms.of(d)
        && let Some(alarm) = alarms.of(d)
        && let Some(every) = alarm.remind_every_s
    {
        let first = h.since + Millis::from(alarm.after_s) * 1000;
        if now >= first {
            let passed = (now - first) / (Millis::from(every) * 1000);
            let passed = u32::try_from(passed).unwrap_or(u32::MAX - 1);
            h.sent = h.sent.max(passed + 1);
        }
    }
}

/// Seconds a state held from `since` to `at`, as the bodies carry it.
pub fn held_s(since: Millis, at: Millis) -> u64 {
    u64::try_from((at - since).max(0) / 1000).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alarms(after_s: u32, remind: Option<u32>) -> HoldAlarms {
        HoldAlarms::from_list(&[HoldAlarm {
            data: 1,
            after_s,
            remind_every_s: remind,
        }])
        .unwrap()
    }

    #[test]
    fn the_list_takes_one_alarm_per_value_within_bounds() {
        let a = |data, after_s, remind_every_s| HoldAlarm {
            data,
            after_s,
            remind_every_s,
        };
        assert!(HoldAlarms::from_list(&[a(1, 60, None), a(0, 600, Some(60))]).is_ok());
        let err = |l: &[HoldAlarm]| HoldAlarms::from_list(l).unwrap_err();
        assert!(err(&[a(1, 60, None), a(1, 90, None)]).contains("at most one per value"));
        assert!(err(&[a(2, 60, None)]).contains("0 or 1"));
        assert!(err(&[a(1, 0, None)]).contains("after_s"));
        assert!(err(&[a(1, MAX_HOLD_S + 1, None)]).contains("after_s"));
        assert!(err(&[a(1, 60, Some(0))]).contains("remind_every_s"));
        let both = HoldAlarms::from_list(&[a(1, 60, None), a(0, 600, Some(60))]).unwrap();
        assert_eq!(both.to_list(), [a(0, 600, Some(60)), a(1, 60, None)]);
        assert_eq!(HoldAlarms::from_column(both.to_column().as_deref()), both);
        assert_eq!(HoldAlarms::default().to_column(), None);
    }

    #[test]
    fn a_held_state_alarms_once_then_reminds_on_its_interval() {
        let al = alarms(60, Some(30));
        let mut hold = Some(Hold::new(1_000));
        assert_eq!(due(&al, Some(true), false, hold), Some(61_000));
        assert_eq!(fire(&al, Some(true), false, &mut hold, 60_999), None);
        let (at, d) = fire(&al, Some(true), false, &mut hold, 61_000).unwrap();
        assert_eq!((at, d.reminder, d.lost_since), (61_000, None, Some(1_000)));
        assert_eq!(held_s(1_000, at), 60);
        assert_eq!(
            fire(&al, Some(true), false, &mut hold, 90_999),
            None,
            "once"
        );
        let (at, d) = fire(&al, Some(true), false, &mut hold, 91_000).unwrap();
        assert_eq!((at, d.reminder), (91_000, Some(1)));
        // Away for three intervals: one reminder, numbered by the intervals passed.
        let (at, d) = fire(&al, Some(true), false, &mut hold, 185_000).unwrap();
        assert_eq!((at, d.reminder), (181_000, Some(4)));
        assert_eq!(due(&al, Some(true), false, hold), Some(211_000));
    }

    #[test]
    fn a_state_held_while_latch_was_away_alarms_once_at_start() {
        let al = alarms(60, Some(30));
        let mut hold = Some(Hold::new(0));
        let (at, d) = fire(&al, Some(true), false, &mut hold, 1_000_000).unwrap();
        assert_eq!((at, d.reminder), (60_000, None));
        assert_eq!(
            fire(&al, Some(true), false, &mut hold, 1_000_000),
            None,
            "the reminders it missed are not a burst"
        );
        assert_eq!(due(&al, Some(true), false, hold), Some(1_020_000));
    }

    #[test]
    fn no_alarm_for_the_other_state_nor_while_lost_nor_after_the_last() {
        let al = alarms(60, None);
        let mut hold = Some(Hold::new(0));
        assert_eq!(due(&al, Some(false), false, hold), None);
        assert_eq!(due(&al, None, false, hold), None);
        assert_eq!(due(&al, Some(true), true, hold), None, "lost: not known");
        assert!(fire(&al, Some(true), false, &mut hold, 60_000).is_some());
        assert_eq!(due(&al, Some(true), false, hold), None, "no reminders");
    }

    #[test]
    fn a_change_clears_only_what_was_made() {
        let al = alarms(60, None);
        let mut hold = Some(Hold::new(0));
        assert_eq!(changed(&al, &mut hold, 5_000), None, "not held yet");
        assert_eq!(hold, Some(Hold::new(5_000)));
        fire(&al, Some(true), false, &mut hold, 70_000).unwrap();
        let d = changed(&al, &mut hold, 80_000).unwrap();
        assert_eq!(d.lost_since, Some(5_000));
        assert_eq!(hold, Some(Hold::new(80_000)));
        // Without alarms, nothing is kept.
        assert_eq!(changed(&HoldAlarms::default(), &mut hold, 90_000), None);
        assert_eq!(hold, None);
    }

    /// Simulation seed 313 `--signals`: a door held open since 0 was told at 4 s (after
    /// 4 s); at 4.4 s its alarm became "after 1 s, every 2 s". The new settings owe a
    /// reminder for 3 s, a time before the `state_held` told at 4 s: it is not made (its
    /// alarm was not open then); the next comes at the next interval's end, 5 s.
    #[test]
    fn new_settings_remind_from_now_not_from_a_time_before_what_was_told() {
        let before = alarms(4, Some(4));
        let mut hold = Some(Hold::new(0));
        let (at, d) = fire(&before, Some(true), false, &mut hold, 4_000).unwrap();
        assert_eq!((at, d.reminder), (4_000, None));
        let after = alarms(1, Some(2));
        configured(&before, &after, &mut hold, Some(true), 4_400);
        assert_eq!(fire(&after, Some(true), false, &mut hold, 4_400), None);
        assert_eq!(due(&after, Some(true), false, hold), Some(5_000));
        let (at, d) = fire(&after, Some(true), false, &mut hold, 5_000).unwrap();
        assert_eq!((at, d.reminder), (5_000, Some(2)));
        // Settings that keep the alarm as it was change nothing: a reminder owed stays owed.
        let mut owed = Some(Hold { since: 0, sent: 1 });
        configured(&after, &after, &mut owed, Some(true), 9_000);
        assert_eq!(owed, Some(Hold { since: 0, sent: 1 }));
    }
}
