//! The escalation round ([`crate::domain::escalation`]), in one transaction: each timer
//! due is taken once (marked made), and where its alarm is still open and not
//! acknowledged, the client it goes to gets `alarm.escalated`; each client reached whose
//! alarm has been resolved since gets the notification that resolved it (its lane did not
//! carry it, as the client is not linked to the sensor), once.

use std::collections::HashSet;
use std::future::Future;

use crate::domain::alarm::{Alarm, AlarmState};
use crate::domain::escalation::escalated_body;
use crate::domain::{Millis, NotificationRef, SensorId};
use crate::store::Result;

/// Whether a round has anything to do: a timer due by `?1` (`$1`) not made, or one made
/// whose alarm is resolved and that is not closed. Asked first, without writing: a round
/// runs every second, and an empty write would end a full disk's episode in SQLite's eyes.
pub const ANY: &str = "SELECT EXISTS (SELECT 1 FROM escalations WHERE made_at IS NULL \
     AND due_at <= {now}) OR EXISTS (SELECT 1 FROM escalations e \
     JOIN alarms a ON a.id = e.alarm_id WHERE e.made_at IS NOT NULL AND e.closed_at IS NULL \
     AND a.state = 'resolved')";

/// The kinds whose notification resolves an alarm, as an SQL list
/// ([`crate::domain::alarm::resolving_kinds_sql`]).
pub static RESOLVING: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(crate::domain::alarm::resolving_kinds_sql);

/// How many timers a round takes at most.
pub const PER_ROUND: u32 = 200;

/// A timer: alarm `alarm_id` goes to `to` from `from` at `level`, in the lane of `sensor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    pub alarm_id: String,
    pub to: String,
    pub from: String,
    pub level: u32,
    pub sensor: SensorId,
}

/// The tables the round reads and writes, within one transaction.
pub trait EscalationTables {
    /// Up to `limit` timers due by `now` and not made, oldest first, each taken for this
    /// transaction (another node's round skips it).
    fn due(&mut self, now: Millis, limit: u32) -> impl Future<Output = Result<Vec<Timer>>>;
    /// Up to `limit` timers made whose alarm is resolved and that are not closed, taken
    /// as [`EscalationTables::due`]'s.
    fn resolved(&mut self, limit: u32) -> impl Future<Output = Result<Vec<Timer>>>;
    fn alarm(&mut self, id: &str) -> impl Future<Output = Result<Option<Alarm>>>;
    /// Marks the timer made (`closed`: closed too) at `now`.
    fn mark(
        &mut self,
        timer: &Timer,
        closed: bool,
        now: Millis,
    ) -> impl Future<Output = Result<()>>;
    /// Inserts a pending `alarm.escalated` with `body` for the timer's client, in its lane,
    /// naming the alarm; `None` when the client does not want the type (or is gone).
    fn insert_escalated(
        &mut self,
        timer: &Timer,
        body: &str,
        now: Millis,
    ) -> impl Future<Output = Result<Option<NotificationRef>>>;
    /// Copies, for the timer's client, the alarm's newest notification that resolved it
    /// (of its sensor, at its `resolved_at`), pending and due `now`; `None` when the
    /// client got it already, is linked to that sensor (so it got its own) or does not
    /// want the type.
    fn tell_resolved(
        &mut self,
        timer: &Timer,
        alarm: &Alarm,
        now: Millis,
    ) -> impl Future<Output = Result<Option<NotificationRef>>>;
    /// As [`super::commit::CommitTables::silence_new`].
    fn silence_new(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> impl Future<Output = Result<HashSet<i64>>>;
}

/// Runs one round: what `Alarms::escalate` does on every backend. Answers the
/// notifications made that are to be sent.
pub async fn escalate<T: EscalationTables>(t: &mut T, now: Millis) -> Result<Vec<NotificationRef>> {
    let mut made = Vec::new();
    for timer in t.due(now, PER_ROUND).await? {
        let alarm = t.alarm(&timer.alarm_id).await?;
        let open = alarm.as_ref().filter(|a| a.state == AlarmState::Open);
        // A timer of an alarm taken or resolved meanwhile is spent: the chain stops. So it
        // does at a client that does not take `alarm.escalated` (its `events`): it was not
        // reached, so it hears nothing more of the alarm.
        let sent = match open {
            Some(a) => {
                let body = escalated_body(a, timer.level, &timer.from);
                t.insert_escalated(&timer, &body, now).await?
            }
            None => None,
        };
        t.mark(&timer, sent.is_none(), now).await?;
        made.extend(sent);
    }
    for timer in t.resolved(PER_ROUND).await? {
        t.mark(&timer, true, now).await?;
        if let Some(a) = t.alarm(&timer.alarm_id).await? {
            made.extend(t.tell_resolved(&timer, &a, now).await?);
        }
    }
    let seqs: Vec<i64> = made.iter().map(|n| n.seq).collect();
    let silenced = t.silence_new(&seqs, now).await?;
    made.retain(|n| !silenced.contains(&n.seq));
    Ok(made)
}
