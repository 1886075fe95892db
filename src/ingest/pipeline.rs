//! The acknowledge-after-durable pipeline both broker sources run: batches go to the engine
//! in arrival order, up to `depth` of them wait for their group commit at once, and each
//! comes back, in the same order, with how much of it from the start is settled. The source
//! acknowledges exactly that prefix; when the batch was not wholly settled it ends the
//! session, so the broker redelivers the rest in its original order.
//!
//! Only a prefix, because acknowledging a later reading of a sensor while an earlier one
//! is still to come would let the earlier one land last.
//!
//! What commits behind the first failure is not acknowledged in order but must not be
//! applied again when the broker redelivers it: the batches are one engine [`Sequence`],
//! so nothing of a sensor commits behind a reading of it that did not, and
//! [`Done::committed`] names what did commit past the prefix, for the source to
//! recognise on redelivery (AMQP `message_id`, MQTT packet id) and skip.

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;

use super::{Error, Ingest, Report};
use crate::domain::{Reading, Rejection, Source};
use crate::engine::Sequence;

/// Batches in the engine, waiting for their commits; `T` is what the source keeps of a
/// batch to acknowledge it (delivery tags, publishes).
pub(crate) struct Pipeline<T> {
    ingest: Ingest,
    source: Source,
    depth: usize,
    waiting: FuturesOrdered<BoxFuture<'static, Done<T>>>,
    /// The session's batches: cut at the first that does not wholly commit.
    sequence: Sequence,
}

/// A batch back from its commit.
pub(crate) struct Done<T> {
    /// What the source handed in with the items.
    pub batch: T,
    /// How many items the batch had.
    pub len: usize,
    pub result: Result<Report, Error>,
    /// How many items, from the start, are settled: committed, or rejected for good.
    pub settled: usize,
}

impl<T: Send + 'static> Pipeline<T> {
    /// The time readings arriving now are stamped with.
    pub(crate) fn now(&self) -> crate::domain::Millis {
        self.ingest.now()
    }

    pub(crate) fn new(ingest: Ingest, source: Source, depth: usize) -> Self {
        Self {
            ingest,
            source,
            depth,
            waiting: FuturesOrdered::new(),
            sequence: Sequence::new(),
        }
    }

    /// Batches pushed from now on are a new sequence (a new broker connection, whose
    /// redelivery starts after what the last one settled), not cut by the last one's
    /// failure. Only once none of the old sequence is waiting.
    pub(crate) fn new_sequence(&mut self) {
        debug_assert!(self.waiting.is_empty());
        self.sequence = Sequence::new();
    }

    /// Whether another batch may go in: fewer than `depth` are waiting.
    pub(crate) fn has_room(&self) -> bool {
        self.waiting.len() < self.depth
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Hands a batch's items to the engine, behind the batches already waiting. `Err` only
    /// when the engine is closing; nothing of the batch was applied then.
    pub(crate) async fn push(
        &mut self,
        batch: T,
        items: Vec<Result<Reading, Rejection>>,
        received_at: crate::domain::Millis,
    ) -> Result<(), Error> {
        let len = items.len();
        let durable = self
            .ingest
            .enqueue_in(self.source, items, received_at, &self.sequence)
            .await?;
        self.waiting.push_back(Box::pin(async move {
            let result = durable.await;
            let settled = settled(len, &result);
            Done {
                batch,
                len,
                result,
                settled,
            }
        }));
        Ok(())
    }

    /// The oldest waiting batch, once its commit is done; `None` when none is waiting. A
    /// batch not wholly settled cuts the sequence (the engine has cut it already where its
    /// readings failed; this covers what failed before reaching a shard).
    pub(crate) async fn next(&mut self) -> Option<Done<T>> {
        let done = self.waiting.next().await?;
        if !done.all_settled() {
            self.sequence.cut();
        }
        Some(done)
    }
}

impl<T> Done<T> {
    /// Whether every item is settled; if not, the session must end so that the broker
    /// redelivers the rest.
    pub(crate) fn all_settled(&self) -> bool {
        self.settled == self.len
    }

    /// Items from `from` on that committed. Those past the acknowledged prefix (from
    /// [`Done::settled`], or all of a batch behind one that failed) are delivered again by
    /// the broker and must then be skipped, not applied again.
    pub(crate) fn committed(&self, from: usize) -> Vec<usize> {
        let Ok(report) = &self.result else {
            return Vec::new();
        };
        let mut rejected = report.rejected.iter().map(|(i, _)| *i).peekable();
        (from..self.len)
            .filter(|i| {
                while rejected.next_if(|r| r < i).is_some() {}
                rejected.peek() != Some(i)
            })
            .collect()
    }

    /// The rejections among the settled items: for good, never to be redelivered.
    pub(crate) fn settled_rejections(&self) -> &[(usize, Rejection)] {
        match &self.result {
            Ok(report) => {
                let end = report.rejected.partition_point(|(i, _)| *i < self.settled);
                &report.rejected[..end]
            }
            Err(_) => &[],
        }
    }
}

/// How many of a batch's items, from the start, are settled: committed, or rejected for
/// good. The first transient rejection (or a commit of the whole batch that failed) ends
/// the run.
fn settled(len: usize, result: &Result<Report, Error>) -> usize {
    match result {
        Ok(report) => report
            .rejected
            .iter()
            .filter(|(_, rej)| rej.code.is_transient())
            .map(|(i, _)| *i)
            .min()
            .unwrap_or(len),
        Err(_) => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_transient_rejection_ends_what_is_settled() {
        use crate::domain::RejectCode::*;
        let rej = |c| Rejection::new(c, "x");
        let report = |r: Vec<(usize, Rejection)>| {
            Ok(Report {
                accepted: 0,
                rejected: r,
            })
        };
        assert_eq!(settled(4, &report(vec![])), 4);
        assert_eq!(settled(4, &report(vec![(1, rej(InvalidData))])), 4);
        assert_eq!(
            settled(
                4,
                &report(vec![
                    (0, rej(InvalidData)),
                    (2, rej(StoreUnavailable)),
                    (3, rej(StoreUnavailable))
                ])
            ),
            2
        );
        let failed: Result<Report, Error> = Err(crate::engine::Error::Closed.into());
        assert_eq!(settled(4, &failed), 0);
    }

    #[test]
    fn what_committed_past_the_settled_prefix_is_named() {
        use crate::domain::RejectCode::*;
        let rej = |c| Rejection::new(c, "x");
        let done = |len, rejected: Vec<(usize, Rejection)>| {
            let result = Ok(Report {
                accepted: 0,
                rejected,
            });
            Done {
                batch: (),
                len,
                settled: settled(len, &result),
                result,
            }
        };
        // 0 committed; 1 failed (the prefix ends); 2 committed in another shard; 3 failed;
        // 4 rejected for good; 5 committed.
        let d = done(
            6,
            vec![
                (1, rej(StoreUnavailable)),
                (3, rej(StoreUnavailable)),
                (4, rej(UnknownSensor)),
            ],
        );
        assert_eq!(d.settled, 1);
        assert_eq!(d.committed(d.settled), vec![2, 5]);
        assert_eq!(d.committed(0), vec![0, 2, 5]);
        assert!(done(3, vec![]).committed(3).is_empty());
        let failed: Done<()> = Done {
            batch: (),
            len: 3,
            result: Err(crate::engine::Error::Closed.into()),
            settled: 0,
        };
        assert!(failed.committed(0).is_empty());
    }
}
