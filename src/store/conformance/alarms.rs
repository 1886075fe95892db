//! Alarms: one per sensor and kind while open, opened by its opening event and resolved by
//! its clearing one; every notification of it names it; an acknowledgement is taken once,
//! quiets the alarm's reminders and tells each client told of it.

use super::*;
use crate::domain::alarm::{AlarmKind, AlarmState};
use crate::store::rules::alarms::{Ack, Acked};

fn ack(by: &str) -> Ack {
    Ack {
        by: by.into(),
        note: Some("guard sent".into()),
    }
}

async fn alarm_of(s: &Subject, state: AlarmState) -> Vec<crate::domain::alarm::Alarm> {
    let filter = AlarmFilter {
        state: Some(state),
        ..AlarmFilter::default()
    };
    s.list_alarms(filter, page(100)).await.unwrap().items
}

/// A still-lost reminder of `id` at `at`.
fn reminder(id: &str, at: Millis) -> CommitBatch {
    let mut b = liveness(id, EventKind::ConnectionLost, at);
    b.events[0].kind = EventKind::StillLost;
    b.events[0].detail.reminder = Some(1);
    b.events[0].detail.lost_since = Some(5_000);
    b
}

pub(super) async fn an_alarm_opens_once_names_its_notifications_and_resolves(s: &Subject) {
    s.create_sensor(sensor("al1")).await.unwrap();
    for c in ["alc1", "alc2"] {
        s.create_client(client(c, "http://127.0.0.1:9/h"))
            .await
            .unwrap();
        s.link(c.into(), sid("al1"), 1).await.unwrap();
    }
    let lost = s
        .commit(liveness("al1", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    assert_eq!(lost.len(), 2);
    let open = alarm_of(s, AlarmState::Open).await;
    assert_eq!(
        open.len(),
        1,
        "one alarm whatever the number of clients told"
    );
    let a = &open[0];
    assert_eq!(
        (a.kind, a.sensor_id, a.opened_at, a.resolved_at),
        (AlarmKind::ConnectionLost, Some(sid("al1")), 5_000, None)
    );
    for r in &lost {
        let (n, _) = s.get_notification(r.id.clone()).await.unwrap().unwrap();
        assert_eq!(n.alarm_id.as_deref(), Some(a.id.as_str()));
    }
    // A reminder belongs to it; a restore resolves it and names it too.
    let reminded = s.commit(reminder("al1", 6_000), 6_000).await.unwrap();
    assert_eq!(reminded.len(), 2, "an open alarm's reminders go out");
    let back = s
        .commit(liveness("al1", EventKind::ConnectionRestored, 7_000), 7_000)
        .await
        .unwrap();
    let (n, _) = s
        .get_notification(back[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.alarm_id.as_deref(), Some(a.id.as_str()));
    let (resolved, ids) = s.get_alarm(a.id.clone()).await.unwrap().unwrap();
    assert_eq!(
        (resolved.state, resolved.resolved_at),
        (AlarmState::Resolved, Some(7_000))
    );
    assert_eq!(
        ids.len(),
        6,
        "two losses, two reminders, two restores: {ids:?}"
    );
    assert!(matches!(
        s.ack_alarm(a.id.clone(), ack("anna"), 8_000).await.unwrap(),
        Acked::Resolved(_)
    ));

    // The next loss is a new alarm; the filters combine.
    s.commit(liveness("al1", EventKind::ConnectionLost, 9_000), 9_000)
        .await
        .unwrap();
    let open = alarm_of(s, AlarmState::Open).await;
    assert_eq!(open.len(), 1);
    assert_ne!(open[0].id, a.id);
    let all = s
        .list_alarms(
            AlarmFilter {
                sensor_id: Some(sid("al1")),
                kind: Some(AlarmKind::ConnectionLost),
                ..AlarmFilter::default()
            },
            page(100),
        )
        .await
        .unwrap()
        .items;
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].id, open[0].id, "newest first");
    let none = s
        .list_alarms(
            AlarmFilter {
                kind: Some(AlarmKind::Tamper),
                ..AlarmFilter::default()
            },
            page(100),
        )
        .await
        .unwrap()
        .items;
    assert!(none.is_empty());
    assert!(s.get_alarm("nope".into()).await.unwrap().is_none());

    // A deleted sensor's alarm ends with it: one made again under its id starts afresh.
    let old = open[0].id.clone();
    assert!(s.delete_sensor(sid("al1"), 9_500).await.unwrap());
    let (gone, _) = s.get_alarm(old.clone()).await.unwrap().unwrap();
    assert_eq!(
        (gone.state, gone.resolved_at),
        (AlarmState::Resolved, Some(9_500))
    );
    s.create_sensor(sensor("al1")).await.unwrap();
    s.commit(liveness("al1", EventKind::ConnectionLost, 10_000), 10_000)
        .await
        .unwrap();
    let open = alarm_of(s, AlarmState::Open).await;
    assert_eq!(open.len(), 1);
    assert_ne!(open[0].id, old);
}

pub(super) async fn an_acknowledgement_is_taken_once_quiets_reminders_and_tells_the_clients_told(
    s: &Subject,
) {
    s.create_sensor(sensor("ak1")).await.unwrap();
    for c in ["akc1", "akc2"] {
        s.create_client(client(c, "http://127.0.0.1:9/h"))
            .await
            .unwrap();
        s.link(c.into(), sid("ak1"), 1).await.unwrap();
    }
    s.commit(liveness("ak1", EventKind::ConnectionLost, 5_000), 5_000)
        .await
        .unwrap();
    let waiting = s.commit(reminder("ak1", 6_000), 6_000).await.unwrap();
    assert_eq!(waiting.len(), 2);
    // A client linked after the alarm was told of it hears nothing of its acknowledgement.
    s.create_client(client("akc3", "http://127.0.0.1:9/h"))
        .await
        .unwrap();
    s.link("akc3".into(), sid("ak1"), 7_000).await.unwrap();
    let id = alarm_of(s, AlarmState::Open).await[0].id.clone();

    let Acked::Taken(a, made) = s.ack_alarm(id.clone(), ack("anna"), 8_000).await.unwrap() else {
        panic!("the first acknowledgement is taken");
    };
    assert_eq!(
        (
            a.state,
            a.acknowledged_at,
            a.acknowledged_by.as_deref(),
            a.note.as_deref()
        ),
        (
            AlarmState::Acknowledged,
            Some(8_000),
            Some("anna"),
            Some("guard sent")
        )
    );
    let told: Vec<&str> = made.iter().map(|r| r.client_id.as_str()).collect();
    assert_eq!(told, ["akc1", "akc2"]);
    for r in &made {
        assert_eq!(
            (r.kind, r.sensor_id),
            (EventKind::AlarmAcknowledged, sid("ak1"))
        );
        let (n, _) = s.get_notification(r.id.clone()).await.unwrap().unwrap();
        assert_eq!(
            (n.status, n.alarm_id.as_deref()),
            (Status::Pending, Some(id.as_str()))
        );
        let body: serde_json::Value = serde_json::from_str(n.body.as_deref().unwrap()).unwrap();
        assert_eq!(body["alarm"]["id"], id.as_str());
        assert_eq!(body["alarm"]["kind"], "connection_lost");
        assert_eq!(body["alarm"]["sensor_id"], "ak1");
        assert_eq!(
            (body["by"].as_str(), body["note"].as_str()),
            (Some("anna"), Some("guard sent"))
        );
    }
    // The reminders still waiting are superseded; later ones make no notification.
    for r in &waiting {
        let (n, _) = s.get_notification(r.id.clone()).await.unwrap().unwrap();
        assert_eq!(
            n.status,
            Status::Superseded,
            "a reminder after its acknowledgement"
        );
    }
    assert!(
        s.commit(reminder("ak1", 9_000), 9_000)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        s.list_events(sid("ak1"), TimeRange::default(), page(100))
            .await
            .unwrap()
            .items
            .iter()
            .filter(|e| e.row.kind == EventKind::StillLost)
            .count(),
        2,
        "a quiet reminder is still history"
    );

    let Acked::Already(again) = s.ack_alarm(id.clone(), ack("boris"), 9_500).await.unwrap() else {
        panic!("a second acknowledgement changes nothing");
    };
    assert_eq!(again.acknowledged_by.as_deref(), Some("anna"));
    assert!(matches!(
        s.ack_alarm("nope".into(), ack("x"), 1).await.unwrap(),
        Acked::Missing
    ));
    // The restore still tells every client linked, and resolves the acknowledged alarm.
    let back = s
        .commit(
            liveness("ak1", EventKind::ConnectionRestored, 10_000),
            10_000,
        )
        .await
        .unwrap();
    assert_eq!(back.len(), 3);
    let (a, _) = s.get_alarm(id).await.unwrap().unwrap();
    assert_eq!(
        (a.state, a.acknowledged_by.as_deref()),
        (AlarmState::Resolved, Some("anna"))
    );
}

/// A site down is one `site_down` alarm: its loss names it, its sensors' held losses open
/// none of their own, and its return resolves it and names it too.
pub(super) async fn a_site_down_is_one_alarm_for_its_sensors(s: &Subject) {
    use super::silences::RULES;
    super::site_edges::fill(s, "as-a", &["as1", "as2", "as3", "as4"], "asc1").await;
    for id in ["as1", "as2", "as3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 5_000), 5_000)
            .await
            .unwrap();
    }
    let down = s.decide_sites(RULES, 36_000).await.unwrap();
    assert_eq!(
        down.made.len(),
        1,
        "one site.connection_lost for the client"
    );
    let open = alarm_of(s, AlarmState::Open).await;
    assert_eq!(
        open.len(),
        1,
        "the sensors' losses open none of their own: {open:?}"
    );
    let a = &open[0];
    assert_eq!(
        (a.kind, a.site_id.as_deref(), a.sensor_id),
        (AlarmKind::SiteDown, Some("as-a"), None)
    );
    let (n, _) = s
        .get_notification(down.made[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.alarm_id.as_deref(), Some(a.id.as_str()));
    let by_site = s
        .list_alarms(
            AlarmFilter {
                site_id: Some("as-a".into()),
                ..AlarmFilter::default()
            },
            page(10),
        )
        .await
        .unwrap()
        .items;
    assert_eq!(by_site.len(), 1);

    for id in ["as1", "as2", "as3"] {
        s.commit(liveness(id, EventKind::ConnectionRestored, 40_000), 40_000)
            .await
            .unwrap();
    }
    let back = s.decide_sites(RULES, 80_000).await.unwrap();
    let restored: Vec<&NotificationRef> = back
        .made
        .iter()
        .filter(|n| n.kind == EventKind::SiteConnectionRestored)
        .collect();
    assert_eq!(restored.len(), 1, "{:?}", back.made);
    let (n, _) = s
        .get_notification(restored[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.alarm_id.as_deref(), Some(a.id.as_str()));
    let (a, _) = s.get_alarm(a.id.clone()).await.unwrap().unwrap();
    assert_eq!(a.state, AlarmState::Resolved);
    assert!(a.resolved_at.is_some());

    // A site deleted while down takes its alarm along.
    for id in ["as1", "as2", "as3"] {
        s.commit(liveness(id, EventKind::ConnectionLost, 90_000), 90_000)
            .await
            .unwrap();
    }
    s.decide_sites(RULES, 130_000).await.unwrap();
    let open = alarm_of(s, AlarmState::Open).await;
    assert_eq!(open.len(), 1);
    assert_ne!(open[0].id, a.id, "a new outage, a new alarm");
    s.delete_site("as-a".into(), 140_000).await.unwrap();
    let (gone, _) = s.get_alarm(open[0].id.clone()).await.unwrap().unwrap();
    assert_eq!(
        (gone.state, gone.resolved_at),
        (AlarmState::Resolved, Some(140_000))
    );
}

/// A schedule is kept whole: created once (a second with its id is a conflict), read back
/// as written, listed by id, replaced, deleted.
pub(super) async fn a_schedule_is_kept_whole(s: &Subject) {
    use crate::domain::schedule::Schedule;
    let schedule = |id: &str, name: &str| {
        Schedule::parse(serde_json::json!({
            "id": id, "name": name, "tz": "Europe/Berlin",
            "weekly": [{"days": ["mon", "tue"], "from": "22:00", "to": "06:00"}],
            "except": ["2026-12-25"]
        }))
        .unwrap()
    };
    let stored = |id: &str, name: &str, at: Millis| StoredSchedule {
        schedule: schedule(id, name),
        created_at: at,
        updated_at: at,
    };
    s.create_schedule(stored("night", "Nights", 1_000))
        .await
        .unwrap();
    s.create_schedule(stored("day", "Days", 1_000))
        .await
        .unwrap();
    assert!(matches!(
        s.create_schedule(stored("night", "Again", 2_000)).await,
        Err(Error::Conflict(_))
    ));
    assert_eq!(
        s.get_schedule("night".into()).await.unwrap(),
        Some(stored("night", "Nights", 1_000))
    );
    let listed: Vec<String> = s
        .list_schedules(page(1))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|x| x.schedule.id)
        .collect();
    assert_eq!(listed, ["day"]);
    let mut changed = stored("night", "Late nights", 1_000);
    changed.updated_at = 3_000;
    assert!(s.replace_schedule(changed.clone()).await.unwrap());
    assert_eq!(s.get_schedule("night".into()).await.unwrap(), Some(changed));
    assert!(!s.replace_schedule(stored("none", "x", 1)).await.unwrap());
    assert!(s.delete_schedule("night".into()).await.unwrap());
    assert!(!s.delete_schedule("night".into()).await.unwrap());
    assert_eq!(s.get_schedule("night".into()).await.unwrap(), None);
}

/// One batch that resolves an alarm and opens the next of the same sensor and kind (a
/// device's buffer sent at once): it commits, with one alarm resolved and one open, never
/// two open.
pub(super) async fn a_batch_that_resolves_and_reopens_an_alarm_commits(s: &Subject) {
    s.create_sensor(sensor("rr1")).await.unwrap();
    s.create_client(client("rrc", "http://127.0.0.1:9/h"))
        .await
        .unwrap();
    s.link("rrc".into(), sid("rr1"), 1).await.unwrap();
    // Lost, back and lost again within one batch, no alarm open before.
    let mut batch = liveness("rr1", EventKind::ConnectionLost, 5_000);
    let mut back = batch.events[0].clone();
    back.kind = EventKind::ConnectionRestored;
    back.at = 6_000;
    let mut again = batch.events[0].clone();
    again.at = 7_000;
    batch.events.extend([back, again]);
    let made = s.commit(batch, 7_000).await.unwrap();
    assert_eq!(made.len(), 3);
    let open = alarm_of(s, AlarmState::Open).await;
    let resolved = alarm_of(s, AlarmState::Resolved).await;
    assert_eq!(
        (open.len(), resolved.len()),
        (1, 1),
        "{open:?} {resolved:?}"
    );
    assert_eq!(
        (resolved[0].opened_at, resolved[0].resolved_at),
        (5_000, Some(6_000))
    );
    assert_eq!(open[0].opened_at, 7_000);

    // With that one open: back and lost again in one batch.
    let mut batch = liveness("rr1", EventKind::ConnectionRestored, 8_000);
    let mut again = batch.events[0].clone();
    again.kind = EventKind::ConnectionLost;
    again.at = 9_000;
    batch.events.push(again);
    batch.states[0].connection = Connection::Lost;
    s.commit(batch, 9_000).await.unwrap();
    let now_open = alarm_of(s, AlarmState::Open).await;
    assert_eq!(now_open.len(), 1);
    assert_ne!(now_open[0].id, open[0].id);
    assert_eq!(now_open[0].opened_at, 9_000);
    assert_eq!(alarm_of(s, AlarmState::Resolved).await.len(), 2);
}

/// Retention keeps the notifications of an alarm not resolved, so that an acknowledgement
/// long after still tells the clients told; once it is resolved they go at their time.
pub(super) async fn retention_keeps_an_open_alarms_notifications(s: &Subject) {
    s.create_sensor(sensor("ra1")).await.unwrap();
    s.create_client(client("rac", "http://127.0.0.1:9/h"))
        .await
        .unwrap();
    s.link("rac".into(), sid("ra1"), 1).await.unwrap();
    let lost = s
        .commit(liveness("ra1", EventKind::ConnectionLost, 1_000), 1_000)
        .await
        .unwrap()
        .remove(0);
    s.record(vec![delivered(&lost, 2_000)], 2_000, NEVER)
        .await
        .unwrap();
    let keep = Retention {
        history_before: None,
        notifications_before: Some(10_000),
        audit_unshipped_kept: false,
    };
    s.maintain(60_000, keep).await.unwrap();
    assert!(
        s.get_notification(lost.id.clone()).await.unwrap().is_some(),
        "its alarm is open"
    );
    let id = alarm_of(s, AlarmState::Open).await[0].id.clone();
    let Acked::Taken(_, made) = s.ack_alarm(id, ack("anna"), 61_000).await.unwrap() else {
        panic!("taken");
    };
    assert_eq!(made.len(), 1, "the client told 60 s ago hears of it");

    s.commit(
        liveness("ra1", EventKind::ConnectionRestored, 62_000),
        62_000,
    )
    .await
    .unwrap();
    s.maintain(63_000, keep).await.unwrap();
    assert!(
        s.get_notification(lost.id.clone()).await.unwrap().is_none(),
        "resolved: it goes at its time"
    );
}
