//! Escalation (book: Alarms, escalation), as the store holds it after the run: every
//! `alarm.escalated` goes to the `to` of the client it names as `from`, once per alarm and
//! client, at the level after the one that client was reached at (or 1 when it was told
//! directly); only of an alarm not acknowledged when it was made, and only past its time:
//! at least `after_s` after the attempt that ended an alarm's notification to `from`.

use std::collections::BTreeSet;

use latch::domain::alarm::AlarmKind;
use latch::domain::{EventKind, Millis, Status};

use crate::log::Log;
use crate::model::Tables;
use crate::world::World;

pub(super) fn escalations(world: &World, t: &Tables, log: &Log, start: Millis) {
    let v = |invariant: &'static str, id: &str, why: String| {
        world.violate(invariant, format!("{id}: {why}"), vec![id.to_string()])
    };
    let trails: Vec<_> = t.audit.trails().collect();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for e in trails
        .iter()
        .filter(|n| n.kind == EventKind::AlarmEscalated)
    {
        let body: serde_json::Value = e
            .body
            .as_deref()
            .and_then(|b| serde_json::from_str(b).ok())
            .unwrap_or_default();
        let (Some(alarm), Some(from), Some(level)) = (
            e.alarm_id.clone(),
            body["from"].as_str(),
            body["level"].as_u64(),
        ) else {
            v(
                "an escalation names its alarm, level and client",
                &e.id,
                format!("{body}"),
            );
            continue;
        };
        if body["alarm"]["id"] != alarm.as_str()
            || body["alarm"]["kind"]
                .as_str()
                .and_then(AlarmKind::parse)
                .is_none()
        {
            v("an escalation names its alarm", &e.id, format!("{body}"));
        }
        let Some(esc) = log.escalations.get(from) else {
            v(
                "an escalation comes from a client that escalates",
                &e.id,
                from.into(),
            );
            continue;
        };
        if esc.to != e.client_id {
            v(
                "an escalation goes to the next client",
                &e.id,
                format!("to {}, {from} escalates to {}", e.client_id, esc.to),
            );
        }
        if !seen.insert((alarm.clone(), e.client_id.clone())) {
            v("an alarm escalates to a client once", &e.id, alarm.clone());
        }
        // The level after the one `from` was reached at.
        let reached = trails
            .iter()
            .filter(|n| {
                n.kind == EventKind::AlarmEscalated
                    && n.alarm_id.as_deref() == Some(alarm.as_str())
                    && n.client_id == from
            })
            .filter_map(|n| {
                n.body
                    .as_deref()
                    .and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok())
                    .and_then(|b| b["level"].as_u64())
            })
            .next()
            // Reached by a timer whose notification it did not want (its `events`).
            .or_else(|| {
                t.escalations
                    .get(&(alarm.clone(), from.to_string()))
                    .filter(|r| r.made_at.is_some())
                    .map(|r| u64::from(r.level))
            });
        // Told directly (linked), its chain may start at 1 whether or not it was also
        // reached: the first timer started from it counts.
        let direct = trails.iter().any(|n| {
            n.alarm_id.as_deref() == Some(alarm.as_str())
                && n.client_id == from
                && !n.kind.is_alarm()
                && n.seq < e.seq
        });
        let fits = (direct && level == 1) || reached.is_some_and(|r| level == r + 1);
        if !fits || level > 5 {
            v(
                "an escalation's level follows the chain",
                &e.id,
                format!("level {level}, {from} reached at {reached:?}"),
            );
        }
        // Past its time: an alarm's notification to `from` ended by an attempt at least
        // `after_s` before.
        let due = trails
            .iter()
            .filter(|n| {
                n.alarm_id.as_deref() == Some(alarm.as_str())
                    && n.client_id == from
                    && n.kind != EventKind::AlarmAcknowledged
                    && n.seq < e.seq
            })
            .filter(|n| {
                n.changes
                    .iter()
                    .any(|c| matches!(c.to, Status::Delivered | Status::Failed))
            })
            .filter_map(|n| n.attempts.iter().map(|a| a.at).min())
            .min();
        match due {
            None => v(
                "an escalation follows a notification that ended",
                &e.id,
                format!("no ended notification of {alarm} to {from}"),
            ),
            Some(at) if e.made_at < at + Millis::from(esc.after_s) * 1000 => v(
                "an escalation only past its time",
                &e.id,
                format!(
                    "made at {}, the first attempt to {from} at {}, after_s {}",
                    e.made_at - start,
                    at - start,
                    esc.after_s
                ),
            ),
            Some(_) => {}
        }
        if let Some(&taken) = t.acks_applied.get(&alarm)
            && taken <= e.made_at
        {
            v(
                "no escalation of an alarm acknowledged",
                &e.id,
                format!(
                    "made at {}, acknowledged at {}",
                    e.made_at - start,
                    taken - start
                ),
            );
        }
    }
}
