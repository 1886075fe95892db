//! The notification policy: which pending notification a newer one makes pointless, which
//! one may be claimed and sent, what an attempt's answer means for it, and when a manual
//! retry is refused. Pure, so it is tested on its own; the store and the dispatcher carry
//! out its decisions and decide nothing themselves.
//!
//! Two of these rules also run inside SQL, where they must be set-based and within the
//! commit's transaction; those statements mirror the functions here and must change with
//! them (see [`supersedes`] and [`retry_refusal`]).

use super::client::DisabledReason;
use super::notification::{EventKind, Notification, Status};
use super::outbox::{Claim, Outcome, Sendable, Verdict};
use super::time::Millis;

/// A notification as the supersede rule sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// Outbox order.
    pub seq: i64,
    pub kind: EventKind,
}

/// The supersede rule, for two pending notifications of the same (client, sensor): a
/// `sensor.state_changed` one makes every older state notification pointless (the newer
/// one carries the truth), unless the older one is in flight: that one finishes first and
/// the newer one follows it. Lost/restored notifications are never superseded and never
/// supersede.
///
/// The store applies this rule when it commits a state change, in the `UPDATE
/// notifications SET status = 'superseded'` of `commit_batch` in `store/sqlite.rs` and
/// `store/postgres.rs`: per sensor, every pending `sensor.state_changed` row with a lower
/// `seq` than the first one the change created, whose lease is unset or ran out (leased
/// means in flight). Every client linked to the sensor gets a newer notification in the
/// same commit, so per sensor is per (client, sensor) for them. The dispatcher applies it
/// again to its lanes ([`crate::delivery`]), for heads whose lease it has not released yet.
pub fn supersedes(newer: Queued, older: Queued, older_in_flight: bool) -> bool {
    newer.kind == EventKind::StateChanged
        && older.kind == EventKind::StateChanged
        && older.seq < newer.seq
        && !older_in_flight
}

/// What is known of a notification once an attempt to send it has been answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempted {
    /// The receiver answered 2xx.
    pub delivered: bool,
    /// The receiver answered `410 Gone`: it asks never to be tried again.
    pub gone: bool,
    /// latch refused the destination (the SSRF guard): nothing was sent, and another try
    /// would be refused the same way.
    pub not_allowed: bool,
    /// Attempts made, including this one.
    pub attempts: u32,
    /// The attempt budget of the retry policy.
    pub max_attempts: u32,
    pub kind: EventKind,
    /// A state notification waits behind it in its lane. Lanes are in outbox order, so
    /// that one is newer.
    pub state_behind: bool,
}

/// What an answered attempt makes of its notification: delivered; failed when the
/// receiver is gone, the destination is not allowed, or the budget is spent; superseded rather than retried when a newer
/// state waits behind it (the supersede rule, now that it is no longer in flight);
/// otherwise retried at `retry_at()`, asked only then (it draws the jitter).
pub fn verdict(a: Attempted, retry_at: impl FnOnce() -> Millis) -> Verdict {
    if a.delivered {
        Verdict::Delivered
    } else if a.gone || a.not_allowed || a.attempts >= a.max_attempts {
        Verdict::Failed
    } else if a.kind == EventKind::StateChanged && a.state_behind {
        Verdict::Superseded
    } else {
        Verdict::Retry {
            next_at: retry_at(),
        }
    }
}

/// The status a verdict leaves its notification in: a retry leaves it pending.
pub fn status_after(verdict: Verdict) -> Status {
    match verdict {
        Verdict::Delivered => Status::Delivered,
        Verdict::Retry { .. } => Status::Pending,
        Verdict::Failed => Status::Failed,
        Verdict::Superseded => Status::Superseded,
    }
}

/// A notification as a claim reads it: the row, its lease, and the registry now.
pub struct ClaimRow {
    pub notification: Notification,
    pub lease_until: Option<Millis>,
    pub claimed_by: Option<String>,
    /// The client's URL and secret, if the client still exists.
    pub url: Option<String>,
    pub secret: Option<String>,
    /// The sensor's address, if the sensor still exists.
    pub address: Option<String>,
    /// The client still owns the sensor.
    pub linked: bool,
    /// The secret a rotation replaced and until when it still signs.
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<Millis>,
    /// The client is disabled.
    pub disabled: bool,
    pub rate_limit: Option<u32>,
    /// Where it stands in its (client, sensor) lane in the store; read on a store shared by
    /// several nodes, whose lanes may each hold part of one lane around a takeover.
    pub lane: LaneInStore,
}

/// What the store holds of a notification's lane besides it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LaneInStore {
    /// Older notifications of the lane still pending (another node's, or not yet swept).
    pub older_pending: u32,
    /// The latest lease among those, if any is leased.
    pub older_lease_until: Option<Millis>,
    /// A newer state of the sensor was delivered to the client already.
    pub newer_state_delivered: bool,
}

/// How soon a head waiting behind older pending notifications of its lane asks again.
pub const BEHIND_RECHECK_MS: Millis = 1_000;

/// What a claim does with one notification, the same on every backend.
pub enum ClaimStep {
    /// Lease it to the claiming node and send it.
    Lease(Box<Sendable>),
    /// Its client is gone or no longer owns the sensor: mark it cancelled.
    Cancel,
    /// A newer state of its sensor reached the client already: mark it superseded.
    Supersede,
    /// Nothing to write: answer this.
    Answer(Claim),
}

/// Which head may be claimed: only a pending notification, not leased by another node
/// (a node takes its own unexpired leases back, after a restart), whose client still
/// exists, still owns the sensor and is not disabled, is sent. A disabled client's
/// notification is left as it is: it waits for the client to be enabled.
///
/// Order across nodes: a head with older notifications of its lane still pending in the
/// store waits for them (until the latest of their leases, or a second: the node serving
/// the sensor has them in its lanes, or sweeps them up); a state older than one the client
/// already got is superseded, never sent after it.
pub fn claim_step(row: ClaimRow, node: &str, now: Millis) -> ClaimStep {
    let n = row.notification;
    if n.status != Status::Pending {
        return ClaimStep::Answer(Claim::Done {
            id: n.id,
            status: n.status,
        });
    }
    if let Some(until) = row.lease_until
        && until > now
        && row.claimed_by.as_deref() != Some(node)
    {
        return ClaimStep::Answer(Claim::Leased { id: n.id, until });
    }
    if row.lane.newer_state_delivered && n.kind == EventKind::StateChanged {
        return ClaimStep::Supersede;
    }
    if row.lane.older_pending > 0 {
        let until = row
            .lane
            .older_lease_until
            .filter(|&u| u > now)
            .unwrap_or(now + BEHIND_RECHECK_MS);
        return ClaimStep::Answer(Claim::Leased { id: n.id, until });
    }
    match (row.url, row.secret, row.address, row.linked) {
        (Some(_), Some(_), Some(_), true) if row.disabled => {
            ClaimStep::Answer(Claim::Disabled { id: n.id })
        }
        (Some(url), Some(secret), Some(address), true) => ClaimStep::Lease(Box::new(Sendable {
            notification: n,
            url,
            secret,
            // Only while its grace lasts.
            previous_secret: row
                .previous_secret
                .filter(|_| row.previous_secret_until.is_some_and(|until| until > now)),
            address,
            rate_limit: row.rate_limit,
        })),
        _ => ClaimStep::Cancel,
    }
}

/// What one batch of recorded attempts says of one client, in the order they were made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAttempts {
    pub client_id: String,
    /// An attempt was delivered: the client is healthy again from then on.
    pub succeeded: bool,
    /// The first failed attempt after the last delivered one, if any.
    pub failing_since: Option<Millis>,
    /// A failed attempt after the last delivered one answered `410 Gone`.
    pub gone: bool,
}

/// Sums up a batch of outcomes per client, for [`disable_reason`]. Outcomes without an
/// attempt (superseded while waiting) say nothing of the client.
pub fn client_attempts(outcomes: &[Outcome]) -> Vec<ClientAttempts> {
    let mut out: Vec<ClientAttempts> = Vec::new();
    for o in outcomes {
        let Some(a) = &o.attempt else { continue };
        let i = match out.iter().position(|c| c.client_id == o.client_id) {
            Some(i) => i,
            None => {
                out.push(ClientAttempts {
                    client_id: o.client_id.clone(),
                    succeeded: false,
                    failing_since: None,
                    gone: false,
                });
                out.len() - 1
            }
        };
        let c = &mut out[i];
        if a.delivered() {
            c.succeeded = true;
            c.failing_since = None;
            c.gone = false;
        } else {
            c.failing_since = Some(c.failing_since.map_or(a.at, |f| f.min(a.at)));
            c.gone |= a.status_code == Some(410);
        }
    }
    out
}

/// When a client is disabled: it answered `410 Gone`, or every attempt since
/// `failing_since` failed and that is `disable_after` ago or more. `failing_since` is the
/// client's first failure since its last delivery, as the store keeps it across batches.
pub fn disable_reason(
    gone: bool,
    failing_since: Option<Millis>,
    now: Millis,
    disable_after: Millis,
) -> Option<DisabledReason> {
    if gone {
        Some(DisabledReason::Gone)
    } else if failing_since.is_some_and(|since| now - since >= disable_after) {
        Some(DisabledReason::Failing)
    } else {
        None
    }
}

/// Why a manual retry is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RetryRefusal {
    #[error("only failed notifications can be retried; this one is {}", .0.as_str())]
    NotFailed(Status),
    #[error(
        "a newer state of this sensor was sent to this client since; \
         retrying would deliver an older state after a newer one"
    )]
    NewerStateSent,
}

/// When a manual retry is refused: only a failed notification goes back to pending, and
/// not a state that would reach its client after a newer one (ordering outranks a retry).
///
/// `newer_state_sent` is read by the backends' `retry_notification` in SQL: the
/// notification is a `sensor.state_changed` one and a later (`seq`) one of the same
/// client and sensor is `pending` or `delivered`.
pub fn retry_refusal(n: &Notification, newer_state_sent: bool) -> Option<RetryRefusal> {
    if n.status != Status::Failed {
        return Some(RetryRefusal::NotFailed(n.status));
    }
    newer_state_sent.then_some(RetryRefusal::NewerStateSent)
}

#[cfg(test)]
mod tests {
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
            status,
            attempts: 3,
            next_attempt_at: Some(5),
            created_at: 1,
            updated_at: 2,
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
            linked: true,
            previous_secret: None,
            previous_secret_until: None,
            disabled: false,
            rate_limit: None,
            lane: LaneInStore::default(),
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
                // Every failed attempt has an error; without a status and without one it
                // would be a broker's acknowledgement.
                error: (!code.is_some_and(|c| (200..300).contains(&c))).then(|| "failed".into()),
                duration_ms: 1,
            }),
            attempts: 1,
            verdict: Verdict::Failed,
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
                },
                ClientAttempts {
                    client_id: "b".into(),
                    succeeded: false,
                    failing_since: Some(11),
                    gone: true,
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
                newer_state_delivered: false,
            },
            ..row(Status::Pending)
        };
        // Another node sends the older one now: until its lease ends.
        match claim_step(behind(Some(5_000)), "me", 100) {
            ClaimStep::Answer(Claim::Leased { until, .. }) => assert_eq!(until, 5_000),
            _ => panic!("expected to wait"),
        }
        // Not in flight (or its lease ran out): ask again shortly.
        for lease in [None, Some(50)] {
            match claim_step(behind(lease), "me", 100) {
                ClaimStep::Answer(Claim::Leased { until, .. }) => {
                    assert_eq!(until, 100 + BEHIND_RECHECK_MS)
                }
                _ => panic!("expected to wait"),
            }
        }
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
}
