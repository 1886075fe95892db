//! Sites: the buildings sensors are installed in, which fail together (a gateway loses
//! power, an uplink goes down), so that one alarm can stand for all of a site's sensors and
//! a maintenance window can name them at once.

pub mod decide;
pub mod moves;
pub mod retell;

use serde::{Deserialize, Serialize};

use super::notification::EventKind;
use super::sensor::SensorId;
use super::time::Millis;

/// The longest site id.
pub const MAX_SITE_ID_LEN: usize = 64;

/// A site as the registry keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    pub id: String,
    pub name: Option<String>,
    pub address: Option<String>,
    /// A sensor whose loss alone means the site is down (the building's gateway).
    pub gateway_sensor_id: Option<SensorId>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

/// A site's sensors, counted by connection (what `GET /v1/sites/{id}` reports beside it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteCounts {
    /// Sensors that belong to the site.
    pub sensors: u64,
    /// Of those, the ones lost now.
    pub lost: u64,
    /// Whether its gateway sensor is lost now.
    #[serde(skip)]
    pub gateway_lost: bool,
    /// Whether its decision says it is down, and since when it is down or up again.
    #[serde(skip)]
    pub down: bool,
    #[serde(skip)]
    pub since: Option<Millis>,
}

/// A site's change, as the round that decided it tells the live stream: it went down
/// (`site.connection_lost`) or came back (`site.connection_restored`), with its sensors
/// counted as the decision read them.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteEvent {
    pub site_id: String,
    /// [`EventKind::SiteConnectionLost`] or [`EventKind::SiteConnectionRestored`].
    pub kind: EventKind,
    pub at: Millis,
    /// Sensors in the site.
    pub sensors: u64,
    /// Of those, lost when it was decided.
    pub lost: u64,
}

/// The sites' state across the store, for the gauges a round refreshes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SiteTotals {
    /// Sites down now.
    pub down: u64,
    /// Events held for the grace of sites that are up (waiting for their decision).
    pub held: u64,
    /// When the oldest grace still running began (`sites.pending_since`); `None`: none runs.
    pub oldest_grace: Option<Millis>,
}

/// The site a site event's body names (`{"site": {"id": …}, …}`): stored beside the
/// notification, so that a newer event of the same site for the same client supersedes
/// one still waiting (the owner's decision in issue #68; `policy::claim_step`).
pub fn named_in(body: Option<&str>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(body?).ok()?;
    v["site"]["id"].as_str().map(str::to_string)
}

/// The sensors a site event's body names, in its order: a loss's `sensors`, a return's
/// `restored` then `still_lost`. Kept beside the notification (`notification_sensors`), so
/// a sensor's notifications include the site events that named it without reading bodies.
pub fn sensors_named_in(body: Option<&str>) -> Vec<SensorId> {
    let Some(v) = body.and_then(|b| serde_json::from_str::<serde_json::Value>(b).ok()) else {
        return Vec::new();
    };
    let mut out: Vec<SensorId> = Vec::new();
    for list in ["sensors", "restored", "still_lost"] {
        for x in v[list].as_array().into_iter().flatten() {
            if let Some(id) = x["id"].as_str().and_then(|i| SensorId::parse(i).ok())
                && !out.contains(&id)
            {
                out.push(id);
            }
        }
    }
    out
}

/// A site event's `body` without `gone`, sensors whose connection the client heard of
/// since from a newer notification (a dead-lettered site event replayed after the
/// sensor's own return was delivered, issue #68): what it would tell of them is stale,
/// the newer one stands. `None` when a loss names none of its sensors any more (nothing
/// left to tell: it is superseded); a return always stays, as the site's own news.
pub fn without(kind: EventKind, body: &str, gone: &[SensorId]) -> Option<String> {
    let mut v: serde_json::Value = serde_json::from_str(body).ok()?;
    let lists: &[&str] = match kind {
        EventKind::SiteConnectionLost => &["sensors"],
        EventKind::SiteConnectionRestored => &["restored", "still_lost"],
        _ => return Some(body.to_string()),
    };
    let gone: Vec<String> = gone.iter().map(|s| s.to_string()).collect();
    for list in lists {
        if let Some(a) = v[*list].as_array_mut() {
            a.retain(|x| {
                !x["id"]
                    .as_str()
                    .is_some_and(|id| gone.iter().any(|g| g == id))
            });
        }
    }
    if kind == EventKind::SiteConnectionLost && v["sensors"].as_array().is_none_or(|a| a.is_empty())
    {
        return None;
    }
    Some(v.to_string())
}

/// Whether a site with these counts is down: its gateway is lost, or at least `ratio` of
/// its sensors, and at least `min_sensors`, are.
pub fn down(c: SiteCounts, ratio: f64, min_sensors: u32) -> bool {
    c.gateway_lost
        || (c.sensors > 0
            && c.lost >= u64::from(min_sensors)
            && c.lost as f64 >= ratio * c.sensors as f64)
}

/// Why a site id is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SiteIdError {
    #[error("site id is empty")]
    Empty,
    #[error("site id is {0} characters long; at most {MAX_SITE_ID_LEN} are allowed")]
    TooLong(usize),
    #[error(
        "site id has {0:?} at position {1}; only ASCII letters, digits, '-', '_' and '.' are allowed"
    )]
    BadChar(char, usize),
}

/// Checks a site id. Sites are named by people, not by device firmware, so besides the
/// sensors' letters and digits an id may hold `-`, `_` and `.` (`bldg-7`), and be up to
/// 64 characters long.
pub fn check_site_id(id: &str) -> Result<(), SiteIdError> {
    if id.is_empty() {
        return Err(SiteIdError::Empty);
    }
    let n = id.chars().count();
    if n > MAX_SITE_ID_LEN {
        return Err(SiteIdError::TooLong(n));
    }
    match id
        .chars()
        .enumerate()
        .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        Some((i, c)) => Err(SiteIdError::BadChar(c, i)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_is_down_by_its_gateway_or_by_a_share_of_enough_sensors() {
        let c = |sensors, lost, gateway_lost| SiteCounts {
            sensors,
            lost,
            gateway_lost,
            ..SiteCounts::default()
        };
        assert!(down(c(10, 5, false), 0.5, 3));
        assert!(!down(c(10, 4, false), 0.5, 3));
        assert!(
            !down(c(4, 2, false), 0.5, 3),
            "half, but fewer than the minimum"
        );
        assert!(down(c(10, 0, true), 0.5, 3), "its gateway alone");
        assert!(!down(c(0, 0, false), 0.5, 3));
    }

    #[test]
    fn a_site_event_names_its_lists_sensors_once_in_order() {
        let ids = |b: &str| -> Vec<String> {
            sensors_named_in(Some(b))
                .iter()
                .map(|s| s.to_string())
                .collect()
        };
        let lost = r#"{"site":{"id":"b"},"sensors":[{"id":"s2"},{"id":"s1"}],"sensors_total":3}"#;
        assert_eq!(ids(lost), ["s2", "s1"]);
        let back = r#"{"site":{"id":"b"},"restored":[{"id":"s3"}],"still_lost":[{"id":"s1"},{"id":"s3"}]}"#;
        assert_eq!(ids(back), ["s3", "s1"]);
        assert!(sensors_named_in(None).is_empty());
        assert!(sensors_named_in(Some("not json")).is_empty());
    }

    #[test]
    fn a_site_event_drops_the_sensors_a_newer_notification_told_of() {
        let gone = [SensorId::parse("s1").unwrap()];
        let back = r#"{"site":{"id":"b"},"restored":[{"id":"s1","data":1}],"still_lost":[{"id":"s1"},{"id":"s2"}]}"#;
        let v: serde_json::Value =
            serde_json::from_str(&without(EventKind::SiteConnectionRestored, back, &gone).unwrap())
                .unwrap();
        assert_eq!(v["restored"], serde_json::json!([]));
        assert_eq!(v["still_lost"], serde_json::json!([{"id": "s2"}]));
        assert_eq!(v["site"]["id"], "b");
        let only = r#"{"site":{"id":"b"},"restored":[],"still_lost":[{"id":"s1"}]}"#;
        assert!(
            without(EventKind::SiteConnectionRestored, only, &gone).is_some(),
            "the site's return is news of its own"
        );
        let lost = r#"{"site":{"id":"b"},"sensors":[{"id":"s1"}],"sensors_total":3}"#;
        assert_eq!(without(EventKind::SiteConnectionLost, lost, &gone), None);
        let two = r#"{"site":{"id":"b"},"sensors":[{"id":"s1"},{"id":"s3"}],"sensors_total":3}"#;
        let v: serde_json::Value =
            serde_json::from_str(&without(EventKind::SiteConnectionLost, two, &gone).unwrap())
                .unwrap();
        assert_eq!(v["sensors"], serde_json::json!([{"id": "s3"}]));
        assert_eq!(v["sensors_total"], 3);
    }

    #[test]
    fn site_ids_take_what_people_name_buildings_with_and_say_why_not() {
        assert!(check_site_id("bldg-7").is_ok());
        assert!(check_site_id("Svobody_23.fl1").is_ok());
        assert_eq!(check_site_id(""), Err(SiteIdError::Empty));
        assert_eq!(
            check_site_id(&"a".repeat(65)),
            Err(SiteIdError::TooLong(65))
        );
        assert_eq!(check_site_id("a b"), Err(SiteIdError::BadChar(' ', 1)));
    }
}
