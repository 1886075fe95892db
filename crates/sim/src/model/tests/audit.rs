//! The audit: each notification's life as the store saw it, changes out of a final status
//! found, and a run the same every time.

use latch::domain::{Attempt, NotificationRef, Outcome, Status, Verdict};
use latch::store::conformance::{change, client, sensor};
use latch::store::prelude::*;
use latch::store::{ReplayFilter, Retention};

use super::*;
use crate::model::Call;

fn answered(n: &NotificationRef, at: i64, code: u16, verdict: Verdict) -> Outcome {
    Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at,
            status_code: Some(code),
            error: None,
            duration_ms: 1,
        }),
        attempts: 1,
        verdict,
        node: "n".into(),
        batch_id: None,
    }
}

/// A sensor linked to a client, and one state notification of it.
async fn one(s: &NodeStore) -> NotificationRef {
    s.create_sensor(sensor("au1")).await.unwrap();
    s.create_client(client("au-a", "http://a/")).await.unwrap();
    s.link("au-a".into(), sid("au1"), 1).await.unwrap();
    s.commit(change("au1", true, None, 10), 10)
        .await
        .unwrap()
        .remove(0)
}

#[tokio::test]
async fn a_trail_keeps_every_status_and_attempt_even_past_retention() {
    let (model, _, s) = shared(4);
    let n = one(&s).await;
    s.record(
        vec![answered(&n, 20, 500, Verdict::Failed)],
        20,
        i64::MAX / 2,
    )
    .await
    .unwrap();
    s.retry_notification(n.id.clone(), 30).await.unwrap();
    let other = model.for_node("other");
    other
        .record(
            vec![answered(&n, 40, 200, Verdict::Delivered)],
            40,
            i64::MAX / 2,
        )
        .await
        .unwrap();
    let pruned = s
        .maintain(
            START,
            Retention {
                history_before: None,
                notifications_before: Some(START),
                audit_unshipped_kept: false,
            },
        )
        .await
        .unwrap();
    assert_eq!((pruned.notifications, pruned.attempts), (1, 2));
    assert!(model.read(|t| t.notification(&n.id).is_none()), "deleted");
    let trail = model.read(|t| t.audit().trail(&n.id).cloned()).unwrap();
    let life: Vec<(Status, &str, &str)> = trail
        .changes
        .iter()
        .map(|c| (c.to, c.op, &*c.node))
        .collect();
    assert_eq!(
        life,
        [
            (Status::Failed, "record", "n"),
            (Status::Pending, "retry_notification", "n"),
            (Status::Delivered, "record", "other"),
        ]
    );
    assert_eq!(trail.status, Status::Delivered);
    assert_eq!(trail.attempts.len(), 2);
    assert_eq!(trail.deleted_at, Some(START));
    assert_eq!(&*trail.created_by, "n");
    assert!(
        model.violations().is_empty(),
        "a retry of a failed one is allowed"
    );
    let readings = model.read(|t| t.audit().readings().len());
    assert_eq!(readings, 1, "every reading committed");
}

/// Leaving a final status is never done by the store's own calls; should one do it, the
/// audit names it.
#[tokio::test]
async fn a_change_out_of_a_final_status_is_a_violation() {
    let (model, _, s) = shared(4);
    let n = one(&s).await;
    s.record(
        vec![answered(&n, 20, 200, Verdict::Delivered)],
        20,
        i64::MAX / 2,
    )
    .await
    .unwrap();
    // A retry of a delivered one is refused, and changes nothing.
    assert!(s.retry_notification(n.id.clone(), 30).await.is_err());
    let all = ReplayFilter {
        client_id: "au-a".into(),
        sensor_id: None,
        since: None,
    };
    assert!(s.retry_notifications(all, 30).await.unwrap().is_empty());
    assert!(model.violations().is_empty());
    let call = Call {
        node: "rogue".into(),
        op: "record",
        writes: true,
    };
    model
        .apply(&call, |t, cx| {
            let seq = t.seq(&n.id).unwrap();
            t.set_status(cx, seq, Status::Superseded, cx.now);
            Ok(())
        })
        .unwrap();
    let v = model.violations();
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0].change.from, v[0].change.to),
        (Status::Delivered, Status::Superseded)
    );
    assert_eq!((v[0].change.op, &*v[0].change.node), ("record", "rogue"));
    assert!(v[0].to_string().contains(&n.id));
}

/// The same calls at the same times give the same store: ids, seqs and trails.
#[tokio::test]
async fn a_run_is_the_same_every_time() {
    async fn run() -> Vec<(String, i64, Status)> {
        let (model, clock, s) = shared(4);
        one(&s).await;
        for i in 0..5 {
            clock.advance(Duration::from_millis(7));
            let at = 100 + i;
            s.commit(change("au1", i % 2 == 0, None, at), at)
                .await
                .unwrap();
        }
        model.read(|t| {
            t.audit()
                .trails()
                .map(|tr| (tr.id.clone(), tr.seq, tr.status))
                .collect()
        })
    }
    let first = run().await;
    assert_eq!(first.len(), 6);
    assert_eq!(first, run().await);
    let ids: std::collections::BTreeSet<&String> = first.iter().map(|(id, ..)| id).collect();
    assert_eq!(ids.len(), 6, "unique");
}
