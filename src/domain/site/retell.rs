//! A site's loss a silence kept from a client, told at the silence's end while the site is
//! still down (book: Silences): one `site.connection_lost` naming the client's sensors
//! its loss named and still lost — a building of 200 doors pages once, not 200 times — and
//! the site's return then goes to that client too.

use super::Site;
use super::decide::{Linked, Made, Member, SiteState, site_loss};
use crate::domain::client::wants;
use crate::domain::{Connection, EventKind, Millis, SensorId};

/// A site's loss told again.
#[derive(Debug, Clone, PartialEq)]
pub struct Retold {
    pub made: Made,
    /// The site's state with the client told of it.
    pub state: SiteState,
    /// The sensors it names: brought up to date by it.
    pub named: Vec<SensorId>,
}

/// The site's loss for `client` at `now`; `None` when the site is up, its loss told the client already, the client takes no
/// site events, or none of its sensors the loss named is still lost (then each is brought
/// up to date on its own).
pub fn retell(
    site: &Site,
    state: &SiteState,
    members: &[Member],
    client: &Linked,
    now: Millis,
) -> Option<Retold> {
    if !state.down
        || state.told_clients.contains(&client.client_id)
        || !wants(&client.events, EventKind::SiteConnectionLost)
    {
        return None;
    }
    let lost = |s: &SensorId| {
        members
            .iter()
            .any(|m| m.id == *s && m.connection == Connection::Lost)
    };
    let mine: Vec<SensorId> = client
        .sensors
        .iter()
        .filter(|s| state.told.contains(s) && lost(s))
        .copied()
        .collect();
    if mine.is_empty() {
        return None;
    }
    let made = site_loss(site, members, client, &mine, now);
    let mut state = state.clone();
    state.told_clients.push(client.client_id.clone());
    state
        .retold
        .push((client.client_id.clone(), state.released));
    Some(Retold {
        made,
        state,
        named: mine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(s: &str) -> SensorId {
        SensorId::parse(s).unwrap()
    }

    fn member(id: &str, lost: bool) -> Member {
        Member {
            id: sid(id),
            address: format!("room {id}"),
            connection: if lost {
                Connection::Lost
            } else {
                Connection::Online
            },
            data: Some(true),
            last_seen_at: Some(1_000),
        }
    }

    #[test]
    fn a_kept_site_loss_is_told_once_naming_what_is_still_lost() {
        let site = Site {
            id: "bldg-7".into(),
            name: None,
            address: None,
            gateway_sensor_id: None,
            created_at: 0,
            updated_at: 0,
        };
        let state = SiteState {
            down: true,
            told: vec![sid("r1"), sid("r2"), sid("r3")],
            told_clients: vec!["other".into()],
            ..SiteState::default()
        };
        let members = [
            member("r1", true),
            member("r2", false),
            member("r3", true),
            member("r4", false),
        ];
        let kept = Linked {
            client_id: "kept".into(),
            events: None,
            sensors: vec![sid("r1"), sid("r2"), sid("r3"), sid("r4")],
        };
        let Retold {
            made,
            state: after,
            named: listed,
        } = retell(&site, &state, &members, &kept, 9_000).expect("told");
        assert_eq!(listed, [sid("r1"), sid("r3")]);
        assert_eq!(made.event.kind, EventKind::SiteConnectionLost);
        let body: serde_json::Value = serde_json::from_str(made.body.as_deref().unwrap()).unwrap();
        let named: Vec<&str> = body["sensors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["id"].as_str().unwrap())
            .collect();
        assert_eq!(named, ["r1", "r3"], "r2 is back: its own return tells it");
        assert_eq!(body["sensors_total"], 4);
        assert_eq!(
            after.told_clients,
            ["other", "kept"],
            "the return goes to it too"
        );
        assert_eq!(
            retell(&site, &after, &members, &kept, 9_500),
            None,
            "told once"
        );
        let up = SiteState {
            down: false,
            ..state.clone()
        };
        assert_eq!(retell(&site, &up, &members, &kept, 9_000), None);
        let own_only = Linked {
            events: Some(vec!["sensor.connection_lost".into()]),
            ..kept.clone()
        };
        assert_eq!(retell(&site, &state, &members, &own_only, 9_000), None);
    }
}
