//! Retention (book, Testing: after each retention round): it deletes only what is past
//! its time and no lane still needs, and keeps the history within its window.

use std::collections::{BTreeMap, BTreeSet};

use latch::domain::policy::outranked_by;
use latch::domain::{EventKind, Millis, SensorId, Status};
use latch::store::Retention;

use crate::log::Log;
use crate::model::{ModelStore, Tables, Trail};
use crate::receivers::lane_key;
use crate::world::World;

/// After a retention round whose cut-offs are `keep`, made from `from` to `to` (book,
/// Retention; Testing: after each retention round): `notifications_deleted` and
/// `history_kept`.
pub fn retention(
    world: &World,
    model: &ModelStore,
    log: &Log,
    keep: Retention,
    from: Millis,
    to: Millis,
) {
    model.read(|t| {
        notifications_deleted(world, t, keep, from, to);
        history_kept(world, t, log, keep);
    });
}

/// Retention deletes only what is past its time and keeps what a lane still needs (book,
/// Retention: a notification's age is its last change, pending ones are never deleted, nor
/// a delivered state while an older state of its lane still waits, nor a delivered one
/// while an older failed one of its lane that it outranks is kept): what a round made from
/// `from` to `to` deleted was finished and last changed before its cut-off, and no lane
/// needed it (a delivered notification while an older one of its lane and kind class is
/// pending: the supersede rule and a retry's refusal read it); every pending notification
/// is still stored.
fn notifications_deleted(world: &World, t: &Tables, keep: Retention, from: Millis, to: Millis) {
    let audit = t.audit();
    let trails: Vec<&Trail> = audit.trails().collect();
    let mut lanes: BTreeMap<(&str, SensorId), Vec<&Trail>> = BTreeMap::new();
    for tr in &trails {
        lanes
            .entry((tr.client_id.as_str(), tr.sensor_id))
            .or_default()
            .push(tr);
    }
    for tr in &trails {
        let keys = || {
            vec![
                tr.id.clone(),
                lane_key(&(tr.client_id.clone(), tr.sensor_id)),
            ]
        };
        let Some(at) = tr.deleted_at.filter(|&at| at >= from && at <= to) else {
            if tr.deleted_at.is_none() && t.notification(&tr.id).is_none() {
                world.violate(
                    "retention deletes only what is past its time",
                    format!("{} ({}) is gone from the store", tr.id, tr.status.as_str()),
                    keys(),
                );
            }
            continue;
        };
        let updated = tr.deleted_updated_at.unwrap_or(tr.created_at);
        let past = keep
            .notifications_before
            .is_some_and(|b| updated < b && tr.created_at < b);
        if tr.status == Status::Pending || !past {
            world.violate(
                "retention deletes only what is past its time",
                format!(
                    "{} deleted at {at}: {}, last changed at {updated}, cut-off {:?}",
                    tr.id,
                    tr.status.as_str(),
                    keep.notifications_before
                ),
                keys(),
            );
        }
        // What its lane still needed: a delivered notification outranks an older one of
        // its lane that failed (a retry of that one is refused while it is stored) or, a
        // state, an older state pending (a claim of that one supersedes it).
        if tr.status == Status::Delivered
            && let Some(older) = lanes[&(tr.client_id.as_str(), tr.sensor_id)]
                .iter()
                .filter(|o| o.seq < tr.seq && outranked_by(o.kind).contains(&tr.kind))
                .filter(|o| o.deleted_at.is_none_or(|d| d > at))
                .find(|o| match status_at(o, at) {
                    Status::Failed => true,
                    Status::Pending => o.kind == EventKind::StateChanged,
                    _ => false,
                })
        {
            world.violate(
                "retention keeps what a lane still needs",
                format!(
                    "{} ({}, delivered) deleted at {at} while the older {} ({}) was {}",
                    tr.id,
                    tr.kind.as_str(),
                    older.id,
                    older.kind.as_str(),
                    status_at(older, at).as_str()
                ),
                keys(),
            );
        }
    }
}

/// Retention keeps the history within its window (book, Retention: readings and sensor
/// events older than `LATCH_RETENTION_READINGS` are deleted): every reading and event a
/// round's cut-off keeps is still stored, but a deleted sensor's.
fn history_kept(world: &World, t: &Tables, log: &Log, keep: Retention) {
    let audit = t.audit();
    if let Some(before) = keep.history_before {
        let readings: BTreeSet<i64> = t.readings().map(|(id, _)| id).collect();
        if let Some((r, _)) = audit
            .readings()
            .iter()
            .zip(audit.reading_commits())
            .find(|(r, c)| {
                r.row.ts >= before
                    && !readings.contains(&r.id)
                    && !log.deleted_after(r.row.sensor_id, c.at)
            })
        {
            world.violate(
                "retention keeps the history within its window",
                format!(
                    "reading {} of {} at {} deleted (cut-off {before})",
                    r.id, r.row.sensor_id, r.row.ts
                ),
                vec![r.row.sensor_id.to_string()],
            );
        }
        let events: BTreeSet<i64> = t.events().map(|(id, _)| id).collect();
        if let Some((e, _)) = audit
            .events()
            .iter()
            .zip(audit.event_commits())
            .find(|(e, c)| {
                e.row.at >= before
                    && !events.contains(&e.id)
                    && !log.forgotten_after(e.row.sensor_id, c.at)
            })
        {
            world.violate(
                "retention keeps the history within its window",
                format!(
                    "event {} of {} at {} deleted (cut-off {before})",
                    e.id, e.row.sensor_id, e.row.at
                ),
                vec![e.row.sensor_id.to_string()],
            );
        }
    }
}

/// A notification's status at `at`, from its trail.
fn status_at(tr: &Trail, at: Millis) -> Status {
    tr.changes
        .iter()
        .rev()
        .find(|c| c.at <= at)
        .map_or(Status::Pending, |c| c.to)
}
