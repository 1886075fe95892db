//! The sweeper: on a store shared with other nodes, finds pending notifications this node
//! was not told about (written by another node, or left by one that died).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Cmd, Serves};
use crate::clock::Clock;
use crate::domain::Millis;
use crate::store::{Outbox, Registry};

/// How often a node sharing its store with others looks for pending notifications it was
/// not told about: written by another node, or left by one that died. What a site round
/// or a silence's end on another node makes for the sensors this node serves waits for
/// it: at 2 s, with a batched client's waits, a healthy client's notification took 3 s
/// (simulation seed 1401125). A sweep past the marks is one indexed read.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How many sweeps back the watermark of a sweep lies: a notification committed by a
/// transaction that began before that sweep may carry a lower seq than the newest one seen.
/// Six seconds of them, longer than a transaction may take (`database_timeout`, 5 s).
const SWEEP_LOOKBACK: usize = 6;
/// How often a sweep reads every pending notification, for transactions slower than the
/// lookback.
const FULL_SWEEP_EVERY: Duration = Duration::from_secs(60);
/// The least time between sweeps a claim asked for, so that many lanes waiting on
/// unswept notifications at once cost a few reads a second, not one each.
const SOON_GAP: Duration = Duration::from_millis(200);

/// On a shared store, feeds pending notifications to the dispatcher now and then; the
/// dispatcher skips the ones it knows, and claims (with leases) settle who sends what. Most
/// sweeps read only what came after the newest seq seen a few sweeps ago, so a large
/// outbox is not read in full every second; and of that, only the notifications no sweep
/// since that mark brought (the seqs are read first), so a backlog of the last seconds is
/// not read every second either. A full sweep, and one a claim asked for, bring everything
/// they find.
/// In cluster mode only the notifications of sensors this node serves are kept; `now`
/// asks for a full sweep at once (partitions were taken over), `soon` for one past the
/// marks (a claim found a lane waiting on a notification not swept yet), which leaves the
/// marks as they were: the lookback stays a few regular sweeps long.
#[allow(clippy::too_many_arguments)]
pub(super) async fn sweeper(
    store: Arc<dyn Outbox>,
    registry: Arc<dyn Registry>,
    tx: mpsc::UnboundedSender<Cmd>,
    serves: Option<Serves>,
    now: Arc<tokio::sync::Notify>,
    soon: Arc<tokio::sync::Notify>,
    clock: Clock,
    stop: CancellationToken,
) {
    let mut marks: VecDeque<i64> = VecDeque::new();
    // The seqs past the oldest mark that a sweep read, sent on or not served here (a
    // partition taken over asks for a full sweep, which sends them).
    let mut known: Arc<BTreeSet<i64>> = Arc::default();
    let mut last_full = clock.now();
    // A full sweep asked for (partitions taken over) whose read failed: the next sweep
    // is that full one, not one past the marks, which would miss the older backlog of
    // those partitions for a minute.
    let mut owed = false;
    let full_every = FULL_SWEEP_EVERY.as_millis() as Millis;
    loop {
        let (asked, early) = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SWEEP_EVERY) => (false, false),
            _ = now.notified() => (true, false),
            _ = soon.notified() => (false, true),
        };
        if early {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SOON_GAP) => {}
            }
        }
        let full = asked || owed || clock.now() - last_full >= full_every;
        let after = match marks.front() {
            Some(&mark) if !full => mark,
            _ => i64::MIN,
        };
        // A claim asks when a lane waits on a notification this node lacks: whether a
        // sweep brought it before or not, it is looked for again. (A notification swept
        // in the last seconds, failed and replayed through a node that stopped before
        // sending it keeps its seq: a lane with nothing newer finds it at the full sweep.)
        let skip = if full || early {
            Arc::default()
        } else {
            known.clone()
        };
        match store.load_pending_unknown(after, skip).await {
            Ok(mut refs) => {
                let read: Vec<i64> = refs.iter().map(|r| r.seq).collect();
                if let Some(Serves(serves)) = &serves {
                    refs.retain(|r| serves(r.sensor_id));
                }
                if full {
                    last_full = clock.now();
                    owed = false;
                }
                if !early || full {
                    // Whoever serves them: a node whose own sensors are quiet still
                    // moves its marks, and what it remembers stays a few seconds' worth.
                    let newest = read.iter().copied().max();
                    let mark = newest.max(marks.back().copied()).unwrap_or(i64::MIN);
                    marks.push_back(mark);
                    if marks.len() > SWEEP_LOOKBACK {
                        marks.pop_front();
                    }
                }
                remember(&mut known, read, full, marks.front().copied());
                if tx.send(Cmd::Sweep(refs)).is_err() {
                    return;
                }
                // A client enabled through another node: its lanes parked here resume.
                if let Ok(disabled) = disabled_clients(registry.as_ref()).await
                    && tx.send(Cmd::StillDisabled(disabled)).is_err()
                {
                    return;
                }
            }
            Err(e) => {
                owed |= full;
                tracing::warn!(error = %e, "Looking for pending notifications failed.");
            }
        }
    }
}

/// Keeps the seqs a sweep read (after a full one, only those) past the oldest mark: the
/// next sweeps read no lower.
fn remember(known: &mut Arc<BTreeSet<i64>>, read: Vec<i64>, full: bool, oldest: Option<i64>) {
    let known = Arc::make_mut(known);
    if full {
        known.clear();
    }
    let floor = oldest.unwrap_or(i64::MIN);
    known.extend(read.into_iter().filter(|&s| s > floor));
    *known = known.split_off(&floor.saturating_add(1));
}

/// The ids of the clients disabled now (few: a client is disabled by a `410` or a long
/// failure streak, until enabled).
async fn disabled_clients(store: &dyn Registry) -> crate::store::Result<Vec<Arc<str>>> {
    let mut out = Vec::new();
    let mut page = crate::store::PageRequest {
        limit: 1000,
        after: None,
    };
    loop {
        let p = store.list_clients(page.clone(), Some(true)).await?;
        out.extend(p.items.into_iter().map(|c| Arc::from(c.id.as_str())));
        match p.next {
            Some(next) => page.after = Some(next),
            None => return Ok(out),
        }
    }
}
