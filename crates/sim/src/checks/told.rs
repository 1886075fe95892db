//! What each client is told of a sensor's connection, its own events and its sites' taken
//! together (book: Sites, Silences): a return only after a loss, a reminder only while
//! lost. A site's decision that lost a held loss (a sensor moved or its site deleted in
//! the grace, issue #68) leaves a client told of a return it never heard the loss of.

use std::collections::BTreeMap;

use latch::domain::{EventKind, Millis, SensorId, Status};

use crate::log::Log;
use crate::model::{Tables, Trail};
use crate::receivers::lane_key;
use crate::world::World;

/// What a client was last told of a sensor's connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    /// Nothing the check can rely on: not told yet since the client's link, subscription
    /// or a silence that kept something from it (which its end reconciles).
    Unknown,
    Online,
    Lost,
}

/// The sensors a site's notification names, each with what it tells of it.
/// What a notification told of the connection of the sensors it names; `None` for one that
/// tells nothing of it. A change of data is never held, so it may come before the return a
/// site holds back; nor does a battery, tamper or fault event tell of the connection.
fn connection_told(tr: &Trail) -> Option<Vec<(SensorId, Told)>> {
    Some(match tr.kind {
        EventKind::SiteConnectionLost | EventKind::SiteConnectionRestored => named(tr),
        EventKind::ConnectionLost | EventKind::StillLost => vec![(tr.sensor_id, Told::Lost)],
        EventKind::ConnectionRestored => vec![(tr.sensor_id, Told::Online)],
        EventKind::StateChanged
        | EventKind::BatteryLow
        | EventKind::BatteryOk
        | EventKind::Tamper
        | EventKind::TamperCleared
        | EventKind::Fault
        | EventKind::FaultCleared
        | EventKind::StateHeld
        | EventKind::StateHeldCleared
        | EventKind::Flapping
        | EventKind::FlappingStopped
        | EventKind::AlarmAcknowledged
        | EventKind::StateOutOfSchedule => return None,
        // A sensor's loss escalated tells the client reached that it is lost: its end, the
        // return, is told to it too.
        EventKind::AlarmEscalated => match escalated_kind(tr).as_deref() {
            Some("connection_lost") => vec![(tr.sensor_id, Told::Lost)],
            _ => return None,
        },
    })
}

/// The kind of the alarm an `alarm.escalated` names.
fn escalated_kind(tr: &Trail) -> Option<String> {
    let body: serde_json::Value = serde_json::from_str(tr.body.as_deref()?).ok()?;
    body["alarm"]["kind"].as_str().map(str::to_string)
}

fn named(tr: &Trail) -> Vec<(SensorId, Told)> {
    let body: serde_json::Value = tr
        .body
        .as_deref()
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or_default();
    let lists: &[(&str, Told)] = match tr.kind {
        EventKind::SiteConnectionLost => &[("sensors", Told::Lost)],
        _ => &[("restored", Told::Online), ("still_lost", Told::Lost)],
    };
    let mut out = Vec::new();
    for (list, told) in lists {
        for x in body[*list].as_array().into_iter().flatten() {
            if let Some(id) = x["id"].as_str().and_then(|s| SensorId::parse(s).ok()) {
                out.push((id, *told));
            }
        }
    }
    out
}

/// Per (client, sensor), in outbox order: a `connection_restored` only after the client was
/// told of a loss (its own, or a site's event naming the sensor), a `still_lost` only while
/// it was. A link or subscription change, a silence's keeping, a notification cancelled or
/// dead-lettered starts the client's knowledge afresh.
pub fn told_in_order(world: &World, t: &Tables, log: &Log, start: Millis) {
    let mut trails: Vec<&Trail> = t.audit.trails().collect();
    trails.sort_by_key(|tr| tr.seq);
    let mut told: BTreeMap<(String, SensorId), (Told, Millis)> = BTreeMap::new();
    // Whether the client's knowledge of `sensor` was reset in `(from, to]`.
    let reset = |client: &str, sensor: SensorId, from: Millis, to: Millis| {
        log.unlinked
            .iter()
            .any(|(c, s, at)| c == client && *s == sensor && *at > from && *at <= to)
            || log
                .subscriptions
                .iter()
                .any(|(c, at, _)| c == client && *at > from && *at <= to)
    };
    for tr in trails {
        let Some(about) = connection_told(tr) else {
            continue;
        };
        for (sensor, now) in about {
            let key = (tr.client_id.clone(), sensor);
            let (was, since) = told.get(&key).copied().unwrap_or((Told::Unknown, 0));
            let was = match reset(&tr.client_id, sensor, since, tr.created_at) {
                true => Told::Unknown,
                false => was,
            };
            // Not received (kept, cancelled, a site's event a newer one of the site
            // superseded, or a dead letter a replay may send any time): what the client
            // knows is open, and a silence's end may tell it again.
            if matches!(
                tr.status,
                Status::Silenced | Status::Cancelled | Status::Failed | Status::Superseded
            ) {
                told.insert(key, (Told::Unknown, tr.created_at));
                continue;
            }
            let wrong = match tr.kind {
                EventKind::ConnectionRestored => was == Told::Online,
                EventKind::StillLost => was == Told::Online,
                _ => false,
            };
            if wrong {
                world.violate(
                    "a client is told of a return only after the loss, of a reminder only while lost",
                    format!(
                        "{}: {} of {sensor} at {} ({}, {}) when it was last told the sensor online",
                        tr.client_id,
                        tr.kind.as_str(),
                        tr.created_at - start,
                        tr.id,
                        tr.status.as_str()
                    ),
                    vec![tr.id.clone(), lane_key(&(tr.client_id.clone(), sensor))],
                );
            }
            told.insert(key, (now, tr.created_at));
        }
    }
}

/// Once healed and settled: what each client heard last of a sensor's connection, in the
/// order the notifications reached it (its own events and its sites' travel in different
/// lanes, issue #68 item 12), is the sensor's connection now. Only for pairs whose every
/// notification about the sensor was delivered (none kept by a silence, cancelled, failed
/// or superseded, which leave what the client knows open) and whose link and subscription
/// never changed during the run.
pub fn final_view_is_true(world: &World, t: &Tables, log: &Log, start: Millis) {
    use latch::domain::Connection;
    // And the pairs something left open.
    /// Per (client, sensor): each delivered notification's time, seq and what it told.
    type Heard = BTreeMap<(String, SensorId), Vec<(Millis, i64, Told)>>;
    let mut heard: Heard = BTreeMap::new();
    let mut open: std::collections::BTreeSet<(String, SensorId)> = Default::default();
    for tr in t.audit.trails() {
        let Some(about) = connection_told(tr) else {
            continue;
        };
        let delivered_at = tr
            .attempts
            .iter()
            .filter(|a| a.delivered())
            .map(|a| a.at)
            .min();
        for (sensor, told) in about {
            let key = (tr.client_id.clone(), sensor);
            match (tr.status, delivered_at) {
                (Status::Delivered, Some(at)) => {
                    heard.entry(key).or_default().push((at, tr.seq, told))
                }
                _ => {
                    open.insert(key);
                }
            }
        }
    }
    for ((client, sensor), mut told) in heard {
        let key = (client.clone(), sensor);
        let changed = log
            .unlinked
            .iter()
            .any(|(c, s, _)| *c == client && *s == sensor)
            || log.subscriptions.iter().any(|(c, _, _)| *c == client);
        if open.contains(&key) || changed || !t.linked(&client, sensor) {
            continue;
        }
        let Some(now) = t.states.get(&sensor).map(|s| s.connection) else {
            continue;
        };
        told.sort_by_key(|&(at, seq, _)| (at, seq));
        let (at, _, last) = *told.last().expect("heard at least once");
        let truth = match now {
            Connection::Online => Told::Online,
            Connection::Lost => Told::Lost,
            Connection::Unknown => continue,
        };
        if last != truth {
            world.violate(
                "a client's final view of each sensor's connection is true",
                format!(
                    "{client} last heard {sensor} {last:?} (delivered at {}), which is {truth:?}",
                    at - start
                ),
                vec![lane_key(&(client.clone(), sensor))],
            );
        }
    }
}
