//! Sites and silences as each client saw them (book: Sites, Silences).

use std::collections::BTreeMap;

use latch::domain::{EventKind, Millis, SensorId, Status};

use super::{Bounds, troubled};
use crate::log::{Log, SimClient};
use crate::receivers::lane_key;
use crate::world::World;

/// Silences and the site (book: Sites, Silences): a silenced notification was made
/// under an active silence that matches it and is never sent; a site's events alternate,
/// lost then restored, per client; each names only the site's sensors; and while a site
/// event has told a client that a sensor is lost, that client gets no loss of it of its
/// own (until it stops taking site events: then it learns of them by their own).
pub(super) fn sites_and_silences(
    world: &World,
    t: &crate::model::Tables,
    log: &Log,
    start: Millis,
) {
    let trails: Vec<&crate::model::Trail> = t.audit.trails().collect();
    for tr in trails.iter().filter(|tr| tr.status == Status::Silenced) {
        let keys = vec![
            tr.id.clone(),
            lane_key(&(tr.client_id.clone(), tr.sensor_id)),
        ];
        if !tr.attempts.is_empty() {
            world.violate(
                "a silenced notification is never sent",
                format!(
                    "{} ({}) has {} attempts",
                    tr.id,
                    tr.kind.as_str(),
                    tr.attempts.len()
                ),
                keys.clone(),
            );
        }
        let matched = t.silences.values().any(|s| {
            let m = &s.matcher;
            let written = t.silence_written_at.get(&s.id).copied().unwrap_or(0);
            // The window it held then: a silence that follows a schedule moved on since.
            let last_end = s.ends_at.max(s.updated_at).max(written);
            let in_window = match (&s.schedule_id, t.silence_windows.get(&s.id)) {
                (Some(_), Some(held)) => held.iter().enumerate().any(|(i, w)| {
                    let end = match i + 1 == held.len() {
                        true => w.ends_at.max(last_end),
                        false => w.ends_at,
                    };
                    w.starts_at <= tr.created_at && tr.created_at < end
                }),
                _ => s.starts_at <= tr.created_at && tr.created_at < last_end,
            };
            in_window
                && m.client_id.as_ref().is_none_or(|c| *c == tr.client_id)
                && m.sensor_ids
                    .as_ref()
                    .is_none_or(|ids| ids.contains(&tr.sensor_id))
                && m.types.as_ref().is_none_or(|k| k.contains(&tr.kind))
                && m.site_id.as_ref().is_none_or(|site| {
                    // The site as the commit found it: stamped then, applied by `made_at`.
                    log.in_site_at(tr.sensor_id, site, tr.created_at)
                        || log.in_site_at(tr.sensor_id, site, tr.made_at)
                })
        });
        if !matched {
            world.violate(
                "a notification is silenced only by an active silence that matches it",
                format!(
                    "{} ({}) silenced at {}",
                    tr.id,
                    tr.kind.as_str(),
                    tr.created_at - start
                ),
                keys,
            );
        }
    }
    // Per client and site, the site's events in outbox order.
    let site_in = |tr: &crate::model::Trail| -> String {
        tr.body
            .as_deref()
            .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
            .and_then(|b| b["site"]["id"].as_str().map(str::to_string))
            .unwrap_or_default()
    };
    let mut site_events: BTreeMap<(&str, String), Vec<&crate::model::Trail>> = BTreeMap::new();
    for tr in trails.iter().filter(|tr| tr.kind.is_site()) {
        site_events
            .entry((tr.client_id.as_str(), site_in(tr)))
            .or_default()
            .push(tr);
    }
    // Whether `site` was deleted in `(from, to]`: a loss it told needs no return.
    let deleted_between = |site: &str, from: Millis, to: Millis| {
        log.sites_deleted
            .iter()
            .any(|(s, began, ended)| s == site && *ended > from && *began <= to)
    };
    for ((client, site), events) in &site_events {
        let client = *client;
        let mut told: Option<(Millis, Vec<SensorId>)> = None;
        // Whether the client was unlinked from `sensor` in `(from, to]`.
        let unlinked_between = |sensor: &SensorId, from: Millis, to: Millis| {
            log.unlinked
                .iter()
                .any(|(c, s, at)| c == client && s == sensor && *at > from && *at <= to)
        };
        // When the client first stopped taking site events after `from`.
        let off_after = |from: Millis| {
            log.subscriptions
                .iter()
                .filter(|(c, at, takes)| c == client && *at > from && !takes)
                .map(|(_, at, _)| *at)
                .min()
                .unwrap_or(Millis::MAX)
        };
        for (i, tr) in events.iter().enumerate() {
            let lost = tr.kind == EventKind::SiteConnectionLost;
            // Unlinked from a sensor the loss named, the sensor moved away or the site
            // deleted: its return may rightly not come.
            let unlinked = told.as_ref().is_some_and(|(from, sensors)| {
                deleted_between(site, *from, tr.created_at)
                    || sensors.iter().any(|s| {
                        unlinked_between(s, *from, tr.created_at)
                            || log.moved_between(*s, *from, tr.created_at)
                    })
            });
            // Stopped taking site events: the loss told it, but no return may follow.
            let off = told
                .as_ref()
                .is_some_and(|(from, _)| off_after(*from) <= tr.created_at);
            if (lost == told.is_some() && !unlinked && !off) || (i == 0 && !lost) {
                world.violate(
                    "a site's events alternate, lost then restored, per client",
                    format!(
                        "{client}: {} at {}",
                        tr.kind.as_str(),
                        tr.created_at - start
                    ),
                    vec![tr.id.clone()],
                );
            }
            let named: Vec<SensorId> = tr
                .body
                .clone()
                .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
                .map(|b| {
                    ["sensors", "restored", "still_lost"]
                        .iter()
                        .flat_map(|k| b[k].as_array().cloned().unwrap_or_default())
                        .filter_map(|s| SensorId::parse(s["id"].as_str()?).ok())
                        .collect()
                })
                .unwrap_or_default();
            if let Some(s) = named.iter().find(|s| {
                !log.in_site_at(**s, site, tr.created_at) && !log.in_site_at(**s, site, tr.made_at)
            }) {
                world.violate(
                    "a site's event names only the site's sensors",
                    format!("{client}: {} of {site} names {s}", tr.id),
                    vec![tr.id.clone()],
                );
            }
            // A silenced loss told nothing, and no return follows it: its silence's end
            // brings the client up to date sensor by sensor.
            told = (lost && tr.status != Status::Silenced).then_some((tr.created_at, named));
            if let Some((from, sensors)) = told.as_ref() {
                // Meanwhile is in outbox order (a round's notifications carry the time it
                // began, which a freeze of its node may put before a loss committed while
                // the round waited), up to the client's next site event, and while the
                // client takes site events.
                let next_seq = events.get(i + 1).map_or(i64::MAX, |n| n.seq);
                let until = off_after(*from);
                // Once told of the sensor's own return (a client that takes no site
                // returns), a new loss of it is its own.
                let back_before = |o: &crate::model::Trail| {
                    trails.iter().any(|r| {
                        r.client_id == *client
                            && r.sensor_id == o.sensor_id
                            && r.kind == EventKind::ConnectionRestored
                            && r.seq > tr.seq
                            && r.seq < o.seq
                    })
                };
                // Unlinked from the sensor since, what the loss told of it no longer holds
                // (a return may not come, and a new link learns of it by its own).
                for own in trails.iter().filter(|o| {
                    o.client_id == *client
                        && o.kind == EventKind::ConnectionLost
                        && sensors.contains(&o.sensor_id)
                        && o.seq > tr.seq
                        && o.seq < next_seq
                        && o.created_at < until
                        && !back_before(o)
                        && !unlinked_between(&o.sensor_id, *from, o.created_at)
                        && !log.moved_between(o.sensor_id, *from, o.created_at)
                }) {
                    world.violate(
                        "a sensor a site's event told of gets no loss of its own meanwhile",
                        format!(
                            "{client}: {} lost at {}",
                            own.sensor_id,
                            own.created_at - start
                        ),
                        vec![own.id.clone(), tr.id.clone()],
                    );
                }
            }
        }
    }
}

/// A site holds its sensors' own connection events only for its decision (book: Sites):
/// one that reaches a client as its own is made within the grace and a round of the event,
/// in quiet time, by a client that kept its subscription and link meanwhile, whether the
/// site stays up, is down, or comes back.
pub(super) fn site_events_not_held_long(
    world: &World,
    t: &crate::model::Tables,
    log: &Log,
    clients: &[SimClient],
    bounds: &Bounds,
    start: Millis,
) {
    let in_site = |s: SensorId, at: Millis| log.sites_at(s, at).iter().any(Option::is_some);
    let bound = bounds.site_grace + 2_000;
    for tr in t.audit.trails().filter(|tr| {
        matches!(
            tr.kind,
            EventKind::ConnectionLost | EventKind::ConnectionRestored
        ) && in_site(tr.sensor_id, tr.occurred_at)
            && tr.created_at - tr.occurred_at > bound
    }) {
        let (from, to) = (tr.occurred_at, tr.created_at);
        let resubscribed = log
            .subscriptions
            .iter()
            .any(|(c, at, _)| *c == tr.client_id && from < *at && *at <= to);
        let relinked = clients
            .iter()
            .find(|c| c.id == tr.client_id)
            .and_then(|c| c.links.get(&tr.sensor_id))
            .is_none_or(|at| *at > from);
        // Moved since (or its site deleted): held again where it went, from then.
        let moved = log.moved_between(tr.sensor_id, from, to);
        // A timeout changed since: a loss is judged when the change took effect, dated at
        // the deadline it had passed.
        let retimed = log.retimed_between(tr.sensor_id, from, to);
        if resubscribed || relinked || moved || retimed || troubled(log, from, to) {
            continue;
        }
        world.violate(
            "a site holds its sensors' own events only for its decision",
            format!(
                "{}: {} of {} at {} made at {}",
                tr.client_id,
                tr.kind.as_str(),
                tr.sensor_id,
                from - start,
                to - start
            ),
            vec![
                tr.id.clone(),
                lane_key(&(tr.client_id.clone(), tr.sensor_id)),
            ],
        );
    }
}

/// book, "Silences": a silence that follows a schedule is active exactly in the schedule's
/// windows — each window it held is one of the schedule's, whole (an ended one's last
/// window may end early, when it was ended) — and never twice the same one.
pub(super) fn scheduled_silences(world: &World, t: &crate::model::Tables, start: Millis) {
    for s in t.silences.values() {
        let Some(id) = &s.schedule_id else { continue };
        let Some(schedule) = t.schedules.get(id) else {
            continue;
        };
        let held = t.silence_windows.get(&s.id).map_or(&[][..], |w| &w[..]);
        for (i, w) in held.iter().enumerate() {
            let last = i + 1 == held.len();
            let window = schedule.schedule.window_at(w.starts_at);
            let whole = window == Some((w.starts_at, w.ends_at));
            // Ended: its window ends when it was ended; one ended before it began holds
            // an empty window.
            let cut = last
                && s.ended_at.is_some()
                && (w.starts_at == w.ends_at
                    || window.is_some_and(|(a, b)| a == w.starts_at && w.ends_at <= b));
            let again = held[..i]
                .iter()
                .any(|o| o.starts_at == w.starts_at && o.ends_at == w.ends_at);
            if !(whole || cut) || again {
                world.violate(
                    "a scheduled silence is active exactly in its schedule's windows",
                    format!(
                        "silence {} held [{}, {}) (written at {}): the schedule's window there is {:?}{}",
                        s.id,
                        w.starts_at - start,
                        w.ends_at - start,
                        w.since - start,
                        window.map(|(a, b)| (a - start, b - start)),
                        if again { ", and it held it before" } else { "" }
                    ),
                    vec![s.id.clone()],
                );
            }
        }
    }
}
