//! Claiming heads before their attempt: each head's row read with its lease, its lane and
//! the registry now, the policy's step for it (`policy::claim_step`: lease, retell,
//! cancel, supersede, or an answer that writes nothing), and the writes those steps make.

use std::future::Future;

use crate::domain::policy::{ClaimRow, ClaimStep, claim_step};
use crate::domain::{Claim, ClaimBatch, Millis, Status};
use crate::store::Result;

/// What the claim found of an id.
pub enum Found {
    /// The row, its lease and the registry now, on the claiming node's clock.
    Row(Box<ClaimRow>),
    /// Another node is claiming it at this moment (a shared store skips such rows rather
    /// than wait for them).
    Locked,
}

/// A notification leased with a new body ([`ClaimStep::Retell`]).
pub struct Retold<'a> {
    pub seq: i64,
    pub body: Option<&'a str>,
}

/// The tables a claim reads and writes, within one transaction.
pub trait ClaimTables {
    /// Each id's [`Found`] (an id absent: gone), held against other claims for the rest
    /// of the transaction, its times on `now`'s clock (the claiming node's).
    fn rows(
        &mut self,
        ids: &[String],
        node: &str,
        now: Millis,
    ) -> impl Future<Output = Result<std::collections::HashMap<String, Found>>>;
    /// Marks them superseded (the status alone: a lease the row had stays).
    fn supersede(&mut self, ids: &[&str], now: Millis) -> impl Future<Output = Result<()>>;
    /// Leases them (by id and seq, as the rows read them) to `node` until `lease_until`
    /// (on `now`'s clock: a backend that leases by its own clock translates), out of any
    /// batch.
    fn lease(
        &mut self,
        leased: &[(&str, i64)],
        node: &str,
        lease_until: Millis,
    ) -> impl Future<Output = Result<()>>;
    /// Writes a retold body and keeps the notification's named sensors to those it names.
    fn retell(&mut self, retold: &[Retold<'_>]) -> impl Future<Output = Result<()>>;
    /// Takes them out of the batch they were marked for.
    fn unmark(&mut self, ids: &[&str]) -> impl Future<Output = Result<()>>;
    fn cancel(&mut self, ids: &[&str], now: Millis) -> impl Future<Output = Result<()>>;
}

/// Claims `ids` for `node`: what `Outbox::claim` does on every backend. Answers a claim
/// per id, in their order (secrets still sealed).
pub async fn claim<T: ClaimTables>(
    t: &mut T,
    ids: Vec<String>,
    node: &str,
    now: Millis,
    lease_until: Millis,
    batch: Option<ClaimBatch>,
) -> Result<Vec<Claim>> {
    let mut found = t.rows(&ids, node, now).await?;
    let mut out = Vec::with_capacity(ids.len());
    // What each claim decided, by index into `out` (the ids own their strings there).
    let (mut lease, mut supersede, mut cancel) = (Vec::new(), Vec::new(), Vec::new());
    let mut retold = Vec::new();
    for id in ids {
        let row: ClaimRow = match found.remove(&id) {
            Some(Found::Row(row)) => *row,
            Some(Found::Locked) => {
                out.push(Claim::Leased {
                    id,
                    until: now + 1000,
                });
                continue;
            }
            None => {
                out.push(Claim::Done {
                    id,
                    status: Status::Cancelled,
                });
                continue;
            }
        };
        let i = out.len();
        out.push(match claim_step(row, node, now) {
            ClaimStep::Lease(s) => {
                lease.push(i);
                Claim::Send(s)
            }
            ClaimStep::Retell(s) => {
                lease.push(i);
                retold.push(i);
                Claim::Send(s)
            }
            ClaimStep::Cancel => {
                cancel.push(i);
                Claim::Done {
                    id,
                    status: Status::Cancelled,
                }
            }
            ClaimStep::Supersede => {
                supersede.push(i);
                Claim::Done {
                    id,
                    status: Status::Superseded,
                }
            }
            ClaimStep::Answer(c) => c,
        });
    }
    let ids_of = |at: &[usize]| -> Vec<&str> { at.iter().map(|&i| out[i].id()).collect() };
    if !supersede.is_empty() {
        t.supersede(&ids_of(&supersede), now).await?;
    }
    if !lease.is_empty() {
        let leased: Vec<(&str, i64)> = lease
            .iter()
            .filter_map(|&i| match &out[i] {
                Claim::Send(s) => Some((s.notification.id.as_str(), s.notification.seq)),
                _ => None,
            })
            .collect();
        t.lease(&leased, node, lease_until).await?;
        let retold: Vec<Retold<'_>> = retold
            .iter()
            .filter_map(|&i| match &out[i] {
                Claim::Send(s) => Some(Retold {
                    seq: s.notification.seq,
                    body: s.notification.body.as_deref(),
                }),
                _ => None,
            })
            .collect();
        if !retold.is_empty() {
            t.retell(&retold).await?;
        }
    }
    // A batch's heads left pending now are unmarked with those left out (`ClaimBatch`);
    // the leased ones were by their lease.
    if let Some(b) = &batch {
        let unmark: Vec<&str> = out
            .iter()
            .filter_map(Claim::left_pending)
            .chain(b.left_out.iter().map(String::as_str))
            .collect();
        if !unmark.is_empty() {
            t.unmark(&unmark).await?;
        }
    }
    if !cancel.is_empty() {
        t.cancel(&ids_of(&cancel), now).await?;
    }
    Ok(out)
}
