//! Delivery once the run has healed and settled (book: What latch guarantees, Testing):
//! nothing left pending, an attempt answered 2xx recorded delivered, every linked lane's
//! newest state delivered and soon, and a healthy client not held up by another's endpoint.

use std::collections::{BTreeMap, BTreeSet};

use latch::domain::{EventKind, Millis, SensorId, Status};

use super::{Bounds, troubled};
use crate::log::{Log, SimClient};
use crate::model::{Tables, Trail};
use crate::receivers::lane_key;
use crate::world::World;

/// Nothing pending is left once everything healed: progress (book, Testing: once the run
/// has healed, every lane's last state delivered; Crash safety: every pending notification
/// is delivered).
pub(super) fn nothing_pending(world: &World, t: &Tables, trails: &[&Trail], start: Millis) {
    for tr in trails {
        if tr.status == Status::Pending {
            let row = t.notifications.get(&tr.seq);
            world.violate(
                "every lane's final state is delivered once faults stop",
                format!(
                    "{} ({} of {}/{}) still pending: {} attempts, next at {:?}, leased by {:?} until {:?}",
                    tr.id,
                    tr.kind.as_str(),
                    tr.client_id,
                    tr.sensor_id,
                    row.map_or(0, |r| r.notification.attempts),
                    row.and_then(|r| r.notification.next_attempt_at).map(|a| a - start),
                    row.and_then(|r| r.claimed_by.clone()),
                    row.and_then(|r| r.lease_until).map(|a| a - start),
                ),
                vec![tr.id.clone(), lane_key(&(tr.client_id.clone(), tr.sensor_id))],
            );
        }
    }
}

/// An attempt answered 2xx is recorded delivered (book, Testing: "a 2xx is recorded
/// delivered"), unless its process died or froze before it could say so. `answered`: each
/// notification an endpoint answered 2xx, when and through which process's life.
pub(super) fn answered_is_delivered(
    world: &World,
    t: &Tables,
    trails: &[&Trail],
    answered: &BTreeMap<String, (Millis, String)>,
    log: &Log,
    start: Millis,
) {
    for tr in trails {
        // A client or sensor deleted meanwhile: its notifications end cancelled, an
        // attempt in flight then may have been answered.
        let deleted = tr.status == Status::Cancelled
            && (t.audit().client_deleted_at(&tr.client_id).is_some()
                || tr
                    .changes
                    .iter()
                    .any(|c| c.to == Status::Cancelled && c.op == "delete_sensor"));
        if let Some((at, life)) = answered.get(&tr.id)
            && !log.unsure_lives.contains(life)
            && tr.status != Status::Delivered
            && !deleted
        {
            world.violate(
                "an attempt answered 2xx is recorded delivered",
                format!(
                    "{} answered 2xx at {} through {life}, recorded {}",
                    tr.id,
                    at - start,
                    tr.status.as_str()
                ),
                vec![tr.id.clone()],
            );
        }
    }
}

/// Every linked lane's newest state made since its link is delivered once faults stop
/// (book, Testing: every lane's last state delivered), and soon: within the claim lease
/// and 5 s of the faults' end (book: what a killed node leased waits out its lease;
/// anything else goes within seconds), for a client without a rate limit (a limit spreads
/// its backlog over time by design) and a state not failed and replayed since.
pub(super) fn newest_delivered(
    world: &World,
    t: &Tables,
    trails: &[&Trail],
    clients: &[SimClient],
    bounds: &Bounds,
    start: Millis,
) {
    let mut newest: BTreeMap<(String, SensorId), &Trail> = BTreeMap::new();
    for tr in trails.iter().filter(|t| t.kind == EventKind::StateChanged) {
        newest.insert((tr.client_id.clone(), tr.sensor_id), tr);
    }
    let limited: BTreeSet<&str> = t
        .clients()
        .filter(|c| c.client.rate_limit.is_some())
        .map(|c| c.client.id.as_str())
        .collect();
    let due = bounds.healed_at.max(bounds.silences_told_by) + bounds.claim_lease + 5_000;
    for c in clients {
        for (sensor, linked_at) in &c.links {
            let Some(tr) = newest.get(&(c.id.clone(), *sensor)) else {
                continue;
            };
            // A silence kept it: its end brings the client up to date (checked there).
            if tr.created_at <= *linked_at || tr.status == Status::Silenced {
                continue;
            }
            let keys = vec![tr.id.clone(), lane_key(&(c.id.clone(), *sensor))];
            // A dead letter past its retention is gone: no replay brings it back.
            let expired = tr.status == Status::Failed && tr.deleted_at.is_some();
            if tr.status != Status::Delivered && !expired {
                world.violate(
                    "every lane's final state is delivered once faults stop",
                    format!(
                        "{}/{sensor}: newest state {} is {}",
                        c.id,
                        tr.id,
                        tr.status.as_str()
                    ),
                    keys,
                );
                continue;
            }
            let replayed = tr
                .changes
                .iter()
                .any(|ch| ch.to == Status::Pending && ch.at >= bounds.healed_at);
            let delivered = tr
                .changes
                .iter()
                .rfind(|ch| ch.to == Status::Delivered)
                .map(|ch| ch.at);
            if let Some(at) = delivered
                && at > due
                && !replayed
                && !limited.contains(c.id.as_str())
            {
                world.violate(
                    "every lane's final state is delivered within a bound once faults stop",
                    format!(
                        "{}/{sensor}: newest state {} delivered at {}, {} ms after the faults stopped at {}",
                        c.id,
                        tr.id,
                        at - start,
                        at - bounds.healed_at,
                        bounds.healed_at - start
                    ),
                    keys,
                );
            }
        }
    }
}

/// Isolation (book: Clients are isolated): a healthy client is not held up by another
/// client's endpoint; its notifications settle promptly in quiet time.
pub(super) fn isolation(
    world: &World,
    trails: &[&Trail],
    log: &Log,
    clients: &[SimClient],
    bounds: &Bounds,
    start: Millis,
    now: Millis,
) {
    let healthy: BTreeSet<&str> = clients
        .iter()
        .filter(|c| c.healthy)
        .map(|c| c.id.as_str())
        .collect();
    for tr in trails {
        if !healthy.contains(tr.client_id.as_str())
            || tr.created_at + bounds.isolation > now
            || troubled(
                log,
                tr.created_at - bounds.isolation,
                tr.created_at + bounds.isolation,
            )
        {
            continue;
        }
        let settled = tr
            .changes
            .iter()
            .find(|c| c.from == Status::Pending)
            .map(|c| c.at);
        if settled.is_none_or(|at| at - tr.created_at > bounds.isolation) {
            world.violate(
                "a healthy client is not held up by another client's endpoint",
                format!(
                    "{} of healthy {} made at {} settled {:?}",
                    tr.id,
                    tr.client_id,
                    tr.created_at - start,
                    settled.map(|s| s - tr.created_at)
                ),
                vec![
                    tr.id.clone(),
                    lane_key(&(tr.client_id.clone(), tr.sensor_id)),
                ],
            );
        }
    }
}
