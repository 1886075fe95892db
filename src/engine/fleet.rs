//! A shard's sensors: their state, and the deadline index that finds silent ones.
//!
//! Sensors live in a slab (`Vec<Slot>`, reused through a free list); a hash table of slab
//! positions, hashed by the sensor id kept in the slot itself, finds them by id. Every
//! online sensor is also on an intrusive doubly-linked list, one list per distinct heartbeat
//! timeout, ordered by when it was last seen. A reading moves its sensor to the back of its
//! list (O(1)); the fronts are the next to expire (O(1) to find, O(1) to take). Nothing ever
//! scans the fleet, and the index costs two `u32` links a sensor. We chose per-timeout lists
//! over a timing wheel because nearly every sensor shares one timeout, so a list per value is
//! exact (no tick granularity) and needs no cascading.
//!
//! A sensor's deadline is `max(last_seen, resumed_at) + timeout`, `resumed_at` being when
//! this process started: latch's own downtime is not the sensor's silence. Since that is a
//! monotone function of `last_seen`, a list ordered by `last_seen` is ordered by deadline.
//!
//! A map from timeout to list finds a sensor's list in O(1), however many distinct timeouts
//! there are; list ids are `u32`, like slab positions. A list that empties is dropped from
//! that map and its id reused, so the lists follow the live distinct timeouts. Finding the
//! next deadline looks at each list's front: per round of the shard, not per reading.
//!
//! Memory is the point at 10M sensors: a slot is 48 bytes (the id's 96 bits, two times,
//! two links, the timeout, the list and a packed byte of data, connection, source and
//! whether [`Extras`] holds more of it) and the table 4 bytes a slot plus control bytes.
//! `changed_at` is not kept: the store has it, and a commit only writes it when the state
//! changed. What few sensors carry beyond that (an own debounce window, a change waiting
//! one out, reminders while lost) and the timers it sets are in [`Extras`].
//!
//! Our broker links count like our own downtime: a sensor last heard over AMQP or MQTT is
//! on a list of its timeout *and source*, and while latch's connection to that broker is
//! down ([`Fleet::set_link`]) the list is not expired at all; once it is back, deadlines
//! on it are `max(last_seen, resumed_at, reconnected_at) + timeout`, which is still
//! monotone in `last_seen`. Sensors heard over HTTP (or never) are on lists no link holds.

use crate::hashing::FastMap as HashMap;
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use super::extra::Extras;
pub use super::extra::Policy;
use crate::domain::sensor::SensorState;
use crate::domain::{Connection, Millis, SensorId, Source};
use crate::domain::{flap, hold};
use crate::telemetry::families;

const NIL: u32 = u32::MAX;
/// `last_seen_at` / `last_ts` of a sensor that never sent one.
const NEVER: Millis = Millis::MIN;
/// `group` of a sensor on no list.
const NO_GROUP: u32 = u32::MAX;

/// Moves `latch_sensors_lost`, the number of sensors currently lost, across all shards.
pub fn lost_gauge(delta: f64) {
    families::SENSORS_LOST.gauge().increment(delta);
}

struct Slot {
    last_seen_at: Millis,
    last_ts: Millis,
    /// Low 64 of the id's 96 packed bits.
    id_lo: u64,
    id_hi: u32,
    prev: u32,
    next: u32,
    /// Own heartbeat timeout in seconds; 0 for the service default.
    timeout_s: u32,
    /// Index in `groups` while on a list.
    group: u32,
    /// Bits 0–1: data (0 none, 1 false, 2 true); bits 2–3: connection; bits 4–5: source
    /// of the last reading (0 none, else [`Source::index`] + 1); bit 6: [`EXTRA`].
    flags: u8,
}

/// The flag bit saying [`Extras`] holds more of a sensor's state.
const EXTRA: u8 = 1 << 6;

/// One broker link as the deadlines see it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Link {
    /// latch's connection to the broker is down: sensors last heard through it are not
    /// expired.
    pub down: bool,
    /// When it was last (re)connected: their deadlines count from then at the earliest.
    pub up_since: Millis,
    /// latch stopped taking readings ([`deafen`]): held for good, whatever the link does
    /// after (another node's reconnect that a cluster's lease round follows).
    pub deaf: bool,
}

/// The links per [`Source::index`]; HTTP's is never down.
pub type Links = [Link; 3];

/// Records that `source`'s link went down or came back (`up`) at `at`. A link that is up
/// and told so again keeps when it came back.
pub fn change_link(links: &mut Links, source: Source, up: bool, at: Millis) {
    if source == Source::Http {
        return;
    }
    let link = &mut links[source.index()];
    match (up, link.down) {
        (true, true) => {
            link.down = false;
            link.up_since = at;
        }
        (false, _) => link.down = true,
        (true, false) => {}
    }
}

/// latch stopped taking readings (a stop began): from then on no sensor's silence is its
/// own, whatever it was heard through, so every list is held as by a link that is down
/// (HTTP's too) until the process exits. The next start counts deadlines from then.
pub fn deafen(links: &mut Links) {
    for link in links.iter_mut() {
        link.deaf = true;
    }
}

impl Slot {
    fn new(id: SensorId, s: &SensorState) -> Self {
        let packed = id.packed();
        let mut slot = Self {
            last_seen_at: NEVER,
            last_ts: NEVER,
            id_lo: packed as u64,
            id_hi: (packed >> 64) as u32,
            prev: NIL,
            next: NIL,
            timeout_s: 0,
            group: NO_GROUP,
            flags: 0,
        };
        slot.set_state(s, false);
        slot
    }

    fn id(&self) -> SensorId {
        SensorId::from_packed(((self.id_hi as u128) << 64) | self.id_lo as u128)
    }

    fn state(&self) -> SensorState {
        let opt = |t: Millis| (t != NEVER).then_some(t);
        SensorState {
            data: match self.flags & 3 {
                1 => Some(false),
                2 => Some(true),
                _ => None,
            },
            changed_at: None,
            last_ts: opt(self.last_ts),
            last_seen_at: opt(self.last_seen_at),
            connection: self.connection(),
            heartbeat_timeout_s: (self.timeout_s != 0).then_some(self.timeout_s),
            last_source: match (self.flags >> 4) & 3 {
                0 => None,
                n => Some(Source::ALL[n as usize - 1]),
            },
            ..SensorState::new(None)
        }
    }

    /// Stores the slot's part of `s`; `extra`: whether [`Extras`] holds the rest.
    fn set_state(&mut self, s: &SensorState, extra: bool) {
        let data = match s.data {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        };
        let conn = match s.connection {
            Connection::Unknown => 0,
            Connection::Online => 1,
            Connection::Lost => 2,
        };
        let source = s.last_source.map_or(0, |x| x.index() as u8 + 1);
        self.flags = data | (conn << 2) | (source << 4) | if extra { EXTRA } else { 0 };
        self.last_seen_at = s.last_seen_at.unwrap_or(NEVER);
        self.last_ts = s.last_ts.unwrap_or(NEVER);
        self.timeout_s = s.heartbeat_timeout_s.unwrap_or(0);
    }

    fn connection(&self) -> Connection {
        match (self.flags >> 2) & 3 {
            1 => Connection::Online,
            2 => Connection::Lost,
            _ => Connection::Unknown,
        }
    }

    /// The link whose outage holds this sensor's deadline: its last reading's source
    /// (HTTP's, never down, for one heard over HTTP or never).
    fn link(&self) -> u8 {
        ((self.flags >> 4) & 3).saturating_sub(1)
    }
}

struct Group {
    timeout_ms: Millis,
    /// The [`Links`] entry of its sensors' source.
    link: u8,
    head: u32,
    tail: u32,
}

/// The sensors of one shard.
pub struct Fleet {
    index: HashTable<u32>,
    hasher: RandomState,
    slots: Vec<Slot>,
    free: Vec<u32>,
    groups: Vec<Group>,
    /// The group of each timeout and link that has listed sensors.
    group_of: HashMap<(Millis, u8), u32>,
    /// Groups emptied, to be reused for the next new timeout.
    free_groups: Vec<u32>,
    policy: Policy,
    resumed_at: Millis,
    links: Links,
    extras: Extras,
}

impl Fleet {
    pub fn new(policy: Policy, resumed_at: Millis) -> Self {
        Self {
            index: HashTable::new(),
            hasher: RandomState::new(),
            slots: Vec::new(),
            free: Vec::new(),
            groups: Vec::new(),
            group_of: HashMap::default(),
            free_groups: Vec::new(),
            policy,
            resumed_at,
            links: Links::default(),
            extras: Extras::default(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A broker link went down or came back (`up`) at `at`: see the module doc.
    pub fn set_link(&mut self, source: Source, up: bool, at: Millis) {
        change_link(&mut self.links, source, up, at);
    }

    /// Every link at once (a partition taken over starts with the shard's).
    pub fn set_links(&mut self, links: Links) {
        self.links = links;
    }

    /// Makes room for `n` more sensors at once, so a load does not leave the slab and table
    /// with doubling slack.
    pub fn reserve(&mut self, n: usize) {
        self.slots.reserve_exact(n);
        let hasher = &self.hasher;
        let slots = &self.slots;
        self.index
            .reserve(n, |&i| hasher.hash_one(slots[i as usize].id().packed()));
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    fn find(&self, id: SensorId) -> Option<u32> {
        let h = self.hasher.hash_one(id.packed());
        let (lo, hi) = (id.packed() as u64, (id.packed() >> 64) as u32);
        self.index
            .find(h, |&i| {
                let s = &self.slots[i as usize];
                s.id_lo == lo && s.id_hi == hi
            })
            .copied()
    }

    /// A sensor's state (`changed_at` is not kept here: always `None`).
    pub fn get(&self, id: SensorId) -> Option<SensorState> {
        self.find(id).map(|i| self.state_at(i))
    }

    fn state_at(&self, i: u32) -> SensorState {
        let slot = &self.slots[i as usize];
        let mut s = slot.state();
        if slot.flags & EXTRA != 0 {
            self.extras.read(slot.id().packed(), &mut s);
        }
        s
    }

    /// Stores `new` for slot `i` (`old`: its state before, `None` for a new slot).
    fn store(&mut self, i: u32, old: Option<&SensorState>, new: &SensorState) {
        let slot = &self.slots[i as usize];
        // Most sensors never had and do not get anything beyond the slot: no look-ups.
        let extra = if slot.flags & EXTRA == 0 && !Extras::wanted(new, &self.policy) {
            false
        } else {
            let key = slot.id().packed();
            self.extras.write(key, old, new, &self.policy)
        };
        self.slots[i as usize].set_state(new, extra);
    }

    /// Adds a sensor (or replaces its state), listing it when online.
    pub fn insert(&mut self, id: SensorId, state: SensorState) {
        if self.find(id).is_some() {
            self.update(id, state);
            return;
        }
        if state.connection == Connection::Lost {
            lost_gauge(1.0);
        }
        let slot = Slot::new(id, &SensorState::new(None));
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        let h = self.hasher.hash_one(id.packed());
        let (hasher, slots) = (&self.hasher, &self.slots);
        self.index
            .insert_unique(h, i, |&j| hasher.hash_one(slots[j as usize].id().packed()));
        self.store(i, None, &state);
        if state.connection == Connection::Online {
            self.link_ordered(i);
        }
    }

    /// How many of its sensors are lost (for the gauge when a partition leaves a node).
    pub fn count_lost(&self) -> usize {
        let slots = &self.slots;
        self.index
            .iter()
            .filter(|&&i| slots[i as usize].connection() == Connection::Lost)
            .count()
    }

    /// Forgets a sensor; returns its last state.
    pub fn remove(&mut self, id: SensorId) -> Option<SensorState> {
        let h = self.hasher.hash_one(id.packed());
        let (lo, hi) = (id.packed() as u64, (id.packed() >> 64) as u32);
        let slots = &self.slots;
        let entry = self
            .index
            .find_entry(h, |&i| {
                let s = &slots[i as usize];
                s.id_lo == lo && s.id_hi == hi
            })
            .ok()?;
        let (i, _) = entry.remove();
        self.unlink(i);
        self.free.push(i);
        let state = self.state_at(i);
        self.extras.remove(id.packed(), &state, &self.policy);
        self.slots[i as usize].flags = 0;
        Some(state)
    }

    /// Takes a committed new state: a sensor seen again moves to the back of its list; one
    /// that is no longer online leaves it.
    /// Returns the state it replaced (`None` for an unknown sensor).
    pub fn update(&mut self, id: SensorId, new: SensorState) -> Option<SensorState> {
        let i = self.find(id)?;
        let old = self.state_at(i);
        self.store(i, Some(&old), &new);
        if new.heartbeat_timeout_s != old.heartbeat_timeout_s || new.last_source != old.last_source
        {
            self.unlink(i);
            if new.connection == Connection::Online {
                self.link_ordered(i);
            }
            return Some(old);
        }
        match new.connection {
            Connection::Online
                if old.connection != Connection::Online || new.last_seen_at != old.last_seen_at =>
            {
                // Same timeout, same list: move it to the back without freeing the list
                // when it was alone on it.
                match self.detach(i) {
                    NO_GROUP => self.link_back(i),
                    g => {
                        let tail = self.groups[g as usize].tail;
                        self.link_after(i, g, tail);
                    }
                }
            }
            Connection::Online => {}
            _ => self.unlink(i),
        }
        Some(old)
    }

    /// Changes a sensor's settings (its own timeout and debounce window, `None`: the
    /// service's; its battery threshold; its hold alarms; its flap). Returns its state with
    /// the hold the new alarms make of it ([`hold::configured`], at `now`) and the count
    /// its flap keeps ([`flap::configured`]) when either differs: the caller commits it
    /// like any other change of state, so the store keeps it too.
    pub fn set_settings(
        &mut self,
        id: SensorId,
        settings: super::Settings,
        now: Millis,
    ) -> Option<SensorState> {
        // The connection does not change here, so the lost gauge stays right.
        let s = self.get(id)?;
        let new = SensorState {
            heartbeat_timeout_s: settings.heartbeat_timeout_s,
            debounce_s: settings.debounce_s,
            battery_low_pct: settings.battery_low_pct,
            hold_alarms: settings.hold_alarms,
            flap: settings.flap,
            ..s
        };
        self.update(id, new);
        let mut held = new;
        hold::configured(
            &s.hold_alarms,
            &settings.hold_alarms,
            &mut held.hold,
            held.data,
            now,
        );
        flap::configured(settings.flap, &mut held.flapping);
        (held.hold != new.hold || held.flapping != new.flapping).then_some(held)
    }

    fn timeout_ms(&self, i: u32) -> Millis {
        match self.slots[i as usize].timeout_s {
            0 => self.policy.default_timeout_ms,
            t => t as Millis * 1000,
        }
    }

    /// When a listed sensor goes lost.
    fn deadline(&self, i: u32, g: &Group) -> Millis {
        let floor = self.resumed_at.max(self.links[g.link as usize].up_since);
        self.slots[i as usize].last_seen_at.max(floor) + g.timeout_ms
    }

    /// Whether a group's sensors wait for their broker link to come back.
    fn held(&self, g: &Group) -> bool {
        let link = &self.links[g.link as usize];
        link.down || link.deaf
    }

    /// The earliest deadline of all online sensors not held by a link that is down, or
    /// timer ([`Fleet::each_timer`]).
    pub fn next_deadline(&self) -> Option<Millis> {
        self.groups
            .iter()
            .filter(|g| g.head != NIL && !self.held(g))
            .map(|g| self.deadline(g.head, g))
            .chain(self.extras.next())
            .min()
    }

    /// A listed (online) sensor's deadline now; `None` for one not listed, or held by a
    /// link that is down.
    pub fn deadline_of(&self, id: SensorId) -> Option<Millis> {
        let i = self.find(id)?;
        let g = self.groups.get(self.slots[i as usize].group as usize)?;
        (!self.held(g)).then(|| self.deadline(i, g))
    }

    /// Calls `f` with each sensor whose timer (end of a debounce window, next reminder:
    /// [`Policy::timer`]) is at or before `now`, earliest first, until it returns false.
    pub fn each_timer(&self, now: Millis, mut f: impl FnMut(SensorId) -> bool) {
        self.extras
            .each_due(now, |key| f(SensorId::from_packed(key)));
    }

    /// Up to `limit` sensors whose deadline is at or before `now`, oldest first, with
    /// their deadlines. They stay listed until their lost state is committed. The tests'
    /// view of [`Fleet::each_expired`], which the shards walk.
    #[cfg(test)]
    pub fn expired(&self, now: Millis, limit: usize) -> Vec<(SensorId, Millis)> {
        let mut out = Vec::new();
        if limit == 0 {
            return out;
        }
        self.each_expired(now, |id, deadline| {
            out.push((id, deadline));
            out.len() < limit
        });
        out
    }

    /// Calls `f` with each sensor whose deadline is at or before `now`, and the deadline
    /// (each timeout's in deadline order), until it returns false: a walk that allocates
    /// nothing.
    pub fn each_expired(&self, now: Millis, mut f: impl FnMut(SensorId, Millis) -> bool) {
        for g in self.groups.iter().filter(|g| !self.held(g)) {
            let mut i = g.head;
            while i != NIL {
                let d = self.deadline(i, g);
                if d > now {
                    break;
                }
                if !f(self.slots[i as usize].id(), d) {
                    return;
                }
                i = self.slots[i as usize].next;
            }
        }
    }

    fn group_for(&mut self, timeout_ms: Millis, link: u8) -> u32 {
        if let Some(&g) = self.group_of.get(&(timeout_ms, link)) {
            return g;
        }
        let group = Group {
            timeout_ms,
            link,
            head: NIL,
            tail: NIL,
        };
        let g = match self.free_groups.pop() {
            Some(g) => {
                self.groups[g as usize] = group;
                g
            }
            None => {
                self.groups.push(group);
                (self.groups.len() - 1) as u32
            }
        };
        self.group_of.insert((timeout_ms, link), g);
        g
    }

    fn link_back(&mut self, i: u32) {
        let g = self.group_for(self.timeout_ms(i), self.slots[i as usize].link());
        let tail = self.groups[g as usize].tail;
        self.link_after(i, g, tail);
    }

    /// Links in `last_seen` order, walking from the back: a sensor just seen lands at the
    /// back at once; only a timeout change or a load moves one further in.
    fn link_ordered(&mut self, i: u32) {
        let g = self.group_for(self.timeout_ms(i), self.slots[i as usize].link());
        let seen = self.slots[i as usize].last_seen_at;
        let mut after = self.groups[g as usize].tail;
        while after != NIL && self.slots[after as usize].last_seen_at > seen {
            after = self.slots[after as usize].prev;
        }
        self.link_after(i, g, after);
    }

    /// Links `i` into group `g` after node `after` (`NIL`: at the front).
    fn link_after(&mut self, i: u32, g: u32, after: u32) {
        debug_assert_eq!(self.slots[i as usize].connection(), Connection::Online);
        let next = if after == NIL {
            self.groups[g as usize].head
        } else {
            self.slots[after as usize].next
        };
        {
            let s = &mut self.slots[i as usize];
            s.prev = after;
            s.next = next;
            s.group = g;
        }
        if after == NIL {
            self.groups[g as usize].head = i;
        } else {
            self.slots[after as usize].next = i;
        }
        if next == NIL {
            self.groups[g as usize].tail = i;
        } else {
            self.slots[next as usize].prev = i;
        }
    }

    /// Takes `i` off its list; a list left empty is freed for another timeout.
    fn unlink(&mut self, i: u32) {
        let group = self.detach(i);
        if group != NO_GROUP && self.groups[group as usize].head == NIL {
            let g = &self.groups[group as usize];
            self.group_of.remove(&(g.timeout_ms, g.link));
            self.free_groups.push(group);
        }
    }

    /// Takes `i` off its list, returning the list (`NO_GROUP`: it was on none).
    fn detach(&mut self, i: u32) -> u32 {
        let (prev, next, group) = {
            let s = &mut self.slots[i as usize];
            let r = (s.prev, s.next, std::mem::replace(&mut s.group, NO_GROUP));
            s.prev = NIL;
            s.next = NIL;
            r
        };
        if group == NO_GROUP {
            return NO_GROUP;
        }
        let g = group as usize;
        if prev == NIL {
            self.groups[g].head = next;
        } else {
            self.slots[prev as usize].next = next;
        }
        if next == NIL {
            self.groups[g].tail = prev;
        } else {
            self.slots[next as usize].prev = prev;
        }
        group
    }
}

#[cfg(test)]
mod tests;
