//! The group commit: a batch's rows of sensors still registered, and its events'
//! notifications — one per event and linked client that wants its type, in event order,
//! clients in id order, none for an event a site's decision holds — with the supersede
//! rule: per sensor, the first notification of its newest state change supersedes every
//! older pending state notification no attempt holds. A new notification a silence covers
//! is made silenced and not answered. Alarms ([`alarm::plan`]): an event opens, reminds of
//! or resolves its sensor's alarm of its kind, its notifications name the alarm, and a
//! reminder of an acknowledged alarm makes none.

use std::collections::{BTreeMap, HashSet};
use std::future::Future;

use super::alarms::AlarmTables;
use super::armed::{self, ArmedTables};
use crate::domain::alarm;
use crate::domain::{Event, EventKind, Millis, NotificationRef, SensorId};
use crate::store::{CommitBatch, Error, Fence, Result};

/// A notification the commit made: its event's place among the events written, its seq,
/// id and client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Made {
    pub event: usize,
    pub seq: i64,
    pub id: String,
    pub client_id: String,
}

/// A newer state notification of `sensor` (in one client's lane, or in every lane of the
/// sensor): the pending state notifications older than `seq` that no attempt holds are
/// superseded by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Newer<'a> {
    pub sensor: SensorId,
    pub client: Option<&'a str>,
    pub seq: i64,
}

/// The tables a group commit writes, within one transaction. An operation may hold its
/// writes and send them with a later operation's statements (PostgreSQL pipelines them);
/// all are sent by the time the last, [`CommitTables::silence_new`], answers.
pub trait CommitTables: AlarmTables + ArmedTables {
    /// The partitions of `fence` no longer held at their epoch, sorted (a store without
    /// partitions refuses a fence).
    fn fenced(&mut self, fence: &[Fence]) -> impl Future<Output = Result<Vec<u32>>>;
    /// Writes the batch's readings, states, events and applied keys, skipping the rows of
    /// sensors no longer registered (a delete racing a batch never resurrects state);
    /// answers the places in `batch.events` of the events written, in order.
    fn write_rows(
        &mut self,
        batch: &CommitBatch,
        now: Millis,
    ) -> impl Future<Output = Result<Vec<usize>>>;
    /// The places of the liveness events a site's decision holds (their notifications are
    /// the site's to make), recording each hold.
    fn hold_for_sites(
        &mut self,
        events: &[&Event],
        now: Millis,
    ) -> impl Future<Output = Result<HashSet<usize>>>;
    /// Inserts, pending and due `now`, one notification per event not `held` and client
    /// linked to its sensor that wants its type, in event order, clients in id order;
    /// answers them in that (seq) order. Each names its event's alarm in `alarm_ids` (by
    /// the event's place; empty: none has one). `events` may be empty.
    fn fan_out(
        &mut self,
        events: &[&Event],
        held: &HashSet<usize>,
        alarm_ids: &[Option<String>],
        now: Millis,
    ) -> impl Future<Output = Result<Vec<Made>>>;
    /// Supersedes, for each newer state, the older pending state notifications of its
    /// lanes whose lease is unset or ran out (on the clock claims lease by). `newer` may
    /// be empty.
    fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> impl Future<Output = Result<()>>;
    /// Marks silenced the new notifications (`seqs`, ascending; maybe none) an active
    /// silence covers; answers their seqs.
    fn silence_new(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> impl Future<Output = Result<HashSet<i64>>>;
}

/// Commits `batch`: what `Runtime::commit` does on every backend. Answers the
/// notifications made that are to be sent, in outbox order.
pub async fn commit<T: CommitTables>(
    t: &mut T,
    batch: &CommitBatch,
    now: Millis,
) -> Result<Vec<NotificationRef>> {
    let fenced = t.fenced(&batch.fence).await?;
    if !fenced.is_empty() {
        return Err(Error::Fenced(fenced));
    }
    // A sensor's out-of-schedule follows its change in the batch, so it is written,
    // journaled and fanned out as the engine's own events are.
    let mut armed = armed::decide(t, &batch.events).await?;
    let extended;
    let batch = match armed.events.take() {
        Some(events) => {
            extended = CommitBatch {
                events,
                ..batch.clone()
            };
            &extended
        }
        None => batch,
    };
    // Every operation is called, with nothing to do or not: a backend may hold an
    // operation's writes to send with the next one's (`CommitTables`).
    let written = t.write_rows(batch, now).await?;
    let events: Vec<&Event> = written.iter().map(|&k| &batch.events[k]).collect();
    let held = match events.is_empty() {
        true => HashSet::new(),
        false => t.hold_for_sites(&events, now).await?,
    };
    let plan = alarms(t, &events, &held, &armed.resolving).await?;
    let quiet = match plan.quiet.is_empty() {
        true => held,
        false => held.union(&plan.quiet).copied().collect(),
    };
    let made = t.fan_out(&events, &quiet, &plan.ids, now).await?;
    if !armed.bodies.is_empty() {
        let bodies: Vec<(i64, String)> = made
            .iter()
            .filter_map(|m| Some((m.seq, armed.bodies.get(&written[m.event])?.clone())))
            .collect();
        t.describe(&bodies).await?;
    }
    t.supersede(&newest_states(&events, &made), now).await?;
    let seqs: Vec<i64> = made.iter().map(|m| m.seq).collect();
    let silenced = t.silence_new(&seqs, now).await?;
    Ok(made
        .into_iter()
        .filter(|m| !silenced.contains(&m.seq))
        .map(|m| {
            let e = events[m.event];
            NotificationRef {
                id: m.id,
                seq: m.seq,
                client_id: m.client_id,
                sensor_id: e.sensor_id,
                kind: e.kind,
                due_at: now,
                attempts: 0,
                batch_id: None,
            }
        })
        .collect())
}

/// The alarms `events` open, remind of or resolve ([`alarm::plan`]), written; read only
/// when an event of the batch may touch one.
async fn alarms<T: CommitTables>(
    t: &mut T,
    events: &[&Event],
    held: &HashSet<usize>,
    resolving: &HashSet<SensorId>,
) -> Result<alarm::Plan> {
    let keys = alarm::keys(events, held, resolving);
    if keys.is_empty() {
        return Ok(alarm::Plan::default());
    }
    let unresolved = t.unresolved_alarms(&keys).await?;
    let plan = alarm::plan(events, held, resolving, unresolved, || t.new_alarm_id());
    t.write_alarms(&plan.opened, &plan.resolved).await?;
    Ok(plan)
}

/// Per sensor, the first notification of its newest state change among `made`: every
/// client linked to the sensor got one of that change, so it supersedes in each lane.
fn newest_states(events: &[&Event], made: &[Made]) -> Vec<Newer<'static>> {
    let mut newest: BTreeMap<SensorId, i64> = BTreeMap::new();
    let mut first_of_event = usize::MAX;
    for m in made {
        if m.event == first_of_event {
            continue;
        }
        first_of_event = m.event;
        let e = events[m.event];
        if e.kind == EventKind::StateChanged {
            newest.insert(e.sensor_id, m.seq);
        }
    }
    newest
        .into_iter()
        .map(|(sensor, seq)| Newer {
            sensor,
            client: None,
            seq,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Detail;

    fn event(sensor: &str, kind: EventKind) -> Event {
        Event {
            sensor_id: SensorId::parse(sensor).unwrap(),
            kind,
            at: 1,
            data: Some(true),
            previous: Some(false),
            last_seen_at: Some(1),
            detail: Detail::default(),
        }
    }

    fn made(event: usize, seq: i64, client: &str) -> Made {
        Made {
            event,
            seq,
            id: format!("n{seq}"),
            client_id: client.into(),
        }
    }

    #[test]
    fn the_newest_change_of_each_sensor_supersedes_from_its_first_notification() {
        let a1 = event("a", EventKind::StateChanged);
        let lost = event("a", EventKind::ConnectionLost);
        let a2 = event("a", EventKind::StateChanged);
        let b = event("b", EventKind::StateChanged);
        let events = [&a1, &lost, &a2, &b];
        let made = [
            made(0, 1, "c1"),
            made(0, 2, "c2"),
            made(1, 3, "c1"),
            made(2, 4, "c1"),
            made(2, 5, "c2"),
            made(3, 6, "c2"),
        ];
        let newer = newest_states(&events, &made);
        let got: Vec<(String, i64)> = newer
            .iter()
            .map(|n| (n.sensor.to_string(), n.seq))
            .collect();
        assert_eq!(got, [("a".to_string(), 4), ("b".to_string(), 6)]);
        assert!(newer.iter().all(|n| n.client.is_none()));
    }

    #[test]
    fn events_of_other_kinds_supersede_nothing() {
        let lost = event("a", EventKind::ConnectionLost);
        let restored = event("a", EventKind::ConnectionRestored);
        assert!(newest_states(&[&lost, &restored], &[made(0, 1, "c"), made(1, 2, "c")]).is_empty());
    }
}
