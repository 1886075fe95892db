//! Alarms as an operator works them (DESIGN §5, wave 5): one per sensor (or site) and kind
//! while it is open, whatever the number of clients told, opened by its opening event,
//! resolved by its clearing one, acknowledged by a person. Not to be confused with
//! [`super::alarms`], the rule that turns a door sensor's reports into those events.
//!
//! [`plan`] is the rule a group commit applies to its events, written once here: which
//! event opens, reminds of or resolves which alarm, and which reminders an acknowledgement
//! keeps from being sent.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::notification::{Event, EventKind};
use super::sensor::SensorId;
use super::time::Millis;

/// What an alarm is about.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AlarmKind {
    /// A sensor lost (`sensor.connection_lost` … `sensor.connection_restored`).
    ConnectionLost,
    /// A site down (`site.connection_lost` … `site.connection_restored`): the losses it
    /// names open none of their own.
    SiteDown,
    StateHeld,
    BatteryLow,
    Tamper,
    Fault,
    Flapping,
    OutOfSchedule,
}

impl AlarmKind {
    pub const ALL: [AlarmKind; 8] = [
        AlarmKind::ConnectionLost,
        AlarmKind::SiteDown,
        AlarmKind::StateHeld,
        AlarmKind::BatteryLow,
        AlarmKind::Tamper,
        AlarmKind::Fault,
        AlarmKind::Flapping,
        AlarmKind::OutOfSchedule,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AlarmKind::ConnectionLost => "connection_lost",
            AlarmKind::SiteDown => "site_down",
            AlarmKind::StateHeld => "state_held",
            AlarmKind::BatteryLow => "battery_low",
            AlarmKind::Tamper => "tamper",
            AlarmKind::Fault => "fault",
            AlarmKind::Flapping => "flapping",
            AlarmKind::OutOfSchedule => "out_of_schedule",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// Where an alarm is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlarmState {
    /// Nobody took it yet.
    Open,
    /// Someone took it; its reminders stop. Still not resolved.
    Acknowledged,
    /// Its clearing event came (or its sensor was deleted); whether it was acknowledged
    /// before stays in `acknowledged_at`.
    Resolved,
}

impl AlarmState {
    pub fn as_str(self) -> &'static str {
        match self {
            AlarmState::Open => "open",
            AlarmState::Acknowledged => "acknowledged",
            AlarmState::Resolved => "resolved",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            AlarmState::Open,
            AlarmState::Acknowledged,
            AlarmState::Resolved,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// An alarm as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alarm {
    /// ULID.
    pub id: String,
    pub kind: AlarmKind,
    pub sensor_id: Option<SensorId>,
    pub site_id: Option<String>,
    pub state: AlarmState,
    pub opened_at: Millis,
    pub acknowledged_at: Option<Millis>,
    pub acknowledged_by: Option<String>,
    pub note: Option<String>,
    pub resolved_at: Option<Millis>,
}

/// The alarms not resolved across the store, for the gauges a round refreshes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlarmTotals {
    /// Alarms open (not acknowledged) and acknowledged, by kind; kinds with none left out.
    pub open: Vec<(AlarmKind, u64)>,
    pub acknowledged: Vec<(AlarmKind, u64)>,
    /// When the oldest alarm nobody acknowledged opened.
    pub oldest_unacknowledged: Option<Millis>,
}

impl AlarmTotals {
    /// From rows of (kind, state, count, oldest opened_at), as both stores group them.
    pub fn of(rows: impl IntoIterator<Item = (String, String, i64, i64)>) -> Self {
        let mut t = Self::default();
        for (kind, state, n, oldest) in rows {
            let Some(kind) = AlarmKind::parse(&kind) else {
                continue;
            };
            match AlarmState::parse(&state) {
                Some(AlarmState::Open) => {
                    t.open.push((kind, n.max(0) as u64));
                    t.oldest_unacknowledged =
                        Some(t.oldest_unacknowledged.map_or(oldest, |o| o.min(oldest)));
                }
                Some(AlarmState::Acknowledged) => t.acknowledged.push((kind, n.max(0) as u64)),
                _ => {}
            }
        }
        t
    }
}

/// A new alarm id (a ULID, as notifications have).
pub fn new_alarm_id() -> String {
    ulid::Ulid::new().to_string()
}

/// The alarm as the bodies about it name it (`alarm.acknowledged`, `alarm.escalated`):
/// `{id, kind, sensor_id?, site_id?, opened_at}`.
pub fn alarm_ref(a: &Alarm) -> serde_json::Value {
    let mut alarm = serde_json::json!({
        "id": a.id,
        "kind": a.kind.as_str(),
        "opened_at": super::time::format(a.opened_at),
    });
    if let Some(s) = a.sensor_id {
        alarm["sensor_id"] = s.to_string().into();
    }
    if let Some(s) = &a.site_id {
        alarm["site_id"] = s.clone().into();
    }
    alarm
}

/// An `alarm.acknowledged`'s own fields (DESIGN §4): the alarm, who took it, their note
/// (`null` without one).
pub fn ack_body(a: &Alarm) -> String {
    serde_json::json!({"alarm": alarm_ref(a), "by": a.acknowledged_by, "note": a.note}).to_string()
}

/// The longest `by` and `note` of an acknowledgement.
pub const MAX_BY_LEN: usize = 200;
pub const MAX_NOTE_LEN: usize = 2000;

/// What an event does to its sensor's alarm of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Opens(AlarmKind),
    /// A reminder of the open alarm: not sent once it is acknowledged.
    Reminds(AlarmKind),
    Resolves(AlarmKind),
}

/// What `e` does to an alarm, if anything. A new fault code while a fault is open, or a
/// loss told again, belongs to the alarm open already (it opens none).
pub fn role(e: &Event) -> Option<Role> {
    use AlarmKind as A;
    Some(match e.kind {
        EventKind::ConnectionLost => Role::Opens(A::ConnectionLost),
        EventKind::StillLost => Role::Reminds(A::ConnectionLost),
        EventKind::ConnectionRestored => Role::Resolves(A::ConnectionLost),
        EventKind::StateHeld if e.detail.reminder.is_some() => Role::Reminds(A::StateHeld),
        EventKind::StateHeld => Role::Opens(A::StateHeld),
        EventKind::StateHeldCleared => Role::Resolves(A::StateHeld),
        EventKind::BatteryLow => Role::Opens(A::BatteryLow),
        EventKind::BatteryOk => Role::Resolves(A::BatteryLow),
        EventKind::Tamper => Role::Opens(A::Tamper),
        EventKind::TamperCleared => Role::Resolves(A::Tamper),
        EventKind::Fault => Role::Opens(A::Fault),
        EventKind::FaultCleared => Role::Resolves(A::Fault),
        EventKind::Flapping => Role::Opens(A::Flapping),
        EventKind::FlappingStopped => Role::Resolves(A::Flapping),
        EventKind::StateOutOfSchedule => Role::Opens(A::OutOfSchedule),
        EventKind::StateChanged
        | EventKind::SiteConnectionLost
        | EventKind::SiteConnectionRestored
        | EventKind::AlarmAcknowledged
        | EventKind::AlarmEscalated => return None,
    })
}

/// What `e` does to an alarm where the sensors `resolving` may have one `out_of_schedule`
/// open ([`super::armed`]): a state change of one of them resolves it.
fn role_among(e: &Event, resolving: &HashSet<SensorId>) -> Option<Role> {
    role(e).or_else(|| {
        (e.kind == EventKind::StateChanged && resolving.contains(&e.sensor_id))
            .then_some(Role::Resolves(AlarmKind::OutOfSchedule))
    })
}

/// The kinds whose notification resolves a sensor's alarm (a state change resolves an
/// `out_of_schedule`), as the SQL list `'a', 'b', …`: the escalation round finds by them
/// the notification that resolved one.
pub fn resolving_kinds_sql() -> String {
    EventKind::ALL
        .iter()
        .filter(|&&k| {
            let e = Event {
                sensor_id: SensorId::from_packed(1),
                kind: k,
                at: 0,
                data: None,
                previous: None,
                last_seen_at: None,
                detail: Default::default(),
            };
            let resolving = HashSet::from([e.sensor_id]);
            matches!(role_among(&e, &resolving), Some(Role::Resolves(_)))
        })
        .map(|k| format!("'{}'", k.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A sensor's alarm not resolved yet, as a commit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    pub id: String,
    pub sensor_id: SensorId,
    pub kind: AlarmKind,
    pub acknowledged: bool,
}

/// An alarm a commit opens; resolved already when the same events also resolved it (a
/// loss and its return in one batch), so that at most one is ever unresolved per sensor
/// and kind (the stores' unique index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub id: String,
    pub sensor_id: SensorId,
    pub kind: AlarmKind,
    pub at: Millis,
    pub resolved_at: Option<Millis>,
}

/// What a commit does with alarms: each event's alarm (by place in `events`), the events
/// that make no notification (reminders of an acknowledged alarm), the alarms opened and
/// the ones resolved (with when).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    pub ids: Vec<Option<String>>,
    pub quiet: HashSet<usize>,
    pub opened: Vec<Opened>,
    pub resolved: Vec<(String, Millis)>,
}

/// The keys of the alarms `events` may touch (not those `held` by a site's decision; the
/// state changes of sensors `resolving` an `out_of_schedule`), sorted and without
/// repeats: what a commit reads before [`plan`].
pub fn keys(
    events: &[&Event],
    held: &HashSet<usize>,
    resolving: &HashSet<SensorId>,
) -> Vec<(SensorId, AlarmKind)> {
    let mut keys: Vec<(SensorId, AlarmKind)> = events
        .iter()
        .enumerate()
        .filter(|(k, _)| !held.contains(k))
        .filter_map(|(_, e)| {
            role_among(e, resolving).map(|r| match r {
                Role::Opens(a) | Role::Reminds(a) | Role::Resolves(a) => (e.sensor_id, a),
            })
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The rule: walks `events` in order over the alarms `unresolved` now. An opening event
/// opens an alarm unless one of its kind is open (then it is that one's news); a reminder
/// carries the open alarm's id and is quiet once it is acknowledged; a clearing event
/// resolves the open one. Events `held` by a site's decision touch no alarm (the site's
/// is theirs). A state change of a sensor `resolving` resolves its `out_of_schedule`.
/// `new_id` names each alarm opened.
pub fn plan(
    events: &[&Event],
    held: &HashSet<usize>,
    resolving: &HashSet<SensorId>,
    unresolved: Vec<Unresolved>,
    mut new_id: impl FnMut() -> String,
) -> Plan {
    let mut open: HashMap<(SensorId, AlarmKind), (String, bool)> = unresolved
        .into_iter()
        .map(|u| ((u.sensor_id, u.kind), (u.id, u.acknowledged)))
        .collect();
    let mut plan = Plan {
        ids: vec![None; events.len()],
        ..Plan::default()
    };
    for (k, e) in events.iter().enumerate() {
        let Some(role) = role_among(e, resolving).filter(|_| !held.contains(&k)) else {
            continue;
        };
        match role {
            Role::Opens(a) => {
                let (id, _) = open.entry((e.sensor_id, a)).or_insert_with(|| {
                    let id = new_id();
                    plan.opened.push(Opened {
                        id: id.clone(),
                        sensor_id: e.sensor_id,
                        kind: a,
                        at: e.at,
                        resolved_at: None,
                    });
                    (id, false)
                });
                plan.ids[k] = Some(id.clone());
            }
            Role::Reminds(a) => {
                if let Some((id, acknowledged)) = open.get(&(e.sensor_id, a)) {
                    plan.ids[k] = Some(id.clone());
                    if *acknowledged {
                        plan.quiet.insert(k);
                    }
                }
            }
            Role::Resolves(a) => {
                if let Some((id, _)) = open.remove(&(e.sensor_id, a)) {
                    match plan.opened.iter_mut().find(|o| o.id == id) {
                        Some(o) => o.resolved_at = Some(e.at),
                        None => plan.resolved.push((id.clone(), e.at)),
                    }
                    plan.ids[k] = Some(id);
                }
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Detail;

    fn event(sensor: &str, kind: EventKind, at: Millis) -> Event {
        Event {
            sensor_id: SensorId::parse(sensor).unwrap(),
            kind,
            at,
            data: Some(true),
            previous: Some(false),
            last_seen_at: None,
            detail: Detail::default(),
        }
    }

    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("A{n}")
        }
    }

    #[test]
    fn a_loss_opens_an_alarm_its_reminders_carry_and_its_restore_resolves() {
        let lost = event("s1", EventKind::ConnectionLost, 10);
        let still = event("s1", EventKind::StillLost, 20);
        let back = event("s1", EventKind::ConnectionRestored, 30);
        let p = plan(
            &[&lost, &still, &back],
            &HashSet::new(),
            &HashSet::new(),
            vec![],
            ids(),
        );
        assert_eq!(
            p.ids,
            [Some("A1".into()), Some("A1".into()), Some("A1".into())]
        );
        assert_eq!(p.opened.len(), 1);
        assert_eq!((p.opened[0].at, p.opened[0].resolved_at), (10, Some(30)));
        assert!(p.resolved.is_empty());
        assert!(p.quiet.is_empty());
    }

    #[test]
    fn a_second_loss_after_a_restore_opens_a_new_alarm() {
        let e = [
            event("s1", EventKind::ConnectionLost, 1),
            event("s1", EventKind::ConnectionRestored, 2),
            event("s1", EventKind::ConnectionLost, 3),
        ];
        let p = plan(
            &e.iter().collect::<Vec<_>>(),
            &HashSet::new(),
            &HashSet::new(),
            vec![],
            ids(),
        );
        assert_eq!(
            p.ids,
            [Some("A1".into()), Some("A1".into()), Some("A2".into())]
        );
        // Opened and resolved by the same events: written resolved, never two open.
        assert!(p.resolved.is_empty());
        let opened: Vec<(&str, Option<Millis>)> = p
            .opened
            .iter()
            .map(|o| (o.id.as_str(), o.resolved_at))
            .collect();
        assert_eq!(opened, [("A1", Some(2)), ("A2", None)]);
    }

    #[test]
    fn reminders_of_an_acknowledged_alarm_are_quiet_and_news_of_an_open_one_is_not_new() {
        let open = Unresolved {
            id: "OLD".into(),
            sensor_id: SensorId::parse("s1").unwrap(),
            kind: AlarmKind::ConnectionLost,
            acknowledged: true,
        };
        let fault = Unresolved {
            id: "F".into(),
            sensor_id: SensorId::parse("s1").unwrap(),
            kind: AlarmKind::Fault,
            acknowledged: true,
        };
        let still = event("s1", EventKind::StillLost, 5);
        let new_code = event("s1", EventKind::Fault, 6);
        let p = plan(
            &[&still, &new_code],
            &HashSet::new(),
            &HashSet::new(),
            vec![open, fault],
            ids(),
        );
        assert_eq!(p.ids, [Some("OLD".into()), Some("F".into())]);
        assert_eq!(
            p.quiet,
            HashSet::from([0]),
            "only the reminder is kept back"
        );
        assert!(p.opened.is_empty());
    }

    #[test]
    fn a_clearing_without_an_open_alarm_and_a_held_loss_touch_none() {
        let ok = event("s1", EventKind::BatteryOk, 1);
        let lost = event("s2", EventKind::ConnectionLost, 2);
        let changed = event("s2", EventKind::StateChanged, 3);
        let held = HashSet::from([1]);
        let p = plan(
            &[&ok, &lost, &changed],
            &held,
            &HashSet::new(),
            vec![],
            ids(),
        );
        assert_eq!(p.ids, [None, None, None]);
        assert!(p.opened.is_empty() && p.resolved.is_empty());
        assert!(keys(&[&ok, &lost, &changed], &held, &HashSet::new()).len() == 1);
    }

    #[test]
    fn a_held_state_opens_its_alarm_and_its_reminders_keep_it() {
        let held = event("d", EventKind::StateHeld, 1);
        let mut again = event("d", EventKind::StateHeld, 2);
        again.detail.reminder = Some(1);
        let cleared = event("d", EventKind::StateHeldCleared, 3);
        let p = plan(
            &[&held, &again, &cleared],
            &HashSet::new(),
            &HashSet::new(),
            vec![],
            ids(),
        );
        assert_eq!(p.opened.len(), 1);
        assert_eq!(p.opened[0].kind, AlarmKind::StateHeld);
        assert_eq!(p.opened[0].resolved_at, Some(3));
        assert!(p.ids.iter().all(|i| i.as_deref() == Some("A1")));
    }

    #[test]
    fn the_resolving_kinds_are_the_clearing_events_and_a_state_change() {
        let sql = resolving_kinds_sql();
        for k in [
            "sensor.connection_restored",
            "sensor.state_held_cleared",
            "sensor.battery_ok",
            "sensor.tamper_cleared",
            "sensor.fault_cleared",
            "sensor.flapping_stopped",
            "sensor.state_changed",
        ] {
            assert!(sql.contains(&format!("'{k}'")), "{k} in {sql}");
        }
        assert!(!sql.contains("'sensor.connection_lost'"), "{sql}");
        assert!(!sql.contains("alarm."), "{sql}");
    }

    #[test]
    fn kinds_and_states_read_back_what_they_write() {
        for k in AlarmKind::ALL {
            assert_eq!(AlarmKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(
            AlarmState::parse("acknowledged"),
            Some(AlarmState::Acknowledged)
        );
        assert_eq!(AlarmState::parse("closed"), None);
    }
}
