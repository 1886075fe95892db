//! Recording delivery outcomes: the attempts kept, each notification's result written
//! where `policy::recorded` lets it (never over another node's attempt in flight), and
//! each client's running summary and failure streak, which may disable it.

use std::collections::{HashMap, HashSet};
use std::future::Future;

use crate::domain::client::{Disabled, DisabledReason};
use crate::domain::policy::{self, ClientAttempts};
use crate::domain::{Millis, Outcome, Status};
use crate::store::Result;

/// A notification as recording finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub pending: bool,
    pub claimed_by: Option<String>,
    pub lease_until: Option<Millis>,
    /// Whether it names an alarm (its outcome may start an escalation).
    pub alarm: bool,
}

/// A notification's result: its status, attempts, next attempt and batch; its lease ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded<'a> {
    pub id: &'a str,
    pub status: Status,
    pub attempts: u32,
    pub next_attempt_at: Option<Millis>,
    pub batch_id: Option<&'a str>,
}

/// The tables recording reads and writes, within one transaction.
pub trait OutcomeTables {
    /// The notifications `ids` name (those that exist), held against other writers for
    /// the rest of the transaction, and the time their leases are judged at: `now`, or the
    /// database's clock where claims lease by it (PostgreSQL).
    fn held(
        &mut self,
        ids: &[&str],
        now: Millis,
    ) -> impl Future<Output = Result<(HashMap<String, Held>, Millis)>>;
    /// Keeps the attempts the outcomes made, in their order.
    fn insert_attempts(&mut self, attempted: &[&Outcome]) -> impl Future<Output = Result<()>>;
    /// Writes the results (one per notification), stamped `now`.
    fn write_results(
        &mut self,
        results: &[Recorded<'_>],
        now: Millis,
    ) -> impl Future<Output = Result<()>>;
    /// Adds a client's attempts of the batch to its running summary (last success, last
    /// failure, failures since the last success) and its failure streak: ended by a
    /// delivery last, else begun at the batch's first failure after its last delivery (or
    /// kept, when one ran). Answers when the streak began, if one runs on a client not
    /// disabled (`None` too for a client that no longer exists). An increment the backend
    /// makes where the row is: other nodes' recorders add to the same client at once.
    fn note_client(&mut self, c: &ClientAttempts) -> impl Future<Output = Result<Option<Millis>>>;
    /// Starts, at `now`, the escalation timers of the alarms the notifications `ids`
    /// (delivered or failed for good, each naming an alarm) were sent for: where the
    /// alarm is still open, the client has an `escalation` to a client that exists, and
    /// the chain is not past its last level; one per alarm and client it goes to.
    fn start_escalations(&mut self, ids: &[&str], now: Millis) -> impl Future<Output = Result<()>>;
    /// Disables the client from `now` for `reason`.
    fn disable_client(
        &mut self,
        client_id: &str,
        now: Millis,
        reason: DisabledReason,
    ) -> impl Future<Output = Result<()>>;
}

/// Records a batch of outcomes: what `Outbox::record` does on every backend. Answers the
/// clients it disabled.
pub async fn record<T: OutcomeTables>(
    t: &mut T,
    outcomes: &[Outcome],
    now: Millis,
    disable_after: Millis,
) -> Result<Vec<Disabled>> {
    let attempted: Vec<&Outcome> = outcomes.iter().filter(|o| o.attempt.is_some()).collect();
    if !attempted.is_empty() {
        t.insert_attempts(&attempted).await?;
    }
    let (results, alarmed) = results(t, outcomes, now).await?;
    if !results.is_empty() {
        t.write_results(&results, now).await?;
    }
    // The escalation timer starts when an alarm's notification is delivered or fails.
    let ended: Vec<&str> = results
        .iter()
        .filter(|r| matches!(r.status, Status::Delivered | Status::Failed))
        .filter(|r| alarmed.contains(r.id))
        .map(|r| r.id)
        .collect();
    if !ended.is_empty() {
        t.start_escalations(&ended, now).await?;
    }
    let mut disabled = Vec::new();
    for c in policy::client_attempts(outcomes) {
        let Some(since) = t.note_client(&c).await? else {
            continue;
        };
        if let Some(reason) = policy::disable_reason(c.gone, Some(since), now, disable_after) {
            t.disable_client(&c.client_id, now, reason).await?;
            disabled.push(Disabled {
                client_id: c.client_id,
                reason,
            });
        }
    }
    Ok(disabled)
}

/// Each notification's result, in the order of its first outcome. Outcomes are taken in
/// order, each seeing what the one before it wrote (a lease it ended, a final status), so
/// two outcomes of one notification in a batch end as if recorded one after the other.
/// Also answers which of them name an alarm.
async fn results<'a, T: OutcomeTables>(
    t: &mut T,
    outcomes: &'a [Outcome],
    now: Millis,
) -> Result<(Vec<Recorded<'a>>, HashSet<String>)> {
    let mut ids: Vec<&str> = outcomes
        .iter()
        .map(|o| o.notification_id.as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let (mut held, lease_now) = t.held(&ids, now).await?;
    let alarmed: HashSet<String> = held
        .iter()
        .filter(|(_, h)| h.alarm)
        .map(|(id, _)| id.clone())
        .collect();
    let mut results: Vec<Recorded<'a>> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for o in outcomes {
        let Some(h) = held.get_mut(&o.notification_id) else {
            continue;
        };
        if !policy::recorded(
            o,
            h.pending,
            h.claimed_by.as_deref(),
            h.lease_until,
            lease_now,
        ) {
            continue;
        }
        let status = policy::status_after(o.verdict);
        *h = Held {
            pending: status == Status::Pending,
            claimed_by: None,
            lease_until: None,
            alarm: h.alarm,
        };
        let r = Recorded {
            id: &o.notification_id,
            status,
            attempts: o.attempts,
            next_attempt_at: o.verdict.next_at(),
            batch_id: o.batch_id.as_deref(),
        };
        match at.get(r.id) {
            Some(&i) => results[i] = r,
            None => {
                at.insert(r.id, results.len());
                results.push(r);
            }
        }
    }
    Ok((results, alarmed))
}
