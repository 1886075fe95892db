//! The outbox on PostgreSQL, where several nodes share it: claims across nodes, leases by
//! the database's clock, the pending list, the lock order of a recording, and the leases
//! a restarted node gives back.

use super::*;

/// Two nodes' lanes may each hold part of one (client, sensor) lane around a takeover:
/// the claim keeps the order the lanes alone keep on one node.
#[tokio::test]
async fn claims_keep_a_lanes_order_across_nodes() {
    use crate::domain::{Claim, Outcome, Status, Verdict};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, schema)) = fresh().await else {
        return;
    };
    s.create_sensor(sensor("ord1")).await.unwrap();
    s.create_client(client("ord-c", "http://a/")).await.unwrap();
    s.link("ord-c".into(), sensor("ord1").id, 1).await.unwrap();
    let n1 = s
        .commit(change("ord1", true, None, 1_000), 1_000)
        .await
        .unwrap()[0]
        .clone();
    // Node A sends the first state (its lease runs to 90 s) when the sensor's partition
    // moves to node B, which commits the next state: the first, leased, is not superseded.
    let claimed = s
        .claim(vec![n1.id.clone()], "a".into(), 1_000, 90_000, None)
        .await
        .unwrap();
    assert!(matches!(claimed[0], Claim::Send(_)));
    let n2 = s
        .commit(change("ord1", false, Some(true), 2_000), 2_000)
        .await
        .unwrap()[0]
        .clone();

    // B waits for A's attempt rather than overtake it, asking again within a second (not
    // at the end of A's lease), so it goes on as soon as A records the outcome…
    match &s
        .claim(vec![n2.id.clone()], "b".into(), 2_000, 60_000, None)
        .await
        .unwrap()[0]
    {
        Claim::Later { at, .. } => assert_eq!(*at, 2_000 + crate::domain::policy::RECHECK_MS),
        other => panic!("expected to wait behind A's attempt: {other:?}"),
    }
    // …while A's own lane, which holds both in order, goes on.
    assert!(matches!(
        s.claim(vec![n2.id.clone()], "a".into(), 2_000, 60_000, None)
            .await
            .unwrap()[0],
        Claim::Send(_)
    ));
    let delivered = |n: &crate::domain::NotificationRef| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: None,
        attempts: 1,
        verdict: Verdict::Delivered,
        node: "a".into(),
        batch_id: None,
    };
    s.record(vec![delivered(&n2)], 3_000, i64::MAX / 2)
        .await
        .unwrap();
    // A died before recording the first: once its lease ran out (by the database's
    // clock, which judges leases: moved here by hand), the older state is superseded,
    // never sent after the newer one the client has.
    let (admin, conn) =
        tokio_postgres::connect(&schema_url(&base_url(), &schema), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    admin
        .execute(
            "UPDATE notifications SET lease_until = lease_until - 90000 WHERE id = $1",
            &[&n1.id],
        )
        .await
        .unwrap();
    match &s
        .claim(vec![n1.id.clone()], "b".into(), 95_000, 150_000, None)
        .await
        .unwrap()[0]
    {
        Claim::Done { status, .. } => assert_eq!(*status, Status::Superseded),
        other => panic!("expected superseded: {other:?}"),
    }
    let (n, _) = s.get_notification(n1.id.clone()).await.unwrap().unwrap();
    assert_eq!(n.status, Status::Superseded);
}

/// Outbox leases are judged by the database's clock, as partition leases are: a node
/// whose clock runs ahead (by more than the lease, here a minute) does not take over a
/// notification whose attempt another node has in flight, nor supersede it.
#[tokio::test]
async fn a_node_whose_clock_runs_ahead_leaves_a_live_lease_alone() {
    use crate::domain::{Claim, Outcome, Status, Verdict, time::now_ms};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, _)) = fresh().await else {
        return;
    };
    s.create_sensor(sensor("sk1")).await.unwrap();
    s.create_client(client("sk-c", "http://a/")).await.unwrap();
    s.link("sk-c".into(), sensor("sk1").id, 1).await.unwrap();
    let now = now_ms();
    let n = s.commit(change("sk1", true, None, now), now).await.unwrap()[0].clone();
    // Node A sends it: its lease runs 35 s.
    let lease = 35_000;
    let claimed = s
        .claim(vec![n.id.clone()], "a".into(), now, now + lease, None)
        .await
        .unwrap();
    assert!(matches!(claimed[0], Claim::Send(_)));
    // Node B, its clock a minute ahead: by that clock A's lease ran out long ago.
    let ahead = now + 60_000;
    let by_b = s
        .claim(vec![n.id.clone()], "b".into(), ahead, ahead + lease, None)
        .await
        .unwrap();
    assert!(
        matches!(by_b[0], Claim::Leased { .. }),
        "B takes over an attempt in flight: {:?}",
        by_b[0]
    );
    // B's failed attempt (or a head its lane dropped) is not written over A's.
    let failed = Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: None,
        attempts: 0,
        verdict: Verdict::Superseded,
        node: "b".into(),
        batch_id: None,
    };
    s.record(vec![failed], ahead, i64::MAX / 2).await.unwrap();
    let (stored, _) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(
        stored.status,
        Status::Pending,
        "A's attempt is the one kept"
    );
    // Nor does a newer state B commits supersede it while A's attempt is out.
    s.commit(change("sk1", false, Some(true), ahead), ahead)
        .await
        .unwrap();
    let (stored, _) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(stored.status, Status::Pending, "in flight: not superseded");
}

/// Fails unless `notifications_pending` lists exactly the pending notifications.
async fn assert_pending_listed(s: &PgStore, step: &str) {
    let c = s.db.unbounded().await.unwrap();
    let odd: i64 = c
        .query_one(
            "SELECT count(*) FROM notifications_pending p FULL JOIN \
             (SELECT seq FROM notifications WHERE status = 'pending') n USING (seq) \
             WHERE p.seq IS NULL OR n.seq IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        odd, 0,
        "after {step}: the list differs from the pending notifications"
    );
}

/// Every change of status into or out of pending keeps `notifications_pending` — which
/// claims, the commit's supersede and a restart read — the same as the outbox.
#[tokio::test]
async fn the_pending_list_follows_every_change_of_status() {
    use crate::domain::{Claim, Outcome, Status, Verdict};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, _)) = fresh().await else {
        return;
    };
    for id in ["pl1", "pl2"] {
        s.create_sensor(sensor(id)).await.unwrap();
    }
    for c in ["pl-a", "pl-b"] {
        s.create_client(client(c, "http://a/")).await.unwrap();
        for id in ["pl1", "pl2"] {
            s.link(c.into(), sensor(id).id, 1).await.unwrap();
        }
    }
    let outcome = |n: &crate::domain::NotificationRef, verdict| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: None,
        attempts: 1,
        verdict,
        node: "n".into(),
        batch_id: None,
    };
    let ids = |ns: &[crate::domain::NotificationRef]| ns.iter().map(|n| n.id.clone()).collect();

    let first = s
        .commit(change("pl1", true, None, 1_000), 1_000)
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    assert_pending_listed(&s, "a commit").await;
    let second = s
        .commit(change("pl1", false, Some(true), 2_000), 2_000)
        .await
        .unwrap();
    assert_pending_listed(&s, "a supersede").await;
    assert_eq!(
        s.count_pending().await.unwrap(),
        2,
        "the first two superseded"
    );

    // A retry stays listed; delivered leaves.
    s.claim(ids(&second), "n".into(), 3_000, 60_000, None)
        .await
        .unwrap();
    s.record(
        vec![
            outcome(&second[0], Verdict::Retry { next_at: 4_000 }),
            outcome(&second[1], Verdict::Delivered),
        ],
        3_000,
        i64::MAX / 2,
    )
    .await
    .unwrap();
    assert_pending_listed(&s, "a retry and a delivery").await;
    assert_eq!(s.count_pending().await.unwrap(), 1);
    // Failed leaves; a replay brings it back.
    s.claim(vec![second[0].id.clone()], "n".into(), 4_000, 60_000, None)
        .await
        .unwrap();
    s.record(
        vec![outcome(&second[0], Verdict::Failed)],
        4_000,
        i64::MAX / 2,
    )
    .await
    .unwrap();
    assert_pending_listed(&s, "a failure").await;
    assert_eq!(s.count_pending().await.unwrap(), 0);
    s.retry_notification(second[0].id.clone(), 5_000)
        .await
        .unwrap();
    assert_pending_listed(&s, "a replay").await;
    let back = s.load_pending(0).await.unwrap();
    assert_eq!(ids(&back), vec![second[0].id.clone()] as Vec<String>);
    // A claim cancels it once its client no longer owns the sensor.
    s.unlink(second[0].client_id.clone(), sensor("pl1").id)
        .await
        .unwrap();
    let done = s
        .claim(vec![second[0].id.clone()], "n".into(), 6_000, 60_000, None)
        .await
        .unwrap();
    assert!(
        matches!(
            &done[0],
            Claim::Done {
                status: Status::Cancelled,
                ..
            }
        ),
        "{done:?}"
    );
    assert_pending_listed(&s, "a cancelled claim").await;
    // Deleting a client, then a sensor, cancels theirs.
    let third = s
        .commit(change("pl2", true, None, 7_000), 7_000)
        .await
        .unwrap();
    assert_eq!(third.len(), 2);
    s.delete_client("pl-b".into(), 8_000).await.unwrap();
    assert_pending_listed(&s, "a client's delete").await;
    assert_eq!(s.count_pending().await.unwrap(), 1);
    s.delete_sensor(sensor("pl2").id, 9_000).await.unwrap();
    assert_pending_listed(&s, "a sensor's delete").await;
    assert_eq!(s.count_pending().await.unwrap(), 0);
}

/// A database of schema v10 keeps its pending notifications through the move to their
/// own list: they are loaded and counted after the upgrade, the finished ones are not.
#[tokio::test]
async fn a_version_10_outbox_lists_its_pending_notifications() {
    let Some((c, url)) = schema_at(10).await else {
        return;
    };
    for (id, status) in [("old-pending", "pending"), ("old-done", "delivered")] {
        c.execute(
            "INSERT INTO notifications (id, client_id, sensor_id, kind, data, occurred_at, \
             status, next_attempt_at, created_at, updated_at) \
             VALUES ($1, 'c1', 's1', 'sensor.state_changed', true, 1, $2, 1, 1, 1)",
            &[&id, &status],
        )
        .await
        .unwrap();
    }

    let store = PgStore::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let pending = store.load_pending(0).await.unwrap();
    assert_eq!(
        pending.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["old-pending"]
    );
    assert_eq!(store.count_pending().await.unwrap(), 1);
    assert_pending_listed(&store, "the upgrade").await;
}

/// A recording of attempts for several clients takes their rows in id order, the order
/// resealing (`latch rotate-key`) walks them in: a transaction holding the first client
/// keeps the recorder from taking any, and the second stays free. (In outcome order the
/// recorder held the second while it waited for the first: a deadlock with the resealer.)
#[tokio::test]
async fn a_recorder_takes_its_clients_rows_in_id_order() {
    use crate::domain::{Attempt, Claim, Outcome, Verdict};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, schema)) = fresh().await else {
        return;
    };
    let s = std::sync::Arc::new(s);
    let mut outcomes = Vec::new();
    for (c, sensor_id) in [("lock-b", "lk2"), ("lock-a", "lk1")] {
        s.create_sensor(sensor(sensor_id)).await.unwrap();
        s.create_client(client(c, "http://a/")).await.unwrap();
        s.link(c.into(), sensor(sensor_id).id, 1).await.unwrap();
        let n = s
            .commit(change(sensor_id, true, None, 1_000), 1_000)
            .await
            .unwrap()[0]
            .clone();
        let claimed = s
            .claim(vec![n.id.clone()], "a".into(), 1_000, 90_000, None)
            .await
            .unwrap();
        assert!(matches!(claimed[0], Claim::Send(_)));
        outcomes.push(Outcome {
            notification_id: n.id.clone(),
            client_id: n.client_id.clone(),
            attempt: Some(Attempt {
                notification_id: n.id.clone(),
                at: 1_500,
                status_code: Some(500),
                error: Some("HTTP 500".into()),
                duration_ms: 3,
            }),
            attempts: 1,
            verdict: Verdict::Failed,
            node: "a".into(),
            batch_id: None,
        });
    }
    let url = schema_url(&base_url(), &schema);
    let (mut holder, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let (watch, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = holder.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM clients WHERE id = 'lock-a' FOR UPDATE", &[])
        .await
        .unwrap();
    let recording = tokio::spawn({
        let s = s.clone();
        async move { s.record(outcomes, 2_000, i64::MAX / 2).await }
    });
    // Until the recorder waits for a row lock.
    let mut waited = false;
    for _ in 0..200 {
        let n: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(waited, "the recorder never waited for the held client");
    tx.batch_execute("SET LOCAL lock_timeout = '3s'")
        .await
        .unwrap();
    tx.execute("SELECT 1 FROM clients WHERE id = 'lock-b' FOR UPDATE", &[])
        .await
        .expect("the recorder holds the second client while it waits for the first");
    tx.commit().await.unwrap();
    recording.await.unwrap().unwrap();
    // Both failures counted once the holder let go.
    let streaks: Vec<i64> = watch
        .query(
            "SELECT failures_since_success FROM clients ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(streaks, vec![1, 1]);
}

/// A node's start gives back the delivery leases its earlier process held, and only
/// those: another node's claim of such a notification goes at once instead of waiting
/// for the lease, and another node's lease stays.
#[tokio::test]
async fn a_start_gives_back_its_earlier_process_delivery_leases() {
    use crate::domain::Claim;
    use crate::store::ClusterStore;
    use crate::store::conformance::{change, client, sensor};
    let Some((s, _)) = fresh().await else {
        return;
    };
    let mut made = Vec::new();
    for (c, id) in [("fl-a", "fl1"), ("fl-b", "fl2")] {
        s.create_sensor(sensor(id)).await.unwrap();
        s.create_client(client(c, "http://a/")).await.unwrap();
        s.link(c.into(), sensor(id).id, 1).await.unwrap();
        made.push(
            s.commit(change(id, true, None, 1_000), 1_000)
                .await
                .unwrap()[0]
                .clone(),
        );
    }
    let until = crate::domain::time::now_ms() + 600_000;
    for (n, node) in made.iter().zip(["old", "other"]) {
        let claimed = s
            .claim(vec![n.id.clone()], node.into(), 1_000, until, None)
            .await
            .unwrap();
        assert!(matches!(claimed[0], Claim::Send(_)));
    }
    assert_eq!(s.forget_outbox_leases("old").await.unwrap(), 1);
    let again = s
        .claim(
            made.iter().map(|n| n.id.clone()).collect(),
            "new".into(),
            2_000,
            until,
            None,
        )
        .await
        .unwrap();
    assert!(matches!(again[0], Claim::Send(_)), "{:?}", again[0]);
    assert!(matches!(again[1], Claim::Leased { .. }), "{:?}", again[1]);
}
