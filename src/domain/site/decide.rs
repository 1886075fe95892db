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
    /// Up: the first loss of one of its sensors not decided on yet (its grace runs from
    /// then). Down: a change of its sensors asks for a decision at the next round.
    pub pending_since: Option<Millis>,
    /// The sensors its `site.connection_lost` named, while it is down.
    pub told: Vec<SensorId>,
    /// The clients that `site.connection_lost` went to: its return goes to them (a client
    /// linked while the site was down learns of its sensors' return by their own).
    pub told_clients: Vec<String>,
    /// While down: the last held event (its id) released to the clients the site's loss
    /// did not tell. Held events stay until the site's return, which tells the others.
    pub released: i64,
    /// Clients among `told_clients` told by a silence's end ([`super::retell`]), each with
    /// `released` then: what was held up to it went to them as the sensors' own before, so
    /// it is not owed to them again (simulation seed 2189: a sensor moved away after such
    /// a client had its return gave it that return twice).
    pub retold: Vec<(String, i64)>,
}

impl SiteState {
    /// The last held event already released to `client`, a client the site's loss told:
    /// none (0) if the decision told it, `released` at the time if a silence's end did.
    pub fn released_to(&self, client: &str) -> i64 {
        self.retold
            .iter()
            .find(|(c, _)| c == client)
            .map_or(0, |(_, at)| *at)
    }
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

/// Whether the commit asks for the site's decision at the next round (sets its
/// `pending_since`), given what it did with a liveness event: a loss held on a site that
/// is up starts its grace; on a site down, a return sent at once (of a sensor its loss did
/// not name) may leave too few of its sensors lost, so it is decided again — else such a
/// site stays down with every sensor back (simulation seed 411: nothing else asks).
pub fn asks_decision(kind: EventKind, state: &SiteState, hold: Hold) -> bool {
    match (kind, hold) {
        (EventKind::ConnectionLost, Hold::Hold) => !state.down,
        (EventKind::ConnectionRestored, Hold::Send) => state.down,
        _ => false,
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
    /// Every held event read is consumed (the store deletes them); `false`: they stay (the
    /// site stays down: its return still owes them to the clients its loss told).
    pub consumes_held: bool,
}

/// Whether a round should decide this site at `now` (the stores' `DUE` says the same in
/// SQL): its grace ran out; it is down and something asks for a decision (a change of its
/// sensors, [`super::moves`]); or it holds events not released yet with no grace running —
/// a site down with new events of its sensors, or (a race lost to a decision) one up. A
/// site down with nothing new is not due: a round would only read it again, and many such
/// sites would starve the rest of a round's batch.
pub fn due(state: &SiteState, held: &[HeldEvent], rules: &Rules, now: Millis) -> bool {
    match state.pending_since {
        Some(p) => state.down || p + rules.grace <= now,
        None => held.iter().any(|h| h.id > state.released),
    }
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
    if !due(state, held, rules, now) {
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
            for c in clients {
                out.release_all(c, c.sensors.clone());
            }
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
        let data_now = members.iter().find(|m| m.id == h.event.sensor_id);
        let e = &released(&h.event, data_now.map_or(h.event.data, |m| m.data));
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
    let stays_down = state.down && next.down;
    if stays_down && made.is_empty() && next == *state {
        return None;
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
        consumes_held: !stays_down,
    })
}

/// A held event as it goes out: a return carries the sensor's data at release, not the
/// data it had when it came back. A change of data is never held, so a client may have
/// been told a newer state since; the return's older one, arriving after it, would leave
/// the client believing the sensor holds what it no longer does.
pub fn released(e: &Event, data_now: Option<bool>) -> Event {
    match e.kind {
        EventKind::ConnectionRestored => Event {
            data: data_now,
            ..e.clone()
        },
        _ => e.clone(),
    }
}

impl Decision {
    /// Takes the clients of `silenced` site losses off the clients the site's loss told:
    /// a silence kept it from them, so they know nothing of it; the silence's end then
    /// reconciles each of their sensors, and the site's return does not go to them.
    pub fn untell<'a>(&mut self, silenced: impl Iterator<Item = &'a NotificationRef>) {
        for n in silenced.filter(|n| n.kind == EventKind::SiteConnectionLost) {
            self.state.told_clients.retain(|c| *c != n.client_id);
            self.state.retold.retain(|(c, _)| *c != n.client_id);
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
            self.made
                .push(site_loss(self.site, self.members, c, &mine, self.now));
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
            retold: Vec::new(),
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
        let mut retold = state.retold.clone();
        for c in clients {
            if self.release_down(state, c).is_none() {
                told_clients.retain(|t| *t != c.client_id);
                retold.retain(|(t, _)| *t != c.client_id);
            }
        }
        SiteState {
            told_clients,
            retold,
            released: held.last().map_or(state.released, |h| h.id),
            pending_since: None,
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
            let made = site_return(self.site, self.members, c, &mine, self.now);
            self.made.push(made);
        }
        SiteState {
            down: false,
            since: Some(self.now),
            pending_since: None,
            told: Vec::new(),
            told_clients: Vec::new(),
            released: 0,
            retold: Vec::new(),
        }
    }
}

/// The `site.connection_restored` that tells client `c` which of its sensors `mine` (of
/// `members`, which the site's loss named) are back and which are still lost, in the lane of
/// the first.
pub fn site_return(
    site: &Site,
    members: &[Member],
    c: &Linked,
    mine: &[SensorId],
    now: Millis,
) -> Made {
    let (back, still): (Vec<&Member>, Vec<&Member>) = mine
        .iter()
        .filter_map(|s| members.iter().find(|m| m.id == *s))
        .partition(|m| m.connection == Connection::Online);
    let restored: Vec<_> = back
        .iter()
        .map(|m| json!({"id": m.id.to_string(), "data": m.data.map(u8::from)}))
        .collect();
    let still_lost: Vec<_> = still
        .iter()
        .map(|m| json!({"id": m.id.to_string(), "last_seen_at": m.last_seen_at.map(time::format)}))
        .collect();
    let body = json!({"site": site_json(site), "restored": restored,
                      "still_lost": still_lost});
    site_made(c, EventKind::SiteConnectionRestored, mine[0], body, now)
}

/// The `site.connection_lost` that tells client `c` of its sensors `mine` (lost, of
/// `members`), in the lane of the first.
pub fn site_loss(
    site: &Site,
    members: &[Member],
    c: &Linked,
    mine: &[SensorId],
    now: Millis,
) -> Made {
    let sensors: Vec<_> = mine
        .iter()
        .filter_map(|s| members.iter().find(|m| m.id == *s))
        .map(|m| {
            json!({"id": m.id.to_string(), "address": m.address,
                   "data": m.data.map(u8::from),
                   "last_seen_at": m.last_seen_at.map(time::format)})
        })
        .collect();
    let body = json!({"site": site_json(site), "sensors": sensors,
                      "sensors_total": c.sensors.len()});
    site_made(c, EventKind::SiteConnectionLost, mine[0], body, now)
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
#[path = "decide_tests.rs"]
mod tests;
