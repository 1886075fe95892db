//! What a caller holds while its readings wait for their group commits, and the one place
//! where the shards' answers are put back together in the caller's order.

use tokio::sync::oneshot;

use super::{Error, Verdicts};
use crate::domain::{Rejection, reading::RejectCode};

/// What became of a batch of items. The engine's shards commit separately, so a batch can
/// come out partly durable: its readings whose shard failed to commit are rejected with
/// `store_unavailable` ([`RejectCode::is_transient`]): valid, not stored, to be sent again.
/// The rest were accepted or rejected for good.
#[derive(Debug, Default)]
pub struct Report {
    /// Readings now durable.
    pub accepted: usize,
    /// Input index and reason of every rejected item, in input order.
    pub rejected: Vec<(usize, Rejection)>,
}

pub type VerdictsRx = oneshot::Receiver<Result<Verdicts, Error>>;

/// Items handed to the engine ([`Engine::enqueue`](super::Engine::enqueue)), not yet known
/// durable; [`Ticket::wait`] resolves once they are.
pub struct Ticket {
    /// Items the caller had already rejected, with their input index.
    pub(super) rejected: Vec<(usize, Rejection)>,
    /// Per shard: input positions of its readings and its verdicts to come.
    pub(super) waits: Vec<(Vec<usize>, VerdictsRx)>,
}

impl Ticket {
    /// Waits for the commits. The readings of a shard whose commit failed are rejected with
    /// `store_unavailable` while the other shards' stand; `Err` only when no shard
    /// committed, so nothing was accepted.
    pub async fn wait(self) -> Result<Report, Error> {
        let mut report = Report {
            accepted: 0,
            rejected: self.rejected,
        };
        let mut failed = None;
        let mut committed = false;
        for (idx, rx) in self.waits {
            match rx.await.unwrap_or(Err(Error::Closed)) {
                Ok(verdicts) => {
                    committed = true;
                    for (i, v) in idx.into_iter().zip(verdicts) {
                        match v {
                            None => report.accepted += 1,
                            Some(rej) => report.rejected.push((i, rej)),
                        }
                    }
                }
                Err(e) => {
                    let code = match e {
                        Error::StorageFull(_) => RejectCode::StorageFull,
                        _ => RejectCode::StoreUnavailable,
                    };
                    let message = match e {
                        Error::Unknown(_) => {
                            format!("maybe stored ({e}); sending it again changes no state twice")
                        }
                        _ => format!("not stored ({e}); send it again"),
                    };
                    let rejection = Rejection::new(code, message);
                    for i in idx {
                        report.rejected.push((i, rejection.clone()));
                    }
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) if !committed => Err(e),
            _ => {
                report.rejected.sort_by_key(|(i, _)| *i);
                Ok(report)
            }
        }
    }
}
