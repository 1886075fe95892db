//! Checks of retention: what upkeep deletes, and what it must keep.

use super::*;

/// Every reading of a sensor, oldest first.
async fn readings(s: &dyn Store, id: &str) -> Vec<i64> {
    let mut out = Vec::new();
    let mut req = page(1000);
    loop {
        let p = s
            .list_readings(sid(id), TimeRange::default(), req.clone())
            .await
            .unwrap();
        out.extend(p.items.iter().map(|r| r.row.ts));
        match p.next {
            Some(n) => req.after = Some(n),
            None => return out,
        }
    }
}

async fn event_times(s: &dyn Store, id: &str) -> Vec<i64> {
    s.list_events(sid(id), TimeRange::default(), page(1000))
        .await
        .unwrap()
        .items
        .iter()
        .map(|e| e.row.at)
        .collect()
}

/// `n` readings of `id` from `from` on, a millisecond apart.
fn burst(id: &str, from: Millis, n: i64) -> CommitBatch {
    CommitBatch {
        readings: (0..n)
            .map(|i| ReadingRecord {
                sensor_id: sid(id),
                data: i % 2 == 0,
                ts: from + i,
                received_at: from + i,
                late: false,
                signals: Default::default(),
            })
            .collect(),
        ..Default::default()
    }
}

pub(super) async fn history_goes_at_its_time_and_no_sooner(s: &Subject) {
    let now = now_ms();
    let old = 1_000_000;
    for id in ["rt1", "rt2", "rt3"] {
        s.create_sensor(sensor(id)).await.unwrap();
    }
    // rt1: more old readings than one step deletes, an old change, and new ones;
    // rt2: only new ones; rt3: only old ones.
    s.commit(burst("rt1", old, 2_500), now).await.unwrap();
    s.commit(change("rt1", true, None, old + 5_000), now)
        .await
        .unwrap();
    s.commit(burst("rt3", old + 10_000, 3), now).await.unwrap();
    s.commit(change("rt1", false, Some(true), now - 1_000), now)
        .await
        .unwrap();
    s.commit(change("rt2", true, None, now - 500), now)
        .await
        .unwrap();
    if let Some(journal) = &s.journal {
        journal.archive_history(1_000_000).await.unwrap();
    }
    assert_eq!(s.history_from().await.unwrap(), Some(old));

    let kept = s.maintain(now, Retention::default()).await.unwrap();
    assert!(
        kept.is_empty(),
        "nothing to delete without a cut-off: {kept:?}"
    );
    assert_eq!(readings(&**s, "rt1").await.len(), 2_502);

    let pruned = s
        .maintain(
            now,
            Retention {
                history_before: Some(now - 86_400_000),
                notifications_before: None,
                audit_unshipped_kept: false,
            },
        )
        .await
        .unwrap();
    let left = readings(&**s, "rt1").await;
    assert!(
        left == [now - 1_000],
        "{} left, from {:?}",
        left.len(),
        left.first()
    );
    assert_eq!(event_times(&**s, "rt1").await, [now - 1_000]);
    assert_eq!(readings(&**s, "rt2").await, [now - 500]);
    assert_eq!(readings(&**s, "rt3").await.len(), 0);
    // PostgreSQL drops whole months; these rows were in none (its default partition).
    assert_eq!((pruned.readings, pruned.events), (2_504, 1), "{pruned:?}");
    assert_eq!(s.history_from().await.unwrap(), Some(now - 1_000));
}

pub(super) async fn finished_notifications_go_pending_ones_stay(s: &Subject) {
    s.create_sensor(sensor("rn1")).await.unwrap();
    s.create_sensor(sensor("rn2")).await.unwrap();
    s.create_client(client("rn-a", "http://a/")).await.unwrap();
    s.link("rn-a".into(), sid("rn1"), 1).await.unwrap();
    s.link("rn-a".into(), sid("rn2"), 1).await.unwrap();
    // Made at 1 s: one delivered at 2 s, one left pending (its client is down).
    let done = s
        .commit(change("rn1", true, None, 1_000), 1_000)
        .await
        .unwrap()
        .remove(0);
    let waiting = s
        .commit(change("rn2", true, None, 1_000), 1_000)
        .await
        .unwrap()
        .remove(0);
    let attempt = |id: &str, code| Attempt {
        notification_id: id.into(),
        at: 2_000,
        status_code: Some(code),
        error: None,
        duration_ms: 3,
    };
    let outcome = |n: &NotificationRef, code, verdict| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(attempt(&n.id, code)),
        attempts: 1,
        verdict,
        node: "n1".into(),
        batch_id: None,
    };
    s.record(
        vec![
            outcome(&done, 200, Verdict::Delivered),
            outcome(&waiting, 500, Verdict::Retry { next_at: 10_000 }),
        ],
        2_000,
        NEVER,
    )
    .await
    .unwrap();
    // Made after the cut-off: kept, delivered or not.
    let recent = s
        .commit(change("rn1", false, Some(true), 50_000), 50_000)
        .await
        .unwrap()
        .remove(0);
    s.record(
        vec![outcome(&recent, 200, Verdict::Delivered)],
        50_000,
        NEVER,
    )
    .await
    .unwrap();

    let pruned = s
        .maintain(
            60_000,
            Retention {
                history_before: None,
                notifications_before: Some(10_000),
                audit_unshipped_kept: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (pruned.notifications, pruned.attempts),
        (1, 1),
        "{pruned:?}"
    );
    assert!(s.get_notification(done.id.clone()).await.unwrap().is_none());
    let (w, attempts) = s
        .get_notification(waiting.id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((w.status, attempts.len()), (Status::Pending, 1));
    assert!(
        s.get_notification(recent.id.clone())
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(s.count_pending().await.unwrap(), 1);
    // The history of the sensors is not the notifications': it stays.
    assert_eq!(event_times(&**s, "rn1").await, [1_000, 50_000]);
}

/// A delivered state outranks an older state of its lane still pending (a node sent the
/// newer one while the older was out with another node): retention keeps it until the
/// older one is settled, or the older one's claim on a shared store, no longer seeing a
/// newer state, would send it after the newer one.
pub(super) async fn a_delivered_state_stays_while_an_older_one_of_its_lane_waits(s: &Subject) {
    s.create_sensor(sensor("rk1")).await.unwrap();
    s.create_client(client("rk-a", "http://a/")).await.unwrap();
    s.link("rk-a".into(), sid("rk1"), 1).await.unwrap();
    let older = s
        .commit(change("rk1", true, None, 1_000), 1_000)
        .await
        .unwrap()
        .remove(0);
    // Out with node a (a lease the commit of the next state does not supersede).
    s.claim(
        vec![older.id.clone()],
        "a".into(),
        1_000,
        now_ms() + 600_000,
        None,
    )
    .await
    .unwrap();
    let newer = s
        .commit(change("rk1", false, Some(true), 2_000), 2_000)
        .await
        .unwrap()
        .remove(0);
    let outcome = |n: &NotificationRef, node: &str, verdict| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at: 3_000,
            status_code: Some(if verdict == Verdict::Delivered {
                200
            } else {
                500
            }),
            error: None,
            duration_ms: 3,
        }),
        attempts: 1,
        verdict,
        node: node.into(),
        batch_id: None,
    };
    s.record(vec![outcome(&newer, "b", Verdict::Delivered)], 3_000, NEVER)
        .await
        .unwrap();
    s.record(
        vec![outcome(&older, "a", Verdict::Retry { next_at: 4_000 })],
        3_500,
        NEVER,
    )
    .await
    .unwrap();
    let cut = Retention {
        history_before: None,
        notifications_before: Some(10_000),
        audit_unshipped_kept: false,
    };
    let pruned = s.maintain(60_000, cut).await.unwrap();
    assert_eq!(pruned.notifications, 0, "{pruned:?}");
    assert!(
        s.get_notification(newer.id.clone())
            .await
            .unwrap()
            .is_some()
    );
    if s.cluster.is_none() {
        // One node: its lanes keep the order, and a claim does not read the lane's rest.
        return;
    }
    match &s
        .claim(vec![older.id.clone()], "b".into(), 5_000, 16_000, None)
        .await
        .unwrap()[0]
    {
        Claim::Done { status, .. } => assert_eq!(*status, Status::Superseded),
        other => panic!("the older state must not go after the newer one: {other:?}"),
    }
    // Settled: both go at the next round.
    let pruned = s.maintain(60_000, cut).await.unwrap();
    assert_eq!(pruned.notifications, 2, "{pruned:?}");
}

/// A delivered notification outranks an older one of its lane that failed: a manual retry
/// of that one is refused while the newer is stored (`policy::retry_refusal`). Retention
/// keeps the newer while the older failed one is kept (here it failed after the cut-off; an
/// open alarm keeps one longer still), or the retry would tell the client an outdated state
/// after a newer one. Once the older one goes, so does the newer.
pub(super) async fn a_delivered_notification_stays_while_an_older_failed_one_it_outranks_does(
    s: &Subject,
) {
    s.create_sensor(sensor("rf1")).await.unwrap();
    s.create_sensor(sensor("rf2")).await.unwrap();
    s.create_client(client("rf-a", "http://a/")).await.unwrap();
    s.link("rf-a".into(), sid("rf1"), 1).await.unwrap();
    s.link("rf-a".into(), sid("rf2"), 1).await.unwrap();
    let outcome = |n: &NotificationRef, node: &str, at, verdict| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at,
            status_code: Some(if verdict == Verdict::Delivered {
                200
            } else {
                500
            }),
            error: None,
            duration_ms: 3,
        }),
        attempts: 1,
        verdict,
        node: node.into(),
        batch_id: None,
    };
    // Each lane: the older one out with node a (a lease the newer one's commit does not
    // supersede), the newer delivered by node b, then the older one failed at 12 s.
    let mut lanes = Vec::new();
    for (id, older, newer) in [
        (
            "rf1",
            change("rf1", true, None, 1_000),
            change("rf1", false, Some(true), 2_000),
        ),
        (
            "rf2",
            liveness("rf2", EventKind::ConnectionLost, 1_000),
            liveness("rf2", EventKind::ConnectionRestored, 2_000),
        ),
    ] {
        let older = s.commit(older, 1_000).await.unwrap().remove(0);
        s.claim(
            vec![older.id.clone()],
            "a".into(),
            1_000,
            now_ms() + 600_000,
            None,
        )
        .await
        .unwrap();
        let newer = s.commit(newer, 2_000).await.unwrap().remove(0);
        assert_eq!(newer.sensor_id, sid(id));
        s.record(
            vec![outcome(&newer, "b", 3_000, Verdict::Delivered)],
            3_000,
            NEVER,
        )
        .await
        .unwrap();
        s.record(
            vec![outcome(&older, "a", 12_000, Verdict::Failed)],
            12_000,
            NEVER,
        )
        .await
        .unwrap();
        lanes.push((older, newer));
    }
    let stored = |id: String| async move { s.get_notification(id).await.unwrap().map(|(n, _)| n) };
    let cut = |before| Retention {
        history_before: None,
        notifications_before: Some(before),
        audit_unshipped_kept: false,
    };

    let pruned = s.maintain(60_000, cut(10_000)).await.unwrap();
    assert_eq!(pruned.notifications, 0, "{pruned:?}");
    for (older, newer) in &lanes {
        let n = stored(newer.id.clone()).await;
        assert!(
            n.is_some(),
            "{:?}: kept while the older failed one is",
            newer.kind
        );
        assert_eq!(
            stored(older.id.clone()).await.map(|n| n.status),
            Some(Status::Failed)
        );
        assert!(
            matches!(
                s.retry_notification(older.id.clone(), 61_000).await,
                Err(Error::Conflict(_))
            ),
            "{:?}: the older one must not go after the newer one",
            older.kind
        );
    }

    // Past the older ones' failure: they go, and the newer ones with them or at the next
    // round (a backend may read the lane as it was when the round began).
    s.maintain(62_000, cut(20_000)).await.unwrap();
    for (older, _) in &lanes {
        assert!(stored(older.id.clone()).await.is_none());
    }
    s.maintain(63_000, cut(20_000)).await.unwrap();
    for (_, newer) in &lanes {
        assert!(stored(newer.id.clone()).await.is_none());
    }
}

/// Attempts ship past a mark of the last id shipped: once retention has deleted every
/// attempt (a quiet month, a disabled client), the next attempt must still get an id
/// above that mark, or it never reaches ClickHouse while the spool says nothing waits.
pub(super) async fn attempts_made_after_retention_emptied_them_still_ship(s: &Subject) {
    s.create_sensor(sensor("ra1")).await.unwrap();
    s.create_client(client("ra-a", "http://a/")).await.unwrap();
    s.link("ra-a".into(), sid("ra1"), 1).await.unwrap();
    for (i, at) in [1_000, 3_000].into_iter().enumerate() {
        let n = s
            .commit(change("ra1", i == 0, None, at), at)
            .await
            .unwrap()
            .remove(0);
        s.record(vec![delivered(&n, at + 500)], at + 500, NEVER)
            .await
            .unwrap();
    }
    let sink = Collect::default();
    s.ship_history(100_000, &sink).await.unwrap();
    let shipped: Vec<i64> = sink
        .got
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b.attempts.iter().map(|a| a.id))
        .collect();
    assert_eq!(shipped.len(), 2, "both attempts shipped");
    let pruned = s
        .maintain(
            60_000,
            Retention {
                history_before: None,
                notifications_before: Some(10_000),
                audit_unshipped_kept: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(pruned.attempts, 2, "every attempt is gone: {pruned:?}");

    let n = s
        .commit(change("ra1", true, Some(false), 70_000), 70_000)
        .await
        .unwrap()
        .remove(0);
    s.record(vec![delivered(&n, 70_500)], 70_500, NEVER)
        .await
        .unwrap();
    assert_eq!(
        s.spool_depth().await.unwrap(),
        3,
        "the new reading, event and attempt wait"
    );
    let sink = Collect::default();
    s.ship_history(100_000, &sink).await.unwrap();
    let fresh: Vec<(i64, String)> = sink
        .got
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| {
            b.attempts
                .iter()
                .map(|a| (a.id, a.attempt.notification_id.clone()))
        })
        .collect();
    assert_eq!(fresh.len(), 1, "the new attempt ships: {fresh:?}");
    assert_eq!(fresh[0].1, n.id);
    assert!(
        shipped.iter().all(|&old| fresh[0].0 > old),
        "its id {} is above every id shipped before ({shipped:?})",
        fresh[0].0
    );
}
