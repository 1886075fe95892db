//! Checks of a client's batching: the setting round-trips, a claim reads it (for webhooks
//! only), and the mark of the batch a notification waits to be sent again in follows its
//! requests: set when a batch's outcome is recorded, cleared by the next claim that does not
//! send it in that batch.

use super::*;
use crate::domain::ClaimBatch;
use crate::domain::client::Batch;

const BATCH: Batch = Batch {
    max_events: 100,
    max_wait_ms: 250,
};

/// Three sensors linked to a batched client, one state notification each, due at 10.
async fn three_pending(s: &dyn Store) -> Vec<NotificationRef> {
    let c = Client {
        batch: Some(BATCH),
        ..client("bt-c", "http://a/")
    };
    s.create_client(c).await.unwrap();
    let mut all = Vec::new();
    for id in ["bt1", "bt2", "bt3"] {
        s.create_sensor(sensor(id)).await.unwrap();
        s.link("bt-c".into(), sid(id), 1).await.unwrap();
        all.extend(s.commit(change(id, true, None, 10), 10).await.unwrap());
    }
    all
}

fn tried(n: &NotificationRef, verdict: Verdict, batch: &str) -> Outcome {
    Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at: 20,
            status_code: Some(500),
            error: Some("HTTP 500".into()),
            duration_ms: 3,
        }),
        attempts: 1,
        verdict,
        node: "n1".into(),
        batch_id: Some(batch.into()),
    }
}

async fn marks(s: &dyn Store) -> Vec<(String, Option<String>)> {
    let mut v: Vec<_> = s
        .load_pending(i64::MIN)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.id, r.batch_id))
        .collect();
    v.sort();
    v
}

pub(super) async fn a_clients_batch_round_trips_and_claims_read_it(s: &Subject) {
    let pending = three_pending(&**s).await;
    let got = s.get_client("bt-c".into()).await.unwrap().unwrap();
    assert_eq!(got.batch, Some(BATCH));
    let listed = s.list_clients(page(10), None).await.unwrap().items;
    assert_eq!(listed[0].batch, Some(BATCH));
    let claims = s
        .claim(vec![pending[0].id.clone()], "n1".into(), 10, 1_000, None)
        .await
        .unwrap();
    match &claims[0] {
        Claim::Send(send) => assert_eq!(send.batch, Some(BATCH)),
        other => panic!("expected a send, got {other:?}"),
    }
    // A broker destination gets one message a notification, whatever `batch` says.
    let mut c = got.clone();
    c.url = "mqtt://broker:1883/doors/{sensor_id}".into();
    assert!(s.replace_client(c).await.unwrap());
    let claims = s
        .claim(vec![pending[1].id.clone()], "n1".into(), 10, 1_000, None)
        .await
        .unwrap();
    match &claims[0] {
        Claim::Send(send) => assert_eq!(send.batch, None),
        other => panic!("expected a send, got {other:?}"),
    }
    let mut c = got;
    c.batch = None;
    assert!(s.replace_client(c).await.unwrap());
    let got = s.get_client("bt-c".into()).await.unwrap().unwrap();
    assert_eq!(got.batch, None);
}

pub(super) async fn a_batchs_mark_follows_its_requests(s: &Subject) {
    let p = three_pending(&**s).await;
    let ids: Vec<String> = p.iter().map(|n| n.id.clone()).collect();
    let claims = s
        .claim(
            ids.clone(),
            "n1".into(),
            10,
            1_000,
            Some(ClaimBatch::default()),
        )
        .await
        .unwrap();
    assert!(claims.iter().all(|c| matches!(c, Claim::Send(_))));
    // The request failed: every one waits for its retry in batch B1.
    let retry = Verdict::Retry { next_at: 100 };
    let outcomes = p.iter().map(|n| tried(n, retry, "B1")).collect();
    s.record(outcomes, 20, 86_400_000).await.unwrap();
    let b1 = Some("B1".to_string());
    assert!(marks(&**s).await.iter().all(|(_, b)| *b == b1));
    let (n, _) = s.get_notification(ids[0].clone()).await.unwrap().unwrap();
    assert_eq!(n.batch_id, b1);

    // The batch goes again with the first only; the third is left out of it. Both lose
    // the mark; the second, not in this claim at all, keeps it.
    let again = Some(ClaimBatch {
        left_out: vec![ids[2].clone()],
    });
    let claims = s
        .claim(vec![ids[0].clone()], "n1".into(), 100, 1_000, again)
        .await
        .unwrap();
    assert!(matches!(claims[0], Claim::Send(_)));
    let m = marks(&**s).await;
    let mark = |id: &str| m.iter().find(|(i, _)| i == id).unwrap().1.clone();
    assert_eq!(mark(&ids[0]), None, "a new request of it began");
    assert_eq!(mark(&ids[1]), b1);
    assert_eq!(mark(&ids[2]), None, "left out: never under B1 again");

    // A batch's claim that does not lease a head (not due yet) unmarks it too.
    let claims = s
        .claim(
            vec![ids[1].clone()],
            "n1".into(),
            50,
            1_000,
            Some(ClaimBatch::default()),
        )
        .await
        .unwrap();
    assert!(matches!(claims[0], Claim::Later { .. }), "{claims:?}");
    assert!(marks(&**s).await.iter().all(|(_, b)| b.is_none()));

    // Delivered in B2: the notification keeps the batch that carried it.
    let delivered = Outcome {
        attempt: Some(Attempt {
            status_code: Some(200),
            error: None,
            ..tried(&p[0], Verdict::Delivered, "B2").attempt.unwrap()
        }),
        ..tried(&p[0], Verdict::Delivered, "B2")
    };
    s.record(vec![delivered], 120, 86_400_000).await.unwrap();
    let (n, _) = s.get_notification(ids[0].clone()).await.unwrap().unwrap();
    assert_eq!(
        (n.status, n.batch_id),
        (Status::Delivered, Some("B2".into()))
    );
}
