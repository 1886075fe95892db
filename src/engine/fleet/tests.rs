//! The fleet's deadline index on hand-made fleets.

use super::*;

const MIN: Millis = 60_000;

fn id(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn online(seen: Millis, timeout_s: Option<u32>) -> SensorState {
    SensorState {
        data: Some(true),
        changed_at: Some(seen),
        last_ts: Some(seen),
        last_seen_at: Some(seen),
        connection: Connection::Online,
        heartbeat_timeout_s: timeout_s,
        ..SensorState::new(None)
    }
}

fn names(v: Vec<(SensorId, Millis)>) -> Vec<String> {
    v.into_iter().map(|(i, _)| i.to_string()).collect()
}

#[test]
fn expires_in_last_seen_order_at_the_exact_deadline() {
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("b"), online(2 * MIN, None));
    f.insert(id("a"), online(MIN, None));
    f.insert(id("c"), online(3 * MIN, None));
    assert_eq!(f.next_deadline(), Some(11 * MIN));
    assert!(f.expired(11 * MIN - 1, 10).is_empty());
    assert_eq!(names(f.expired(12 * MIN, 10)), ["a", "b"]);
    assert_eq!(f.expired(12 * MIN, 1).len(), 1, "bounded batches");
}

#[test]
fn a_reading_moves_a_sensor_to_the_back() {
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("a"), online(MIN, None));
    f.insert(id("b"), online(2 * MIN, None));
    f.update(id("a"), online(5 * MIN, None));
    assert_eq!(f.next_deadline(), Some(12 * MIN));
    assert_eq!(names(f.expired(16 * MIN, 10)), ["b", "a"]);
}

#[test]
fn lost_and_unknown_sensors_have_no_deadline() {
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("u"), SensorState::new(None));
    f.insert(id("a"), online(MIN, None));
    let lost = SensorState {
        connection: Connection::Lost,
        ..online(MIN, None)
    };
    f.update(id("a"), lost);
    assert_eq!(f.next_deadline(), None);
    assert!(f.expired(Millis::MAX / 2, 10).is_empty());
    // The next reading brings it back on the list.
    f.update(id("a"), online(30 * MIN, None));
    assert_eq!(f.next_deadline(), Some(40 * MIN));
}

#[test]
fn own_timeouts_win_and_changing_one_keeps_order() {
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("def"), online(MIN, None));
    f.insert(id("fast"), online(MIN + 1000, Some(60)));
    assert_eq!(f.next_deadline(), Some(2 * MIN + 1000));
    assert_eq!(names(f.expired(3 * MIN, 10)), ["fast"]);
    f.insert(id("x"), online(5 * MIN, Some(60)));
    let timeout = |t: Option<u32>| crate::engine::Settings {
        heartbeat_timeout_s: t,
        ..crate::engine::Settings::of(&SensorState::new(None))
    };
    f.set_settings(id("def"), timeout(Some(60)), 0);
    // "def" was seen before "x": it lands in front of it in the 60 s list.
    assert_eq!(names(f.expired(7 * MIN, 10)), ["def", "fast", "x"]);
    f.set_settings(id("fast"), timeout(None), 0);
    assert_eq!(names(f.expired(7 * MIN, 10)), ["def", "x"]);
}

#[test]
fn our_downtime_is_not_the_sensors_silence() {
    // Seen at minute 1, latch restarted at minute 50 with a 10 minute timeout.
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 50 * MIN);
    f.insert(id("a"), online(MIN, None));
    assert_eq!(f.next_deadline(), Some(60 * MIN));
    assert!(f.expired(59 * MIN, 10).is_empty());
}

#[test]
fn a_slot_is_48_bytes_and_round_trips_the_state() {
    assert_eq!(std::mem::size_of::<Slot>(), 48);
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    let long = id("Zz09abcdefghijkl");
    let s = SensorState {
        data: Some(false),
        changed_at: None,
        last_ts: Some(-5),
        last_seen_at: Some(7 * MIN),
        connection: Connection::Lost,
        heartbeat_timeout_s: Some(90),
        ..SensorState::new(None)
    };
    f.insert(long, s);
    assert_eq!(f.get(long), Some(s));
    assert_eq!(f.get(id("Zz09abcdefghijk")), None, "a prefix is another id");
    f.insert(id("n"), SensorState::new(None));
    assert_eq!(f.get(id("n")), Some(SensorState::new(None)));
}

#[test]
fn any_number_of_distinct_timeouts_expire_each_at_its_own_deadline() {
    // More distinct timeouts than a u16 can number.
    const N: u32 = 70_000;
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    for t in 1..=N {
        f.insert(id(&format!("s{t}")), online(0, Some(t)));
    }
    assert_eq!(f.next_deadline(), Some(1000));
    let due = f.expired(Millis::from(N) * 1000, usize::MAX);
    assert_eq!(due.len(), N as usize);
    for (sensor, deadline) in &due {
        let t: Millis = sensor.to_string()[1..].parse().unwrap();
        assert_eq!(*deadline, t * 1000, "{sensor}");
    }
    let half = f.expired(Millis::from(N / 2) * 1000, usize::MAX);
    assert_eq!(half.len(), (N / 2) as usize);

    // Lists that empty are reused: memory follows the live distinct timeouts.
    for t in 1..=N {
        f.remove(id(&format!("s{t}")));
    }
    assert!(f.group_of.is_empty());
    f.insert(id("late"), online(0, Some(N + 1)));
    assert_eq!(f.groups.len(), N as usize, "an emptied list was reused");
    assert_eq!(f.next_deadline(), Some(Millis::from(N + 1) * 1000));
    // Seen again, alone on its list: it stays listed with its new deadline.
    f.update(id("late"), online(5_000, Some(N + 1)));
    assert_eq!(f.next_deadline(), Some(5_000 + Millis::from(N + 1) * 1000));
    assert_eq!((f.group_of.len(), f.groups.len()), (1, N as usize));
}

#[test]
fn removed_slots_are_reused_and_unlisted() {
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("a"), online(MIN, None));
    f.insert(id("b"), online(2 * MIN, None));
    f.remove(id("a"));
    assert_eq!(f.len(), 1);
    assert_eq!(names(f.expired(20 * MIN, 10)), ["b"]);
    f.insert(id("c"), online(3 * MIN, None));
    assert_eq!(f.slots.len(), 2, "the freed slot was reused");
    assert_eq!(names(f.expired(20 * MIN, 10)), ["b", "c"]);
}

fn heard(seen: Millis, source: Source) -> SensorState {
    SensorState {
        last_source: Some(source),
        ..online(seen, None)
    }
}

#[test]
fn a_broker_link_that_is_down_holds_its_sensors_and_counts_from_its_return() {
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("m"), heard(MIN, Source::Mqtt));
    f.insert(id("a"), heard(MIN, Source::Amqp));
    f.insert(id("h"), heard(2 * MIN, Source::Http));
    f.set_link(Source::Mqtt, false, 5 * MIN);
    assert_eq!(
        names(f.expired(60 * MIN, 10)),
        ["a", "h"],
        "held while down"
    );
    assert_eq!(f.deadline_of(id("m")), None);
    assert_eq!(f.next_deadline(), Some(11 * MIN), "the others' only");
    f.set_link(Source::Mqtt, false, 6 * MIN);
    f.set_link(Source::Mqtt, true, 30 * MIN);
    assert_eq!(
        f.deadline_of(id("m")),
        Some(40 * MIN),
        "reconnected_at + timeout"
    );
    assert!(!names(f.expired(40 * MIN - 1, 10)).contains(&"m".to_string()));
    assert!(names(f.expired(40 * MIN, 10)).contains(&"m".to_string()));
    // Up again without going down: the return counts from the first time.
    f.set_link(Source::Mqtt, true, 50 * MIN);
    assert_eq!(f.deadline_of(id("m")), Some(40 * MIN));
    // HTTP has no link to lose.
    f.set_link(Source::Http, false, 0);
    assert_eq!(f.deadline_of(id("h")), Some(12 * MIN));
}

#[test]
fn a_reading_through_another_way_moves_a_sensor_to_that_link() {
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("m"), heard(MIN, Source::Mqtt));
    f.set_link(Source::Mqtt, false, 2 * MIN);
    f.update(id("m"), heard(3 * MIN, Source::Http));
    assert_eq!(f.deadline_of(id("m")), Some(13 * MIN));
    assert_eq!(f.get(id("m")).unwrap().last_source, Some(Source::Http));
    f.update(id("m"), heard(4 * MIN, Source::Mqtt));
    assert_eq!(f.deadline_of(id("m")), None);
    assert_eq!(f.get(id("m")).unwrap().last_source, Some(Source::Mqtt));
}

#[test]
fn windows_and_reminders_keep_one_timer_each_that_follows_the_state() {
    use crate::domain::sensor::Debounce;
    let policy = Policy {
        default_timeout_ms: 10 * MIN,
        default_debounce_ms: 10_000,
        reminder_ms: Some(MIN),
    };
    let mut f = Fleet::new(policy, 0);
    let window = Debounce {
        from: Some(false),
        at: 500,
        since: 1_000,
        flips: 2,
    };
    let held = SensorState {
        debounce: Some(window),
        debounce_s: Some(20),
        ..online(1_000, None)
    };
    // As memory keeps it: all of it but `changed_at`.
    let kept = |s: SensorState| {
        Some(SensorState {
            changed_at: None,
            ..s
        })
    };
    f.insert(id("w"), held);
    assert_eq!(f.get(id("w")), kept(held), "all of it kept");
    assert_eq!(f.next_deadline(), Some(21_000), "its own window");
    let mut due = vec![];
    f.each_timer(21_000, |i| {
        due.push(i);
        true
    });
    assert_eq!(due, [id("w")]);
    f.update(id("w"), online(1_000, None));
    assert_eq!(f.extras.timers(), 0);
    assert_eq!(
        f.get(id("w")),
        kept(online(1_000, None)),
        "nothing left over"
    );

    let lost = SensorState {
        connection: Connection::Lost,
        lost_since: Some(5_000),
        reminders: Some(1),
        ..online(1_000, None)
    };
    f.update(id("w"), lost);
    assert_eq!(f.get(id("w")), kept(lost));
    assert_eq!(
        f.next_deadline(),
        Some(5_000 + 2 * MIN),
        "the second reminder"
    );
    f.remove(id("w"));
    assert_eq!((f.extras.timers(), f.next_deadline()), (0, None));

    // Without reminders memory keeps no lost_since: the store does.
    let mut f = Fleet::new(Policy::timeout(10 * MIN), 0);
    f.insert(id("l"), lost);
    let got = f.get(id("l")).unwrap();
    assert_eq!((got.lost_since, got.reminders), (None, None));
    assert_eq!(f.next_deadline(), None);
}
