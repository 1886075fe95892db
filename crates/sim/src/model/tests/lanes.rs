//! A claim reads its notification's lane in a shared store (`claims_keep_a_lanes_order_
//! across_nodes` in `store/postgres/tests.rs`); one node's store does not.

use latch::domain::policy::RECHECK_MS;
use latch::domain::{Claim, NotificationRef, Outcome, Status, Verdict};
use latch::store::conformance::{change, client, sensor};
use latch::store::prelude::*;

use super::*;

fn delivered(n: &NotificationRef, node: &str) -> Outcome {
    Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: None,
        attempts: 1,
        verdict: Verdict::Delivered,
        node: node.into(),
        batch_id: None,
    }
}

/// A sensor linked to one client, with a state notification leased by node `a`, and a
/// newer one committed after it: what a partition move leaves.
async fn two_states(s: &NodeStore) -> (NotificationRef, NotificationRef) {
    s.create_sensor(sensor("ord1")).await.unwrap();
    s.create_client(client("ord-c", "http://a/")).await.unwrap();
    s.link("ord-c".into(), sid("ord1"), 1).await.unwrap();
    let n1 = s
        .commit(change("ord1", true, None, 1_000), 1_000)
        .await
        .unwrap()[0]
        .clone();
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
    (n1, n2)
}

#[tokio::test]
async fn claims_keep_a_lanes_order_across_nodes() {
    let (_, _, s) = shared(4);
    let (n1, n2) = two_states(&s).await;
    // B waits for A's attempt rather than overtake it, asking again within a second.
    match &s
        .claim(vec![n2.id.clone()], "b".into(), 2_000, 60_000, None)
        .await
        .unwrap()[0]
    {
        Claim::Later { at, .. } => assert_eq!(*at, 2_000 + RECHECK_MS),
        other => panic!("expected to wait behind A's attempt: {other:?}"),
    }
    // A's own lane, which holds both in order, goes on.
    let own = s.claim(vec![n2.id.clone()], "a".into(), 2_000, 60_000, None);
    assert!(matches!(own.await.unwrap()[0], Claim::Send(_)));
    s.record(vec![delivered(&n2, "a")], 3_000, i64::MAX / 2)
        .await
        .unwrap();
    // A died before recording the first: once its lease ran out, the older state is
    // superseded, never sent after the newer one the client has.
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

/// The rows of one claim are read before any is written, as PostgreSQL's one `SELECT`
/// reads them: the second of a lane claimed with the first waits behind it.
#[tokio::test]
async fn a_claim_reads_its_rows_before_it_writes_them() {
    let (_, _, s) = shared(4);
    s.create_sensor(sensor("rd1")).await.unwrap();
    s.create_client(client("rd-c", "http://a/")).await.unwrap();
    s.link("rd-c".into(), sid("rd1"), 1).await.unwrap();
    let lost = latch::store::conformance::liveness;
    let a = s
        .commit(
            lost("rd1", latch::domain::EventKind::ConnectionLost, 10),
            10,
        )
        .await
        .unwrap()
        .remove(0);
    let b = s
        .commit(
            lost("rd1", latch::domain::EventKind::ConnectionRestored, 20),
            20,
        )
        .await
        .unwrap()
        .remove(0);
    let claims = s
        .claim(
            vec![a.id.clone(), b.id.clone()],
            "n".into(),
            30,
            60_000,
            None,
        )
        .await
        .unwrap();
    assert!(matches!(claims[0], Claim::Send(_)));
    assert!(matches!(claims[1], Claim::Later { .. }), "{claims:?}");
}

/// One node's lanes hold every lane whole: its store reads no lane, and a node's own
/// leases never hold it back.
#[tokio::test]
async fn one_node_reads_no_lane() {
    let clock = Clock::manual(START);
    let model = ModelStore::healthy(Mode::Single, clock);
    let s = model.for_node("n");
    let (_, n2) = two_states(&s).await;
    let claims = s.claim(vec![n2.id.clone()], "b".into(), 2_000, 60_000, None);
    assert!(matches!(claims.await.unwrap()[0], Claim::Send(_)));
}
