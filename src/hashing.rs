//! The hash maps latch's hot paths use: foldhash, whose hashing of ids costs a fraction of
//! SipHash's (BENCHMARKS.md, tenth pass), seeded once per process at random — so the
//! order a map iterates in cannot be predicted from outside — or, in a simulation, with a
//! seed it fixes, so the same run iterates in the same order ([`fix_seed`]).

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::OnceLock;

pub type FastMap<K, V> = HashMap<K, V, Seeded>;
pub type FastSet<K> = HashSet<K, Seeded>;

/// The process's hashing seed.
static SEED: OnceLock<u64> = OnceLock::new();

/// Fixes the seed of every [`Seeded`] map made from now on in this process. Only a
/// simulation does this, before latch makes any map; `false` if the seed was already
/// taken (randomly, or fixed to another value).
pub fn fix_seed(seed: u64) -> bool {
    *SEED.get_or_init(|| seed) == seed
}

/// foldhash with the process's seed.
#[derive(Clone, Debug)]
pub struct Seeded(foldhash::fast::FixedState);

impl Default for Seeded {
    fn default() -> Self {
        Self(foldhash::fast::FixedState::with_seed(
            *SEED.get_or_init(rand::random),
        ))
    }
}

impl BuildHasher for Seeded {
    type Hasher = foldhash::fast::FoldHasher<'static>;

    fn build_hasher(&self) -> Self::Hasher {
        self.0.build_hasher()
    }
}
