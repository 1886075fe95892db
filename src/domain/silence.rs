//! Silences (maintenance windows): while one is active, the notifications it matches are
//! made and kept with status `silenced` but never sent; at its end each (client, sensor) it
//! kept something from is brought up to date by one notification, if its view is wrong.

use serde::{Deserialize, Serialize};

use super::notification::EventKind;
use super::sensor::{Connection, SensorId};
use super::time::Millis;

/// How long after a silence's end it is reconciled: a commit stamped before the end may
/// land this much later (a store call's bound), and its notifications must be seen.
pub const SETTLE_MS: Millis = 5_000;

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
    pub fn state(&self, now: Millis) -> SilenceState {
        if now < self.starts_at {
            SilenceState::Pending
        } else if now < self.ends_at {
            SilenceState::Active
        } else {
            SilenceState::Ended
        }
    }
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
        }
    }
}

/// A view corrected by the client's site: while the sensor's site is down and its loss
/// told this client of the sensor (`told`), the client knows the sensor is lost.
pub fn told_by_site(view: View, told: bool) -> View {
    match told {
        true => View { lost: true, ..view },
        false => view,
    }
}

/// The sensors a silenced notification of `kind` kept news of from its client: a site's
/// event names each of the client's sensors in its `body` (`anchor`, the one it travels
/// with, among them); any other names its own. Each becomes a pair the silence's end
/// reconciles, or a site's silenced loss would leave the client never told of the rest.
pub fn kept_sensors(kind: EventKind, anchor: SensorId, body: Option<&str>) -> Vec<SensorId> {
    let lists: &[&str] = match kind {
        EventKind::SiteConnectionLost => &["sensors"],
        EventKind::SiteConnectionRestored => &["restored", "still_lost"],
        _ => &[],
    };
    let body: serde_json::Value = body
        .and_then(|b| serde_json::from_str(b).ok())
        .unwrap_or_default();
    let mut out = vec![anchor];
    for list in lists {
        let named = body[*list].as_array().into_iter().flatten();
        out.extend(named.filter_map(|x| SensorId::parse(x["id"].as_str()?).ok()));
    }
    out.sort();
    out.dedup();
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
    fn a_site_event_kept_from_a_client_keeps_each_sensor_it_names() {
        let id = |s: &str| SensorId::parse(s).unwrap();
        let lost = r#"{"site":{"id":"b"},"sensors":[{"id":"s1"},{"id":"s2"}],"sensors_total":3}"#;
        assert_eq!(
            kept_sensors(EventKind::SiteConnectionLost, id("s1"), Some(lost)),
            [id("s1"), id("s2")]
        );
        let back = r#"{"site":{"id":"b"},"restored":[{"id":"s3"}],"still_lost":[{"id":"s1"}]}"#;
        assert_eq!(
            kept_sensors(EventKind::SiteConnectionRestored, id("s3"), Some(back)),
            [id("s1"), id("s3")]
        );
        assert_eq!(
            kept_sensors(EventKind::ConnectionLost, id("s9"), None),
            [id("s9")]
        );
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
