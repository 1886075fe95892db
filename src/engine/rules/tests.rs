//! The change rule's tests, on times given by hand.

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
    let got: Vec<(Option<u32>, Millis)> = ev.iter().map(|e| (e.detail.reminder, e.at)).collect();
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

/// Simulation seed 295 `--signals`: changes whose device times lag latch's clock (sent
/// late, in order) make a flapping after an earlier one stopped. Its time is when latch
/// counted the change that crossed, never before that stop: its alarm opens after the
/// last one was resolved.
#[test]
fn a_flapping_counted_late_is_timed_by_latch_after_the_last_one_stopped() {
    let mut s = flappy();
    let mut ev = vec![];
    for (i, d) in [1, 0, 1, 0].into_iter().enumerate() {
        let t = 1_000 * i as Millis;
        apply(id(), &mut s, at(d == 1, t, t), 0, &mut ev);
    }
    assert!(unflap(id(), &mut s, 15_000, &mut ev));
    ev.clear();
    for (i, d) in [1, 0, 1].into_iter().enumerate() {
        let i = i as Millis;
        apply(
            id(),
            &mut s,
            at(d == 1, 4_000 + 1_000 * i, 20_000 + 100 * i),
            0,
            &mut ev,
        );
    }
    assert_eq!(kinds(&ev).last(), Some(&EventKind::Flapping), "{ev:?}");
    assert_eq!(
        ev.last().unwrap().at,
        20_200,
        "counted at 20.2 s, not sent at 6 s"
    );
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
