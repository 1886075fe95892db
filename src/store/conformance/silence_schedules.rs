//! Checks of silences that follow a schedule (issue #73): active in every window of the
//! schedule and only there, reconciled at each window's end as a one-off silence is, then
//! moved to the next window in the same transaction; one whose schedule has no window to
//! come stays put.

use super::silences::silence;
use super::*;
use crate::domain::schedule::Schedule;
use crate::domain::silence::{Match, Silence, SilenceState, window_after};

const MINUTE: Millis = 60_000;
const DAY: Millis = 24 * 60 * MINUTE;

/// Every day 00:01–00:02 UTC: windows `[DAY * n + MINUTE, DAY * n + 2 * MINUTE)`.
fn daily(id: &str, weekly: serde_json::Value) -> StoredSchedule {
    let schedule = Schedule::parse(serde_json::json!({
        "id": id, "name": "night work", "tz": "UTC", "weekly": weekly
    }))
    .unwrap();
    StoredSchedule {
        schedule,
        created_at: 1_000,
        updated_at: 1_000,
    }
}

fn every_day() -> serde_json::Value {
    serde_json::json!([{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
        "from": "00:01", "to": "00:02"}])
}

fn following(id: &str, schedule: &StoredSchedule, matcher: Match, now: Millis) -> Silence {
    let (starts_at, ends_at) = window_after(&schedule.schedule, now).unwrap_or((now, now));
    Silence {
        schedule_id: Some(schedule.schedule.id.clone()),
        ..silence(id, matcher, starts_at, ends_at)
    }
}

/// The clients a commit handed a notification to.
fn told(made: &[NotificationRef]) -> Vec<&str> {
    made.iter().map(|n| n.client_id.as_str()).collect()
}

/// Inside a window the silence keeps what it matches; between windows it keeps nothing; at
/// a window's end its pairs are reconciled once and it moves to the next window.
pub(super) async fn a_scheduled_silence_keeps_only_inside_its_windows(s: &Subject) {
    s.create_sensor(sensor("ws1")).await.unwrap();
    s.create_client(client("wq", "http://r/")).await.unwrap();
    s.link("wq".into(), sid("ws1"), 1).await.unwrap();
    let nights = daily("nights", every_day());
    s.create_schedule(nights.clone()).await.unwrap();
    s.commit(change("ws1", true, None, 1_000), 1_000)
        .await
        .unwrap();
    let matcher = Match {
        client_id: Some("wq".into()),
        ..Match::default()
    };
    let w = following("w1", &nights, matcher, 1_000);
    assert_eq!((w.starts_at, w.ends_at), (MINUTE, 2 * MINUTE));
    s.create_silence(w).await.unwrap();
    let listed = |state, at| async move {
        s.list_silences(Some(state), at, page(10))
            .await
            .unwrap()
            .items
            .len()
    };
    assert_eq!(listed(SilenceState::Pending, 30_000).await, 1);

    // Before the window: handed on.
    let made = s
        .commit(change("ws1", false, Some(true), 30_000), 30_000)
        .await
        .unwrap();
    assert_eq!(told(&made), ["wq"], "before its first window");
    // Inside: kept.
    assert_eq!(listed(SilenceState::Active, 70_000).await, 1);
    let made = s
        .commit(change("ws1", true, Some(false), 70_000), 70_000)
        .await
        .unwrap();
    assert!(made.is_empty(), "inside its window: {made:?}");

    // Its end: once pending again, not ended, while it waits for the round.
    assert_eq!(listed(SilenceState::Pending, 2 * MINUTE + 1).await, 1);
    assert_eq!(listed(SilenceState::Ended, 2 * MINUTE + 1).await, 0);
    let made = s
        .reconcile_silences(2 * MINUTE, 2 * MINUTE + 6_000)
        .await
        .unwrap();
    let got: Vec<(&str, EventKind)> = made
        .iter()
        .map(|n| (n.client_id.as_str(), n.kind))
        .collect();
    assert_eq!(got, [("wq", EventKind::StateChanged)]);
    let moved = s.get_silence("w1".into()).await.unwrap().unwrap();
    assert_eq!(
        (moved.starts_at, moved.ends_at, moved.reconciled_at),
        (DAY + MINUTE, DAY + 2 * MINUTE, None),
        "moved to the next window, to be reconciled at its end"
    );
    assert!(
        s.reconcile_silences(3 * MINUTE, 3 * MINUTE)
            .await
            .unwrap()
            .is_empty(),
        "once"
    );

    // Between windows: handed on.
    let made = s
        .commit(change("ws1", false, Some(true), 4 * MINUTE), 4 * MINUTE)
        .await
        .unwrap();
    assert_eq!(told(&made), ["wq"], "between its windows");
    // The next window: kept again; its end reconciled and moved on again.
    let at = DAY + MINUTE + 1_000;
    let made = s
        .commit(change("ws1", true, Some(false), at), at)
        .await
        .unwrap();
    assert!(made.is_empty(), "inside its second window: {made:?}");
    let made = s
        .reconcile_silences(DAY + 2 * MINUTE, DAY + 2 * MINUTE + 6_000)
        .await
        .unwrap();
    assert_eq!(made.len(), 1);
    let moved = s.get_silence("w1".into()).await.unwrap().unwrap();
    assert_eq!(moved.starts_at, 2 * DAY + MINUTE);
    assert_eq!(
        s.silences_following("nights".into())
            .await
            .unwrap()
            .iter()
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>(),
        ["w1"]
    );
}

/// A silence whose schedule has no window to come is reconciled and stays, pending, until
/// it is placed again; one a caller ended moves no more; a one-off silence is not moved.
pub(super) async fn a_scheduled_silence_without_windows_or_ended_stays_put(s: &Subject) {
    let empty = daily("empty", serde_json::json!([]));
    s.create_schedule(empty.clone()).await.unwrap();
    let nights = daily("nights2", every_day());
    s.create_schedule(nights.clone()).await.unwrap();
    let any = Match {
        types: Some(vec![EventKind::ConnectionLost]),
        ..Match::default()
    };
    s.create_silence(following("e1", &empty, any.clone(), 1_000))
        .await
        .unwrap();
    let mut ended = following("e2", &nights, any.clone(), 1_000);
    s.create_silence(ended.clone()).await.unwrap();
    ended.ended_at = Some(70_000);
    ended.ends_at = 70_000;
    assert!(s.update_silence(ended).await.unwrap());

    s.reconcile_silences(2 * MINUTE, 2 * MINUTE).await.unwrap();
    let e1 = s.get_silence("e1".into()).await.unwrap().unwrap();
    assert_eq!(
        (e1.starts_at, e1.ends_at),
        (1_000, 1_000),
        "no window to go to"
    );
    assert_eq!(e1.reconciled_at, Some(2 * MINUTE));
    assert_eq!(e1.state(DAY), SilenceState::Pending);
    let e2 = s.get_silence("e2".into()).await.unwrap().unwrap();
    assert_eq!((e2.ends_at, e2.reconciled_at), (70_000, Some(2 * MINUTE)));
    assert_eq!(e2.state(DAY), SilenceState::Ended);
    assert!(
        s.reconcile_silences(DAY, DAY).await.unwrap().is_empty()
            && s.get_silence("e1".into())
                .await
                .unwrap()
                .unwrap()
                .reconciled_at
                == Some(2 * MINUTE),
        "left as it is: no round takes it again"
    );
    // Placed again (its schedule changed): reconciled at its new window's end.
    let placed = Silence {
        starts_at: DAY + MINUTE,
        ends_at: DAY + 2 * MINUTE,
        ..e1
    };
    assert!(s.update_silence(placed).await.unwrap());
    let e1 = s.get_silence("e1".into()).await.unwrap().unwrap();
    assert_eq!((e1.starts_at, e1.reconciled_at), (DAY + MINUTE, None));
    assert!(
        s.silences_following("nights2".into())
            .await
            .unwrap()
            .is_empty(),
        "an ended silence follows its schedule no more"
    );
}
