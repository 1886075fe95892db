//! Silences (maintenance windows): while one is active, the notifications it matches are
//! made and kept with status `silenced` but never sent; at its end each (client, sensor) it
//! kept something from is brought up to date by one notification, if its view is wrong.

use serde::{Deserialize, Serialize};

use super::notification::EventKind;
use super::schedule::Schedule;
use super::sensor::{Connection, SensorId};
use super::time::Millis;

/// The least time after a silence's end before it is reconciled ([`settle_ms`]).
pub const SETTLE_MS: Millis = 5_000;

/// How long after a silence's end it is reconciled: a commit stamped before the end may
/// land up to a store call's bound (`database_timeout`) later, and its notifications must
/// be seen, or one the silence matched would be noted after its pairs were reconciled and
/// never told (issue #68). A second more for the commit's way to the store.
pub fn settle_ms(database_timeout: std::time::Duration) -> Millis {
    (database_timeout.as_millis() as Millis + 1_000).max(SETTLE_MS)
}

/// The longest a silence may last: planned work is days, not months.
pub const MAX_SILENCE_MS: Millis = 31 * 24 * 3600 * 1000;

/// What a silence applies to: every field given must match (an absent one matches all).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Match {
    pub site_id: Option<String>,
    pub sensor_ids: Option<Vec<SensorId>>,
    pub client_id: Option<String>,
    pub types: Option<Vec<EventKind>>,
}

impl Match {
    /// Whether it names nothing at all, so would silence every notification.
    pub fn is_empty(&self) -> bool {
        self.site_id.is_none()
            && self.sensor_ids.is_none()
            && self.client_id.is_none()
            && self.types.is_none()
    }

    /// A list as the store keeps it: `,a,b,` (one substring test finds a member).
    pub fn listed<T: ToString>(items: &[T]) -> String {
        let mut s = String::from(",");
        for i in items {
            s.push_str(&i.to_string());
            s.push(',');
        }
        s
    }

    /// The inverse of [`Match::listed`]; what does not parse is left out.
    pub fn unlisted<T>(s: &str, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
        s.split(',')
            .filter(|p| !p.is_empty())
            .filter_map(parse)
            .collect()
    }
}

/// A maintenance window.
#[derive(Debug, Clone, PartialEq)]
pub struct Silence {
    pub id: String,
    pub matcher: Match,
    pub starts_at: Millis,
    pub ends_at: Millis,
    pub comment: String,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// When its end was reconciled (once, cluster-wide).
    pub reconciled_at: Option<Millis>,
    /// The schedule it follows (`None`: a one-off silence). Its `starts_at` and `ends_at`
    /// then hold its current or next window ([`window_after`]); the round that reconciles
    /// a window's end moves it to the next one (`store::rules::silences`).
    pub schedule_id: Option<String>,
    /// When a caller ended it (`DELETE`). A silence that follows a schedule only ends so;
    /// a one-off one ends at `ends_at` all the same.
    pub ended_at: Option<Millis>,
}

/// Where a silence is in its life, at a given time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SilenceState {
    /// Starts later.
    Pending,
    Active,
    Ended,
}

impl SilenceState {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Self::Pending),
            "active" => Some(Self::Active),
            "ended" => Some(Self::Ended),
            _ => None,
        }
    }
}

impl Silence {
    /// Active inside its window; a silence that follows a schedule is pending between
    /// windows (also from a window's end until the round moves it on, and when its
    /// schedule has no window to come) and ended only once a caller ended it.
    pub fn state(&self, now: Millis) -> SilenceState {
        if now < self.starts_at {
            SilenceState::Pending
        } else if now < self.ends_at {
            SilenceState::Active
        } else if self.follows_schedule() {
            SilenceState::Pending
        } else {
            SilenceState::Ended
        }
    }

    /// Whether it follows a schedule still: it names one and no caller ended it.
    pub fn follows_schedule(&self) -> bool {
        self.schedule_id.is_some() && self.ended_at.is_none()
    }
}

/// The window a silence that follows `schedule` holds from `at` on: the stretch of the
/// schedule that contains `at`, or else the next one; `None` when none comes (no window,
/// or only `except` dates ahead).
///
/// A window lasts at most [`MAX_SILENCE_MS`], as a one-off silence does: a stretch longer
/// than that (a schedule inside every hour of the week ends at `Millis::MAX`) is taken in
/// pieces, each ending `MAX_SILENCE_MS` after `at` at the latest, so the round that
/// reconciles one piece's end moves the silence to the next piece of the same stretch
/// (asked from that end, which is still inside) and a window's end always lies ahead of
/// `at`: moving never stands still. A stretch that began long ago shows a start at most
/// `MAX_SILENCE_MS` before `at`.
pub fn window_after(schedule: &Schedule, at: Millis) -> Option<(Millis, Millis)> {
    let (start, end) = match schedule.window_at(at) {
        Some(w) => w,
        None => schedule.window_at(schedule.next_change(at)?)?,
    };
    let start = start.max(at.saturating_sub(MAX_SILENCE_MS));
    let end = end.min(start.max(at).saturating_add(MAX_SILENCE_MS));
    (end > at && start < end).then_some((start, end))
}

/// Why a silence's times are refused.
pub fn check_times(starts_at: Millis, ends_at: Millis, now: Millis) -> Result<(), String> {
    if ends_at <= starts_at {
        return Err("ends_at must be after starts_at".into());
    }
    if ends_at <= now {
        return Err("ends_at must be in the future".into());
    }
    if ends_at - starts_at.max(now) > MAX_SILENCE_MS {
        return Err(format!(
            "a silence lasts at most {} days",
            MAX_SILENCE_MS / (24 * 3600 * 1000)
        ));
    }
    Ok(())
}

/// What a client last learnt (or will learn) of a sensor: from its newest notification
/// that was delivered or still waits to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub lost: bool,
    pub data: Option<bool>,
}

impl View {
    /// The view a notification of `kind` carrying `data` leaves.
    pub fn after(kind: EventKind, data: Option<bool>) -> Self {
        let lost = matches!(
            kind,
            EventKind::ConnectionLost | EventKind::StillLost | EventKind::SiteConnectionLost
        );
        Self { lost, data }
    }

    /// The view of a client that has nothing in a sensor's own lane, kept from it by a
    /// site's silenced event that named the sensor: it knew the sensor online, with the
    /// data it has now (`data`), since a change of data is never held and would be in the
    /// lane.
    pub fn unseen(data: Option<bool>) -> Self {
        Self { lost: false, data }
    }

    /// The view a client had before a notification of `kind` (`data`, `previous`) it
    /// never got: for a client that was told nothing before the silence.
    pub fn before(kind: EventKind, data: Option<bool>, previous: Option<bool>) -> Self {
        match kind {
            EventKind::StateChanged => Self {
                lost: false,
                data: previous,
            },
            EventKind::ConnectionLost | EventKind::SiteConnectionLost => Self { lost: false, data },
            EventKind::ConnectionRestored
            | EventKind::StillLost
            | EventKind::SiteConnectionRestored => Self { lost: true, data },
            // Tells nothing of state or connection ([`kept`] keeps no pair of them).
            EventKind::BatteryLow
            | EventKind::BatteryOk
            | EventKind::Tamper
            | EventKind::TamperCleared
            | EventKind::Fault
            | EventKind::FaultCleared
            | EventKind::StateHeld
            | EventKind::StateHeldCleared
            | EventKind::Flapping
            | EventKind::AlarmAcknowledged
            | EventKind::StateOutOfSchedule
            | EventKind::AlarmEscalated => Self { lost: false, data },
            // The client knew the state its `flapping` told.
            EventKind::FlappingStopped => Self {
                lost: false,
                data: previous,
            },
        }
    }
}

/// What a site's notification of `kind` (its `body`) told its client of `sensor`: lost
/// (its loss named it, or its return listed it still lost) or back (listed restored, with
/// its data); `None` when it does not name the sensor. A site's event travels in the lane of
/// the first sensor it names, so for the others the client's view is the newer of this
/// and their own lane's.
pub fn site_view(kind: EventKind, body: Option<&str>, sensor: SensorId) -> Option<View> {
    let body: serde_json::Value = serde_json::from_str(body?).ok()?;
    let lists: &[(&str, bool)] = match kind {
        EventKind::SiteConnectionLost => &[("sensors", true)],
        EventKind::SiteConnectionRestored => &[("restored", false), ("still_lost", true)],
        _ => return None,
    };
    let id = sensor.to_string();
    lists.iter().find_map(|(list, lost)| {
        let x = body[*list]
            .as_array()?
            .iter()
            .find(|x| x["id"].as_str() == Some(id.as_str()))?;
        Some(View {
            lost: *lost,
            data: x["data"].as_u64().map(|d| d == 1),
        })
    })
}

/// The text a site's notification's `body` holds where it names `sensor` (a candidate for
/// [`site_view`], which reads the body itself).
pub fn names_in_body(sensor: &str) -> String {
    format!("\"id\":\"{sensor}\"")
}

/// A view corrected by the client's site: while the sensor's site is down and its loss
/// told this client of the sensor (`told`), the client knows the sensor is lost.
pub fn told_by_site(view: View, told: bool) -> View {
    match told {
        true => View { lost: true, ..view },
        false => view,
    }
}

/// A silenced notification, as the pairs it keeps news of are read from it.
#[derive(Debug, Clone, Copy)]
pub struct Kept<'a> {
    pub kind: EventKind,
    /// The sensor whose lane it travels in (a site's event: the first it names).
    pub anchor: SensorId,
    pub data: Option<bool>,
    pub previous: Option<bool>,
    /// A site's event's own fields.
    pub body: Option<&'a str>,
}

/// The sensors a silenced notification kept news of from its client, each with what the
/// client knew of it before: a site's event names each of the client's sensors in its
/// `body` (the anchor among them) with its data — online before the site's loss, lost
/// before its return —; any other names its own (`View::before`). Each becomes a pair the
/// silence's end reconciles from that view, or a site's silenced loss would leave the
/// client never told of the rest; the view is kept with the pair, since the notification
/// itself may be gone by then (retention) or, a site's, carries no data of the sensor.
pub fn kept(k: Kept<'_>) -> Vec<(SensorId, View)> {
    // A battery, tamper, fault or hold notification says nothing of the state or
    // connection a silence's end reconciles (a change of state has its own), nor does a
    // `flapping` (its `flapping_stopped` tells the state when it ends): a silenced one is
    // not told again.
    if k.kind.is_signal() || k.kind.is_hold() || k.kind == EventKind::Flapping {
        return Vec::new();
    }
    let (lists, lost): (&[&str], bool) = match k.kind {
        EventKind::SiteConnectionLost => (&["sensors"], false),
        EventKind::SiteConnectionRestored => (&["restored", "still_lost"], true),
        _ => return vec![(k.anchor, View::before(k.kind, k.data, k.previous))],
    };
    let body: serde_json::Value = k
        .body
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or_default();
    let mut out: Vec<(SensorId, View)> = Vec::new();
    for list in lists {
        for x in body[*list].as_array().into_iter().flatten() {
            let Some(id) = x["id"].as_str().and_then(|i| SensorId::parse(i).ok()) else {
                continue;
            };
            let data = x["data"].as_u64().map(|d| d == 1);
            out.push((id, View { lost, data }));
        }
    }
    if !out.iter().any(|(id, _)| *id == k.anchor) {
        out.push((k.anchor, View::before(k.kind, k.data, k.previous)));
    }
    out.sort_by_key(|(id, _)| *id);
    out.dedup_by_key(|(id, _)| *id);
    out
}

/// The one notification that brings a client whose view is `view` up to date with a
/// sensor now `connection` with `data`; `None` when its view is right already.
pub fn reconcile(
    view: View,
    connection: Connection,
    data: Option<bool>,
) -> Option<(EventKind, Option<bool>, Option<bool>)> {
    match connection {
        Connection::Unknown => None,
        Connection::Lost if view.lost => None,
        Connection::Lost => Some((EventKind::ConnectionLost, data, None)),
        Connection::Online if view.lost => Some((EventKind::ConnectionRestored, data, None)),
        Connection::Online if view.data == data => None,
        Connection::Online => Some((EventKind::StateChanged, data, view.data)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_silence_settles_past_a_store_calls_bound() {
        use std::time::Duration;
        assert_eq!(super::settle_ms(Duration::from_secs(5)), 6_000);
        assert_eq!(super::settle_ms(Duration::from_secs(30)), 31_000);
        assert_eq!(
            super::settle_ms(Duration::from_millis(500)),
            super::SETTLE_MS
        );
    }

    use super::*;

    #[test]
    fn a_silence_brings_a_client_up_to_date_only_where_its_view_is_wrong() {
        let online = |d| View {
            lost: false,
            data: Some(d),
        };
        // Lost and back within the window, same data: nothing.
        assert_eq!(
            reconcile(online(true), Connection::Online, Some(true)),
            None
        );
        // Changed: one state change from what the client had.
        assert_eq!(
            reconcile(online(true), Connection::Online, Some(false)),
            Some((EventKind::StateChanged, Some(false), Some(true)))
        );
        // Still lost at the end: the loss.
        assert_eq!(
            reconcile(online(true), Connection::Lost, Some(true)),
            Some((EventKind::ConnectionLost, Some(true), None))
        );
        // Told it was lost before, back now: the restoration, with the data now.
        let lost = View {
            lost: true,
            data: Some(true),
        };
        assert_eq!(
            reconcile(lost, Connection::Online, Some(false)),
            Some((EventKind::ConnectionRestored, Some(false), None))
        );
        assert_eq!(reconcile(lost, Connection::Lost, Some(true)), None);
    }

    #[test]
    fn the_view_before_an_unsent_notification_is_what_it_changed_from() {
        assert_eq!(
            View::before(EventKind::StateChanged, Some(true), Some(false)),
            View {
                lost: false,
                data: Some(false)
            }
        );
        assert!(View::before(EventKind::ConnectionRestored, Some(true), None).lost);
        assert!(!View::before(EventKind::ConnectionLost, Some(true), None).lost);
    }

    #[test]
    fn a_site_event_kept_from_a_client_keeps_each_sensor_it_names_as_it_knew_it() {
        let id = |s: &str| SensorId::parse(s).unwrap();
        let site = |kind, anchor, body| Kept {
            kind,
            anchor: id(anchor),
            data: None,
            previous: None,
            body: Some(body),
        };
        let lost = r#"{"site":{"id":"b"},"sensors":[{"id":"s1","data":1},{"id":"s2","data":0}],"sensors_total":3}"#;
        let online = |d| View {
            lost: false,
            data: Some(d),
        };
        assert_eq!(
            kept(site(EventKind::SiteConnectionLost, "s1", lost)),
            [(id("s1"), online(true)), (id("s2"), online(false))],
            "online before the site's loss, with the data it named: not the site event's null"
        );
        let back =
            r#"{"site":{"id":"b"},"restored":[{"id":"s3","data":1}],"still_lost":[{"id":"s1"}]}"#;
        let views: Vec<(SensorId, bool)> =
            kept(site(EventKind::SiteConnectionRestored, "s3", back))
                .into_iter()
                .map(|(s, v)| (s, v.lost))
                .collect();
        assert_eq!(views, [(id("s1"), true), (id("s3"), true)]);
        let own = Kept {
            kind: EventKind::StateChanged,
            anchor: id("s9"),
            data: Some(true),
            previous: Some(false),
            body: None,
        };
        assert_eq!(kept(own), [(id("s9"), online(false))]);
    }

    #[test]
    fn a_site_event_tells_its_client_of_each_sensor_it_names() {
        let id = |s: &str| SensorId::parse(s).unwrap();
        let back =
            r#"{"site":{"id":"s9"},"restored":[{"id":"s3","data":0}],"still_lost":[{"id":"s1"}]}"#;
        let kind = EventKind::SiteConnectionRestored;
        assert_eq!(
            site_view(kind, Some(back), id("s3")),
            Some(View {
                lost: false,
                data: Some(false)
            })
        );
        assert!(site_view(kind, Some(back), id("s1")).unwrap().lost);
        assert_eq!(
            site_view(kind, Some(back), id("s9")),
            None,
            "the site's own id is not a sensor it names"
        );
        assert!(back.contains(&names_in_body("s3")));
    }

    #[test]
    fn a_scheduled_silence_holds_the_stretch_it_is_in_or_the_next() {
        use crate::domain::schedule::Schedule;
        let sched = |weekly: serde_json::Value, except: serde_json::Value| {
            Schedule::parse(serde_json::json!({
                "id": "s", "name": "s", "tz": "UTC", "weekly": weekly, "except": except
            }))
            .unwrap()
        };
        let t = |s: &str| crate::domain::time::parse(s).unwrap();
        let nights = sched(
            serde_json::json!([{"days": ["mon", "tue"], "from": "22:00", "to": "06:00"}]),
            serde_json::json!([]),
        );
        // Monday 2026-11-30, noon: the next night.
        let next = window_after(&nights, t("2026-11-30T12:00:00Z"));
        assert_eq!(
            next,
            Some((t("2026-11-30T22:00:00Z"), t("2026-12-01T06:00:00Z")))
        );
        // Inside it: the same night; from its end: Tuesday's.
        assert_eq!(window_after(&nights, t("2026-12-01T01:00:00Z")), next);
        assert_eq!(
            window_after(&nights, t("2026-12-01T06:00:00Z")),
            Some((t("2026-12-01T22:00:00Z"), t("2026-12-02T06:00:00Z")))
        );
        // Past Tuesday's night, next Monday's.
        assert_eq!(
            window_after(&nights, t("2026-12-02T06:00:00Z")).map(|w| w.0),
            Some(t("2026-12-07T22:00:00Z"))
        );
        // None comes: no windows, or none at all (every start date excepted is not
        // expressible past a year; an empty week is).
        let never = sched(serde_json::json!([]), serde_json::json!([]));
        assert_eq!(window_after(&never, t("2026-11-30T12:00:00Z")), None);
        // Always inside: pieces of at most MAX_SILENCE_MS, each moving on from the last.
        let always = sched(
            serde_json::json!([{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                "from": "00:00", "to": "24:00"}]),
            serde_json::json!([]),
        );
        let now = t("2026-11-30T12:00:00Z");
        let (s1, e1) = window_after(&always, now).unwrap();
        assert!(s1 <= now && e1 == now + MAX_SILENCE_MS, "{s1} {e1}");
        let (s2, e2) = window_after(&always, e1).unwrap();
        assert!(s2 <= e1 && e2 == e1 + MAX_SILENCE_MS);
    }

    #[test]
    fn a_scheduled_silence_is_pending_between_windows_and_ends_only_when_ended() {
        let mut s = Silence {
            id: "x".into(),
            matcher: Match::default(),
            starts_at: 10,
            ends_at: 20,
            comment: String::new(),
            created_at: 0,
            updated_at: 0,
            reconciled_at: None,
            schedule_id: Some("s".into()),
            ended_at: None,
        };
        assert_eq!(s.state(5), SilenceState::Pending);
        assert_eq!(s.state(10), SilenceState::Active);
        assert_eq!(s.state(20), SilenceState::Pending);
        s.ended_at = Some(20);
        assert_eq!(s.state(20), SilenceState::Ended);
        s.ended_at = None;
        s.schedule_id = None;
        assert_eq!(s.state(20), SilenceState::Ended);
    }

    #[test]
    fn times_are_ordered_in_the_future_and_bounded() {
        assert!(check_times(10, 20, 5).is_ok());
        assert!(check_times(20, 10, 5).is_err());
        assert!(check_times(10, 20, 25).is_err());
        assert!(check_times(0, MAX_SILENCE_MS + 1, 0).is_err());
        // A window that began in the past is bounded from now.
        assert!(check_times(0, MAX_SILENCE_MS + 10, 10).is_ok());
    }
}
