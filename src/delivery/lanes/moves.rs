//! Lanes that leave this node: a partition moved to another node, and the lanes of its
//! sensors go with it at once (see [`Lanes::leave`]).

use super::{LaneKey, Lanes, shrink};
use crate::domain::{Millis, SensorId};

impl Lanes {
    /// Schedules a lane whose head was just answered, or drops it if it left this node.
    pub(super) fn reschedule(&mut self, key: LaneKey, due: Millis, now: Millis) {
        match self.lanes.get(&key) {
            Some(lane) if lane.leaving => {
                self.pending -= lane.queue.len();
                self.lanes.remove(&key);
                shrink(&mut self.lanes);
            }
            Some(_) => self.schedule(key, due, now),
            None => {}
        }
    }

    /// The sensors `moved` says left this node (their partition was handed over, lost, or
    /// given up at a stop): their lanes are dropped at once, with no timer left for them.
    /// A lane whose head is out keeps that head until it is answered, and is dropped then
    /// ([`Lanes::finish`]); those lanes are returned, so their heads not yet sent are
    /// withdrawn.
    pub(in crate::delivery) fn leave(&mut self, moved: impl Fn(SensorId) -> bool) -> Vec<LaneKey> {
        let keys: Vec<LaneKey> = self.lanes.keys().filter(|k| moved(k.1)).cloned().collect();
        let mut out = Vec::new();
        for key in keys {
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            if lane.out {
                self.pending -= lane.queue.len().saturating_sub(1);
                lane.queue.truncate(1);
                lane.leaving = true;
                out.push(key);
            } else {
                self.pending -= lane.queue.len();
                if let Some(b) = lane.queue.front().and_then(|h| h.batch.clone()) {
                    self.batching.leave(&b, &key);
                }
                self.lanes.remove(&key);
            }
        }
        let lanes = &self.lanes;
        self.ready.retain(|k| lanes.contains_key(k));
        self.batching
            .forget_gone(|k| lanes.get(k).is_some_and(|l| l.gathered));
        self.client_waiting.retain(|_, q| {
            q.retain(|k| lanes.contains_key(k));
            !q.is_empty()
        });
        shrink(&mut self.lanes);
        out
    }
}
