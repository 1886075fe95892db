//! Each test names the instants a person in the zone would notice, in UTC.

use serde_json::{Value, json};

use super::*;
use crate::domain::time;

const HOUR: Millis = 3_600_000;

fn utc(s: &str) -> Millis {
    time::parse(s).expect("a test time")
}

fn schedule(tz: &str, weekly: Value) -> Schedule {
    excepting(tz, weekly, json!([]))
}

fn excepting(tz: &str, weekly: Value, except: Value) -> Schedule {
    Schedule::parse(
        json!({"id": "s1", "name": "test", "tz": tz, "weekly": weekly, "except": except}),
    )
    .expect("a valid schedule")
}

/// `window_at` as RFC 3339, so a failure reads as times.
fn window(s: &Schedule, at: &str) -> Option<(String, String)> {
    s.window_at(utc(at))
        .map(|(a, b)| (time::format(a), time::format(b)))
}

fn span(a: &str, b: &str) -> Option<(String, String)> {
    Some((time::format(utc(a)), time::format(utc(b))))
}

#[test]
fn a_night_across_midnight_lasts_what_the_berlin_clocks_say() {
    let s = schedule(
        "Europe/Berlin",
        json!([{"days": ["sat"], "from": "22:00", "to": "06:00"}]),
    );
    // An ordinary summer Saturday night: 22:00–06:00 CEST, 8 hours.
    assert_eq!(
        window(&s, "2026-06-13T23:00:00Z"),
        span("2026-06-13T20:00:00Z", "2026-06-14T04:00:00Z")
    );
    // Spring forward (2026-03-29, 02:00 CET becomes 03:00 CEST): 22:00 CET to 06:00 CEST is
    // 7 hours.
    let spring = s.window_at(utc("2026-03-28T23:00:00Z")).unwrap();
    assert_eq!(
        window(&s, "2026-03-28T23:00:00Z"),
        span("2026-03-28T21:00:00Z", "2026-03-29T04:00:00Z")
    );
    assert_eq!(spring.1 - spring.0, 7 * HOUR);
    // Fall back (2026-10-25, 03:00 CEST becomes 02:00 CET): 22:00 CEST to 06:00 CET is 9
    // hours, both passes through 02:00–03:00 inside.
    let autumn = s.window_at(utc("2026-10-24T23:00:00Z")).unwrap();
    assert_eq!(
        window(&s, "2026-10-24T23:00:00Z"),
        span("2026-10-24T20:00:00Z", "2026-10-25T05:00:00Z")
    );
    assert_eq!(autumn.1 - autumn.0, 9 * HOUR);
    assert!(
        s.inside(utc("2026-10-25T00:30:00Z")),
        "02:30 CEST, first pass"
    );
    assert!(
        s.inside(utc("2026-10-25T01:30:00Z")),
        "02:30 CET, second pass"
    );
    assert!(
        !s.inside(utc("2026-10-25T05:00:00Z")),
        "06:00 CET: `to` is exclusive"
    );
    assert!(!s.inside(utc("2026-10-24T19:59:59.999Z")));
}

#[test]
fn a_night_across_midnight_lasts_what_the_new_york_clocks_say() {
    let s = schedule(
        "America/New_York",
        json!([{"days": ["sat"], "from": "22:00", "to": "06:00"}]),
    );
    // Spring forward (2026-03-08, 02:00 EST becomes 03:00 EDT): 22:00 EST to 06:00 EDT.
    assert_eq!(
        window(&s, "2026-03-08T05:00:00Z"),
        span("2026-03-08T03:00:00Z", "2026-03-08T10:00:00Z")
    );
    // Fall back (2026-11-01, 02:00 EDT becomes 01:00 EST): 22:00 EDT to 06:00 EST.
    assert_eq!(
        window(&s, "2026-11-01T05:00:00Z"),
        span("2026-11-01T02:00:00Z", "2026-11-01T11:00:00Z")
    );
    // The week after, all in EST: 8 hours again.
    assert_eq!(
        window(&s, "2026-11-08T05:00:00Z"),
        span("2026-11-08T03:00:00Z", "2026-11-08T11:00:00Z")
    );
}

#[test]
fn a_time_the_clocks_skip_is_the_first_instant_after_the_gap() {
    let berlin = schedule(
        "Europe/Berlin",
        json!([{"days": ["sun"], "from": "02:30", "to": "04:00"}]),
    );
    // 02:30 does not exist on 2026-03-29: the window opens at 03:00 CEST (01:00 UTC) and
    // lasts one hour, not one and a half.
    assert_eq!(
        window(&berlin, "2026-03-29T01:30:00Z"),
        span("2026-03-29T01:00:00Z", "2026-03-29T02:00:00Z")
    );
    assert!(
        !berlin.inside(utc("2026-03-29T00:59:59.999Z")),
        "01:59:59 CET"
    );
    // The Sunday after, 02:30 CEST as written.
    assert_eq!(
        window(&berlin, "2026-04-05T01:00:00Z"),
        span("2026-04-05T00:30:00Z", "2026-04-05T02:00:00Z")
    );

    let new_york = schedule(
        "America/New_York",
        json!([{"days": ["sun"], "from": "02:30", "to": "04:00"}]),
    );
    assert_eq!(
        window(&new_york, "2026-03-08T07:30:00Z"),
        span("2026-03-08T07:00:00Z", "2026-03-08T08:00:00Z")
    );

    // An end in the gap: 01:00 CET to 03:00 CEST.
    let ends = schedule(
        "Europe/Berlin",
        json!([{"days": ["sun"], "from": "01:00", "to": "02:30"}]),
    );
    assert_eq!(
        window(&ends, "2026-03-29T00:30:00Z"),
        span("2026-03-29T00:00:00Z", "2026-03-29T01:00:00Z")
    );
}

#[test]
fn a_window_wholly_in_the_skipped_hour_does_not_happen_that_night() {
    let s = schedule(
        "Europe/Berlin",
        json!([{"days": ["sun"], "from": "02:10", "to": "02:50"}]),
    );
    assert!(!s.inside(utc("2026-03-29T01:00:00Z")));
    assert!(!s.inside(utc("2026-03-29T00:59:00Z")));
    // The next change is the next Sunday's 02:10 CEST.
    assert_eq!(
        s.next_change(utc("2026-03-28T12:00:00Z")),
        Some(utc("2026-04-05T00:10:00Z"))
    );
}

#[test]
fn a_time_the_clocks_repeat_is_its_first_pass() {
    // 02:15–02:45 on 2026-10-25 in Berlin: in CEST, once; the second 02:15 (CET) is outside.
    let berlin = schedule(
        "Europe/Berlin",
        json!([{"days": ["sun"], "from": "02:15", "to": "02:45"}]),
    );
    assert_eq!(
        window(&berlin, "2026-10-25T00:20:00Z"),
        span("2026-10-25T00:15:00Z", "2026-10-25T00:45:00Z")
    );
    assert!(!berlin.inside(utc("2026-10-25T01:20:00Z")), "02:20 CET");
    assert_eq!(
        berlin.next_change(utc("2026-10-25T00:45:00Z")),
        Some(utc("2026-11-01T01:15:00Z")),
        "next Sunday, 02:15 CET"
    );

    // Across the repeated hour: from its first 02:30 (CEST) to 03:30 CET, two hours.
    let across = schedule(
        "Europe/Berlin",
        json!([{"days": ["sun"], "from": "02:30", "to": "03:30"}]),
    );
    assert_eq!(
        window(&across, "2026-10-25T01:45:00Z"),
        span("2026-10-25T00:30:00Z", "2026-10-25T02:30:00Z")
    );

    // New York repeats 01:00–02:00 on 2026-11-01: 01:15–01:45 EDT.
    let new_york = schedule(
        "America/New_York",
        json!([{"days": ["sun"], "from": "01:15", "to": "01:45"}]),
    );
    assert_eq!(
        window(&new_york, "2026-11-01T05:30:00Z"),
        span("2026-11-01T05:15:00Z", "2026-11-01T05:45:00Z")
    );
    assert!(!new_york.inside(utc("2026-11-01T06:30:00Z")), "01:30 EST");

    // An end in the repeated hour ends at its first pass: 00:00 EDT to 01:30 EDT.
    let ends = schedule(
        "America/New_York",
        json!([{"days": ["sun"], "from": "00:00", "to": "01:30"}]),
    );
    assert_eq!(
        window(&ends, "2026-11-01T05:00:00Z"),
        span("2026-11-01T04:00:00Z", "2026-11-01T05:30:00Z")
    );
}

#[test]
fn windows_that_touch_across_midnight_are_one_stretch() {
    let s = schedule(
        "Europe/Berlin",
        json!([
            {"days": ["fri"], "from": "22:00", "to": "24:00"},
            {"days": ["sat"], "from": "00:00", "to": "06:00"},
        ]),
    );
    // Friday 2026-06-12 22:00 CEST to Saturday 06:00 CEST.
    assert_eq!(
        window(&s, "2026-06-12T21:00:00Z"),
        span("2026-06-12T20:00:00Z", "2026-06-13T04:00:00Z")
    );
    assert_eq!(
        s.next_change(utc("2026-06-12T21:00:00Z")),
        Some(utc("2026-06-13T04:00:00Z")),
        "midnight is no change"
    );
}

#[test]
fn an_except_date_cancels_the_window_that_starts_on_it() {
    let s = excepting(
        "Europe/Berlin",
        json!([{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "from": "22:00", "to": "06:00"}]),
        json!(["2026-12-24"]),
    );
    // The night from the 23rd runs into the 24th whole.
    assert_eq!(
        window(&s, "2026-12-24T02:00:00Z"),
        span("2026-12-23T21:00:00Z", "2026-12-24T05:00:00Z")
    );
    // The night from the 24th does not happen; the one from the 25th does.
    assert!(!s.inside(utc("2026-12-24T22:00:00Z")));
    assert!(!s.inside(utc("2026-12-25T02:00:00Z")));
    assert_eq!(
        s.next_change(utc("2026-12-24T05:00:00Z")),
        Some(utc("2026-12-25T21:00:00Z"))
    );
}

#[test]
fn an_except_date_is_a_date_in_the_schedules_zone() {
    let every_day = json!([{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "from": "00:00", "to": "24:00"}]);
    let s = excepting("America/New_York", every_day, json!(["2026-12-25"]));
    // 03:00 UTC on the 25th is still the 24th in New York.
    assert!(s.inside(utc("2026-12-25T03:00:00Z")));
    assert!(
        !s.inside(utc("2026-12-25T05:00:00Z")),
        "00:00 EST on the 25th"
    );
    // Every hour of every day before: a stretch that never began, ending at the holiday.
    assert_eq!(
        s.window_at(utc("2026-12-25T03:00:00Z")),
        Some((Millis::MIN, utc("2026-12-25T05:00:00Z")))
    );
    assert_eq!(
        s.next_change(utc("2026-12-25T05:00:00Z")),
        Some(utc("2026-12-26T05:00:00Z"))
    );
    // After the last except date it never ends.
    assert_eq!(
        s.window_at(utc("2026-12-26T05:00:00Z")),
        Some((utc("2026-12-26T05:00:00Z"), Millis::MAX))
    );
    assert_eq!(s.next_change(utc("2026-12-26T05:00:00Z")), None);
}

#[test]
fn next_change_walks_a_working_week() {
    let s = schedule(
        "Europe/Berlin",
        json!([
            {"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00", "to": "18:00"},
            {"days": ["sat"], "from": "10:00", "to": "14:00"},
        ]),
    );
    // From Monday 2026-06-15 00:00 CEST: each working day 06:00–16:00 UTC, Saturday
    // 08:00–12:00 UTC, then the next Monday.
    let mut at = utc("2026-06-14T22:00:00Z");
    let mut seen = Vec::new();
    let mut inside = s.inside(at);
    assert!(!inside);
    while seen.len() < 13 {
        at = s.next_change(at).expect("a weekly schedule keeps changing");
        assert_ne!(s.inside(at), inside, "inside flips at {}", time::format(at));
        assert!(s.inside(at - 1) == inside, "and not before");
        inside = s.inside(at);
        seen.push(time::format(at));
    }
    let mut expected = Vec::new();
    for day in 15..=19 {
        expected.push(format!("2026-06-{day}T06:00:00.000Z"));
        expected.push(format!("2026-06-{day}T16:00:00.000Z"));
    }
    expected.push("2026-06-20T08:00:00.000Z".into());
    expected.push("2026-06-20T12:00:00.000Z".into());
    expected.push("2026-06-22T06:00:00.000Z".into());
    assert_eq!(seen, expected);
}

#[test]
fn next_change_crosses_the_weekend_the_clocks_change() {
    let s = schedule(
        "America/New_York",
        json!([{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "09:00", "to": "17:00"}]),
    );
    // Friday 2026-03-06 ends at 17:00 EST; Monday 2026-03-09 starts at 09:00 EDT.
    assert_eq!(
        s.next_change(utc("2026-03-06T15:00:00Z")),
        Some(utc("2026-03-06T22:00:00Z"))
    );
    assert_eq!(
        s.next_change(utc("2026-03-06T22:00:00Z")),
        Some(utc("2026-03-09T13:00:00Z"))
    );
}

#[test]
fn a_schedule_without_edges_never_changes() {
    let none = schedule("Europe/Berlin", json!([]));
    assert!(!none.inside(utc("2026-06-15T10:00:00Z")));
    assert_eq!(none.next_change(utc("2026-06-15T10:00:00Z")), None);
    assert_eq!(none.window_at(utc("2026-06-15T10:00:00Z")), None);

    let always = schedule(
        "Europe/Berlin",
        json!([{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"], "from": "00:00", "to": "24:00"}]),
    );
    // Through both changes of the clocks.
    for at in [
        "2026-03-29T01:00:00Z",
        "2026-10-25T01:30:00Z",
        "2026-06-15T10:00:00Z",
    ] {
        assert!(always.inside(utc(at)), "{at}");
        assert_eq!(always.next_change(utc(at)), None, "{at}");
        assert_eq!(always.window_at(utc(at)), Some((Millis::MIN, Millis::MAX)));
    }
}

#[test]
fn a_schedule_reads_back_as_it_was_written() {
    let body = json!({
        "id": "office-hours",
        "name": "Office hours",
        "tz": "Europe/Berlin",
        "weekly": [{"days": ["mon", "fri"], "from": "08:00", "to": "24:00"}],
        "except": ["2026-12-25", "2026-12-24"],
    });
    let s = Schedule::parse(body.clone()).unwrap();
    assert_eq!(s.tz, chrono_tz::Europe::Berlin);
    assert_eq!(s.weekly[0].to, Clock::END_OF_DAY);
    assert_eq!(serde_json::to_value(&s).unwrap(), body);
    // `except` may be left out.
    let s = Schedule::parse(json!({"id": "a", "name": "b", "tz": "UTC", "weekly": []})).unwrap();
    assert!(s.except.is_empty());
}

/// The field and the reason a body is refused with.
fn refused(edit: impl FnOnce(&mut Value)) -> (String, String) {
    let mut body = json!({
        "id": "office",
        "name": "Office",
        "tz": "Europe/Berlin",
        "weekly": [{"days": ["mon", "tue"], "from": "08:00", "to": "18:00"}],
    });
    edit(&mut body);
    let e = Schedule::parse(body).expect_err("refused");
    (e.field, e.reason)
}

#[test]
fn what_is_refused_names_its_field_and_why() {
    let (field, reason) = refused(|b| b["tz"] = json!("Mars/Olympus_Mons"));
    assert_eq!(field, "tz");
    assert!(
        reason.contains("unknown time zone \"Mars/Olympus_Mons\""),
        "{reason}"
    );

    let (field, reason) = refused(|b| b["weekly"][0]["days"][1] = json!("funday"));
    assert_eq!(field, "weekly[0].days[1]");
    assert!(
        reason.contains("funday") && reason.contains("mon"),
        "{reason}"
    );

    let (field, reason) = refused(|b| b["weekly"][0]["days"] = json!(["mon", "tue", "mon"]));
    assert_eq!(
        (field.as_str(), reason.as_str()),
        ("weekly[0].days[2]", "\"mon\" is given twice")
    );

    let (field, _) = refused(|b| b["weekly"][0]["days"] = json!([]));
    assert_eq!(field, "weekly[0].days");

    for bad in ["25:00", "8:00", "08:60", "24:01", "08h00", ""] {
        let (field, reason) = refused(|b| b["weekly"][0]["to"] = json!(bad));
        assert_eq!(field, "weekly[0].to", "{bad}");
        assert!(reason.contains("HH:MM"), "{bad}: {reason}");
    }
    let (field, reason) = refused(|b| b["weekly"][0]["from"] = json!("24:00"));
    assert_eq!(field, "weekly[0].from");
    assert!(reason.contains("only a `to`"), "{reason}");

    let (field, reason) = refused(|b| b["weekly"][0]["to"] = json!("08:00"));
    assert_eq!(field, "weekly[0]");
    assert!(reason.contains("empty window"), "{reason}");

    let (field, _) = refused(|b| b["id"] = json!("a b"));
    assert_eq!(field, "id");
    let (field, _) = refused(|b| b["name"] = json!("  "));
    assert_eq!(field, "name");
    let (field, _) = refused(|b| b["name"] = json!("n".repeat(MAX_NAME + 1)));
    assert_eq!(field, "name");

    let (field, reason) = refused(|b| {
        b["weekly"] = json!(vec![
            json!({"days": ["mon"], "from": "08:00", "to": "09:00"});
            MAX_WINDOWS + 1
        ])
    });
    assert_eq!(
        (field.as_str(), reason.as_str()),
        ("weekly", "at most 64 windows, got 65")
    );

    let (field, reason) = refused(|b| b["except"] = json!(["2026-12-25", "2026-02-30"]));
    assert_eq!(field, "except[1]");
    assert!(reason.contains("YYYY-MM-DD"), "{reason}");
    let (field, _) = refused(|b| b["except"] = json!(["2026-12-25", "2026-12-25"]));
    assert_eq!(field, "except[1]");
    let days: Vec<String> = NaiveDate::from_ymd_opt(2026, 1, 1)
        .unwrap()
        .iter_days()
        .take(MAX_EXCEPT + 1)
        .map(|d| d.to_string())
        .collect();
    let (field, _) = refused(|b| b["except"] = json!(days));
    assert_eq!(field, "except");

    let (field, reason) = refused(|b| {
        b.as_object_mut().unwrap().remove("tz");
    });
    assert_eq!(
        (field.as_str(), reason.as_str()),
        ("schedule", "missing field `tz`")
    );
    let (_, reason) = refused(|b| b["colour"] = json!("blue"));
    assert!(reason.contains("unknown field `colour`"), "{reason}");
}

#[test]
fn next_change_agrees_with_inside_through_a_year_of_clock_changes() {
    // Windows across midnight, in the skipped and the repeated hour, touching, and holidays.
    let s = excepting(
        "Europe/Berlin",
        json!([
            {"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00", "to": "18:00"},
            {"days": ["sat"], "from": "22:00", "to": "02:30"},
            {"days": ["sun"], "from": "02:10", "to": "02:50"},
            {"days": ["sun"], "from": "02:50", "to": "06:00"},
            {"days": ["fri"], "from": "18:00", "to": "19:00"},
        ]),
        json!(["2026-03-29", "2026-12-25", "2026-05-01"]),
    );
    let quarter_hour = HOUR / 4;
    let end = utc("2027-01-01T00:00:00Z");
    let mut at = utc("2026-01-01T00:00:00Z");
    let mut changes = 0;
    while let Some(next) = s.next_change(at).filter(|&n| n < end) {
        assert!(next > at);
        let was = s.inside(at);
        // Nothing changes before it, on a quarter-hour grid and the millisecond before.
        let mut t = at + 1;
        while t < next {
            assert_eq!(s.inside(t), was, "at {}", time::format(t));
            t += quarter_hour;
        }
        assert_eq!(s.inside(next - 1), was, "before {}", time::format(next));
        assert_ne!(s.inside(next), was, "at {}", time::format(next));
        if !was {
            let (start, stop) = s.window_at(next).unwrap();
            assert_eq!(start, next);
            assert_eq!(Some(stop), s.next_change(next));
        }
        at = next;
        changes += 1;
    }
    // Each weekday one stretch (Friday's hour touches its day), 261 weekdays in 2026 less
    // the two Friday holidays; each Saturday night runs into Sunday's early windows as one
    // stretch, 52 of them (on 2026-03-29 Sunday's own are cancelled, Saturday's still
    // runs): two changes each.
    assert_eq!(changes, 2 * (261 - 2) + 2 * 52);
}
