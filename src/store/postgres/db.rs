//! The one place a PostgreSQL connection is taken, and so the one place every call is
//! bounded in time and its failures are classified.
//!
//! A database that stops answering without refusing (a frozen host, a network that drops
//! packets, a proxy that hangs) never enforces its own `statement_timeout`, and TCP may
//! take many minutes to notice. So the caller keeps the clock: [`Db::get`] stamps a
//! deadline on the connection it hands out, and every statement on it (or on a
//! transaction of it) must finish by then. A call that runs out of time fails with a
//! store error, which the API answers with 503 and `/readyz` reports, instead of a request
//! that hangs.
//!
//! Failures say whether the write may have happened: a transaction that failed before its
//! `COMMIT` was sent wrote nothing ([`Error::Backend`]), while a `COMMIT` (or a statement
//! outside a transaction) whose answer never came may have landed
//! ([`Error::Indeterminate`]). A refusal the server sent back (an error with a SQLSTATE)
//! is always determinate.

use std::time::Duration;

use deadpool_postgres::{Pool, Transaction};
use tokio::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Row, Statement, ToStatement};

use super::describe;
use crate::store::{Error, Result};
use crate::telemetry::families;

/// The database's clock in milliseconds: what outbox leases are judged by, as partition
/// leases are, so that nodes whose clocks disagree never hold one attempt at once.
pub(super) const DB_NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// Time a shipment may spend in the history sink on top of the store's own bound: the
/// sink (ClickHouse) has its own timeouts per insert, and a shipment makes a few inserts.
const SINK_ALLOWANCE: Duration = Duration::from_secs(300);

/// How many times the bound the start-time loads may take: they read every sensor or every
/// pending notification at once, which on a large fleet is much more than one request's
/// work.
const BULK_FACTOR: u32 = 12;

/// How long a call may take.
#[derive(Debug, Clone, Copy)]
pub(super) enum Bound {
    /// One request's work.
    Call,
    /// A load of every sensor or every pending notification.
    Bulk,
    /// A history shipment: bulk reads plus the sink's inserts.
    Shipment,
}

/// The pool with its time bound.
#[derive(Clone)]
pub(crate) struct Db {
    pool: Pool,
    limit: Duration,
}

impl Db {
    pub(super) fn new(pool: Pool, limit: Duration) -> Self {
        Self { pool, limit }
    }

    /// How long one call may take (`database_timeout`).
    pub(super) fn limit(&self) -> Duration {
        self.limit
    }

    /// A connection without a deadline, for migrations at start (no caller waits on them;
    /// the pool's own timeouts bound the connecting).
    pub(super) async fn unbounded(&self) -> Result<deadpool_postgres::Object> {
        Ok(self.pool.get().await?)
    }

    /// A connection for the call `what`, which must be done within the store's bound.
    pub(super) async fn get(&self, what: &'static str) -> Result<Conn> {
        self.get_for(what, Bound::Call).await
    }

    /// A connection for the call `what`, bounded as `bound` says.
    pub(super) async fn get_for(&self, what: &'static str, bound: Bound) -> Result<Conn> {
        let limit = match bound {
            Bound::Call => self.limit,
            Bound::Bulk => self.limit * BULK_FACTOR,
            Bound::Shipment => self.limit * BULK_FACTOR + SINK_ALLOWANCE,
        };
        let deadline = Deadline {
            at: Instant::now() + limit,
            limit,
            what,
        };
        let obj = match tokio::time::timeout_at(deadline.at, self.pool.get()).await {
            Ok(got) => got?,
            Err(_) => return Err(deadline.expired(false)),
        };
        Ok(Conn { obj, deadline })
    }
}

/// When a call must be done, and its name for the timeout counter.
#[derive(Debug, Clone, Copy)]
struct Deadline {
    at: Instant,
    limit: Duration,
    what: &'static str,
}

impl Deadline {
    fn expired(&self, maybe_written: bool) -> Error {
        families::STORE_TIMEOUTS
            .counter_with(&[("call", self.what)])
            .increment(1);
        let msg = format!(
            "the database did not answer within {:?} ({})",
            self.limit, self.what
        );
        if maybe_written {
            Error::Indeterminate(msg)
        } else {
            Error::Backend(msg)
        }
    }

    /// Runs one statement by the deadline. `writes`: the statement would take effect by
    /// itself (autocommit, or `COMMIT`), so losing its answer leaves its effect unknown.
    async fn run<T>(
        &self,
        writes: bool,
        call: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T> {
        match tokio::time::timeout_at(self.at, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if writes && e.as_db_error().is_none() => {
                Err(Error::Indeterminate(describe(&e)))
            }
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(self.expired(writes)),
        }
    }
}

/// Statements on a connection or in a transaction, each bounded by the call's deadline.
pub(crate) trait Sql {
    async fn query<T>(&self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>>
    where
        T: ?Sized + ToStatement + Sync;
    async fn query_one<T>(&self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<Row>
    where
        T: ?Sized + ToStatement + Sync;
    async fn query_opt<T>(
        &self,
        statement: &T,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>>
    where
        T: ?Sized + ToStatement + Sync;
    async fn execute<T>(&self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<u64>
    where
        T: ?Sized + ToStatement + Sync;
    async fn batch_execute(&self, sql: &str) -> Result<()>;
}

/// A pooled connection with the deadline of the call that took it. A statement run on it
/// directly commits by itself.
pub(crate) struct Conn {
    obj: deadpool_postgres::Object,
    deadline: Deadline,
}

impl Conn {
    /// Takes the connection out of the pool for good: one whose `COMMIT` answer is still
    /// owed would make the next call on it wait behind that answer.
    pub(super) fn discard(self) {
        drop(deadpool_postgres::Object::take(self.obj));
    }

    /// Begins a transaction under the same deadline.
    pub(super) async fn transaction(&mut self) -> Result<Tx<'_>> {
        let deadline = self.deadline;
        let tx = deadline.run(false, self.obj.transaction()).await?;
        Ok(Tx { tx, deadline })
    }
}

/// A transaction under the deadline of the call that began it. Nothing of it is written
/// before [`Tx::commit`]; dropped without one, it rolls back.
pub(crate) struct Tx<'a> {
    tx: Transaction<'a>,
    deadline: Deadline,
}

impl Tx<'_> {
    /// Commits. A failure whose answer did not come back is [`Error::Indeterminate`].
    pub(super) async fn commit(self) -> Result<()> {
        self.deadline.run(true, self.tx.commit()).await
    }

    pub(super) async fn rollback(self) -> Result<()> {
        self.deadline.run(false, self.tx.rollback()).await
    }

    /// A statement prepared once per connection (deadpool's cache).
    pub(super) async fn prepare_cached(&self, sql: &str) -> Result<Statement> {
        self.deadline.run(false, self.tx.prepare_cached(sql)).await
    }
}

/// [`Sql`] for a type whose field `$inner` runs statements and whose `deadline` bounds
/// them; `$writes`: whether a statement run there takes effect by itself (outside a
/// transaction), so a lost answer leaves it unknown.
macro_rules! bounded_sql {
    ($ty:ty, $inner:ident, $writes:expr) => {
        impl Sql for $ty {
            async fn query<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Vec<Row>>
            where
                T: ?Sized + ToStatement + Sync,
            {
                let call = self.$inner.query(statement, params);
                self.deadline.run($writes, call).await
            }
            async fn query_one<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Row>
            where
                T: ?Sized + ToStatement + Sync,
            {
                let call = self.$inner.query_one(statement, params);
                self.deadline.run($writes, call).await
            }
            async fn query_opt<T>(
                &self,
                statement: &T,
                params: &[&(dyn ToSql + Sync)],
            ) -> Result<Option<Row>>
            where
                T: ?Sized + ToStatement + Sync,
            {
                let call = self.$inner.query_opt(statement, params);
                self.deadline.run($writes, call).await
            }
            async fn execute<T>(&self, statement: &T, params: &[&(dyn ToSql + Sync)]) -> Result<u64>
            where
                T: ?Sized + ToStatement + Sync,
            {
                let call = self.$inner.execute(statement, params);
                self.deadline.run($writes, call).await
            }
            async fn batch_execute(&self, sql: &str) -> Result<()> {
                self.deadline
                    .run($writes, self.$inner.batch_execute(sql))
                    .await
            }
        }
    };
}

bounded_sql!(Conn, obj, true);
bounded_sql!(Tx<'_>, tx, false);

#[cfg(test)]
mod tests {
    use super::*;

    fn deadline() -> Deadline {
        Deadline {
            at: Instant::now() + Duration::from_millis(10),
            limit: Duration::from_millis(10),
            what: "commit",
        }
    }

    /// A statement that never answers: before `COMMIT` nothing was written; a `COMMIT` (or
    /// a statement that commits by itself) may have landed.
    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_is_indeterminate_only_for_what_commits() {
        let never = || std::future::pending::<Result<(), tokio_postgres::Error>>();
        let inside = deadline().run(false, never()).await.unwrap_err();
        assert!(matches!(inside, Error::Backend(_)), "{inside:?}");
        assert!(!inside.maybe_written());
        let commit = deadline().run(true, never()).await.unwrap_err();
        assert!(matches!(commit, Error::Indeterminate(_)), "{commit:?}");
        assert!(commit.maybe_written());
        assert!(commit.to_string().contains("commit"), "{commit}");
    }
}
