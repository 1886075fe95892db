//! The notification policy driven by hand: each rule with the cases that decide it.

use super::*;
use crate::domain::SensorId;

const STATE: EventKind = EventKind::StateChanged;
const LOST: EventKind = EventKind::ConnectionLost;
const RESTORED: EventKind = EventKind::ConnectionRestored;

fn q(seq: i64, kind: EventKind) -> Queued {
    Queued { seq, kind }
}

fn notification(status: Status) -> Notification {
    Notification {
        id: "01JAAAAAAAAAAAAAAAAAAAAAAA".into(),
        seq: 7,
        client_id: "c".into(),
        sensor_id: SensorId::parse("s0000001").unwrap(),
        kind: STATE,
        data: Some(true),
        previous: Some(false),
        occurred_at: 1,
        last_seen_at: None,
        detail: Default::default(),
        status,
        attempts: 3,
        next_attempt_at: Some(5),
        created_at: 1,
        updated_at: 2,
        batch_id: None,
        body: None,
        alarm_id: None,
    }
}

fn row(status: Status) -> ClaimRow {
    ClaimRow {
        notification: notification(status),
        lease_until: None,
        claimed_by: None,
        url: Some("http://x".into()),
        secret: Some("whsec_x".into()),
        address: Some("hall".into()),
        labels: Default::default(),
        linked: true,
        previous_secret: None,
        previous_secret_until: None,
        disabled: false,
        rate_limit: None,
        newer_site_event: false,
        older_site_event: false,
        older_own_event: false,
        newer_connection_told: false,
        overtaken: Vec::new(),
        lane: LaneInStore::default(),
        batch: None,
        receiver: Default::default(),
    }
}

#[test]
fn a_newer_state_supersedes_an_older_waiting_state() {
    assert!(supersedes(q(2, STATE), q(1, STATE), false));
}

#[test]
fn an_older_state_in_flight_is_not_superseded() {
    assert!(!supersedes(q(2, STATE), q(1, STATE), true));
}

#[test]
fn only_an_older_state_is_superseded() {
    assert!(!supersedes(q(2, STATE), q(3, STATE), false));
    assert!(!supersedes(q(2, STATE), q(2, STATE), false));
}

#[test]
fn liveness_notifications_never_supersede_nor_are_superseded() {
    for other in [LOST, RESTORED] {
        assert!(!supersedes(q(2, other), q(1, STATE), false));
        assert!(!supersedes(q(2, STATE), q(1, other), false));
        assert!(!supersedes(q(2, other), q(1, other), false));
    }
}

fn attempted() -> Attempted {
    Attempted {
        delivered: false,
        gone: false,
        not_allowed: false,
        attempts: 1,
        max_attempts: 10,
        kind: STATE,
        state_behind: false,
    }
}

#[test]
fn a_failed_attempt_with_budget_left_is_retried_when_asked() {
    assert_eq!(verdict(attempted(), || 42), Verdict::Retry { next_at: 42 });
}

#[test]
fn delivered_wins_over_everything() {
    let a = Attempted {
        delivered: true,
        attempts: 10,
        state_behind: true,
        ..attempted()
    };
    assert_eq!(verdict(a, || panic!("no retry")), Verdict::Delivered);
}

#[test]
fn gone_or_out_of_attempts_fails_even_with_a_newer_state_behind() {
    let gone = Attempted {
        gone: true,
        state_behind: true,
        ..attempted()
    };
    let spent = Attempted {
        attempts: 10,
        state_behind: true,
        ..attempted()
    };
    for a in [gone, spent] {
        assert_eq!(verdict(a, || panic!("no retry")), Verdict::Failed);
    }
}

#[test]
fn a_destination_not_allowed_fails_at_once_whatever_waits_behind() {
    for kind in [STATE, LOST] {
        let a = Attempted {
            not_allowed: true,
            kind,
            state_behind: true,
            ..attempted()
        };
        assert_eq!(verdict(a, || panic!("no retry")), Verdict::Failed);
    }
}

#[test]
fn a_failed_state_with_a_newer_state_behind_is_superseded_not_retried() {
    let a = Attempted {
        state_behind: true,
        ..attempted()
    };
    assert_eq!(verdict(a, || panic!("no retry")), Verdict::Superseded);
}

#[test]
fn a_failed_liveness_notification_is_retried_whatever_waits_behind() {
    let a = Attempted {
        kind: LOST,
        state_behind: true,
        ..attempted()
    };
    assert_eq!(verdict(a, || 9), Verdict::Retry { next_at: 9 });
}

#[test]
fn verdicts_map_to_statuses() {
    assert_eq!(status_after(Verdict::Delivered), Status::Delivered);
    assert_eq!(status_after(Verdict::Retry { next_at: 1 }), Status::Pending);
    assert_eq!(status_after(Verdict::Failed), Status::Failed);
    assert_eq!(status_after(Verdict::Superseded), Status::Superseded);
}

#[test]
fn a_pending_unleased_linked_notification_is_leased() {
    match claim_step(row(Status::Pending), "me", 100) {
        ClaimStep::Lease(s) => {
            assert_eq!(s.url, "http://x");
            assert_eq!(s.address, "hall");
        }
        _ => panic!("expected a lease"),
    }
}

#[test]
fn a_notification_no_longer_pending_is_answered_done() {
    for status in [
        Status::Delivered,
        Status::Failed,
        Status::Superseded,
        Status::Cancelled,
    ] {
        match claim_step(row(status), "me", 100) {
            ClaimStep::Answer(Claim::Done { status: s, .. }) => assert_eq!(s, status),
            _ => panic!("expected done for {status:?}"),
        }
    }
}

#[test]
fn another_nodes_live_lease_is_respected() {
    let r = ClaimRow {
        lease_until: Some(200),
        claimed_by: Some("other".into()),
        ..row(Status::Pending)
    };
    match claim_step(r, "me", 100) {
        ClaimStep::Answer(Claim::Leased { until, .. }) => assert_eq!(until, 200),
        _ => panic!("expected leased"),
    }
}

#[test]
fn an_expired_or_own_lease_is_taken() {
    let expired = ClaimRow {
        lease_until: Some(100),
        claimed_by: Some("other".into()),
        ..row(Status::Pending)
    };
    let own = ClaimRow {
        lease_until: Some(200),
        claimed_by: Some("me".into()),
        ..row(Status::Pending)
    };
    for r in [expired, own] {
        assert!(matches!(claim_step(r, "me", 100), ClaimStep::Lease(_)));
    }
}

#[test]
fn a_notification_of_a_gone_or_unlinked_client_is_cancelled() {
    let unlinked = ClaimRow {
        linked: false,
        ..row(Status::Pending)
    };
    let no_client = ClaimRow {
        url: None,
        secret: None,
        ..row(Status::Pending)
    };
    let no_sensor = ClaimRow {
        address: None,
        ..row(Status::Pending)
    };
    for r in [unlinked, no_client, no_sensor] {
        assert!(matches!(claim_step(r, "me", 100), ClaimStep::Cancel));
    }
}

#[test]
fn only_failed_notifications_are_retried() {
    assert_eq!(retry_refusal(&notification(Status::Failed), false), None);
    let refusal = retry_refusal(&notification(Status::Delivered), false);
    assert_eq!(refusal, Some(RetryRefusal::NotFailed(Status::Delivered)));
    assert_eq!(
        refusal.unwrap().to_string(),
        "only failed notifications can be retried; this one is delivered"
    );
}

#[test]
fn an_older_state_is_not_retried_after_a_newer_one_was_sent() {
    let refusal = retry_refusal(&notification(Status::Failed), true);
    assert_eq!(refusal, Some(RetryRefusal::NewerStateSent));
    assert_eq!(
        refusal.unwrap().to_string(),
        "a newer state of this sensor was sent to this client since; \
         retrying would deliver an older state after a newer one"
    );
}

#[test]
fn a_disabled_clients_notification_is_left_waiting() {
    let r = ClaimRow {
        disabled: true,
        ..row(Status::Pending)
    };
    assert!(matches!(
        claim_step(r, "me", 100),
        ClaimStep::Answer(Claim::Disabled { .. })
    ));
}

#[test]
fn the_previous_secret_signs_only_while_its_grace_lasts() {
    let r = |until| ClaimRow {
        previous_secret: Some("whsec_old".into()),
        previous_secret_until: Some(until),
        ..row(Status::Pending)
    };
    match claim_step(r(101), "me", 100) {
        ClaimStep::Lease(s) => assert_eq!(s.previous_secret.as_deref(), Some("whsec_old")),
        _ => panic!("expected a lease"),
    }
    match claim_step(r(100), "me", 100) {
        ClaimStep::Lease(s) => assert_eq!(s.previous_secret, None),
        _ => panic!("expected a lease"),
    }
}

fn outcome(client: &str, at: Millis, code: Option<u16>) -> Outcome {
    Outcome {
        notification_id: "n".into(),
        client_id: client.into(),
        attempt: Some(crate::domain::Attempt {
            notification_id: "n".into(),
            at,
            status_code: code,
            // Every failed attempt has an error; without a status and without one it would
            // be a broker's acknowledgement.
            error: (!code.is_some_and(|c| (200..300).contains(&c))).then(|| "failed".into()),
            duration_ms: 1,
        }),
        attempts: 1,
        verdict: Verdict::Failed,
        node: "n1".into(),
        batch_id: None,
    }
}

#[test]
fn attempts_are_summed_up_per_client_in_order() {
    let sums = client_attempts(&[
        outcome("a", 10, Some(500)),
        outcome("b", 11, Some(410)),
        outcome("a", 12, Some(200)),
        outcome("a", 13, None),
        outcome("a", 14, Some(503)),
    ]);
    assert_eq!(
        sums,
        vec![
            ClientAttempts {
                client_id: "a".into(),
                succeeded: true,
                failing_since: Some(13),
                gone: false,
                last_success_at: Some(12),
                last_failure: Some((14, Some("failed".into()))),
                failures_after: 2,
            },
            ClientAttempts {
                client_id: "b".into(),
                succeeded: false,
                failing_since: Some(11),
                gone: true,
                last_success_at: None,
                last_failure: Some((11, Some("failed".into()))),
                failures_after: 1,
            },
        ]
    );
}

#[test]
fn a_client_is_disabled_when_gone_or_failing_long_enough() {
    assert_eq!(
        disable_reason(true, Some(99), 100, 1000),
        Some(DisabledReason::Gone)
    );
    assert_eq!(disable_reason(false, Some(0), 999, 1000), None);
    assert_eq!(
        disable_reason(false, Some(0), 1000, 1000),
        Some(DisabledReason::Failing)
    );
    assert_eq!(disable_reason(false, None, 5000, 1000), None);
}

#[test]
fn a_head_behind_older_pending_ones_of_its_lane_waits_for_them() {
    let behind = |older_lease_until| ClaimRow {
        lane: LaneInStore {
            older_pending: 1,
            older_lease_until,
            ..LaneInStore::default()
        },
        ..row(Status::Pending)
    };
    let later = |r| match claim_step(r, "me", 100) {
        ClaimStep::Answer(Claim::Later { at, unswept, .. }) => (at, unswept),
        _ => panic!("expected to wait"),
    };
    // Another node sends the older one now: asked about again soon, not at the end of its
    // lease, so the lane goes on as soon as that attempt is recorded.
    assert_eq!(later(behind(Some(50_000))), (100 + RECHECK_MS, false));
    assert_eq!(
        later(behind(Some(600))),
        (600, false),
        "a lease ending sooner"
    );
    // Not in flight (or its lease ran out): ask again shortly, and say that no node holds
    // it (the dispatcher looks for it at once rather than at its next sweep).
    for lease in [None, Some(50)] {
        assert_eq!(later(behind(lease)), (100 + RECHECK_MS, true));
    }
}

#[test]
fn a_notification_waits_while_another_node_sends_a_newer_one_of_its_lane() {
    // A failed notification replayed while a newer one of its lane (a reminder, say) is in
    // flight on another node: one request of a lane at a time, whatever their order.
    let ahead = |newer_lease_until| ClaimRow {
        lane: LaneInStore {
            newer_lease_until,
            ..LaneInStore::default()
        },
        ..row(Status::Pending)
    };
    match claim_step(ahead(Some(5_000)), "me", 100) {
        ClaimStep::Answer(Claim::Later { at, .. }) => assert_eq!(at, 100 + RECHECK_MS),
        _ => panic!("sent while another node sends its lane"),
    }
    // That lease ran out: nothing is in flight.
    assert!(matches!(
        claim_step(ahead(Some(50)), "me", 100),
        ClaimStep::Lease(_)
    ));
}

#[test]
fn another_nodes_lease_is_looked_at_again_within_a_second() {
    assert_eq!(look_again(100_000, 1_000), 1_000 + RECHECK_MS);
    assert_eq!(look_again(1_200, 1_000), 1_200);
}

#[test]
fn a_state_with_a_newer_state_waiting_is_superseded_not_sent() {
    // Its lease was released since the newer one came (another node's attempt failed):
    // the supersede rule, now that it is not in flight.
    let r = |kind| ClaimRow {
        lane: LaneInStore {
            newer_state_pending: true,
            ..LaneInStore::default()
        },
        notification: Notification {
            kind,
            ..notification(Status::Pending)
        },
        ..row(Status::Pending)
    };
    assert!(matches!(
        claim_step(r(STATE), "me", 100),
        ClaimStep::Supersede
    ));
    assert!(matches!(
        claim_step(r(LOST), "me", 100),
        ClaimStep::Lease(_)
    ));
    // Still held by the other node: it waits instead.
    let held = ClaimRow {
        lease_until: Some(5_000),
        claimed_by: Some("other".into()),
        ..r(STATE)
    };
    assert!(matches!(
        claim_step(held, "me", 100),
        ClaimStep::Answer(Claim::Leased { until: 5_000, .. })
    ));
}

#[test]
fn a_head_not_yet_due_waits_for_its_time() {
    // A lane that waited on another node's attempt learns its retry time from the claim.
    let r = ClaimRow {
        notification: Notification {
            next_attempt_at: Some(30_000),
            ..notification(Status::Pending)
        },
        ..row(Status::Pending)
    };
    assert!(matches!(
        claim_step(r, "me", 100),
        ClaimStep::Answer(Claim::Later { at: 30_000, .. })
    ));
}

fn held_outcome(verdict: Verdict, attempted: bool) -> Outcome {
    Outcome {
        attempt: attempted.then(|| crate::domain::Attempt {
            notification_id: "n".into(),
            at: 1,
            status_code: Some(200),
            error: None,
            duration_ms: 1,
        }),
        verdict,
        ..outcome("c", 1, Some(200))
    }
}

#[test]
fn another_nodes_live_lease_is_never_written_over_but_by_a_delivery() {
    let other = |o: &Outcome| recorded(o, true, Some("other"), Some(500), 100);
    // Superseded in a lane, or an attempt that failed: that node's attempt decides.
    assert!(!other(&held_outcome(Verdict::Superseded, false)));
    assert!(!other(&held_outcome(Verdict::Retry { next_at: 9 }, true)));
    assert!(!other(&held_outcome(Verdict::Failed, true)));
    // A delivered attempt happened, whoever holds the notification now.
    assert!(other(&held_outcome(Verdict::Delivered, true)));
    // Our own lease, one run out, or none: written.
    let o = held_outcome(Verdict::Superseded, false);
    assert!(recorded(&o, true, Some("n1"), Some(500), 100));
    assert!(recorded(&o, true, Some("other"), Some(99), 100));
    assert!(recorded(&o, true, None, None, 100));
    // Nothing is written over a notification no longer pending.
    assert!(!recorded(
        &held_outcome(Verdict::Delivered, true),
        false,
        None,
        None,
        100
    ));
}

fn w(seq: i64, kind: EventKind, out: bool) -> Waiting {
    Waiting {
        queued: q(seq, kind),
        out,
    }
}

#[test]
fn a_newer_pair_folds_the_waiting_pairs_before_it() {
    // restored (its lost delivered), lost, restored, lost, restored, lost; then the
    // restored that completes the newest pair.
    let lane = [
        w(1, RESTORED, false),
        w(2, LOST, false),
        w(3, STATE, false),
        w(4, RESTORED, false),
        w(5, LOST, false),
        w(6, RESTORED, false),
        w(7, LOST, false),
    ];
    assert_eq!(folds(&lane, q(8, RESTORED)), vec![1, 3, 4, 5]);
    // Only a restored completing a pair folds.
    assert!(folds(&lane, q(8, LOST)).is_empty());
    assert!(folds(&lane, q(8, STATE)).is_empty());
    // One pair, or a restored whose lost went out already: nothing older to fold.
    assert!(folds(&lane[..2], q(8, RESTORED)).is_empty());
    assert!(folds(&lane[..1], q(8, RESTORED)).is_empty());
}

#[test]
fn nothing_folds_up_to_one_that_is_out() {
    // The lost in flight must be followed by its restored.
    let lane = [
        w(1, LOST, true),
        w(2, RESTORED, false),
        w(3, LOST, false),
        w(4, RESTORED, false),
        w(5, LOST, false),
    ];
    assert_eq!(folds(&lane, q(6, RESTORED)), vec![2, 3]);
    let held = [w(1, LOST, false), w(2, RESTORED, true), w(3, LOST, false)];
    assert!(folds(&held, q(4, RESTORED)).is_empty());
}

#[test]
fn what_a_newer_notification_makes_pointless() {
    let lane = [
        w(1, STATE, true),
        w(2, LOST, false),
        w(3, STATE, false),
        w(4, RESTORED, false),
        w(5, STATE, false),
        w(6, LOST, false),
    ];
    assert_eq!(made_pointless(&lane, q(7, STATE)), vec![2, 4]);
    assert_eq!(made_pointless(&lane, q(7, RESTORED)), vec![1, 3]);
    assert!(made_pointless(&lane, q(7, LOST)).is_empty());
}

#[test]
fn an_older_connection_notification_is_not_retried_after_a_newer_one() {
    let lost = Notification {
        kind: LOST,
        ..notification(Status::Failed)
    };
    let refusal = retry_refusal(&lost, true);
    assert_eq!(refusal, Some(RetryRefusal::NewerConnectionSent));
    assert_eq!(retry_refusal(&lost, false), None);
    assert_eq!(outranked_by(LOST), &[LOST, RESTORED]);
    assert_eq!(outranked_by(RESTORED), &[LOST, RESTORED]);
    assert_eq!(outranked_by(STATE), &[STATE]);
}

#[test]
fn a_state_older_than_one_delivered_is_superseded_a_liveness_one_is_sent() {
    let stale = |kind| ClaimRow {
        lane: LaneInStore {
            newer_state_delivered: true,
            ..LaneInStore::default()
        },
        notification: Notification {
            kind,
            ..notification(Status::Pending)
        },
        ..row(Status::Pending)
    };
    assert!(matches!(
        claim_step(stale(STATE), "me", 100),
        ClaimStep::Supersede
    ));
    assert!(matches!(
        claim_step(stale(LOST), "me", 100),
        ClaimStep::Lease(_)
    ));
}

/// The owner's decision (issue #68): a site's event still waiting when a newer one of the
/// same site was made for the client is superseded, whichever lane it travels in; a
/// sensor's own loss never is.
#[test]
fn a_site_event_older_than_one_of_the_same_site_is_superseded() {
    let site = |kind, newer| ClaimRow {
        newer_site_event: newer,
        notification: Notification {
            kind,
            ..notification(Status::Pending)
        },
        ..row(Status::Pending)
    };
    let lost = EventKind::SiteConnectionLost;
    assert!(matches!(
        claim_step(site(lost, true), "me", 100),
        ClaimStep::Supersede
    ));
    assert!(matches!(
        claim_step(site(lost, false), "me", 100),
        ClaimStep::Lease(_)
    ));
    assert!(matches!(
        claim_step(site(LOST, true), "me", 100),
        ClaimStep::Lease(_)
    ));
}

/// Issue #68 item 12: a sensor's own event waits while an older site event for its client
/// that names the sensor is still pending (it travels in another lane); a site's event
/// never waits on that.
#[test]
fn a_sensors_own_event_waits_for_an_older_site_event_naming_it() {
    let waiting = |kind| ClaimRow {
        older_site_event: true,
        notification: Notification {
            kind,
            ..notification(Status::Pending)
        },
        ..row(Status::Pending)
    };
    match claim_step(waiting(EventKind::ConnectionRestored), "me", 100) {
        ClaimStep::Answer(Claim::Later { at, unswept, .. }) => {
            assert_eq!((at, unswept), (100 + RECHECK_MS, false));
        }
        _ => panic!("the sensor's return waits"),
    }
    assert!(matches!(
        claim_step(waiting(EventKind::SiteConnectionRestored), "me", 100),
        ClaimStep::Lease(_)
    ));
}
