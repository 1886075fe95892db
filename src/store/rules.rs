//! The store's rules written once: each transaction's sequence of reads, decisions and
//! writes, over small traits of typed table operations that every backend implements —
//! SQLite, PostgreSQL and the simulation's in-memory model — so the simulation runs the
//! sequence latch runs. The decisions themselves are `domain::policy`'s. A table operation
//! says what it does; the statements behind it (PostgreSQL's `UNNEST`, an atomic increment)
//! are its backend's.
//!
//! The operations are `async`: PostgreSQL's await the server. SQLite's and the model's
//! never wait, so those backends run a sequence to its end in one poll on their own thread
//! ([`now_or_never`]), inside the transaction they hold.

pub mod alarms;
pub mod armed;
pub mod claim;
pub mod commit;
pub mod escalations;
pub mod record;
pub mod silences;
pub mod site_moves;
pub mod sites;

/// Runs a sequence over tables whose operations never wait (SQLite's, the model's) to its
/// end: one poll.
pub fn now_or_never<F: std::future::Future>(f: F) -> F::Output {
    futures::FutureExt::now_or_never(f)
        .expect("a sequence over tables that never wait finishes in one poll")
}
