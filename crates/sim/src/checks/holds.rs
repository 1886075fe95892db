//! A state held too long (issue #72, part 1), as `latch::domain::hold` promises it, over
//! every event committed (the store's audit, in commit order), the readings committed
//! with them, the hold alarms the workload wrote ([`Log::holds`]) and what the
//! endpoints got:
//!
//! - a `sensor.state_held` only for a state that held: the sensor's last reading applied
//!   before it was of that state, the state began (by the reading that began it, on
//!   latch's clock) no later than the event's `since`, and no reading of the other state
//!   came in between `since` and its `at`; its `since` is that reading's `received_at`,
//!   or a time its alarms were set; `at - since` is `after_s` (the first) or `after_s +
//!   reminder × remind_every_s` (a reminder) of an alarm the sensor had for that state;
//!   it is made no earlier than its `at`, and never while the sensor is lost;
//! - made once: no two with the same (sensor, since, reminder); a hold's reminders come
//!   after its first, numbered increasing, one at a time;
//! - a `sensor.state_held_cleared` only after a `state_held` of the same hold, at most
//!   once, at the `received_at` of the reading that changed the state (committed with
//!   it), naming the value held as `previous`; and a hold whose state changed after its
//!   `state_held` is cleared;
//! - what an endpoint got of a hold tells of an event made, and its body carries the
//!   event's `since`, `held_s` and `reminder`.
//!
//! Events and readings of a life of a sensor a later deletion ended are left out, as the
//! other checks do ([`Log::forgotten_after`], [`Log::deleted_after`]).
//!
//! These checks found that readings sent with an `Idempotency-Key` kept the stamp of
//! their request's arrival through the key's step in the store, so with a slow store they
//! were applied after readings received later and after a hold alarm due after they came
//! in (door alarms seeds 595, 996, 1294, 1342, 1393, 1476, 1520, 1681, 1930 and 2498 of the
//! first 3,000); they are stamped again as they reach the engine now.

use std::collections::{BTreeMap, BTreeSet};

use latch::domain::hold::held_s;
use latch::domain::{Event, EventKind, Millis, SensorId, time};

use crate::log::{FOLLOW_MS, Log};
use crate::model::Tables;
use crate::receivers::HoldBody;
use crate::world::World;

/// How long after a registry call a node serving its sensor may set the alarms it wrote
/// on a state already held: it follows the change log each second, and reads the last
/// three reads' changes again.
const SET_SLACK_MS: Millis = FOLLOW_MS + 3_000;

/// A reading committed: its group commit, its state, when it came in.
#[derive(Debug, Clone, Copy)]
struct Read {
    commit: u64,
    data: bool,
    received_at: Millis,
}

/// One hold as its events so far told it.
#[derive(Debug)]
struct Told {
    data: bool,
    /// The commit of its `state_held` and of its last reminder, and that reminder.
    first: u64,
    last: (u64, Option<u32>),
    cleared: bool,
}

pub(super) fn holds(
    world: &World,
    t: &Tables,
    log: &Log,
    bodies: &BTreeMap<String, HoldBody>,
    start: Millis,
) {
    // Each sensor's readings that applied (late ones change nothing), in commit order.
    let mut reads: BTreeMap<SensorId, Vec<Read>> = BTreeMap::new();
    for (r, c) in t.audit.readings().iter().zip(t.audit.reading_commits()) {
        let r = &r.row;
        if r.late || log.deleted_after(r.sensor_id, c.at) {
            continue;
        }
        reads.entry(r.sensor_id).or_default().push(Read {
            commit: c.commit,
            data: r.data,
            received_at: r.received_at,
        });
    }
    let none = Vec::new();
    let mut lost: BTreeSet<SensorId> = BTreeSet::new();
    let mut told: BTreeMap<(SensorId, Millis), Told> = BTreeMap::new();
    let mut made: BTreeSet<(SensorId, Millis, Option<u32>)> = BTreeSet::new();
    for (e, by) in t.audit.events().iter().zip(t.audit.event_commits()) {
        let e = &e.row;
        let x = e.sensor_id;
        if log.forgotten_after(x, by.at) {
            continue;
        }
        let keys = vec![x.to_string()];
        let v = |invariant: &'static str, why: String| {
            world.violate(
                invariant,
                format!("{x}: {} at {}: {why}", e.kind.as_str(), e.at - start),
                keys.clone(),
            )
        };
        let reads = reads.get(&x).unwrap_or(&none);
        match e.kind {
            EventKind::ConnectionLost => {
                lost.insert(x);
            }
            EventKind::ConnectionRestored => {
                lost.remove(&x);
            }
            EventKind::StateHeld => {
                let (Some(data), None, Some(since)) = (e.data, e.previous, e.detail.lost_since)
                else {
                    v(
                        "a state_held names the state held and since when",
                        format!(
                            "data {:?}, previous {:?}, since {:?}",
                            e.data, e.previous, e.detail.lost_since
                        ),
                    );
                    continue;
                };
                if lost.contains(&x) {
                    v(
                        "a lost sensor makes no state_held",
                        format!("committed at {} while lost", by.at - start),
                    );
                }
                if by.at < e.at {
                    v(
                        "a state_held is made once due",
                        format!("committed at {}, before it was due", by.at - start),
                    );
                }
                if !some_alarm_fits(log, x, data, since, e, by.at) {
                    v(
                        "a state_held comes after_s (and reminder × remind_every_s) after its since",
                        format!(
                            "{} ms after since {} (reminder {:?}): no alarm the sensor had for {} fits",
                            e.at - since,
                            since - start,
                            e.detail.reminder,
                            u8::from(data)
                        ),
                    );
                }
                let claim = Claim {
                    sensor: x,
                    data,
                    since,
                    at: e.at,
                    commit: by.commit,
                };
                if let Some(why) = not_held(log, &claim, reads, start) {
                    v("a state_held is made only for a state that held", why);
                }
                if !made.insert((x, since, e.detail.reminder)) {
                    v(
                        "a hold's state_held and each reminder are made once",
                        format!(
                            "a second one of since {} and reminder {:?}",
                            since - start,
                            e.detail.reminder
                        ),
                    );
                    continue;
                }
                match (e.detail.reminder, told.get_mut(&(x, since))) {
                    (None, None) => {
                        told.insert(
                            (x, since),
                            Told {
                                data,
                                first: by.commit,
                                last: (by.commit, None),
                                cleared: false,
                            },
                        );
                    }
                    (None, Some(_)) => {} // A second first: reported above.
                    (Some(n), None) => v(
                        "a hold's reminders follow its state_held",
                        format!("reminder {n} of since {} before any", since - start),
                    ),
                    (Some(n), Some(h)) => {
                        if h.cleared {
                            v(
                                "a hold ends with its clearing",
                                format!("reminder {n} of since {}, cleared", since - start),
                            );
                        }
                        if h.data != data {
                            v(
                                "a hold's reminders are of the state held",
                                format!("reminder {n} of {data}, the hold of {}", h.data),
                            );
                        }
                        if h.last.1.is_some_and(|m| n <= m) || n == 0 {
                            v(
                                "a hold's reminders are numbered increasing",
                                format!("reminder {n} after reminder {:?}", h.last.1),
                            );
                        }
                        if h.last.0 == by.commit {
                            v(
                                "a hold reminds one at a time, never a burst",
                                format!("reminder {n} committed with {:?}", h.last.1),
                            );
                        }
                        h.last = (by.commit, Some(n));
                    }
                }
            }
            EventKind::StateHeldCleared => {
                let (Some(now), Some(held), Some(since)) =
                    (e.data, e.previous, e.detail.lost_since)
                else {
                    v(
                        "a state_held_cleared names the state now, the state held and since when",
                        format!(
                            "data {:?}, previous {:?}, since {:?}",
                            e.data, e.previous, e.detail.lost_since
                        ),
                    );
                    continue;
                };
                if now == held {
                    v(
                        "a state_held_cleared comes of a change",
                        format!("from {held} to {now}"),
                    );
                }
                match told.get_mut(&(x, since)) {
                    None => v(
                        "a state_held_cleared follows a state_held of its hold",
                        format!("of since {}, never held", since - start),
                    ),
                    Some(h) => {
                        if h.cleared {
                            v(
                                "a hold is cleared at most once",
                                format!("of since {} again", since - start),
                            );
                        }
                        if h.data != held {
                            v(
                                "a state_held_cleared names the state held",
                                format!("previous {held}, the hold of {}", h.data),
                            );
                        }
                        h.cleared = true;
                    }
                }
                let change = reads
                    .iter()
                    .any(|r| r.commit == by.commit && r.data == now && r.received_at == e.at);
                if !change {
                    v(
                        "a state_held_cleared is dated by the reading that changed the state",
                        format!(
                            "no reading of {now} received at {} committed with it",
                            e.at - start
                        ),
                    );
                }
            }
            _ => {}
        }
    }
    // A hold whose state changed after its state_held was made is cleared.
    for ((x, since), h) in &told {
        if h.cleared {
            continue;
        }
        let reads = reads.get(x).unwrap_or(&none);
        if let Some(r) = reads
            .iter()
            .find(|r| r.commit > h.first && r.data != h.data)
        {
            world.violate(
                "a hold whose state changed after its state_held is cleared",
                format!(
                    "{x}: held {} since {}, changed to {} by the reading received at {}: no state_held_cleared",
                    h.data,
                    since - start,
                    r.data,
                    r.received_at - start
                ),
                vec![x.to_string()],
            );
        }
    }
    bodies_tell_events(world, t, bodies, start);
}

/// Whether an alarm `sensor` had for `data` (written by a call begun by `made`, its
/// event's commit) dates `e` as it is dated: `after_s` after `since`, and a reminder `n`
/// `n × remind_every_s` after that.
fn some_alarm_fits(
    log: &Log,
    sensor: SensorId,
    data: bool,
    since: Millis,
    e: &Event,
    made: Millis,
) -> bool {
    log.holds
        .iter()
        .filter(|h| h.sensor == sensor && h.began <= made)
        .filter_map(|h| h.alarms.of(data))
        .any(|a| {
            let after = Millis::from(a.after_s) * 1000;
            match (e.detail.reminder, a.remind_every_s) {
                (None, _) => e.at - since == after,
                (Some(n), Some(every)) => {
                    e.at - since == after + Millis::from(n) * Millis::from(every) * 1000
                }
                (Some(_), None) => false,
            }
        })
}

/// A `state_held` as [`not_held`] judges it: of `data` since `since`, due at `at`, made by
/// group commit `commit`.
struct Claim {
    sensor: SensorId,
    data: bool,
    since: Millis,
    at: Millis,
    commit: u64,
}

/// Why a `state_held` is not of a state that held (`None`: it is). `reads`: the sensor's
/// applied readings.
fn not_held(log: &Log, c: &Claim, reads: &[Read], start: Millis) -> Option<String> {
    let Claim {
        sensor,
        data,
        since,
        at,
        commit,
    } = *c;
    // Applied before it: earlier commits', and its own commit's of the state held (one
    // of the other state there may have come after it).
    let before: Vec<&Read> = reads
        .iter()
        .filter(|r| r.commit < commit || (r.commit == commit && r.data == data))
        .collect();
    let Some(last) = before.last() else {
        return Some("no reading of the sensor applied before it".into());
    };
    if last.data != data {
        return Some(format!(
            "the last reading applied before it (received at {}) was of {}",
            last.received_at - start,
            last.data
        ));
    }
    let from = before
        .iter()
        .rposition(|r| r.data != data)
        .map_or(0, |i| i + 1);
    let began = before[from].received_at;
    if since < began {
        return Some(format!(
            "since {}, before the state began with the reading received at {}",
            since - start,
            began - start
        ));
    }
    if since > began && !alarms_set_at(log, sensor, since) {
        return Some(format!(
            "since {}: the state began at {}, and no call set the sensor's alarms then",
            since - start,
            began - start
        ));
    }
    if let Some(r) = reads
        .iter()
        .find(|r| r.data != data && since < r.received_at && r.received_at < at)
    {
        return Some(format!(
            "a reading of {} received at {} (applied {} it), between since {} and {}",
            r.data,
            r.received_at - start,
            if r.commit > commit { "after" } else { "before" },
            since - start,
            at - start
        ));
    }
    None
}

/// Whether a hold of `sensor` timed from `since`, later than its state began, may have
/// been timed from when its alarms were set on the state held: a registry call of the
/// sensor began by then, and ended no more than [`SET_SLACK_MS`] before (the node serving
/// it follows a call made elsewhere), or trouble since may have held the node back.
fn alarms_set_at(log: &Log, sensor: SensorId, since: Millis) -> bool {
    let calls = log
        .holds
        .iter()
        .map(|h| (h.sensor, h.began, h.ended))
        .chain(log.memberships.iter().map(|m| (m.0, m.2, m.3)))
        .chain(log.settings.iter().map(|s| (s.sensor, s.began, s.ended)));
    calls.into_iter().any(|(s, began, ended)| {
        s == sensor
            && began <= since
            && (since <= ended.saturating_add(SET_SLACK_MS) || super::troubled(log, ended, since))
    })
}

/// What the endpoints got of holds tells of events made, in bodies that carry them.
fn bodies_tell_events(
    world: &World,
    t: &Tables,
    bodies: &BTreeMap<String, HoldBody>,
    start: Millis,
) {
    // What a hold notification carries of its event.
    type Told = (
        SensorId,
        &'static str,
        Millis,
        Option<bool>,
        Option<bool>,
        Option<Millis>,
        Option<u32>,
    );
    let made: BTreeSet<Told> = t
        .audit
        .events()
        .iter()
        .map(|e| &e.row)
        .filter(|e| e.kind.is_hold())
        .map(|e| {
            (
                e.sensor_id,
                e.kind.as_str(),
                e.at,
                e.data,
                e.previous,
                e.detail.lost_since,
                e.detail.reminder,
            )
        })
        .collect();
    for (id, b) in bodies {
        let v = |why: String| {
            world.violate(
                "an endpoint's hold notification tells of a hold event made, in its body",
                format!(
                    "{id} to {} of {}: {} at {}: {why}",
                    b.client,
                    b.sensor,
                    b.kind.as_str(),
                    b.occurred_at - start
                ),
                vec![id.clone(), b.sensor.to_string()],
            )
        };
        let told = (
            b.sensor,
            b.kind.as_str(),
            b.occurred_at,
            b.data,
            b.previous,
            b.since,
            b.reminder,
        );
        if !made.contains(&told) {
            v(format!(
                "no such event committed (data {:?}, previous {:?}, since {:?}, reminder {:?})",
                b.data, b.previous, b.since, b.reminder
            ));
            continue;
        }
        let body = &b.body;
        let bit = |d: Option<bool>| d.map_or(serde_json::Value::Null, |d| u8::from(d).into());
        let since = b.since.unwrap_or(b.occurred_at);
        let want_since = match b.kind {
            EventKind::StateHeld => Some(time::format(since)),
            _ => None,
        };
        let got_since = body.get("since").and_then(|s| s.as_str()).map(String::from);
        if body.get("data") != Some(&bit(b.data))
            || body.get("previous") != Some(&bit(b.previous))
            || got_since != want_since
            || body.get("held_s").and_then(|h| h.as_u64()) != Some(held_s(since, b.occurred_at))
            || body.get("reminder").and_then(|r| r.as_u64()) != b.reminder.map(u64::from)
        {
            v(format!("its body says otherwise: {body}"));
        }
    }
}

/// A line for the trace of a door alarms run: how many holds were made, cleared and got.
pub fn summary(t: &Tables, bodies: &BTreeMap<String, HoldBody>) -> String {
    let count = |k: EventKind, reminder: bool| {
        t.audit
            .events()
            .iter()
            .filter(|e| e.row.kind == k && e.row.detail.reminder.is_some() == reminder)
            .count()
    };
    format!(
        "holds: {} state_held, {} reminders, {} cleared made; {} notifications of them got",
        count(EventKind::StateHeld, false),
        count(EventKind::StateHeld, true),
        count(EventKind::StateHeldCleared, false),
        bodies.len()
    )
}
