//! What left the lanes lately, for the sweeps of a shared store.

use crate::hashing::FastMap as HashMap;
use std::collections::VecDeque;
use std::hash::Hash;

use super::FINISHED_MEMORY_MS;
use crate::domain::Millis;

/// Ids of notifications that left their lane lately, with when. Only a shared store's
/// sweeps need them: a sweep may read a notification as pending just before our result
/// for it is recorded. Forgotten after [`FINISHED_MEMORY_MS`], so this holds half a
/// minute's worth of deliveries, not all of them.
#[derive(Default)]
pub(super) struct RecentlyFinished {
    at: HashMap<String, Millis>,
    /// The same ids in the order they finished (an id finished twice is here twice).
    order: VecDeque<(Millis, String)>,
}

impl RecentlyFinished {
    pub(super) fn insert(&mut self, id: String, now: Millis) {
        self.forget(now);
        self.at.insert(id.clone(), now);
        self.order.push_back((now, id));
    }

    pub(super) fn contains(&self, id: &str) -> bool {
        self.at.contains_key(id)
    }

    pub(super) fn forget(&mut self, now: Millis) {
        while let Some((at, _)) = self.order.front() {
            if now - *at < FINISHED_MEMORY_MS {
                break;
            }
            let Some((at, id)) = self.order.pop_front() else {
                break;
            };
            // Only if it did not finish again since.
            if self.at.get(&id) == Some(&at) {
                self.at.remove(&id);
            }
        }
        shrink(&mut self.at);
        if self.order.capacity() > 64 && self.order.len() < self.order.capacity() / 4 {
            self.order.shrink_to(self.order.len() * 2);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.at.len()
    }
}

/// Gives a map's room back after a burst: a map keeps the capacity of its largest size,
/// and the dispatcher's maps peak with a backlog (a restart with a million pending).
pub(super) fn shrink<K: Eq + Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}
