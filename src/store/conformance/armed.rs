//! Armed sensors: a change to the armed state outside the schedule is told as
//! `sensor.state_out_of_schedule` right after the `state_changed`, naming the schedule and
//! opening an `out_of_schedule` alarm, which the sensor's next change resolves; a change in
//! hours, or of a sensor not armed, tells none.

use super::*;
use crate::domain::alarm::{AlarmKind, AlarmState};
use crate::domain::armed::{Armed, When};
use crate::domain::schedule::Schedule;

/// 2026-12-01 00:00 UTC, a Tuesday.
const MIDNIGHT: Millis = 1_796_083_200_000;
const HOUR: Millis = 3_600_000;

pub(super) async fn an_armed_sensor_tells_a_change_out_of_schedule_and_its_next_change_resolves_it(
    s: &Subject,
) {
    let office = Schedule::parse(serde_json::json!({
        "id": "office", "name": "Office hours", "tz": "UTC",
        "weekly": [{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00", "to": "18:00"}]
    }))
    .unwrap();
    s.create_schedule(StoredSchedule {
        schedule: office,
        created_at: 1_000,
        updated_at: 1_000,
    })
    .await
    .unwrap();
    s.create_sensor(Sensor {
        armed: Some(Armed {
            schedule_id: "office".into(),
            data: 1,
            when: When::Outside,
        }),
        ..sensor("door1")
    })
    .await
    .unwrap();
    s.create_sensor(sensor("plain1")).await.unwrap();
    s.create_client(client("arc1", "http://127.0.0.1:9/h"))
        .await
        .unwrap();
    for id in ["door1", "plain1"] {
        s.link("arc1".into(), sid(id), 1).await.unwrap();
    }
    // In office hours (10:00): only the change.
    let day = s
        .commit(change("door1", true, None, MIDNIGHT + 10 * HOUR), MIDNIGHT)
        .await
        .unwrap();
    let kinds = |made: &[NotificationRef]| made.iter().map(|n| n.kind).collect::<Vec<_>>();
    assert_eq!(kinds(&day), [EventKind::StateChanged]);
    s.commit(
        change("door1", false, Some(true), MIDNIGHT + 11 * HOUR),
        MIDNIGHT,
    )
    .await
    .unwrap();
    // At 02:00 the next night, the door and a sensor not armed open.
    let night = MIDNIGHT + 26 * HOUR;
    let mut batch = change("door1", true, Some(false), night);
    let other = change("plain1", true, None, night);
    batch.readings.extend(other.readings);
    batch.states.extend(other.states);
    batch.events.extend(other.events);
    let made = s.commit(batch, night).await.unwrap();
    assert_eq!(
        kinds(&made),
        [
            EventKind::StateChanged,
            EventKind::StateOutOfSchedule,
            EventKind::StateChanged
        ],
        "the out-of-schedule right after its change, none for the sensor not armed"
    );
    let (n, _) = s
        .get_notification(made[1].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.data, Some(true));
    assert_eq!(
        n.body.as_deref(),
        Some(r#"{"id":"office","name":"Office hours"}"#)
    );
    let alarm = n.alarm_id.clone().expect("it names its alarm");
    let (a, _) = s.get_alarm(alarm.clone()).await.unwrap().unwrap();
    assert_eq!(
        (a.kind, a.state, a.sensor_id, a.opened_at),
        (
            AlarmKind::OutOfSchedule,
            AlarmState::Open,
            Some(sid("door1")),
            night
        )
    );
    // The door closes: its change resolves the alarm and names it.
    let closed = s
        .commit(
            change("door1", false, Some(true), night + HOUR),
            night + HOUR,
        )
        .await
        .unwrap();
    assert_eq!(kinds(&closed), [EventKind::StateChanged]);
    let (n, _) = s
        .get_notification(closed[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.alarm_id.as_deref(), Some(alarm.as_str()));
    let (a, ids) = s.get_alarm(alarm).await.unwrap().unwrap();
    assert_eq!(
        (a.state, a.resolved_at),
        (AlarmState::Resolved, Some(night + HOUR))
    );
    assert_eq!(
        ids.len(),
        2,
        "the out-of-schedule and the change that closed it"
    );
}

pub(super) async fn a_disarmed_sensors_next_change_still_resolves_its_alarm(s: &Subject) {
    let always = Schedule::parse(serde_json::json!({
        "id": "never", "name": "Never open", "tz": "UTC", "weekly": []
    }))
    .unwrap();
    s.create_schedule(StoredSchedule {
        schedule: always,
        created_at: 1_000,
        updated_at: 1_000,
    })
    .await
    .unwrap();
    let armed = Armed {
        schedule_id: "never".into(),
        data: 1,
        when: When::Outside,
    };
    s.create_sensor(Sensor {
        armed: Some(armed),
        ..sensor("door2")
    })
    .await
    .unwrap();
    s.commit(change("door2", true, None, 5_000), 5_000)
        .await
        .unwrap();
    let open = s
        .list_alarms(AlarmFilter::default(), page(10))
        .await
        .unwrap()
        .items;
    assert_eq!(open.len(), 1, "opened with no client told");
    s.replace_sensor(
        sid("door2"),
        "address of door2".into(),
        None,
        None,
        None,
        crate::domain::sensor::SensorAlarms::default(),
        6_000,
    )
    .await
    .unwrap()
    .unwrap();
    let (view, _) = s.get_sensor(sid("door2")).await.unwrap().unwrap();
    assert_eq!(view.armed, None, "disarmed");
    s.commit(change("door2", false, Some(true), 7_000), 7_000)
        .await
        .unwrap();
    let (a, _) = s.get_alarm(open[0].id.clone()).await.unwrap().unwrap();
    assert_eq!(a.resolved_at, Some(7_000));
}
