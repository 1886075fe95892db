//! Lanes that leave this node: a partition moved to another node, and the lanes of its
//! sensors go with it at once (see [`Lanes::leave`]).

use super::{LaneKey, Lanes, shrink};
use crate::domain::{Millis, Outcome, SensorId};

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
    /// withdrawn. A head whose claim failed may be leased to this node all the same (the
    /// claim landed, its answer was lost): that lease is given back (the outcomes
    /// returned), or a lane that comes back here would find its older notification leased
    /// to itself, let a newer one pass it, and send the older one after.
    pub(in crate::delivery) fn leave(
        &mut self,
        moved: impl Fn(SensorId) -> bool,
        now: Millis,
    ) -> (Vec<LaneKey>, Vec<Outcome>) {
        let keys: Vec<LaneKey> = self.lanes.keys().filter(|k| moved(k.1)).cloned().collect();
        let mut out = Vec::new();
        let mut given_back = Vec::new();
        for key in keys {
            let Some(lane) = self.lanes.get_mut(&key) else {
                continue;
            };
            // A head out is claimed again or being sent: what comes of it gives its lease
            // back (withdrawn) or records its attempt.
            let waiting = lane.queue.iter().skip(usize::from(lane.out));
            for e in waiting.filter(|e| e.claim_unsure) {
                given_back.push((key.clone(), e.id.clone(), e.attempts));
            }
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
        // Its lease is on its way back: a sweep does not queue it again before that.
        let given_back = given_back
            .into_iter()
            .map(|(key, id, attempts)| {
                let o = self.given_back(id, &key, attempts, now);
                self.unwritten(&o, &key);
                o
            })
            .collect();
        (out, given_back)
    }
}
