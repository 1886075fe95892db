//! The harness shared by the integration tests (`tests/it`) and `latch bench`: the real
//! service on a port-0 listener in this process, a local webhook receiver, a fresh
//! PostgreSQL schema. One kit, so a bench measures exactly what the tests check.
//!
//! Not part of the service: nothing under `run` uses it.

mod bodies;
mod postgres;
mod receiver;
mod server;

pub use bodies::{Violations, Watch, assert_body, check_body};
pub use postgres::{PgSchema, schema_url};
pub use receiver::{Answer, Keep, Received, Receiver, token_endpoint};
pub use server::Server;

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `f` until it returns `Some`, or panics after `secs` naming `what` (tests only).
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
