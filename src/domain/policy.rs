//! The notification policy: which pending notification a newer one makes pointless, which
//! one may be claimed and sent, what an attempt's answer means for it, whose outcome the
//! store keeps, and when a manual retry is refused. Pure, so it is tested on its own; the
//! store and the dispatcher carry out its decisions and decide nothing themselves.
//!
//! Some of these rules also run inside SQL, where they must be set-based and within one
//! transaction; those statements mirror the functions here and must change with them (see
//! [`supersedes`], [`recorded`] and [`retry_refusal`]).

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
/// the newer one follows it. Lost/restored notifications are never superseded by it (they
/// fold: [`folds`]).
///
/// The store applies this rule when it commits a state change, in the `UPDATE
/// notifications SET status = 'superseded'` of `commit_batch` in `store/sqlite/commit.rs`
/// and `store/postgres/commit.rs`: per sensor, every pending `sensor.state_changed` row
/// with a lower `seq` than the first one the change created, whose lease is unset or ran
/// out (leased means in flight). Every client linked to the sensor gets a newer
/// notification in the same commit, so per sensor is per (client, sensor) for them. The
/// dispatcher applies it again to its lanes ([`crate::delivery`]), for heads whose lease it
/// has not released yet, and a claim on a shared store to a head whose lease was released
/// since ([`claim_step`]).
pub fn supersedes(newer: Queued, older: Queued, older_in_flight: bool) -> bool {
    newer.kind == EventKind::StateChanged
        && older.kind == EventKind::StateChanged
        && older.seq < newer.seq
        && !older_in_flight
}

/// A pending notification of a lane as the lane rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub queued: Queued,
    /// It may be out: in flight here, or leased by another node as far as this node knows.
    /// No rule drops it: the outcome of its attempt decides it.
    pub out: bool,
}

/// Which of a lane's pending notifications (`older`, in outbox order) a `newer` one of the
/// same lane makes pointless: older states by the supersede rule ([`supersedes`]), waiting
/// lost/restored pairs by the fold rule ([`folds`]). Positions in `older`, ascending.
pub fn made_pointless(older: &[Waiting], newer: Queued) -> Vec<usize> {
    let mut out: Vec<usize> = older
        .iter()
        .enumerate()
        .filter(|(_, w)| supersedes(newer, w.queued, w.out))
        .map(|(i, _)| i)
        .collect();
    out.extend(folds(older, newer));
    out.sort_unstable();
    out
}

fn is_connection(kind: EventKind) -> bool {
    matches!(
        kind,
        EventKind::ConnectionLost | EventKind::ConnectionRestored
    )
}

/// The fold rule for connection notifications: an undelivered `sensor.connection_lost`
/// followed by its `restored` carries nothing the client needs once a newer pair of them
/// exists (the newer pair tells it the same, and later), so when a `restored` completes a
/// newer pair, the older pairs waiting before it are superseded. A client that is down for
/// weeks while a sensor comes and goes so holds a few of them per lane, not one pair per
/// outage: a `restored` whose `lost` it already got, the newest pair, and a `lost` after it.
///
/// Only pairs wholly waiting fold: nothing before or at one that is out (the `restored` of
/// a `lost` in flight must follow it), and a `restored` whose `lost` is not in `older`
/// (delivered already) stays, so the client still learns that the sensor came back.
pub fn folds(older: &[Waiting], newer: Queued) -> Vec<usize> {
    if newer.kind != EventKind::ConnectionRestored {
        return Vec::new();
    }
    let conn: Vec<usize> = (0..older.len())
        .filter(|&i| older[i].queued.seq < newer.seq && is_connection(older[i].queued.kind))
        .collect();
    // The newer pair's `lost`: what folds comes before it.
    let Some(pair) = conn
        .iter()
        .rposition(|&i| older[i].queued.kind == EventKind::ConnectionLost)
    else {
        return Vec::new();
    };
    let before = &conn[..pair];
    let after_out = before
        .iter()
        .rposition(|&i| older[i].out)
        .map_or(0, |p| p + 1);
    let tail = &before[after_out..];
    let kind_at = |k: usize| older[tail[k]].queued.kind;
    let first_lost = (0..tail.len()).find(|&k| kind_at(k) == EventKind::ConnectionLost);
    let last_restored = (0..tail.len()).rfind(|&k| kind_at(k) == EventKind::ConnectionRestored);
    match (first_lost, last_restored) {
        (Some(from), Some(to)) if from < to => tail[from..=to].to_vec(),
        _ => Vec::new(),
    }
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
    /// The sensor's labels now (none when it has none, or no longer exists).
    pub labels: super::sensor::Labels,
    /// The client still owns the sensor.
    pub linked: bool,
    /// The secret a rotation replaced and until when it still signs.
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<Millis>,
    /// The client is disabled.
    pub disabled: bool,
    pub rate_limit: Option<u32>,
    pub batch: Option<super::client::Batch>,
    /// The client's headers, authentication and certificate.
    pub receiver: super::receiver::Receiver,
    /// A site's notification: a newer one of the same site reached the client or waits
    /// for it, and supersedes this one (the owner's decision in issue #68).
    pub newer_site_event: bool,
    /// A sensor's own notification: an older notification of a site, for the same client,
    /// names the sensor and is still pending. The sensor's events wait for it, so a client
    /// never hears a sensor come back before the site event that still counts it lost
    /// (issue #68 item 12: a site's events travel in another lane).
    pub older_site_event: bool,
    /// A site's notification: an older notification of a sensor it names, about that
    /// sensor's connection and for the same client, is still pending. The site event
    /// waits for it, so a client hears what it is told of a sensor's connection in the
    /// order it was made, whichever lanes carry it (simulation seed 2125: a reminder,
    /// held up in its own lane, reached the client after the site's return named the
    /// sensor back). Every wait is on an older notification, so none goes round in a
    /// circle.
    pub older_own_event: bool,
    /// A sensor's own notification about its connection: a newer one about it (its own,
    /// or a site's naming it) was delivered to the client. It is superseded: sent now, a
    /// replayed dead letter would leave the client believing what is no longer so.
    pub newer_connection_told: bool,
    /// A site's notification: the sensors it names that a newer notification about their
    /// connection, delivered to the client, told of since. They are dropped from what it
    /// says (`site::without`; simulation seed 1684: a site's return replayed after the
    /// sensor's own return was delivered listed it still lost).
    pub overtaken: Vec<super::SensorId>,
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
    /// The latest lease another node holds on a newer notification of the lane still
    /// pending: a failed one replayed (or one swept up around a move) while the lane's
    /// newer one is in flight there waits for it.
    pub newer_lease_until: Option<Millis>,
    /// A newer state of the sensor was delivered to the client already.
    pub newer_state_delivered: bool,
    /// A newer state of the sensor waits for the client.
    pub newer_state_pending: bool,
}

/// How soon a lane waiting on another node asks the store again: for an attempt that node
/// has in flight (the lane goes on as soon as its outcome is recorded, not when its lease
/// would run out, tens of seconds later), or for older notifications of the lane still
/// pending there.
pub const RECHECK_MS: Millis = 1_000;

/// When a lane whose head another node holds until `lease_until` asks again.
pub fn look_again(lease_until: Millis, now: Millis) -> Millis {
    lease_until.min(now + RECHECK_MS)
}

/// What a claim does with one notification, the same on every backend.
pub enum ClaimStep {
    /// Lease it to the claiming node and send it.
    Lease(Box<Sendable>),
    /// Lease it and send it with the body it now has, which the store writes over the old
    /// one (and forgets the sensors it no longer names): a site's event without the
    /// sensors a newer notification told of ([`ClaimRow::overtaken`]).
    Retell(Box<Sendable>),
    /// Its client is gone or no longer owns the sensor: mark it cancelled.
    Cancel,
    /// A newer state of its sensor reached the client already, or waits for it: mark it
    /// superseded.
    Supersede,
    /// Nothing to write: answer this.
    Answer(Claim),
}

/// Which head may be claimed: only a pending notification, not leased by another node
/// (a node's own lease is one its lanes hold: at its start it gave back those of its
/// earlier process, `ClusterStore::forget_outbox_leases`), due, whose client still
/// exists, still owns the sensor and is not disabled, is sent. A disabled client's
/// notification is left as it is: it waits for the client to be enabled.
///
/// Order across nodes: a head with older notifications of its lane still pending in the
/// store waits for them, and one whose newer notification another node has in flight (a
/// replay of a failed one) waits for that attempt (asking again within [`RECHECK_MS`]: the node serving the sensor
/// has them in its lanes, or sweeps them up); a state older than one the client already
/// got, or than one waiting for it, is superseded (the supersede rule, now that it is not
/// in flight), never sent before it. A head not yet due waits for its time: a lane that
/// waited on another node's attempt learns its retry time here.
pub fn claim_step(row: ClaimRow, node: &str, now: Millis) -> ClaimStep {
    let mut n = row.notification;
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
    if n.kind == EventKind::StateChanged
        && (row.lane.newer_state_delivered || row.lane.newer_state_pending)
    {
        return ClaimStep::Supersede;
    }
    // A site's events travel in the lanes of the sensors they name first, which may
    // differ: the newer one is the site as it is, whichever lane reaches the client first.
    if n.kind.is_site() && row.newer_site_event {
        return ClaimStep::Supersede;
    }
    if n.kind.is_connection() && row.newer_connection_told {
        return ClaimStep::Supersede;
    }
    let mut retold = false;
    if n.kind.is_site() && !row.overtaken.is_empty() {
        match super::site::without(n.kind, n.body.as_deref().unwrap_or("{}"), &row.overtaken) {
            Some(body) => {
                n.body = Some(body);
                retold = true;
            }
            None => return ClaimStep::Supersede,
        }
    }
    // Each wait is on an older notification, so none goes round in a circle; it ends
    // when that one is delivered, superseded or dead-lettered.
    if (!n.kind.is_site() && row.older_site_event) || (n.kind.is_site() && row.older_own_event) {
        return ClaimStep::Answer(Claim::Later {
            id: n.id,
            at: now + RECHECK_MS,
            unswept: false,
        });
    }
    if row.lane.older_pending > 0 {
        let until = row.lane.older_lease_until.filter(|&u| u > now);
        let at = look_again(until.unwrap_or(Millis::MAX), now);
        let unswept = until.is_none();
        return ClaimStep::Answer(Claim::Later {
            id: n.id,
            at,
            unswept,
        });
    }
    if let Some(until) = row.lane.newer_lease_until.filter(|&u| u > now) {
        let at = look_again(until, now);
        return ClaimStep::Answer(Claim::Later {
            id: n.id,
            at,
            unswept: false,
        });
    }
    if let Some(at) = n.next_attempt_at.filter(|&at| at > now) {
        return ClaimStep::Answer(Claim::Later {
            id: n.id,
            at,
            unswept: false,
        });
    }
    match (row.url, row.secret, row.address, row.linked) {
        (Some(_), Some(_), Some(_), true) if row.disabled => {
            ClaimStep::Answer(Claim::Disabled { id: n.id })
        }
        (Some(url), Some(secret), Some(address), true) => {
            let send = Box::new(Sendable {
                notification: n,
                batch: super::client::effective_batch(row.batch, &url),
                url,
                secret,
                // Only while its grace lasts.
                previous_secret: row
                    .previous_secret
                    .filter(|_| row.previous_secret_until.is_some_and(|until| until > now)),
                address,
                labels: row.labels,
                rate_limit: row.rate_limit,
                receiver: row.receiver,
                unopened: None,
            });
            match retold {
                true => ClaimStep::Retell(send),
                false => ClaimStep::Lease(send),
            }
        }
        _ => ClaimStep::Cancel,
    }
}

/// Whether an outcome is written over its notification as the store holds it (pending or
/// not, and its lease): only over a pending one, and not over another node's live lease —
/// that node's attempt is in flight, and its outcome is the one to keep — unless it is an
/// attempt that was delivered: that happened, whichever node holds the notification now.
/// A head superseded in a lane, or an attempt that failed, never overwrites another node's
/// attempt in flight.
///
/// A lease given back unsent ([`gives_back`]) is written only over this node's own: once
/// another node's record freed the row, it holds that node's retry time, which a give-back
/// written late would move to now (simulation seed 1970516, `--debounce`: a 429's
/// `Retry-After` cut short on a third node).
///
/// `store::rules::record` applies it, to the notifications it holds for the transaction.
pub fn recorded(
    o: &Outcome,
    pending: bool,
    claimed_by: Option<&str>,
    lease_until: Option<Millis>,
    now: Millis,
) -> bool {
    let own = claimed_by == Some(&*o.node);
    if gives_back(o) {
        return pending && own;
    }
    let delivered = o.attempt.is_some() && o.verdict == Verdict::Delivered;
    let free = lease_until.is_none_or(|until| until < now) || own;
    pending && (delivered || free)
}

/// Whether `o` only gives a lease back: no attempt was made, and the notification stays
/// pending, due at once.
pub fn gives_back(o: &Outcome) -> bool {
    o.attempt.is_none() && matches!(o.verdict, Verdict::Retry { .. })
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
    /// The time of the last delivered attempt of the batch.
    pub last_success_at: Option<Millis>,
    /// The time and error of the last failed attempt of the batch.
    pub last_failure: Option<(Millis, Option<String>)>,
    /// Failed attempts after the batch's last delivered one (all of them without one).
    pub failures_after: u64,
}

/// Sums up a batch of outcomes per client, for [`disable_reason`], ordered by client id.
/// Outcomes without an attempt (superseded while waiting) say nothing of the client.
///
/// The order is the order the recorder locks the clients' rows in: the same as every
/// other writer of several clients (resealing walks them by id), so two of them never
/// wait for each other (a recorder in outcome order deadlocked `latch rotate-key`).
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
                    last_success_at: None,
                    last_failure: None,
                    failures_after: 0,
                });
                out.len() - 1
            }
        };
        let c = &mut out[i];
        if a.delivered() {
            c.succeeded = true;
            c.failing_since = None;
            c.gone = false;
            c.last_success_at = Some(c.last_success_at.map_or(a.at, |s| s.max(a.at)));
            c.failures_after = 0;
        } else {
            c.failing_since = Some(c.failing_since.map_or(a.at, |f| f.min(a.at)));
            c.gone |= a.status_code == Some(410);
            c.last_failure = Some((a.at, a.error.clone()));
            c.failures_after += 1;
        }
    }
    out.sort_by(|a, b| a.client_id.cmp(&b.client_id));
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
    #[error(
        "a newer connection_lost or connection_restored of this sensor was sent to this \
         client since; retrying would tell it an older connection state after a newer one"
    )]
    NewerConnectionSent,
}

/// The kinds of a newer notification of the same lane that make a manual retry of one of
/// `kind` pointless and harmful: a newer state for a state, a newer lost or restored for
/// a lost or restored (a failed `lost` sent again after a delivered `restored` would tell
/// the client that an online sensor is lost), and any newer connection notification for
/// a reminder (a `still_lost` sent after the sensor came back is false).
pub fn outranked_by(kind: EventKind) -> &'static [EventKind] {
    match kind {
        EventKind::StateChanged => &[EventKind::StateChanged],
        EventKind::ConnectionLost | EventKind::ConnectionRestored => {
            &[EventKind::ConnectionLost, EventKind::ConnectionRestored]
        }
        EventKind::StillLost => &[
            EventKind::ConnectionLost,
            EventKind::ConnectionRestored,
            EventKind::StillLost,
        ],
        EventKind::SiteConnectionLost | EventKind::SiteConnectionRestored => &[
            EventKind::SiteConnectionLost,
            EventKind::SiteConnectionRestored,
        ],
        // An alarm sent again after its newer clearing (or a clearing after a newer alarm)
        // would tell the client what is no longer so.
        EventKind::BatteryLow | EventKind::BatteryOk => {
            &[EventKind::BatteryLow, EventKind::BatteryOk]
        }
        EventKind::Tamper | EventKind::TamperCleared => {
            &[EventKind::Tamper, EventKind::TamperCleared]
        }
        EventKind::Fault | EventKind::FaultCleared => &[EventKind::Fault, EventKind::FaultCleared],
        // A `state_held` after a newer change of state is false; a clearing after a newer
        // `state_held` would close what is open.
        EventKind::StateHeld => &[
            EventKind::StateChanged,
            EventKind::StateHeld,
            EventKind::StateHeldCleared,
        ],
        EventKind::StateHeldCleared => &[EventKind::StateHeld, EventKind::StateHeldCleared],
        // Each tells the state: a newer state outranks it, as a state does.
        EventKind::Flapping | EventKind::FlappingStopped => &[
            EventKind::StateChanged,
            EventKind::Flapping,
            EventKind::FlappingStopped,
        ],
        // An acknowledgement stays true whatever came after it, as does a state that was
        // out of schedule when it began.
        EventKind::AlarmAcknowledged
        | EventKind::AlarmEscalated
        | EventKind::StateOutOfSchedule => &[],
    }
}

/// When a manual retry is refused: only a failed notification goes back to pending, and
/// not one that would reach its client after a newer one of its kind (ordering outranks a
/// retry).
///
/// `newer_sent` is read by the backends' `retry_notification` and `retry_notifications`
/// in SQL: a later (`seq`) notification of the same client and sensor, of a kind in
/// [`outranked_by`], is `pending` or `delivered`.
pub fn retry_refusal(n: &Notification, newer_sent: bool) -> Option<RetryRefusal> {
    if n.status != Status::Failed {
        return Some(RetryRefusal::NotFailed(n.status));
    }
    newer_sent.then_some(match n.kind {
        EventKind::StateChanged => RetryRefusal::NewerStateSent,
        _ => RetryRefusal::NewerConnectionSent,
    })
}

#[cfg(test)]
mod tests;
