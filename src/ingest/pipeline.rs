//! The acknowledge-after-durable pipeline both broker sources run: batches go to the engine
//! in arrival order, up to `depth` of them wait for their group commit at once, and each
//! comes back, in the same order, with how much of it from the start is settled. The source
//! acknowledges exactly that prefix; when the batch was not wholly settled it ends the
//! session, so the broker redelivers the rest in its original order.
//!
//! Only a prefix, because acknowledging a later reading of a sensor while an earlier one
//! is still to come would let the earlier one land last.

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;

use super::{Error, Ingest, Report};
use crate::domain::{Reading, Rejection};

/// Batches in the engine, waiting for their commits; `T` is what the source keeps of a
/// batch to acknowledge it (delivery tags, publishes).
pub(crate) struct Pipeline<T> {
    ingest: Ingest,
    source: &'static str,
    depth: usize,
    waiting: FuturesOrdered<BoxFuture<'static, Done<T>>>,
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

    pub(crate) fn new(ingest: Ingest, source: &'static str, depth: usize) -> Self {
        Self {
            ingest,
            source,
            depth,
            waiting: FuturesOrdered::new(),
        }
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
        let durable = self.ingest.enqueue(self.source, items, received_at).await?;
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

    /// The oldest waiting batch, once its commit is done; `None` when none is waiting.
    pub(crate) async fn next(&mut self) -> Option<Done<T>> {
        self.waiting.next().await
    }
}

impl<T> Done<T> {
    /// Whether every item is settled; if not, the session must end so that the broker
    /// redelivers the rest.
    pub(crate) fn all_settled(&self) -> bool {
        self.settled == self.len
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
}
