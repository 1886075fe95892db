//! Checks of the outbox: claims, leases, recorded attempts and retries.

use super::*;

pub(super) async fn claim_reads_registry_and_cancels_orphans(s: &Subject) {
    s.create_sensor(sensor("cl1")).await.unwrap();
    s.create_client(client("cl-a", "http://old/"))
        .await
        .unwrap();
    s.create_client(client("cl-b", "http://b/")).await.unwrap();
    s.link("cl-a".into(), sid("cl1"), 1).await.unwrap();
    s.link("cl-b".into(), sid("cl1"), 1).await.unwrap();
    let created = s.commit(change("cl1", true, None, 1), 1).await.unwrap();
    // The URL changes after the notification was written; the claim sees the new one.
    let mut a = s.get_client("cl-a".into()).await.unwrap().unwrap();
    a.url = "http://new/".into();
    s.replace_client(a).await.unwrap();
    s.unlink("cl-b".into(), sid("cl1")).await.unwrap();
    let now = now_ms();
    let claims = s
        .claim(
            created.iter().map(|c| c.id.clone()).collect(),
            "n1".into(),
            now,
            now + 60_000,
            None,
        )
        .await
        .unwrap();
    match &claims[0] {
        Claim::Send(x) => {
            assert_eq!(x.url, "http://new/");
            assert_eq!(x.address, "address of cl1");
            assert_eq!(x.notification.data, Some(true));
        }
        other => panic!("expected a send, got {other:?}"),
    }
    assert_eq!(
        claims[1],
        Claim::Done {
            id: created[1].id.clone(),
            status: Status::Cancelled
        }
    );
    assert_eq!(
        s.get_notification(created[1].id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Cancelled
    );
    // A leased head in flight is not superseded by a newer change.
    s.commit(change("cl1", false, Some(true), 2), 2)
        .await
        .unwrap();
    assert_eq!(
        s.get_notification(created[0].id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Pending
    );
}

pub(super) async fn record_and_retry(s: &Subject) {
    s.create_sensor(sensor("rc1")).await.unwrap();
    s.create_client(client("rc-a", "http://a/")).await.unwrap();
    s.link("rc-a".into(), sid("rc1"), 1).await.unwrap();
    let n = s
        .commit(change("rc1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let attempt = |code: Option<u16>| {
        Some(Attempt {
            notification_id: n.id.clone(),
            at: 5,
            status_code: code,
            error: code.is_none().then(|| "connection refused".to_string()),
            duration_ms: 3,
        })
    };
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            client_id: n.client_id.clone(),
            attempt: attempt(None),
            attempts: 1,
            verdict: Verdict::Retry { next_at: 99 },
            node: "n1".into(),
            batch_id: None,
        }],
        5,
        NEVER,
    )
    .await
    .unwrap();
    let (got, attempts) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(
        (got.status, got.attempts, got.next_attempt_at),
        (Status::Pending, 1, Some(99))
    );
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].error.as_deref(), Some("connection refused"));
    assert!(matches!(
        s.retry_notification(n.id.clone(), 6).await,
        Err(Error::Conflict(_))
    ));
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            client_id: n.client_id.clone(),
            attempt: attempt(Some(500)),
            attempts: 2,
            verdict: Verdict::Failed,
            node: "n1".into(),
            batch_id: None,
        }],
        7,
        NEVER,
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_notification(n.id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Failed
    );
    let again = s.retry_notification(n.id.clone(), 8).await.unwrap();
    assert_eq!((again.attempts, again.due_at), (0, 8));
    let (got, attempts) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(got.status, Status::Pending);
    assert_eq!(attempts.len(), 2, "the attempt log keeps every round");
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            client_id: n.client_id.clone(),
            attempt: attempt(Some(200)),
            attempts: 1,
            verdict: Verdict::Delivered,
            node: "n1".into(),
            batch_id: None,
        }],
        9,
        NEVER,
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_notification(n.id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Delivered
    );
    assert!(matches!(
        s.retry_notification("missing".into(), 1).await,
        Err(Error::NotFound(_))
    ));

    // A failed state notification cannot be replayed once a newer state went out.
    let old = s
        .commit(change("rc1", false, Some(true), 10), 10)
        .await
        .unwrap()
        .remove(0);
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            client_id: n.client_id.clone(),
            attempt: attempt(Some(500)),
            attempts: 10,
            verdict: Verdict::Failed,
            node: "n1".into(),
            batch_id: None,
        }]
        .into_iter()
        .map(|mut o| {
            o.notification_id = old.id.clone();
            o
        })
        .collect(),
        11,
        NEVER,
    )
    .await
    .unwrap();
    s.commit(change("rc1", true, Some(false), 12), 12)
        .await
        .unwrap();
    assert!(matches!(
        s.retry_notification(old.id.clone(), 13).await,
        Err(Error::Conflict(_))
    ));
}

/// A lease these checks let run out: PostgreSQL judges outbox leases by the database's
/// clock, not by the `now` a check passes, so a check waits for it rather than moving its
/// `now` past it (the embedded store, one node, judges by `now`: the check moves both).
const LEASE: Millis = 500;

async fn lease_runs_out() {
    tokio::time::sleep(std::time::Duration::from_millis(LEASE as u64 + 100)).await;
}

pub(super) async fn leases_exclude_other_nodes(s: &Subject) {
    s.create_sensor(sensor("ls1")).await.unwrap();
    s.create_client(client("ls-a", "http://a/")).await.unwrap();
    s.link("ls-a".into(), sid("ls1"), 1).await.unwrap();
    let n = s
        .commit(change("ls1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let first = s
        .claim(vec![n.id.clone()], "node-1".into(), 100, 100 + LEASE, None)
        .await
        .unwrap();
    assert!(matches!(first[0], Claim::Send(_)));
    let second = s
        .claim(vec![n.id.clone()], "node-2".into(), 200, 200 + LEASE, None)
        .await
        .unwrap();
    match &second[0] {
        Claim::Leased { id, until } => assert!(id == &n.id && *until > 200, "{until}"),
        other => panic!("expected node-1's lease: {other:?}"),
    }
    // Once the lease ran out, another node takes over.
    lease_runs_out().await;
    let third = s
        .claim(
            vec![n.id.clone()],
            "node-2".into(),
            101 + LEASE,
            20_000,
            None,
        )
        .await
        .unwrap();
    assert!(matches!(third[0], Claim::Send(_)));
}

/// An outcome without a delivery never writes over a notification another node holds a
/// live lease on: that node's attempt is in flight (around a partition move) and its
/// outcome is the one kept. A delivery is written whoever holds it: it happened.
/// A lease given back unsent is written over this node's own lease only: written late,
/// after the notification was claimed again and a retry recorded (a 429's `Retry-After`),
/// it would make it due at once (simulation seed 1970516).
pub(super) async fn a_lease_given_back_late_keeps_anothers_retry_time(s: &Subject) {
    s.create_sensor(sensor("gb1")).await.unwrap();
    s.create_client(client("gb-a", "http://a/")).await.unwrap();
    s.link("gb-a".into(), sid("gb1"), 1).await.unwrap();
    let n = s
        .commit(change("gb1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let claim =
        |node: &str, now: Millis| s.claim(vec![n.id.clone()], node.into(), now, now + 10_000, None);
    let outcome = |node: &str, verdict, attempt: Option<Attempt>, attempts| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt,
        attempts,
        verdict,
        node: node.into(),
        batch_id: None,
    };
    // Node A claims it, is answered 429, and records a retry 2 s on.
    assert!(matches!(
        claim("node-a", 100).await.unwrap()[0],
        Claim::Send(_)
    ));
    let throttled = Attempt {
        notification_id: n.id.clone(),
        at: 200,
        status_code: Some(429),
        error: None,
        duration_ms: 5,
    };
    let retry = Verdict::Retry { next_at: 2_205 };
    s.record(
        vec![outcome("node-a", retry, Some(throttled), 1)],
        205,
        NEVER,
    )
    .await
    .unwrap();
    // Node B's give-back of a lease it held before, written only now: nothing is written.
    let late = outcome("node-b", Verdict::Retry { next_at: 300 }, None, 0);
    s.record(vec![late], 300, NEVER).await.unwrap();
    let got = s.get_notification(n.id.clone()).await.unwrap().unwrap().0;
    assert_eq!(
        (got.status, got.attempts, got.next_attempt_at),
        (Status::Pending, 1, Some(2_205)),
        "A's retry time stands"
    );
    assert!(
        matches!(
            claim("node-b", 1_000).await.unwrap()[0],
            Claim::Later { .. }
        ),
        "not due before it"
    );
    // A lease given back over the node's own is written: due at once.
    assert!(matches!(
        claim("node-c", 2_300).await.unwrap()[0],
        Claim::Send(_)
    ));
    let back = outcome("node-c", Verdict::Retry { next_at: 2_400 }, None, 1);
    s.record(vec![back], 2_400, NEVER).await.unwrap();
    let got = s.get_notification(n.id.clone()).await.unwrap().unwrap().0;
    assert_eq!(
        (got.attempts, got.next_attempt_at),
        (1, Some(2_400)),
        "given back"
    );
}

pub(super) async fn another_nodes_lease_is_kept_but_for_a_delivery(s: &Subject) {
    s.create_sensor(sensor("ol1")).await.unwrap();
    s.create_client(client("ol-a", "http://a/")).await.unwrap();
    s.link("ol-a".into(), sid("ol1"), 1).await.unwrap();
    let n = s
        .commit(change("ol1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let claimed = s
        .claim(vec![n.id.clone()], "node-a".into(), 100, 10_000, None)
        .await
        .unwrap();
    assert!(matches!(claimed[0], Claim::Send(_)));
    let by = |node: &str, verdict, attempt: bool| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: attempt.then(|| Attempt {
            notification_id: n.id.clone(),
            at: 200,
            status_code: Some(if verdict == Verdict::Delivered {
                204
            } else {
                500
            }),
            error: None,
            duration_ms: 6_000,
        }),
        attempts: 1,
        verdict,
        node: node.into(),
        batch_id: None,
    };
    let status = || async { s.get_notification(n.id.clone()).await.unwrap().unwrap().0 };
    // Node B superseded it in its lanes, or made an attempt of its own that failed: A's
    // lease stands.
    s.record(vec![by("node-b", Verdict::Superseded, false)], 300, NEVER)
        .await
        .unwrap();
    s.record(
        vec![by("node-b", Verdict::Retry { next_at: 400 }, true)],
        300,
        NEVER,
    )
    .await
    .unwrap();
    let got = status().await;
    assert_eq!((got.status, got.attempts), (Status::Pending, 0));
    let again = s
        .claim(vec![n.id.clone()], "node-b".into(), 500, 10_500, None)
        .await
        .unwrap();
    assert!(
        matches!(again[0], Claim::Leased { .. }),
        "still A's: {again:?}"
    );
    // A's attempt was answered 204: delivered, whichever node serves the lane now.
    s.record(vec![by("node-a", Verdict::Delivered, true)], 6_100, NEVER)
        .await
        .unwrap();
    assert_eq!(status().await.status, Status::Delivered);

    // Once a lease ran out, or on a notification leased by nobody, any node's verdict is
    // written.
    let m = s
        .commit(change("ol1", false, Some(true), 2), 2)
        .await
        .unwrap()
        .remove(0);
    s.claim(vec![m.id.clone()], "node-a".into(), 100, 100 + LEASE, None)
        .await
        .unwrap();
    lease_runs_out().await;
    let by_b = Outcome {
        notification_id: m.id.clone(),
        ..by("node-b", Verdict::Superseded, false)
    };
    s.record(vec![by_b], 101 + LEASE, NEVER).await.unwrap();
    let (got, _) = s.get_notification(m.id.clone()).await.unwrap().unwrap();
    assert_eq!(got.status, Status::Superseded);
}

/// A failed lost (or restored) is not replayed after a newer one of its lane went out:
/// the client would be told an online sensor is lost. Single and bulk replay alike.
pub(super) async fn an_older_connection_notification_is_not_replayed(s: &Subject) {
    s.create_sensor(sensor("cr1")).await.unwrap();
    s.create_client(client("cr-a", "http://a/")).await.unwrap();
    s.link("cr-a".into(), sid("cr1"), 1).await.unwrap();
    let answer = |n: &NotificationRef, verdict| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at: 5,
            status_code: Some(if verdict == Verdict::Delivered {
                200
            } else {
                500
            }),
            error: None,
            duration_ms: 1,
        }),
        attempts: 1,
        verdict,
        node: "n1".into(),
        batch_id: None,
    };
    let lost = s
        .commit(liveness("cr1", EventKind::ConnectionLost, 10), 10)
        .await
        .unwrap()
        .remove(0);
    s.record(vec![answer(&lost, Verdict::Failed)], 11, NEVER)
        .await
        .unwrap();
    // Failed, with nothing newer: it may go again.
    let again = s.retry_notification(lost.id.clone(), 12).await.unwrap();
    assert_eq!(again.id, lost.id);
    s.record(vec![answer(&lost, Verdict::Failed)], 13, NEVER)
        .await
        .unwrap();
    let restored = s
        .commit(liveness("cr1", EventKind::ConnectionRestored, 20), 20)
        .await
        .unwrap()
        .remove(0);
    // Refused while the restored waits, and once it was delivered.
    assert!(matches!(
        s.retry_notification(lost.id.clone(), 21).await,
        Err(Error::Conflict(_))
    ));
    s.record(vec![answer(&restored, Verdict::Delivered)], 22, NEVER)
        .await
        .unwrap();
    assert!(matches!(
        s.retry_notification(lost.id.clone(), 23).await,
        Err(Error::Conflict(_))
    ));
    let bulk = s
        .retry_notifications(
            ReplayFilter {
                client_id: "cr-a".into(),
                sensor_id: None,
                since: None,
            },
            24,
        )
        .await
        .unwrap();
    assert!(bulk.is_empty(), "bulk replay skips it too: {bulk:?}");
    let (n, _) = s.get_notification(lost.id.clone()).await.unwrap().unwrap();
    assert_eq!(n.status, Status::Failed);
}
