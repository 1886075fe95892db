//! The store faults of a run: for a while, some of the store's calls fail (the database
//! down, the disk full), come back without an answer (a commit in doubt, applied or not),
//! or are slow. Outside such a window every call is applied and answered at once.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use latch::domain::Millis;

use crate::model::{Call, Fault, Faults};
use crate::world::World;

/// What a fault window does to calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// This share of calls is refused (`store_unavailable`).
    Unavailable(f64),
    /// This share of writes finds the disk full.
    Full(f64),
    /// This share of writes is applied (or, half the time, not) and never answered.
    InDoubt(f64),
    /// Every call waits up to this long first.
    Slow(u64),
}

#[derive(Debug, Clone, Copy)]
struct Window {
    kind: Kind,
    until: Millis,
}

/// The harness's fault hooks on the model of the store.
pub struct StoreFaults {
    world: Arc<World>,
    window: Mutex<Option<Window>>,
    /// Every window opened so far: its kind, start and end (cut short by a close).
    past: Mutex<Vec<(Kind, Millis, Millis)>>,
}

impl StoreFaults {
    pub fn new(world: Arc<World>) -> Arc<Self> {
        Arc::new(Self {
            world,
            window: Mutex::new(None),
            past: Mutex::new(Vec::new()),
        })
    }

    /// Faults of `kind` for `ms` from now.
    pub fn open(&self, kind: Kind, ms: u64) {
        let now = self.world.now();
        let until = now + ms as Millis;
        self.world
            .trace(format!("store faults {kind:?} for {ms} ms"));
        *self.window.lock().unwrap() = Some(Window { kind, until });
        let mut past = self.past.lock().unwrap();
        // A window opened over another ends that one.
        if let Some(last) = past.last_mut() {
            last.2 = last.2.min(now);
        }
        past.push((kind, now, until));
    }

    /// No more faults.
    pub fn close(&self) {
        *self.window.lock().unwrap() = None;
        let now = self.world.now();
        if let Some(last) = self.past.lock().unwrap().last_mut() {
            last.2 = last.2.min(now);
        }
    }

    /// Whether faults that `kind` accepts were on at any time in `[from, to]`.
    pub fn were_on(&self, from: Millis, to: Millis, kind: impl Fn(Kind) -> bool) -> bool {
        self.past
            .lock()
            .unwrap()
            .iter()
            .any(|&(k, a, b)| kind(k) && a <= to && from <= b)
    }

    fn now_kind(&self) -> Option<Kind> {
        let now = self.world.now();
        let w = *self.window.lock().unwrap();
        w.filter(|w| w.until > now).map(|w| w.kind)
    }
}

#[async_trait]
impl Faults for StoreFaults {
    async fn before(&self, call: &Call) -> Fault {
        let fault = match self.now_kind() {
            None => Fault::None,
            Some(Kind::Unavailable(p)) if self.world.chance(p) => Fault::Unavailable,
            Some(Kind::Full(p)) if call.writes && self.world.chance(p) => Fault::Full,
            Some(Kind::InDoubt(p)) if call.writes && self.world.chance(p) => Fault::InDoubt {
                applied: self.world.chance(0.5),
            },
            Some(Kind::Slow(ms)) => {
                let wait = self.world.between(0, ms);
                tokio::time::sleep(Duration::from_millis(wait)).await;
                Fault::None
            }
            Some(_) => Fault::None,
        };
        if fault != Fault::None {
            self.world
                .trace(format!("store {} of {}: {fault:?}", call.op, call.node));
        }
        fault
    }
}
