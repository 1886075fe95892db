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
//! two links, the timeout, the list and a packed byte of data and connection) and the table
//! 4 bytes a slot plus control bytes. `changed_at` is not kept: the store has it, and a
//! commit only writes it when the state changed.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use hashbrown::HashTable;

use crate::domain::sensor::SensorState;
use crate::domain::{Connection, Millis, SensorId};
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
    /// Bits 0–1: data (0 none, 1 false, 2 true); bits 2–3: connection.
    flags: u8,
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
        slot.set_state(s);
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
        }
    }

    fn set_state(&mut self, s: &SensorState) {
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
        self.flags = data | (conn << 2);
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
}

struct Group {
    timeout_ms: Millis,
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
    /// The group of each timeout that has listed sensors.
    group_of: HashMap<Millis, u32>,
    /// Groups emptied, to be reused for the next new timeout.
    free_groups: Vec<u32>,
    default_timeout_ms: Millis,
    resumed_at: Millis,
}

impl Fleet {
    pub fn new(default_timeout_ms: Millis, resumed_at: Millis) -> Self {
        Self {
            index: HashTable::new(),
            hasher: RandomState::new(),
            slots: Vec::new(),
            free: Vec::new(),
            groups: Vec::new(),
            group_of: HashMap::new(),
            free_groups: Vec::new(),
            default_timeout_ms,
            resumed_at,
        }
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
        self.find(id).map(|i| self.slots[i as usize].state())
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
        let slot = Slot::new(id, &state);
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
        Some(self.slots[i as usize].state())
    }

    /// Takes a committed new state: a sensor seen again moves to the back of its list; one
    /// that is no longer online leaves it.
    /// Returns the state it replaced (`None` for an unknown sensor).
    pub fn update(&mut self, id: SensorId, new: SensorState) -> Option<SensorState> {
        let i = self.find(id)?;
        let old = self.slots[i as usize].state();
        self.slots[i as usize].set_state(&new);
        if new.heartbeat_timeout_s != old.heartbeat_timeout_s {
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

    /// Changes a sensor's own timeout (`None`: the service default).
    pub fn set_timeout(&mut self, id: SensorId, timeout_s: Option<u32>) {
        // The connection does not change here, so the lost gauge stays right.
        if let Some(s) = self.get(id) {
            let new = SensorState {
                heartbeat_timeout_s: timeout_s,
                ..s
            };
            self.update(id, new);
        }
    }

    fn timeout_ms(&self, i: u32) -> Millis {
        match self.slots[i as usize].timeout_s {
            0 => self.default_timeout_ms,
            t => t as Millis * 1000,
        }
    }

    /// When a listed sensor goes lost.
    fn deadline(&self, i: u32, g: &Group) -> Millis {
        self.slots[i as usize].last_seen_at.max(self.resumed_at) + g.timeout_ms
    }

    /// The earliest deadline of all online sensors.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.groups
            .iter()
            .filter(|g| g.head != NIL)
            .map(|g| self.deadline(g.head, g))
            .min()
    }

    /// A listed (online) sensor's deadline now; `None` for one not listed.
    pub fn deadline_of(&self, id: SensorId) -> Option<Millis> {
        let i = self.find(id)?;
        let g = self.groups.get(self.slots[i as usize].group as usize)?;
        Some(self.deadline(i, g))
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
        for g in &self.groups {
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

    fn group_for(&mut self, timeout_ms: Millis) -> u32 {
        if let Some(&g) = self.group_of.get(&timeout_ms) {
            return g;
        }
        let group = Group {
            timeout_ms,
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
        self.group_of.insert(timeout_ms, g);
        g
    }

    fn link_back(&mut self, i: u32) {
        let g = self.group_for(self.timeout_ms(i));
        let tail = self.groups[g as usize].tail;
        self.link_after(i, g, tail);
    }

    /// Links in `last_seen` order, walking from the back: a sensor just seen lands at the
    /// back at once; only a timeout change or a load moves one further in.
    fn link_ordered(&mut self, i: u32) {
        let g = self.group_for(self.timeout_ms(i));
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
            self.group_of
                .remove(&self.groups[group as usize].timeout_ms);
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
mod tests {
    use super::*;

    const MIN: Millis = 60_000;

    fn id(s: &str) -> SensorId {
        SensorId::parse(s).unwrap()
    }

    fn online(seen: Millis, timeout_s: Option<u32>) -> SensorState {
        SensorState {
            data: Some(true),
            changed_at: Some(seen),
            last_ts: Some(seen),
            last_seen_at: Some(seen),
            connection: Connection::Online,
            heartbeat_timeout_s: timeout_s,
        }
    }

    fn names(v: Vec<(SensorId, Millis)>) -> Vec<String> {
        v.into_iter().map(|(i, _)| i.to_string()).collect()
    }

    #[test]
    fn expires_in_last_seen_order_at_the_exact_deadline() {
        let mut f = Fleet::new(10 * MIN, 0);
        f.insert(id("b"), online(2 * MIN, None));
        f.insert(id("a"), online(MIN, None));
        f.insert(id("c"), online(3 * MIN, None));
        assert_eq!(f.next_deadline(), Some(11 * MIN));
        assert!(f.expired(11 * MIN - 1, 10).is_empty());
        assert_eq!(names(f.expired(12 * MIN, 10)), ["a", "b"]);
        assert_eq!(f.expired(12 * MIN, 1).len(), 1, "bounded batches");
    }

    #[test]
    fn a_reading_moves_a_sensor_to_the_back() {
        let mut f = Fleet::new(10 * MIN, 0);
        f.insert(id("a"), online(MIN, None));
        f.insert(id("b"), online(2 * MIN, None));
        f.update(id("a"), online(5 * MIN, None));
        assert_eq!(f.next_deadline(), Some(12 * MIN));
        assert_eq!(names(f.expired(16 * MIN, 10)), ["b", "a"]);
    }

    #[test]
    fn lost_and_unknown_sensors_have_no_deadline() {
        let mut f = Fleet::new(10 * MIN, 0);
        f.insert(id("u"), SensorState::new(None));
        f.insert(id("a"), online(MIN, None));
        let lost = SensorState {
            connection: Connection::Lost,
            ..online(MIN, None)
        };
        f.update(id("a"), lost);
        assert_eq!(f.next_deadline(), None);
        assert!(f.expired(Millis::MAX / 2, 10).is_empty());
        // The next reading brings it back on the list.
        f.update(id("a"), online(30 * MIN, None));
        assert_eq!(f.next_deadline(), Some(40 * MIN));
    }

    #[test]
    fn own_timeouts_win_and_changing_one_keeps_order() {
        let mut f = Fleet::new(10 * MIN, 0);
        f.insert(id("def"), online(MIN, None));
        f.insert(id("fast"), online(MIN + 1000, Some(60)));
        assert_eq!(f.next_deadline(), Some(2 * MIN + 1000));
        assert_eq!(names(f.expired(3 * MIN, 10)), ["fast"]);
        f.insert(id("x"), online(5 * MIN, Some(60)));
        f.set_timeout(id("def"), Some(60));
        // "def" was seen before "x": it lands in front of it in the 60 s list.
        assert_eq!(names(f.expired(7 * MIN, 10)), ["def", "fast", "x"]);
        f.set_timeout(id("fast"), None);
        assert_eq!(names(f.expired(7 * MIN, 10)), ["def", "x"]);
    }

    #[test]
    fn our_downtime_is_not_the_sensors_silence() {
        // Seen at minute 1, latch restarted at minute 50 with a 10 minute timeout.
        let mut f = Fleet::new(10 * MIN, 50 * MIN);
        f.insert(id("a"), online(MIN, None));
        assert_eq!(f.next_deadline(), Some(60 * MIN));
        assert!(f.expired(59 * MIN, 10).is_empty());
    }

    #[test]
    fn a_slot_is_48_bytes_and_round_trips_the_state() {
        assert_eq!(std::mem::size_of::<Slot>(), 48);
        let mut f = Fleet::new(10 * MIN, 0);
        let long = id("Zz09abcdefghijkl");
        let s = SensorState {
            data: Some(false),
            changed_at: None,
            last_ts: Some(-5),
            last_seen_at: Some(7 * MIN),
            connection: Connection::Lost,
            heartbeat_timeout_s: Some(90),
        };
        f.insert(long, s);
        assert_eq!(f.get(long), Some(s));
        assert_eq!(f.get(id("Zz09abcdefghijk")), None, "a prefix is another id");
        f.insert(id("n"), SensorState::new(None));
        assert_eq!(f.get(id("n")), Some(SensorState::new(None)));
    }

    #[test]
    fn any_number_of_distinct_timeouts_expire_each_at_its_own_deadline() {
        // More distinct timeouts than a u16 can number.
        const N: u32 = 70_000;
        let mut f = Fleet::new(10 * MIN, 0);
        for t in 1..=N {
            f.insert(id(&format!("s{t}")), online(0, Some(t)));
        }
        assert_eq!(f.next_deadline(), Some(1000));
        let due = f.expired(Millis::from(N) * 1000, usize::MAX);
        assert_eq!(due.len(), N as usize);
        for (sensor, deadline) in &due {
            let t: Millis = sensor.to_string()[1..].parse().unwrap();
            assert_eq!(*deadline, t * 1000, "{sensor}");
        }
        let half = f.expired(Millis::from(N / 2) * 1000, usize::MAX);
        assert_eq!(half.len(), (N / 2) as usize);

        // Lists that empty are reused: memory follows the live distinct timeouts.
        for t in 1..=N {
            f.remove(id(&format!("s{t}")));
        }
        assert!(f.group_of.is_empty());
        f.insert(id("late"), online(0, Some(N + 1)));
        assert_eq!(f.groups.len(), N as usize, "an emptied list was reused");
        assert_eq!(f.next_deadline(), Some(Millis::from(N + 1) * 1000));
        // Seen again, alone on its list: it stays listed with its new deadline.
        f.update(id("late"), online(5_000, Some(N + 1)));
        assert_eq!(f.next_deadline(), Some(5_000 + Millis::from(N + 1) * 1000));
        assert_eq!((f.group_of.len(), f.groups.len()), (1, N as usize));
    }

    #[test]
    fn removed_slots_are_reused_and_unlisted() {
        let mut f = Fleet::new(10 * MIN, 0);
        f.insert(id("a"), online(MIN, None));
        f.insert(id("b"), online(2 * MIN, None));
        f.remove(id("a"));
        assert_eq!(f.len(), 1);
        assert_eq!(names(f.expired(20 * MIN, 10)), ["b"]);
        f.insert(id("c"), online(3 * MIN, None));
        assert_eq!(f.slots.len(), 2, "the freed slot was reused");
        assert_eq!(names(f.expired(20 * MIN, 10)), ["b", "c"]);
    }
}
