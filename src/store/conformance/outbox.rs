//! Checks of the outbox: claims, leases, recorded attempts and retries.

use super::*;

pub(super) async fn claim_reads_registry_and_cancels_orphans(s: &dyn Store) {
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

pub(super) async fn record_and_retry(s: &dyn Store) {
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

pub(super) async fn leases_exclude_other_nodes(s: &dyn Store) {
    s.create_sensor(sensor("ls1")).await.unwrap();
    s.create_client(client("ls-a", "http://a/")).await.unwrap();
    s.link("ls-a".into(), sid("ls1"), 1).await.unwrap();
    let n = s
        .commit(change("ls1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let first = s
        .claim(vec![n.id.clone()], "node-1".into(), 100, 10_000)
        .await
        .unwrap();
    assert!(matches!(first[0], Claim::Send(_)));
    let second = s
        .claim(vec![n.id.clone()], "node-2".into(), 200, 10_200)
        .await
        .unwrap();
    assert_eq!(
        second[0],
        Claim::Leased {
            id: n.id.clone(),
            until: 10_000
        }
    );
    // Once the lease ran out, another node takes over.
    let third = s
        .claim(vec![n.id.clone()], "node-2".into(), 10_001, 20_000)
        .await
        .unwrap();
    assert!(matches!(third[0], Claim::Send(_)));
}
