//! Checks of a client's lifecycle: secret rotation, disabling and enabling, bulk replay,
//! endpoint health and the rate limit setting.

use super::*;
use crate::domain::client::{Disabled, DisabledReason};

/// An outcome of one attempt of `n` at `at`, answered `code` (`None`: no answer).
fn answered(n: &NotificationRef, at: Millis, code: Option<u16>, verdict: Verdict) -> Outcome {
    Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at,
            status_code: code,
            error: (code != Some(200)).then(|| format!("HTTP {code:?}")),
            duration_ms: (at % 1000) as u32,
        }),
        attempts: 1,
        verdict,
        node: "n1".into(),
        batch_id: None,
    }
}

/// A client `id` linked to sensor `sensor`, with one state notification of it.
async fn one_notification(s: &dyn Store, id: &str, sensor_id: &str) -> NotificationRef {
    s.create_sensor(sensor(sensor_id)).await.unwrap();
    s.create_client(client(id, "http://a/")).await.unwrap();
    s.link(id.into(), sid(sensor_id), 1).await.unwrap();
    s.commit(change(sensor_id, true, None, 10), 10)
        .await
        .unwrap()
        .remove(0)
}

pub(super) async fn rotated_secret_signs_during_its_grace(s: &Subject) {
    let n = one_notification(&**s, "ro-a", "ro1").await;
    let old = s.get_client("ro-a".into()).await.unwrap().unwrap().secret;
    let new = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_string();
    let c = s
        .rotate_secret("ro-a".into(), new.clone(), 1_000)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.secret, new);
    assert_eq!(c.previous_secret.as_deref(), Some(old.as_str()));
    assert_eq!(c.previous_secret_until, Some(1_000));
    assert!(
        s.rotate_secret("missing".into(), new.clone(), 1)
            .await
            .unwrap()
            .is_none()
    );
    let send = |claims: Vec<Claim>| match claims.into_iter().next() {
        Some(Claim::Send(x)) => x,
        other => panic!("expected a send, got {other:?}"),
    };
    let x = send(
        s.claim(vec![n.id.clone()], "n".into(), 999, 2_000, None)
            .await
            .unwrap(),
    );
    assert_eq!(
        (x.secret.as_str(), x.previous_secret),
        (new.as_str(), Some(old))
    );
    let x = send(
        s.claim(vec![n.id.clone()], "n".into(), 1_000, 2_000, None)
            .await
            .unwrap(),
    );
    assert_eq!(
        x.previous_secret, None,
        "only the new one once the grace ran out"
    );
}

pub(super) async fn gone_disables_until_enabled(s: &Subject) {
    let n = one_notification(&**s, "gd-a", "gd1").await;
    s.create_client(client("gd-b", "http://b/")).await.unwrap();
    let disabled = s
        .record(
            vec![answered(&n, 30, Some(410), Verdict::Failed)],
            31,
            NEVER,
        )
        .await
        .unwrap();
    // It waits while the client is disabled.
    let second = s
        .commit(change("gd1", false, Some(true), 32), 32)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        disabled,
        vec![Disabled {
            client_id: "gd-a".into(),
            reason: DisabledReason::Gone
        }]
    );
    let c = s.get_client("gd-a".into()).await.unwrap().unwrap();
    assert_eq!(
        (c.disabled_at, c.disabled_reason),
        (Some(31), Some(DisabledReason::Gone))
    );
    assert_eq!(s.count_disabled_clients().await.unwrap(), 1);
    let ids = |p: Page<Client>| p.items.into_iter().map(|c| c.id).collect::<Vec<_>>();
    assert_eq!(
        ids(s.list_clients(page(10), Some(true)).await.unwrap()),
        ["gd-a"]
    );
    assert_eq!(
        ids(s.list_clients(page(10), Some(false)).await.unwrap()),
        ["gd-b"]
    );
    assert_eq!(ids(s.list_clients(page(10), None).await.unwrap()).len(), 2);
    // A claim leaves the disabled client's notification pending and unleased.
    let claims = s
        .claim(vec![second.id.clone()], "n".into(), 40, 1_000, None)
        .await
        .unwrap();
    assert_eq!(
        claims,
        vec![Claim::Disabled {
            id: second.id.clone()
        }]
    );
    let other = s
        .claim(vec![second.id.clone()], "other".into(), 41, 1_000, None)
        .await
        .unwrap();
    assert!(matches!(other[0], Claim::Disabled { .. }), "not leased");
    assert_eq!(s.enable_client("gd-a".into()).await.unwrap(), Some(true));
    assert_eq!(s.enable_client("gd-a".into()).await.unwrap(), Some(false));
    assert_eq!(s.enable_client("missing".into()).await.unwrap(), None);
    assert_eq!(s.count_disabled_clients().await.unwrap(), 0);
    let pending = s.load_client_pending("gd-a".into()).await.unwrap();
    assert_eq!(
        pending.iter().map(|r| &r.id).collect::<Vec<_>>(),
        vec![&second.id]
    );
    assert!(matches!(
        s.claim(vec![second.id.clone()], "n".into(), 42, 1_000, None)
            .await
            .unwrap()[0],
        Claim::Send(_)
    ));
}

pub(super) async fn a_long_failure_streak_disables(s: &Subject) {
    let n = one_notification(&**s, "fs-a", "fs1").await;
    let retry = Verdict::Retry { next_at: 1 };
    let record = |at: Millis, code: Option<u16>| {
        let o = answered(&n, at, code, retry);
        async move { s.record(vec![o], at, 100).await.unwrap() }
    };
    assert!(record(1_000, Some(500)).await.is_empty());
    assert!(record(1_050, None).await.is_empty());
    // A delivery ends the streak; the next failure starts a new one.
    assert!(record(1_060, Some(200)).await.is_empty());
    assert!(record(1_070, Some(503)).await.is_empty());
    assert!(record(1_169, Some(503)).await.is_empty());
    assert_eq!(
        record(1_170, Some(503)).await,
        vec![Disabled {
            client_id: "fs-a".into(),
            reason: DisabledReason::Failing
        }]
    );
    assert!(record(1_500, Some(503)).await.is_empty(), "disabled once");
    s.enable_client("fs-a".into()).await.unwrap();
    assert!(record(1_600, Some(503)).await.is_empty(), "a fresh streak");
}

pub(super) async fn bulk_replay_keeps_order_and_skips_refusals(s: &Subject) {
    s.create_client(client("br-a", "http://a/")).await.unwrap();
    s.create_client(client("br-b", "http://b/")).await.unwrap();
    let mut made = Vec::new();
    for (sensor_id, at) in [("br1", 10), ("br2", 20)] {
        s.create_sensor(sensor(sensor_id)).await.unwrap();
        s.link("br-a".into(), sid(sensor_id), 1).await.unwrap();
        s.link("br-b".into(), sid(sensor_id), 1).await.unwrap();
        made.extend(
            s.commit(change(sensor_id, true, None, at), at)
                .await
                .unwrap(),
        );
    }
    let failed: Vec<Outcome> = made
        .iter()
        .map(|n| answered(n, 25, Some(500), Verdict::Failed))
        .collect();
    s.record(failed, 25, NEVER).await.unwrap();
    // br1 changes again: its newer state is delivered, so the older one is refused.
    let newer = s
        .commit(change("br1", false, Some(true), 30), 30)
        .await
        .unwrap();
    let delivered: Vec<Outcome> = newer
        .iter()
        .map(|n| answered(n, 41, Some(200), Verdict::Delivered))
        .collect();
    s.record(delivered, 41, NEVER).await.unwrap();
    let filter = |sensor_id: Option<&str>, since| ReplayFilter {
        client_id: "br-a".into(),
        sensor_id: sensor_id.map(sid),
        since,
    };
    assert!(
        s.retry_notifications(filter(Some("br2"), Some(21)), 50)
            .await
            .unwrap()
            .is_empty(),
        "created before `since`"
    );
    let replayed = s.retry_notifications(filter(None, None), 50).await.unwrap();
    let br2_a = made
        .iter()
        .find(|n| n.client_id == "br-a" && n.sensor_id == sid("br2"))
        .unwrap();
    assert_eq!(
        replayed.iter().map(|r| &r.id).collect::<Vec<_>>(),
        vec![&br2_a.id],
        "br1's older state is skipped; br-b's are not touched"
    );
    assert_eq!((replayed[0].attempts, replayed[0].due_at), (0, 50));
    let (n, _) = s.get_notification(br2_a.id.clone()).await.unwrap().unwrap();
    assert_eq!(n.status, Status::Pending);
    assert!(matches!(
        s.retry_notifications(
            ReplayFilter {
                client_id: "missing".into(),
                sensor_id: None,
                since: None
            },
            1
        )
        .await,
        Err(Error::NotFound("client"))
    ));
}

pub(super) async fn health_sums_up_attempts(s: &Subject) {
    let n = one_notification(&**s, "he-a", "he1").await;
    let now = 10_000_000;
    let h = s.client_health("he-a".into(), now).await.unwrap().unwrap();
    assert_eq!((h.pending, h.failed, h.consecutive_failures), (1, 0, 0));
    assert_eq!(h.success_ratio_1h, None);
    assert!(s.client_health("x".into(), now).await.unwrap().is_none());
    let retry = Verdict::Retry { next_at: 1 };
    let answers = [
        // More than an hour ago: only in the last success.
        (now - 4_000_000, Some(200)),
        (now - 3_000, Some(200)),
        (now - 2_100, Some(500)),
        (now - 1_200, None),
    ];
    for (at, code) in answers {
        s.record(vec![answered(&n, at, code, retry)], at, NEVER)
            .await
            .unwrap();
    }
    let h = s.client_health("he-a".into(), now).await.unwrap().unwrap();
    assert_eq!(h.last_success_at, Some(now - 3_000));
    assert_eq!(h.last_failure_at, Some(now - 1_200));
    assert_eq!(h.last_error.as_deref(), Some("HTTP None"));
    assert_eq!(h.consecutive_failures, 2);
    assert_eq!(h.success_ratio_1h, Some(1.0 / 3.0));
    // Durations are the attempt times' milliseconds: 0, 900 and 800.
    assert_eq!(
        (h.latency_p50_ms_1h, h.latency_p99_ms_1h),
        (Some(800), Some(900))
    );
    assert_eq!((h.pending, h.failed), (1, 0));
    // The last hour's slices: all three attempts of the hour in the newest one.
    let newest = h.series_1h.last().unwrap();
    assert_eq!(h.series_1h.len(), 12);
    assert_eq!(
        (newest.attempts, newest.failed, newest.latency_p50_ms),
        (3, 2, Some(800))
    );
    assert_eq!(h.series_1h.iter().map(|b| b.attempts).sum::<u64>(), 3);
}

pub(super) async fn rate_limit_is_kept(s: &Subject) {
    let mut c = client("rl-a", "http://a/");
    c.rate_limit = Some(5);
    s.create_client(c.clone()).await.unwrap();
    assert_eq!(
        s.get_client("rl-a".into())
            .await
            .unwrap()
            .unwrap()
            .rate_limit,
        Some(5)
    );
    c.rate_limit = None;
    s.replace_client(c).await.unwrap();
    assert_eq!(
        s.get_client("rl-a".into())
            .await
            .unwrap()
            .unwrap()
            .rate_limit,
        None
    );
}

/// A broker destination's attempt has no HTTP status: with no error it is the broker's
/// acknowledgement, a delivery like a 2xx; with one, a failure.
pub(super) async fn health_counts_broker_acknowledgements(s: &Subject) {
    let n = one_notification(&**s, "hb-a", "hb1").await;
    let now = 10_000_000;
    let attempt = |at: Millis, error: Option<&str>| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        node: "n1".into(),
        attempt: Some(Attempt {
            notification_id: n.id.clone(),
            at,
            status_code: None,
            error: error.map(str::to_string),
            duration_ms: 3,
        }),
        attempts: 1,
        verdict: Verdict::Retry { next_at: 1 },
        batch_id: None,
    };
    let refused = "refused by the broker: returned 312 NO_ROUTE";
    for (at, error) in [(now - 3_000, Some(refused)), (now - 2_000, None)] {
        s.record(vec![attempt(at, error)], at, NEVER).await.unwrap();
    }
    let h = s.client_health("hb-a".into(), now).await.unwrap().unwrap();
    assert_eq!(h.last_success_at, Some(now - 2_000));
    assert_eq!(h.last_failure_at, Some(now - 3_000));
    assert_eq!(h.last_error.as_deref(), Some(refused));
    assert_eq!(h.consecutive_failures, 0);
    assert_eq!(h.success_ratio_1h, Some(0.5));
}
