//! Escalation: an alarm's notification delivered to a client with an `escalation` starts a
//! timer; the round takes it once, past its time, and sends `alarm.escalated` to the next
//! client while the alarm is open and not acknowledged; that client hears of the
//! acknowledgement and, once the alarm resolves, of its end in its own lane.

use super::*;
use crate::domain::escalation::Escalation;
use crate::store::rules::alarms::{Ack, Acked};

const NEVER: Millis = i64::MAX / 4;

pub(super) async fn an_alarm_nobody_takes_escalates_once_and_the_next_client_hears_its_end(
    s: &Subject,
) {
    s.create_sensor(sensor("es1")).await.unwrap();
    s.create_client(client("esnext", "http://127.0.0.1:9/h"))
        .await
        .unwrap();
    s.create_client(Client {
        escalation: Some(Escalation {
            after_s: 60,
            to: "esnext".into(),
        }),
        ..client("esdesk", "http://127.0.0.1:9/h")
    })
    .await
    .unwrap();
    s.link("esdesk".into(), sid("es1"), 1).await.unwrap();
    let lost = s
        .commit(liveness("es1", EventKind::ConnectionLost, 1_000), 1_000)
        .await
        .unwrap()
        .remove(0);
    assert!(
        s.escalate(500_000).await.unwrap().is_empty(),
        "no timer before an outcome"
    );
    s.record(vec![delivered(&lost, 2_000)], 2_000, NEVER)
        .await
        .unwrap();
    assert!(
        s.escalate(61_999).await.unwrap().is_empty(),
        "not before after_s from the delivery"
    );
    let up = s.escalate(62_000).await.unwrap();
    assert_eq!(up.len(), 1, "{up:?}");
    assert_eq!(
        (up[0].kind, up[0].client_id.as_str(), up[0].sensor_id),
        (EventKind::AlarmEscalated, "esnext", sid("es1"))
    );
    assert!(s.escalate(63_000).await.unwrap().is_empty(), "made once");
    let (n, _) = s.get_notification(up[0].id.clone()).await.unwrap().unwrap();
    let alarm = lost_alarm(s, &lost).await;
    assert_eq!(n.alarm_id.as_deref(), Some(alarm.as_str()));
    let body: serde_json::Value = serde_json::from_str(n.body.as_deref().unwrap()).unwrap();
    assert_eq!(
        (&body["alarm"]["id"], &body["level"], &body["from"]),
        (
            &serde_json::json!(alarm),
            &serde_json::json!(1),
            &serde_json::json!("esdesk")
        )
    );
    // The next client, not linked, is told of the acknowledgement.
    let ack = Ack {
        by: "manager".into(),
        note: None,
    };
    let Acked::Taken(_, told) = s.ack_alarm(alarm.clone(), ack, 70_000).await.unwrap() else {
        panic!("taken")
    };
    let mut to: Vec<&str> = told.iter().map(|n| n.client_id.as_str()).collect();
    to.sort();
    assert_eq!(to, ["esdesk", "esnext"]);
    // Its end: the restore goes to the linked desk; the round tells the next client.
    let back = s
        .commit(
            liveness("es1", EventKind::ConnectionRestored, 80_000),
            80_000,
        )
        .await
        .unwrap();
    assert_eq!(back.len(), 1);
    let end = s.escalate(81_000).await.unwrap();
    assert_eq!(end.len(), 1, "{end:?}");
    assert_eq!(
        (end[0].kind, end[0].client_id.as_str()),
        (EventKind::ConnectionRestored, "esnext")
    );
    assert!(s.escalate(82_000).await.unwrap().is_empty(), "told once");
}

pub(super) async fn an_alarm_taken_before_its_time_escalates_to_nobody(s: &Subject) {
    s.create_sensor(sensor("es2")).await.unwrap();
    s.create_client(client("es2next", "http://127.0.0.1:9/h"))
        .await
        .unwrap();
    s.create_client(Client {
        escalation: Some(Escalation {
            after_s: 10,
            to: "es2next".into(),
        }),
        ..client("es2desk", "http://127.0.0.1:9/h")
    })
    .await
    .unwrap();
    s.link("es2desk".into(), sid("es2"), 1).await.unwrap();
    let lost = s
        .commit(liveness("es2", EventKind::ConnectionLost, 1_000), 1_000)
        .await
        .unwrap()
        .remove(0);
    s.record(vec![delivered(&lost, 2_000)], 2_000, NEVER)
        .await
        .unwrap();
    let alarm = lost_alarm(s, &lost).await;
    let ack = Ack {
        by: "desk".into(),
        note: None,
    };
    s.ack_alarm(alarm, ack, 5_000).await.unwrap();
    assert!(s.escalate(100_000).await.unwrap().is_empty());
    assert!(s.escalate(200_000).await.unwrap().is_empty());
}

async fn lost_alarm(s: &Subject, n: &NotificationRef) -> String {
    let (n, _) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    n.alarm_id.expect("a loss names its alarm")
}

pub(super) async fn the_end_told_to_a_client_reached_is_not_superseded_by_a_later_change(
    s: &Subject,
) {
    use crate::domain::armed::{Armed, When};
    let never = crate::domain::schedule::Schedule::parse(serde_json::json!({
        "id": "closed", "name": "Closed", "tz": "UTC", "weekly": []
    }))
    .unwrap();
    s.create_schedule(StoredSchedule {
        schedule: never,
        created_at: 1,
        updated_at: 1,
    })
    .await
    .unwrap();
    s.create_sensor(Sensor {
        armed: Some(Armed {
            schedule_id: "closed".into(),
            data: 1,
            when: When::Outside,
        }),
        ..sensor("es3")
    })
    .await
    .unwrap();
    s.create_client(client("es3next", "http://127.0.0.1:9/h"))
        .await
        .unwrap();
    s.create_client(Client {
        escalation: Some(Escalation {
            after_s: 1,
            to: "es3next".into(),
        }),
        ..client("es3desk", "http://127.0.0.1:9/h")
    })
    .await
    .unwrap();
    s.link("es3desk".into(), sid("es3"), 1).await.unwrap();
    let opened = s
        .commit(change("es3", true, None, 1_000), 1_000)
        .await
        .unwrap();
    let out = opened
        .iter()
        .find(|n| n.kind == EventKind::StateOutOfSchedule)
        .expect("out of schedule");
    s.record(vec![delivered(out, 2_000)], 2_000, NEVER)
        .await
        .unwrap();
    assert_eq!(s.escalate(3_000).await.unwrap().len(), 1);
    // Closed: the change resolves the alarm; the round tells the next client of it.
    s.commit(change("es3", false, Some(true), 4_000), 4_000)
        .await
        .unwrap();
    let end = s.escalate(5_000).await.unwrap();
    assert_eq!(
        end.iter().map(|n| n.kind).collect::<Vec<_>>(),
        [EventKind::StateChanged]
    );
    // Opened again before the end went out: the next client, not linked, gets no newer
    // state, so its end stays pending.
    s.commit(change("es3", true, Some(false), 6_000), 6_000)
        .await
        .unwrap();
    let (n, _) = s
        .get_notification(end[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n.status, Status::Pending);
}
