//! A site's decision, the same for every store: which liveness events of its sensors the
//! group commit holds back ([`hold`]), and what a round makes of them once the grace ran
//! out or while the site is down ([`decide`]): one `site.connection_lost` /
//! `site.connection_restored` per client for what the site's events tell it, and the held
//! events of the others released as the sensors' own notifications.

use serde_json::json;

use super::{Site, SiteCounts, SiteEvent, down};
use crate::domain::client::wants;
use crate::domain::outbox::NotificationRef;
use crate::domain::{Connection, Detail, Event, EventKind, Millis, SensorId, time};

/// Where a site's decision stands, as stored with it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SiteState {
    pub down: bool,
    /// When it went down or came back up.
    pub since: Option<Millis>,
    /// The first loss of one of its sensors not decided on yet.
    pub pending_since: Option<Millis>,
    /// The sensors its `site.connection_lost` named, while it is down.
    pub told: Vec<SensorId>,
    /// The clients that `site.connection_lost` went to: its return goes to them (a client
    /// linked while the site was down learns of its sensors' return by their own).
    pub told_clients: Vec<String>,
}

/// The settings of the decision (`LATCH_SITE_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rules {
    pub grace: Millis,
    pub ratio: f64,
    pub min_sensors: u32,
}

/// What the group commit does with a liveness event of a site's sensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Its notifications are made now, as for any sensor.
    Send,
    /// Kept for the site's decision ([`decide`]).
    Hold,
    /// Kept in history only: a reminder of a sensor its site's event already told of.
    Drop,
}

/// `held`: the sensor has events held already (they wait for the decision; what follows
/// them waits too, so its clients get them in order).
pub fn hold(kind: EventKind, state: &SiteState, sensor: SensorId, held: bool) -> Hold {
    let told = state.down && state.told.contains(&sensor);
    match kind {
        EventKind::ConnectionLost if !state.down || told || held => Hold::Hold,
        EventKind::ConnectionRestored if told || held => Hold::Hold,
        EventKind::StillLost if told => Hold::Drop,
        EventKind::StillLost if held => Hold::Hold,
        _ => Hold::Send,
    }
}

/// One of the site's sensors as the decision reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub id: SensorId,
    pub address: String,
    pub connection: Connection,
    pub data: Option<bool>,
    pub last_seen_at: Option<Millis>,
}

/// A client linked to some of the site's sensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Linked {
    pub client_id: String,
    /// The types it wants (`None`: all).
    pub events: Option<Vec<String>>,
    /// Its sensors of the site.
    pub sensors: Vec<SensorId>,
}

/// A notification the decision makes: a site's (its `body` set, in the lane of the first
/// sensor it names) or a held event released to one client.
#[derive(Debug, Clone, PartialEq)]
pub struct Made {
    pub client_id: String,
    pub event: Event,
    pub body: Option<String>,
}

/// What a round decided: the site's new state, the notifications to make, and that every
/// held event is consumed.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: SiteState,
    pub made: Vec<Made>,
    /// The site went down or came back (what the live stream shows); `None`: it stays up.
    pub changed: Option<SiteEvent>,
}

/// Whether a round should look at this site at `now`.
pub fn due(state: &SiteState, rules: &Rules, now: Millis) -> bool {
    state.down || state.pending_since.is_some_and(|p| p + rules.grace <= now)
}

/// The site's decision at `now` from its sensors, the events held for it (in the order they
/// were held) and its clients; `None`: nothing to do yet (the grace runs, or the site
/// stays down).
pub fn decide(
    site: &Site,
    state: &SiteState,
    members: &[Member],
    held: &[Event],
    clients: &[Linked],
    rules: &Rules,
    now: Millis,
) -> Option<Decision> {
    if !due(state, rules, now) {
        return None;
    }
    let lost = |m: &Member| m.connection == Connection::Lost;
    let counts = SiteCounts {
        sensors: members.len() as u64,
        lost: members.iter().filter(|m| lost(m)).count() as u64,
        gateway_lost: site
            .gateway_sensor_id
            .is_some_and(|g| members.iter().any(|m| m.id == g && lost(m))),
        ..SiteCounts::default()
    };
    let down_now = down(counts, rules.ratio, rules.min_sensors);
    let mut out = Out {
        site,
        members,
        now,
        made: Vec::new(),
        release: Vec::new(),
    };
    let next = match (state.down, down_now) {
        (false, true) => out.went_down(clients),
        // The grace ran out and the site stays up: every held event goes out.
        (false, false) => {
            out.release
                .extend(clients.iter().map(|c| (c, c.sensors.clone())));
            SiteState {
                pending_since: None,
                ..state.clone()
            }
        }
        (true, true) => return None,
        (true, false) => out.came_back(state, clients),
    };
    let Out {
        mut made,
        mut release,
        ..
    } = out;
    // Held events in the order they were held, each to its clients in id order.
    release.sort_by(|a, b| a.0.client_id.cmp(&b.0.client_id));
    for e in held {
        for (c, sensors) in &release {
            if sensors.contains(&e.sensor_id) && wants(&c.events, e.kind) {
                made.push(Made {
                    client_id: c.client_id.clone(),
                    event: e.clone(),
                    body: None,
                });
            }
        }
    }
    let changed = (next.down != state.down).then(|| SiteEvent {
        site_id: site.id.clone(),
        kind: if next.down {
            EventKind::SiteConnectionLost
        } else {
            EventKind::SiteConnectionRestored
        },
        at: now,
        sensors: counts.sensors,
        lost: counts.lost,
    });
    Some(Decision {
        state: next,
        made,
        changed,
    })
}

impl Decision {
    /// Takes the clients of `silenced` site losses off the clients the site's loss told:
    /// a silence kept it from them, so they know nothing of it; the silence's end then
    /// reconciles each of their sensors, and the site's return does not go to them.
    pub fn untell<'a>(&mut self, silenced: impl Iterator<Item = &'a NotificationRef>) {
        for n in silenced.filter(|n| n.kind == EventKind::SiteConnectionLost) {
            self.state.told_clients.retain(|c| *c != n.client_id);
        }
    }
}

/// What a decision makes as it goes: the site's notifications, and per client the sensors
/// whose held events go out as their own.
struct Out<'a> {
    site: &'a Site,
    members: &'a [Member],
    now: Millis,
    made: Vec<Made>,
    release: Vec<(&'a Linked, Vec<SensorId>)>,
}

impl<'a> Out<'a> {
    fn member(&self, id: &SensorId) -> Option<&'a Member> {
        self.members.iter().find(|m| m.id == *id)
    }

    /// Down: its lost sensors are told by the site's event, to each client that wants it;
    /// the rest of what was held goes out as the sensors' own.
    fn went_down(&mut self, clients: &'a [Linked]) -> SiteState {
        let mut told_clients = Vec::new();
        let told: Vec<SensorId> = self
            .members
            .iter()
            .filter(|m| m.connection == Connection::Lost)
            .map(|m| m.id)
            .collect();
        for c in clients {
            let mine: Vec<SensorId> = c
                .sensors
                .iter()
                .filter(|s| told.contains(s))
                .copied()
                .collect();
            if mine.is_empty() || !wants(&c.events, EventKind::SiteConnectionLost) {
                self.release.push((c, c.sensors.clone()));
                continue;
            }
            let sensors: Vec<_> = mine
                .iter()
                .filter_map(|s| self.member(s))
                .map(|m| {
                    json!({"id": m.id.to_string(), "address": m.address,
                           "data": m.data.map(u8::from),
                           "last_seen_at": m.last_seen_at.map(time::format)})
                })
                .collect();
            let body = json!({"site": site_json(self.site), "sensors": sensors,
                              "sensors_total": c.sensors.len()});
            let kind = EventKind::SiteConnectionLost;
            self.made.push(site_made(c, kind, mine[0], body, self.now));
            told_clients.push(c.client_id.clone());
            let others = c.sensors.iter().filter(|s| !mine.contains(s)).copied();
            self.release.push((c, others.collect()));
        }
        SiteState {
            down: true,
            since: Some(self.now),
            pending_since: None,
            told,
            told_clients,
        }
    }

    /// Back up: the sensors told of are listed back or still lost, to each client the
    /// site's loss went to; held events of the rest go out as the sensors' own.
    fn came_back(&mut self, state: &SiteState, clients: &'a [Linked]) -> SiteState {
        for c in clients {
            let mine: Vec<SensorId> = c
                .sensors
                .iter()
                .filter(|s| state.told.contains(s))
                .copied()
                .collect();
            let told_by_site = !mine.is_empty() && state.told_clients.contains(&c.client_id);
            if !told_by_site || !wants(&c.events, EventKind::SiteConnectionRestored) {
                self.release.push((c, c.sensors.clone()));
                continue;
            }
            let (back, still): (Vec<&Member>, Vec<&Member>) = mine
                .iter()
                .filter_map(|s| self.member(s))
                .partition(|m| m.connection == Connection::Online);
            let restored: Vec<_> = back
                .iter()
                .map(|m| json!({"id": m.id.to_string(), "data": m.data.map(u8::from)}))
                .collect();
            let still_lost: Vec<_> = still
                .iter()
                .map(|m| json!({"id": m.id.to_string(), "last_seen_at": m.last_seen_at.map(time::format)}))
                .collect();
            let body = json!({"site": site_json(self.site), "restored": restored,
                              "still_lost": still_lost});
            let kind = EventKind::SiteConnectionRestored;
            self.made.push(site_made(c, kind, mine[0], body, self.now));
            let others = c.sensors.iter().filter(|s| !mine.contains(s)).copied();
            self.release.push((c, others.collect()));
        }
        SiteState {
            down: false,
            since: Some(self.now),
            pending_since: None,
            told: Vec::new(),
            told_clients: Vec::new(),
        }
    }
}

fn site_json(site: &Site) -> serde_json::Value {
    json!({"id": site.id, "name": site.name, "address": site.address})
}

fn site_made(
    c: &Linked,
    kind: EventKind,
    anchor: SensorId,
    body: serde_json::Value,
    now: Millis,
) -> Made {
    Made {
        client_id: c.client_id.clone(),
        event: Event {
            sensor_id: anchor,
            kind,
            at: now,
            data: None,
            previous: None,
            last_seen_at: None,
            detail: Detail::default(),
        },
        body: Some(body.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(s: &str) -> SensorId {
        SensorId::parse(s).unwrap()
    }

    const RULES: Rules = Rules {
        grace: 30_000,
        ratio: 0.5,
        min_sensors: 3,
    };

    fn site() -> Site {
        Site {
            id: "bldg-7".into(),
            name: Some("Svobody 23".into()),
            address: None,
            gateway_sensor_id: None,
            created_at: 0,
            updated_at: 0,
        }
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

    fn lost_event(id: &str, at: Millis) -> Event {
        Event {
            sensor_id: sid(id),
            kind: EventKind::ConnectionLost,
            at,
            data: Some(true),
            previous: None,
            last_seen_at: Some(1_000),
            detail: Detail::default(),
        }
    }

    fn linked(id: &str, sensors: &[&str], events: Option<&[&str]>) -> Linked {
        Linked {
            client_id: id.into(),
            events: events.map(|e| e.iter().map(|s| s.to_string()).collect()),
            sensors: sensors.iter().map(|s| sid(s)).collect(),
        }
    }

    fn pending(at: Millis) -> SiteState {
        SiteState {
            pending_since: Some(at),
            ..SiteState::default()
        }
    }

    #[test]
    fn a_storm_is_one_site_event_per_client_naming_only_its_sensors() {
        let members: Vec<Member> = ["a1", "a2", "a3", "a4"]
            .iter()
            .map(|id| member(id, *id != "a4"))
            .collect();
        let held: Vec<Event> = ["a1", "a2", "a3"]
            .iter()
            .map(|id| lost_event(id, 5_000))
            .collect();
        let clients = [
            linked("c1", &["a1", "a2", "a4"], None),
            linked("c2", &["a3"], None),
            linked("old", &["a1"], Some(&["sensor.connection_lost"])),
        ];
        assert_eq!(
            decide(
                &site(),
                &pending(5_000),
                &members,
                &held,
                &clients,
                &RULES,
                20_000
            ),
            None,
            "the grace still runs"
        );
        let d = decide(
            &site(),
            &pending(5_000),
            &members,
            &held,
            &clients,
            &RULES,
            35_000,
        )
        .unwrap();
        assert!(d.state.down);
        assert_eq!(d.state.told, vec![sid("a1"), sid("a2"), sid("a3")]);
        let changed = d.changed.as_ref().expect("the site went down");
        assert_eq!(
            (changed.kind, changed.at, changed.lost),
            (EventKind::SiteConnectionLost, 35_000, 3)
        );
        let site_events: Vec<&Made> = d.made.iter().filter(|m| m.body.is_some()).collect();
        assert_eq!(site_events.len(), 2);
        let c1: serde_json::Value =
            serde_json::from_str(site_events[0].body.as_ref().unwrap()).unwrap();
        assert_eq!(c1["sensors"].as_array().unwrap().len(), 2, "{c1}");
        assert_eq!(c1["sensors_total"], 3);
        // A client that does not take site events gets its sensor's own loss.
        let own: Vec<(&str, EventKind)> = d
            .made
            .iter()
            .filter(|m| m.body.is_none())
            .map(|m| (m.client_id.as_str(), m.event.kind))
            .collect();
        assert_eq!(own, [("old", EventKind::ConnectionLost)]);
    }

    #[test]
    fn one_sensor_lost_alone_goes_out_after_the_grace() {
        let members: Vec<Member> = (0..10).map(|i| member(&format!("b{i}"), i == 0)).collect();
        let held = [lost_event("b0", 5_000)];
        let clients = [linked("c1", &["b0", "b1"], None)];
        let d = decide(
            &site(),
            &pending(5_000),
            &members,
            &held,
            &clients,
            &RULES,
            35_000,
        )
        .unwrap();
        assert!(!d.state.down);
        assert_eq!(d.state.pending_since, None);
        assert_eq!(d.changed, None, "it stays up: nothing for the live stream");
        assert_eq!(d.made.len(), 1);
        assert_eq!(d.made[0].event.kind, EventKind::ConnectionLost);
        assert!(d.made[0].body.is_none());
    }

    #[test]
    fn a_gateway_lost_is_the_site_down_and_its_return_lists_back_and_still_lost() {
        let s = Site {
            gateway_sensor_id: Some(sid("gw")),
            ..site()
        };
        let members = [
            member("gw", true),
            member("g1", true),
            member("g2", false),
            member("g3", false),
        ];
        let clients = [linked("c1", &["gw", "g1", "g2"], None)];
        let held = [lost_event("gw", 5_000), lost_event("g1", 5_000)];
        let d = decide(
            &s,
            &pending(5_000),
            &members,
            &held,
            &clients,
            &RULES,
            35_000,
        )
        .unwrap();
        assert!(d.state.down, "two of four are lost, but one is the gateway");
        assert_eq!(d.made.len(), 1);
        // The gateway comes back; g1 does not.
        let members = [
            member("gw", false),
            member("g1", true),
            member("g2", false),
            member("g3", false),
        ];
        let restored = Event {
            kind: EventKind::ConnectionRestored,
            ..lost_event("gw", 50_000)
        };
        assert_eq!(
            hold(EventKind::ConnectionRestored, &d.state, sid("gw"), false),
            Hold::Hold
        );
        assert_eq!(
            hold(EventKind::StillLost, &d.state, sid("g1"), false),
            Hold::Drop
        );
        assert_eq!(
            hold(EventKind::ConnectionLost, &d.state, sid("g3"), false),
            Hold::Send
        );
        let up = decide(
            &s,
            &d.state,
            &members,
            &[restored],
            &clients,
            &RULES,
            60_000,
        )
        .unwrap();
        assert!(!up.state.down);
        let back = up.changed.as_ref().expect("the site came back");
        assert_eq!(
            (back.kind, back.sensors, back.lost),
            (EventKind::SiteConnectionRestored, 4, 1)
        );
        assert_eq!(
            up.made.len(),
            1,
            "the site's restoration only: {:?}",
            up.made
        );
        let body: serde_json::Value =
            serde_json::from_str(up.made[0].body.as_ref().unwrap()).unwrap();
        assert_eq!(body["restored"][0]["id"], "gw");
        assert_eq!(body["still_lost"][0]["id"], "g1");
    }

    #[test]
    fn a_client_linked_while_the_site_was_down_gets_the_sensors_own_return() {
        let members = [member("e1", true), member("e2", true), member("e3", true)];
        let held = [lost_event("e1", 5_000)];
        let first = [linked("c1", &["e1", "e2", "e3"], None)];
        let d = decide(
            &site(),
            &pending(5_000),
            &members,
            &held,
            &first,
            &RULES,
            35_000,
        )
        .unwrap();
        assert_eq!(d.state.told_clients, ["c1"]);
        let back = [
            member("e1", false),
            member("e2", false),
            member("e3", false),
        ];
        let restored = Event {
            kind: EventKind::ConnectionRestored,
            ..lost_event("e1", 50_000)
        };
        let both = [
            linked("c1", &["e1", "e2", "e3"], None),
            linked("late", &["e1"], None),
        ];
        let up = decide(&site(), &d.state, &back, &[restored], &both, &RULES, 60_000).unwrap();
        let got: Vec<(&str, EventKind)> = up
            .made
            .iter()
            .map(|m| (m.client_id.as_str(), m.event.kind))
            .collect();
        assert_eq!(
            got,
            [
                ("c1", EventKind::SiteConnectionRestored),
                ("late", EventKind::ConnectionRestored)
            ]
        );
    }

    #[test]
    fn while_up_losses_are_held_and_state_changes_never() {
        let up = SiteState::default();
        assert_eq!(
            hold(EventKind::ConnectionLost, &up, sid("x"), false),
            Hold::Hold
        );
        assert_eq!(
            hold(EventKind::ConnectionRestored, &up, sid("x"), false),
            Hold::Send
        );
        assert_eq!(
            hold(EventKind::ConnectionRestored, &up, sid("x"), true),
            Hold::Hold
        );
        assert_eq!(
            hold(EventKind::StateChanged, &up, sid("x"), true),
            Hold::Send
        );
    }
}
