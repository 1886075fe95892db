//! An alarm acknowledged (`POST /v1/alarms/{id}/ack`), in one transaction: the alarm is
//! marked with who took it and their note, its reminders still waiting are superseded (a
//! reminder made later is quiet, [`crate::domain::alarm::plan`]), and every client told of
//! it that still holds its lane gets one `alarm.acknowledged`, in the lane of its first
//! notification of the alarm — after the alarm in that lane's order.

use std::collections::HashSet;
use std::future::Future;

use crate::domain::alarm::{self, Alarm, AlarmKind, AlarmState, Opened, Unresolved};
use crate::domain::{Event, Millis, NotificationRef, SensorId};
use crate::store::Result;

/// The alarms' table as the rules that open and resolve alarms write it: the group commit
/// (a sensor's) and a site's decision (the site's, and its sensors' events it releases).
pub trait AlarmTables {
    /// A new alarm's id (the simulation's model makes them from its clock).
    fn new_alarm_id(&mut self) -> String {
        alarm::new_alarm_id()
    }
    /// The sensors' alarms not resolved of `keys` (sensor, kind; sorted, not empty).
    fn unresolved_alarms(
        &mut self,
        keys: &[(SensorId, AlarmKind)],
    ) -> impl Future<Output = Result<Vec<Unresolved>>>;
    /// Inserts the sensors' alarms `opened` (open, unacknowledged) and marks `resolved`
    /// those resolved (a site's too), at their times.
    fn write_alarms(
        &mut self,
        opened: &[Opened],
        resolved: &[(String, Millis)],
    ) -> impl Future<Output = Result<()>>;
    /// The site's `site_down` alarm not resolved, if any.
    fn site_alarm(&mut self, site: &str) -> impl Future<Output = Result<Option<String>>>;
    /// Opens the site's `site_down` alarm `id` at `at`.
    fn open_site_alarm(
        &mut self,
        id: &str,
        site: &str,
        at: Millis,
    ) -> impl Future<Output = Result<()>>;
    /// Names alarm `id` on the notification `seq` just made.
    fn name_alarm(&mut self, seq: i64, id: &str) -> impl Future<Output = Result<()>>;
}

/// The alarm each of `events` opens, reminds of or resolves ([`alarm::plan`]), written:
/// for the sensors' events a site releases (its decision, a sensor leaving it), where one
/// event may stand several times (once per client it goes to) and counts once.
pub async fn of_events<T: AlarmTables>(
    t: &mut T,
    events: &[&Event],
) -> Result<Vec<Option<String>>> {
    let key = |e: &Event| (e.sensor_id, e.kind, e.at);
    let mut distinct: Vec<&Event> = Vec::new();
    for e in events {
        if !distinct.iter().any(|d| key(d) == key(e)) {
            distinct.push(e);
        }
    }
    let none = HashSet::new();
    let keys = alarm::keys(&distinct, &none, &HashSet::new());
    if keys.is_empty() {
        return Ok(vec![None; events.len()]);
    }
    let unresolved = t.unresolved_alarms(&keys).await?;
    let plan = alarm::plan(&distinct, &none, &HashSet::new(), unresolved, || {
        t.new_alarm_id()
    });
    t.write_alarms(&plan.opened, &plan.resolved).await?;
    Ok(events
        .iter()
        .map(|e| {
            distinct
                .iter()
                .position(|d| key(d) == key(e))
                .and_then(|k| plan.ids.get(k).cloned().flatten())
        })
        .collect())
}

/// Who acknowledges, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub by: String,
    pub note: Option<String>,
}

/// What an acknowledgement came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Acked {
    /// Taken now: the alarm as it is now, and the `alarm.acknowledged` notifications made.
    Taken(Alarm, Vec<NotificationRef>),
    /// Acknowledged before: nothing changed.
    Already(Alarm),
    /// Resolved before anyone took it: nothing changed.
    Resolved(Alarm),
    Missing,
}

/// A client told of an alarm, and the sensor whose lane its first notification of it
/// travelled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    pub client_id: String,
    pub lane: SensorId,
}

/// The tables an acknowledgement reads and writes, within one transaction.
pub trait AckTables {
    /// The alarm, locked for this transaction where the backend locks rows.
    fn alarm(&mut self, id: &str) -> impl Future<Output = Result<Option<Alarm>>>;
    /// Marks it acknowledged by `ack` at `now`.
    fn acknowledge(&mut self, id: &str, ack: &Ack, now: Millis)
    -> impl Future<Output = Result<()>>;
    /// Supersedes its pending reminders (`sensor.still_lost`, a `sensor.state_held` with a
    /// `reminder`) no attempt holds (on the clock claims lease by).
    fn quiet_reminders(&mut self, id: &str, now: Millis) -> impl Future<Output = Result<()>>;
    /// The clients it made a notification for that was not silenced nor cancelled, still
    /// linked to that notification's sensor and wanting `alarm.acknowledged`, in client
    /// order, each with its first such notification's sensor.
    fn told(&mut self, id: &str) -> impl Future<Output = Result<Vec<Told>>>;
    /// As [`super::commit::CommitTables::silence_new`]: an acknowledgement a silence
    /// matches is kept, not sent.
    fn silence_new(
        &mut self,
        seqs: &[i64],
        now: Millis,
    ) -> impl Future<Output = Result<HashSet<i64>>>;
    /// Inserts a pending `alarm.acknowledged` of alarm `id` for `to`, with `body`, due `now`.
    fn insert_ack(
        &mut self,
        to: &Told,
        id: &str,
        body: &str,
        now: Millis,
    ) -> impl Future<Output = Result<NotificationRef>>;
}

/// Acknowledges alarm `id`: what `Alarms::ack_alarm` does on every backend.
pub async fn acknowledge<T: AckTables>(
    t: &mut T,
    id: &str,
    ack: &Ack,
    now: Millis,
) -> Result<Acked> {
    let Some(mut alarm) = t.alarm(id).await? else {
        return Ok(Acked::Missing);
    };
    if alarm.acknowledged_at.is_some() {
        return Ok(Acked::Already(alarm));
    }
    if alarm.state == AlarmState::Resolved {
        return Ok(Acked::Resolved(alarm));
    }
    t.acknowledge(id, ack, now).await?;
    t.quiet_reminders(id, now).await?;
    alarm.state = AlarmState::Acknowledged;
    alarm.acknowledged_at = Some(now);
    alarm.acknowledged_by = Some(ack.by.clone());
    alarm.note = ack.note.clone();
    let body = alarm::ack_body(&alarm);
    let mut made = Vec::new();
    for to in t.told(id).await? {
        made.push(t.insert_ack(&to, id, &body, now).await?);
    }
    let seqs: Vec<i64> = made.iter().map(|n| n.seq).collect();
    let silenced = t.silence_new(&seqs, now).await?;
    made.retain(|n| !silenced.contains(&n.seq));
    Ok(Acked::Taken(alarm, made))
}

/// Of (client, sensor) rows in client order, each client's first.
pub fn first_of_each(rows: Vec<(String, String)>) -> Vec<Told> {
    let mut out: Vec<Told> = Vec::new();
    for (client_id, sensor) in rows {
        if out.last().is_some_and(|t| t.client_id == client_id) {
            continue;
        }
        // A stored lane's sensor id always parses (latch wrote it).
        if let Ok(lane) = SensorId::parse(&sensor) {
            out.push(Told { client_id, lane });
        }
    }
    out
}
