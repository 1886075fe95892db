//! Alarms (book: Alarms), as the store holds them after the run: per sensor and kind, the
//! alarms follow one another — each opened once, resolved at most once and after it
//! opened, at most one not resolved — and every notification that names an alarm is of
//! its sensor, of a type that belongs to its kind, and made while it was open (its
//! clearing at the very time it was resolved); a site's `site_down` alarm names only the
//! site's loss and return, made while it was down. An acknowledgement goes once, only to
//! clients told of the alarm, dated when it was taken; no reminder is made after it.

use std::collections::BTreeMap;

use latch::domain::alarm::{self, AlarmKind, AlarmState, Role};
use latch::domain::{Detail, Event, EventKind, Millis, SensorId, Status};

use crate::model::Tables;
use crate::world::World;

pub(super) fn alarms(world: &World, t: &Tables, log: &crate::log::Log, start: Millis) {
    let v = |invariant: &'static str, id: &str, why: String| {
        world.violate(
            invariant,
            format!("alarm {id}: {why}"),
            vec![id.to_string()],
        )
    };
    let mut by_key: BTreeMap<(SensorId, AlarmKind), Vec<&alarm::Alarm>> = BTreeMap::new();
    for a in t.alarms.values() {
        if let Some(s) = a.sensor_id {
            by_key.entry((s, a.kind)).or_default().push(a);
        }
        if a.resolved_at.is_some_and(|r| r < a.opened_at) {
            v("an alarm resolves after it opens", &a.id, format!("{a:?}"));
        }
        if (a.state == AlarmState::Resolved) != a.resolved_at.is_some() {
            v("an alarm resolved has its time", &a.id, format!("{a:?}"));
        }
    }
    for ((sensor, kind), mut list) in by_key {
        // In the order made (the model's ids grow with its clock): the times are the
        // events', and a sensor made again may report from a device clock far behind.
        list.sort_by_key(|a| a.id.clone());
        let open = list
            .iter()
            .filter(|a| a.state != AlarmState::Resolved)
            .count();
        if open > 1 {
            v(
                "one alarm open per sensor and kind",
                &list[0].id,
                format!("{sensor} has {open} {} alarms open", kind.as_str()),
            );
        }
        for w in list.windows(2) {
            // Resolved by the sensor's deletion (latch's clock): the sensor made again
            // opens its next alarms at its readings' own times, which may be earlier.
            let deleted = w[0].resolved_at.is_some_and(|r| {
                log.sensors_deleted
                    .iter()
                    .any(|d| d.sensor == sensor && d.began <= r && r <= d.ended)
            });
            if !deleted && w[0].resolved_at.is_none_or(|r| r > w[1].opened_at) {
                v(
                    "a sensor's alarms of a kind follow one another",
                    &w[1].id,
                    format!(
                        "{} {} opened at {} before {} resolved (at {:?})",
                        sensor,
                        kind.as_str(),
                        w[1].opened_at - start,
                        w[0].id,
                        w[0].resolved_at.map(|r| r - start)
                    ),
                );
            }
        }
    }
    // Every notification made, retention's deleted ones too.
    for n in t.audit.trails() {
        let Some(id) = &n.alarm_id else {
            continue;
        };
        let Some(a) = t.alarms.get(id) else {
            v(
                "a notification names an alarm that is",
                id,
                format!("{} names it", n.id),
            );
            continue;
        };
        // Judged by the escalation check (`checks/escalations.rs`).
        if n.kind == EventKind::AlarmEscalated {
            continue;
        }
        if n.kind == EventKind::AlarmAcknowledged {
            if a.acknowledged_at != Some(n.occurred_at) {
                v(
                    "an acknowledgement tells when it was taken",
                    id,
                    n.id.clone(),
                );
            }
            let earlier = |ack: bool| {
                t.audit.trails().any(|o| {
                    o.seq < n.seq
                        && o.client_id == n.client_id
                        && o.alarm_id.as_deref() == Some(id.as_str())
                        && (o.kind == EventKind::AlarmAcknowledged) == ack
                        && o.status != Status::Silenced
                })
            };
            if !earlier(false) {
                v(
                    "an acknowledgement goes only to the clients told of the alarm",
                    id,
                    format!("{} to {}", n.id, n.client_id),
                );
            }
            if earlier(true) {
                v(
                    "an alarm is acknowledged once",
                    id,
                    format!("{} again", n.id),
                );
            }
            continue;
        }
        let reminder = n.kind == EventKind::StillLost
            || (n.kind == EventKind::StateHeld && n.reminder.is_some());
        if let (true, Some(&taken)) = (reminder, t.acks_applied.get(id))
            && n.made_at > taken
        {
            v(
                "no reminder after an acknowledgement",
                id,
                format!(
                    "{} ({}) made at {}, the alarm taken at {}",
                    n.id,
                    n.kind.as_str(),
                    n.made_at - start,
                    taken - start
                ),
            );
        }
        if a.kind == AlarmKind::SiteDown {
            // A site's: its loss and return (in the lane of one of its sensors), made
            // while it was down.
            let of_site = n.kind.is_site() || n.kind == EventKind::AlarmAcknowledged;
            let within =
                n.occurred_at >= a.opened_at && a.resolved_at.is_none_or(|r| n.occurred_at <= r);
            if !of_site || (n.kind.is_site() && !within) {
                v(
                    "a site's alarm names only its events while it is down",
                    id,
                    format!(
                        "{} ({}) at {}",
                        n.id,
                        n.kind.as_str(),
                        n.occurred_at - start
                    ),
                );
            }
            continue;
        }
        if a.sensor_id != Some(n.sensor_id) {
            v(
                "an alarm's notifications are of its sensor",
                id,
                format!("{} is of {}", n.id, n.sensor_id),
            );
        }
        let e = Event {
            sensor_id: n.sensor_id,
            kind: n.kind,
            at: n.occurred_at,
            data: n.data,
            previous: None,
            last_seen_at: None,
            detail: Detail {
                reminder: n.reminder,
                ..Detail::default()
            },
        };
        // A state change resolves an `out_of_schedule` (the commit reads which may).
        let role = alarm::role(&e)
            .or((n.kind == EventKind::StateChanged)
                .then_some(Role::Resolves(AlarmKind::OutOfSchedule)));
        let of_kind = match role {
            Some(Role::Opens(k) | Role::Reminds(k) | Role::Resolves(k)) => k == a.kind,
            None => false,
        };
        if !of_kind {
            v(
                "an alarm's notifications belong to its kind",
                id,
                format!(
                    "{} is a {}, the alarm a {}",
                    n.id,
                    n.kind.as_str(),
                    a.kind.as_str()
                ),
            );
            continue;
        }
        let within = match role {
            Some(Role::Resolves(_)) => a.resolved_at == Some(n.occurred_at),
            _ => n.occurred_at >= a.opened_at && a.resolved_at.is_none_or(|r| n.occurred_at <= r),
        };
        if !within {
            v(
                "an alarm's notifications are made while it is open",
                id,
                format!(
                    "{} ({}) at {}; the alarm opened at {}, resolved at {:?}",
                    n.id,
                    n.kind.as_str(),
                    n.occurred_at - start,
                    a.opened_at - start,
                    a.resolved_at.map(|r| r - start)
                ),
            );
        }
    }
}
