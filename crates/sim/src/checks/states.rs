//! A sensor's states and losses as committed (book: A repeated value notifies nobody,
//! Late readings, Supersede, Debounce, Liveness): no loss declared within a stop, states
//! that change, newer states cancelling older pending ones, and debounced changes held
//! for their window.

use std::collections::BTreeMap;

use latch::domain::{EventKind, Millis, SensorId, Status};

use crate::log::Log;
use crate::model::{Tables, Trail};
use crate::world::World;

/// Downtime begins with a stop (book, Liveness): once a node's SIGTERM came, that node
/// declares no sensor lost for a deadline after it, until its process ends. (Other nodes
/// may: they still take readings. So may the node's next process, which takes its
/// partitions over and judges their deadlines as they were: a commit that began after
/// the stopping process ended is that one's, whatever the node's name. Seed 3002312 at
/// 1,000 steps: n2's next process, started after its stop, declared a sensor lost at a
/// deadline that fell within the stop.)
pub(super) fn not_lost_in_a_stop(world: &World, t: &Tables, log: &Log, start: Millis) {
    let commits = t.audit.event_commits();
    for (e, by) in t.audit.events().iter().zip(commits) {
        if e.row.kind != EventKind::ConnectionLost {
            continue;
        }
        let stopping = log.stops.iter().find(|(node, from, to)| {
            **node == *by.node && e.row.at > *from && e.row.at <= *to && by.at <= *to
        });
        if let Some((node, from, _)) = stopping {
            world.violate(
                "no sensor is declared lost once a stop began",
                format!(
                    "{} lost at {} by node {node}, whose SIGTERM came at {}",
                    e.row.sensor_id,
                    e.row.at - start,
                    from - start
                ),
                vec![e.row.sensor_id.to_string()],
            );
        }
    }
}

/// A repeated value notifies nobody, and a late reading changes no state (book): per
/// sensor, its committed `state_changed` events alternate their data, each names the one
/// before (or the state a `flapping` or its stop told since) as its `previous`, and none
/// is dated before the one before it.
pub(super) fn states_change(world: &World, t: &Tables, log: &Log, start: Millis) {
    let mut last: BTreeMap<SensorId, (bool, Millis)> = BTreeMap::new();
    for (e, by) in t.audit.events().iter().zip(t.audit.event_commits()) {
        let e = &e.row;
        if log.forgotten_after(e.sensor_id, by.at) {
            continue;
        }
        // A flapping sensor's `flapping` and `flapping_stopped` tell its state in place of
        // the changes they stand for: the next change follows the state they told.
        match (e.kind, e.data) {
            (EventKind::Flapping, Some(data)) => {
                last.insert(e.sensor_id, (data, e.at));
                continue;
            }
            (EventKind::FlappingStopped, Some(data)) => {
                // Dated on latch's clock, not the device's: the date stays the change's.
                let at = last.get(&e.sensor_id).map_or(Millis::MIN, |l| l.1);
                last.insert(e.sensor_id, (data, at));
                continue;
            }
            _ => {}
        }
        let (EventKind::StateChanged, Some(data)) = (e.kind, e.data) else {
            continue;
        };
        if let Some(&(before, at)) = last.get(&e.sensor_id) {
            let keys = vec![e.sensor_id.to_string()];
            if data == before || e.previous != Some(before) {
                world.violate(
                    "a repeated value notifies nobody",
                    format!(
                        "{}: state_changed to {data} (previous {:?}) at {} after one to {before}",
                        e.sensor_id,
                        e.previous,
                        e.at - start
                    ),
                    keys.clone(),
                );
            }
            if e.at < at {
                world.violate(
                    "a late reading changes no state",
                    format!(
                        "{}: state_changed to {data} dated {}, before the one to {before} dated {}",
                        e.sensor_id,
                        e.at - start,
                        at - start
                    ),
                    keys,
                );
            }
        }
        last.insert(e.sensor_id, (data, e.at));
    }
}

/// Supersede (book): a newer state cancels the older pending state notifications of its
/// lane; one already in flight (leased) finishes first. So the claim that leased an older
/// state for the attempt that delivered it found no newer state of its lane waiting (made
/// before that claim, not ended by it; the same millisecond is left out either way) —
/// unless a replay put it back. (A lease of an earlier attempt the store still held when
/// the newer one committed was allowed once; see BENCHMARKS.md.)
pub(super) fn superseded(world: &World, trails: &[&Trail], start: Millis) {
    let mut lanes: BTreeMap<(&str, SensorId), Vec<&Trail>> = BTreeMap::new();
    for tr in trails.iter().filter(|t| t.kind == EventKind::StateChanged) {
        lanes
            .entry((tr.client_id.as_str(), tr.sensor_id))
            .or_default()
            .push(tr);
    }
    for lane in lanes.values() {
        for (i, older) in lane.iter().enumerate() {
            let replayed = older.changes.iter().any(|c| c.from == Status::Failed);
            let Some(sent) = older.attempts.iter().rfind(|a| a.delivered()) else {
                continue;
            };
            let Some(&(claimed, _)) = older.claims.iter().rfind(|c| c.0 <= sent.at) else {
                continue;
            };
            if older.status != Status::Delivered || replayed {
                continue;
            }
            // Trails come in outbox order: what follows in the lane is newer.
            let waiting = lane[i + 1..].iter().find(|newer| {
                let ended = newer.changes.iter().find(|c| c.from == Status::Pending);
                newer.made_at < claimed && ended.is_none_or(|c| c.at > claimed)
            });
            if let Some(newer) = waiting {
                world.violate(
                    "a newer state cancels the older pending ones",
                    format!(
                        "{} claimed at {} and delivered, while {} made at {} waited",
                        older.id,
                        claimed - start,
                        newer.id,
                        newer.made_at - start
                    ),
                    vec![older.id.clone(), newer.id.clone()],
                );
            }
        }
    }
}

/// Debounce (book): a debounced sensor's new state is notified only once it has held for
/// its window. Per `state_changed` of such a sensor, among the readings of it committed
/// before (in the order applied, late ones left out; its own commit's, see below): the
/// change began with the first reading of the new value after the last of the other
/// value, and the event's commit came at least a window after that reading came in.
pub(super) fn debounced(world: &World, t: &Tables, log: &Log, start: Millis) {
    let readings: Vec<_> = t
        .audit
        .readings()
        .iter()
        .zip(t.audit.reading_commits())
        .filter(|(r, c)| !r.row.late && !log.deleted_after(r.row.sensor_id, c.at))
        .collect();
    for (e, by) in t.audit.events().iter().zip(t.audit.event_commits()) {
        let e = &e.row;
        if log.forgotten_after(e.sensor_id, by.at) {
            continue;
        }
        let (EventKind::StateChanged, Some(data)) = (e.kind, e.data) else {
            continue;
        };
        // The least window it may have had since its last change began (its changes in
        // the workload, `Log::settings`); none: not debounced.
        let initial = t
            .sensors
            .get(&e.sensor_id)
            .and_then(|s| s.debounce_s)
            .map_or(0, |w| Millis::from(w) * 1000);
        let since = by.at - 60_000;
        let (_, (window, _)) = log.settings_within(e.sensor_id, (0, initial), since, by.at);
        if window == 0 {
            continue;
        }
        // Readings of the event's own commit too (a node frozen past the window commits
        // the reading and the window's end together, seed 4641), but not one of the other
        // value there: it may have come after the window ended.
        let before: Vec<_> = readings
            .iter()
            .filter(|(r, c)| {
                r.row.sensor_id == e.sensor_id
                    && (c.commit < by.commit || (c.commit == by.commit && r.row.data == data))
            })
            .map(|(r, _)| r.row)
            .collect();
        let from = before
            .iter()
            .rposition(|r| r.data != data)
            .map_or(0, |last| last + 1);
        let began = before.get(from).map(|r| r.received_at);
        if began.is_none_or(|at| by.at - at < window) {
            world.violate(
                "a debounced change is notified only once it has held its window",
                format!(
                    "{}: state_changed to {data} committed at {}; the change began at {:?}",
                    e.sensor_id,
                    by.at - start,
                    began.map(|at| at - start)
                ),
                vec![e.sensor_id.to_string()],
            );
        }
    }
}
