//! Requests sent with an `Idempotency-Key`, as `POST /v1/readings` takes them
//! ([`latch::ingest::http::submit_idempotent`]), and sent again — through any node, after
//! any fault — as a client whose answer was lost would.

use latch::domain::{Reading, Source};
use latch::ingest::Ingest;
use latch::ingest::http::{Idempotent, submit_idempotent};

use super::Workload;

/// Keyed requests kept for repeats (the latest).
const KEPT: usize = 16;

impl Workload {
    /// Sends `readings` under a new key, kept for a later repeat.
    pub(super) fn send_keyed_new(&mut self, readings: Vec<Reading>) {
        let key = format!("k{}", self.next_key);
        self.next_key += 1;
        self.keyed.push((key.clone(), readings.clone()));
        if self.keyed.len() > KEPT {
            self.keyed.remove(0);
        }
        self.send_keyed(key, readings);
    }

    /// A keyed request sent before, sent again as it was.
    pub(super) fn repeat_keyed(&mut self) -> bool {
        if self.keyed.is_empty() {
            return false;
        }
        let i = self.world.between(0, self.keyed.len() as u64) as usize;
        let (key, readings) = self.keyed[i].clone();
        self.send_keyed(key, readings);
        true
    }

    /// Sends through a running node; what it applies now is logged as acknowledged.
    fn send_keyed(&self, key: String, readings: Vec<Reading>) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, _)) = self.nodes.entry(&node) else {
            return;
        };
        let world = self.world.clone();
        let log = self.log.clone();
        tokio::spawn(async move {
            let items = readings.iter().cloned().map(Ok).collect();
            let ingest = Ingest::new(engine);
            let at = ingest.now();
            log.lock()
                .unwrap()
                .sent
                .extend(readings.iter().map(|r| (r.sensor_id, Source::Http, at)));
            // The key is its own fingerprint: a repeat is always the same request.
            let ran = submit_idempotent(&ingest, &*store, &key, key.clone(), items, at).await;
            let (answer, before) = match ran {
                Ok(Idempotent::Ran { answer, before }) => (answer, before),
                Ok(Idempotent::Answered { .. }) => {
                    world.trace(format!("keyed {key} via {node}: the first answer again"));
                    return;
                }
                Ok(Idempotent::Busy | Idempotent::Mismatch) | Err(_) => return,
            };
            let refused: Vec<usize> = answer.rejected.iter().map(|r| r.index).collect();
            let now = world.now();
            let mut log = log.lock().unwrap();
            for (i, r) in readings.iter().enumerate() {
                if !refused.contains(&i) && before.binary_search(&(i as u32)).is_err() {
                    log.acked.push((r.sensor_id, r.data, now));
                    log.heard.push((r.sensor_id, Source::Http, at));
                }
            }
            world.trace(format!(
                "keyed {key} via {node}: {} accepted ({} before), {} refused",
                answer.accepted,
                before.len(),
                refused.len()
            ));
        });
    }
}
