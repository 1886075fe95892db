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
    /// While down: the last held event (its id) released to the clients the site's loss
    /// did not tell. Held events stay until the site's return, which tells the others.
    pub released: i64,
}

/// An event held for the site's decision, by its place in the order of holding.
#[derive(Debug, Clone, PartialEq)]
pub struct HeldEvent {
    pub id: i64,
    pub event: Event,
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

/// What a round decided: the site's new state, the notifications to make, and the held
/// events it is done with.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub state: SiteState,
    pub made: Vec<Made>,
    /// The site went down or came back (what the live stream shows); `None`: it stays up.
    pub changed: Option<SiteEvent>,
    /// The held events up to this id are consumed; `None`: they stay (the site stays down:
    /// its return still owes them to the clients its loss told).
    pub consumed: Option<i64>,
}

/// Whether a round should look at this site at `now`.
pub fn due(state: &SiteState, rules: &Rules, now: Millis) -> bool {
    state.down || state.pending_since.is_some_and(|p| p + rules.grace <= now)
}

/// The site's decision at `now` from its sensors, the events held for it (in the order they
/// were held) and its clients; `None`: nothing to do yet (the grace runs, or the site
/// stays down and has nothing new for anyone).
pub fn decide(
    site: &Site,
    state: &SiteState,
    members: &[Member],
    held: &[HeldEvent],
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
            out.release.extend(clients.iter().map(|c| Release {
                client: c,
                all: c.sensors.clone(),
                newer: Vec::new(),
            }));
            SiteState {
                pending_since: None,
                ..state.clone()
            }
        }
        (true, true) => out.stays_down(state, clients, held),
        (true, false) => out.came_back(state, clients),
    };
    let Out {
        mut made,
        mut release,
        ..
    } = out;
    // Held events in the order they were held, each to its clients in id order.
    release.sort_by(|a, b| a.client.client_id.cmp(&b.client.client_id));
    for h in held {
        let e = &h.event;
        for r in &release {
            let due = r.all.contains(&e.sensor_id)
                || (h.id > state.released && r.newer.contains(&e.sensor_id));
            if due && wants(&r.client.events, e.kind) {
                made.push(Made {
                    client_id: r.client.client_id.clone(),
                    event: e.clone(),
                    body: None,
                });
            }
        }
    }
    let last = held.last().map(|h| h.id);
    let consumed = if next.down && state.down {
        if made.is_empty() && next == *state {
            return None;
        }
        None
    } else {
        last
    };
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
        consumed,
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
    release: Vec<Release<'a>>,
}

/// Which held events go to a client as the sensors' own: every one of the sensors in `all`,
/// and of those in `newer` the ones not released yet while the site was down.
struct Release<'a> {
    client: &'a Linked,
    all: Vec<SensorId>,
    newer: Vec<SensorId>,
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
                self.release_all(c, c.sensors.clone());
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
            self.release_all(c, others.collect());
        }
        SiteState {
            down: true,
            since: Some(self.now),
            pending_since: None,
            told,
            told_clients,
            released: 0,
        }
    }

    fn release_all(&mut self, client: &'a Linked, all: Vec<SensorId>) {
        self.release.push(Release {
            client,
            all,
            newer: Vec::new(),
        });
    }

    /// While the site is down or at its return: what of the held events goes to `c` as
    /// the sensors' own. Answers its sensors the site's loss told it of, if the site's
    /// return is for it to tell them; otherwise the client learns of them by their own
    /// events: a client the loss did not tell got what was released already, and one it
    /// told that has since stopped taking site events gets every one of those sensors.
    fn release_down(&mut self, state: &SiteState, c: &'a Linked) -> Option<Vec<SensorId>> {
        let (mine, others): (Vec<SensorId>, Vec<SensorId>) =
            c.sensors.iter().partition(|s| state.told.contains(s));
        let told = !mine.is_empty() && state.told_clients.contains(&c.client_id);
        let tells = told && wants(&c.events, EventKind::SiteConnectionRestored);
        let (all, newer, mine) = match (told, tells) {
            (true, true) => (Vec::new(), others, Some(mine)),
            (true, false) => (mine, others, None),
            _ => (Vec::new(), c.sensors.clone(), None),
        };
        self.release.push(Release {
            client: c,
            all,
            newer,
        });
        mine
    }

    /// Still down: the events held since the last round go to the clients its loss did
    /// not tell; a client it told that stopped taking site events is told no more.
    fn stays_down(
        &mut self,
        state: &SiteState,
        clients: &'a [Linked],
        held: &[HeldEvent],
    ) -> SiteState {
        let mut told_clients = state.told_clients.clone();
        for c in clients {
            if self.release_down(state, c).is_none() {
                told_clients.retain(|t| *t != c.client_id);
            }
        }
        SiteState {
            told_clients,
            released: held.last().map_or(state.released, |h| h.id),
            ..state.clone()
        }
    }

    /// Back up: the sensors told of are listed back or still lost, to each client the
    /// site's loss went to; held events of the rest go out as the sensors' own.
    fn came_back(&mut self, state: &SiteState, clients: &'a [Linked]) -> SiteState {
        for c in clients {
            let Some(mine) = self.release_down(state, c) else {
                continue;
            };
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
        }
        SiteState {
            down: false,
            since: Some(self.now),
            pending_since: None,
            told: Vec::new(),
            told_clients: Vec::new(),
            released: 0,
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

    /// Held events numbered from 1, as a store numbers them.
    fn numbered(events: impl IntoIterator<Item = Event>) -> Vec<HeldEvent> {
        events
            .into_iter()
            .zip(1..)
            .map(|(event, id)| HeldEvent { id, event })
            .collect()
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
        let held = numbered(["a1", "a2", "a3"].iter().map(|id| lost_event(id, 5_000)));
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
        let held = numbered([lost_event("b0", 5_000)]);
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
        let held = numbered([lost_event("gw", 5_000), lost_event("g1", 5_000)]);
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
            &numbered([restored]),
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
        let held = numbered([lost_event("e1", 5_000)]);
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
        let up = decide(
            &site(),
            &d.state,
            &back,
            &numbered([restored]),
            &both,
            &RULES,
            60_000,
        )
        .unwrap();
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
    fn while_down_held_events_go_at_once_to_the_clients_its_loss_did_not_tell() {
        let lost = [
            member("d1", true),
            member("d2", true),
            member("d3", true),
            member("d4", true),
        ];
        let sensor_events = Some(&["sensor.connection_lost", "sensor.connection_restored"][..]);
        let clients = [
            linked("c1", &["d1", "d2", "d3", "d4"], None),
            linked("c2", &["d1", "d2"], sensor_events),
        ];
        let losses = numbered(
            ["d1", "d2", "d3", "d4"]
                .iter()
                .map(|id| lost_event(id, 5_000)),
        );
        let down = decide(
            &site(),
            &pending(5_000),
            &lost,
            &losses,
            &clients,
            &RULES,
            35_000,
        )
        .unwrap();
        assert_eq!(down.consumed, Some(4));
        assert_eq!(down.state.told_clients, ["c1"]);
        let restored = |id: &str, at| Event {
            kind: EventKind::ConnectionRestored,
            ..lost_event(id, at)
        };
        // d1 is back; three of four are still lost.
        let members = [
            member("d1", false),
            member("d2", true),
            member("d3", true),
            member("d4", true),
        ];
        let held = vec![HeldEvent {
            id: 5,
            event: restored("d1", 40_000),
        }];
        let got = |d: &Decision| -> Vec<(String, EventKind, String)> {
            d.made
                .iter()
                .map(|m| {
                    (
                        m.client_id.clone(),
                        m.event.kind,
                        m.event.sensor_id.to_string(),
                    )
                })
                .collect()
        };
        let d = decide(
            &site(),
            &down.state,
            &members,
            &held,
            &clients,
            &RULES,
            41_000,
        )
        .unwrap();
        assert_eq!(
            got(&d),
            [("c2".into(), EventKind::ConnectionRestored, "d1".into())]
        );
        assert_eq!(
            (d.state.down, d.state.released, d.consumed),
            (true, 5, None)
        );
        assert_eq!(d.changed, None);
        assert_eq!(
            decide(&site(), &d.state, &members, &held, &clients, &RULES, 42_000),
            None,
            "nothing new for anyone"
        );
        // c1 stops taking site events: the site's loss told it of d1, so it gets d1's own
        // return now, and what follows as any client the loss did not tell.
        let unsubscribed = [
            linked("c1", &["d1", "d2", "d3", "d4"], sensor_events),
            linked("c2", &["d1", "d2"], sensor_events),
        ];
        let d = decide(
            &site(),
            &d.state,
            &members,
            &held,
            &unsubscribed,
            &RULES,
            43_000,
        )
        .unwrap();
        assert_eq!(
            got(&d),
            [("c1".into(), EventKind::ConnectionRestored, "d1".into())]
        );
        assert!(d.state.told_clients.is_empty());
        let mut held = held;
        held.push(HeldEvent {
            id: 6,
            event: restored("d2", 50_000),
        });
        let back = [
            member("d1", false),
            member("d2", false),
            member("d3", true),
            member("d4", true),
        ];
        let up = decide(
            &site(),
            &d.state,
            &back,
            &held,
            &unsubscribed,
            &RULES,
            51_000,
        )
        .unwrap();
        assert_eq!(
            got(&up),
            [
                ("c1".into(), EventKind::ConnectionRestored, "d2".into()),
                ("c2".into(), EventKind::ConnectionRestored, "d2".into())
            ],
            "each return once, and no site event to a client that no longer takes them"
        );
        assert_eq!((up.state.down, up.consumed), (false, Some(6)));
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
