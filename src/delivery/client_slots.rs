//! A client's request slots on this node: up to its share of requests in flight while its
//! endpoint answers, and one at a time once an attempt got no answer, until one is
//! answered again (book, "Clients are isolated").
//!
//! Admission already claims one head at a time for such a client, but heads claimed
//! ahead before the first timeout still wait for the client's slots: without this, two
//! hanging requests timing out together let two more go to an endpoint known not to
//! answer (simulation, seed 15 with the one-at-a-time check), and four of the node's
//! request slots were a dead endpoint's instead of one.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard, Semaphore, SemaphorePermit};

pub(super) struct ClientSlots {
    /// The client's share (`delivery_client_concurrency`).
    share: Semaphore,
    /// Held shared by each request, alone by one that begins while the endpoint does not
    /// answer: that one waits for those out to end, and those after it wait for it.
    alone: RwLock<()>,
    /// The client's last attempt here got no answer (it timed out or could not connect).
    unanswered: AtomicBool,
}

/// A request's slot, held while it is sent.
pub(super) struct ClientSlot<'a> {
    _share: SemaphorePermit<'a>,
    _turn: Turn<'a>,
}

/// Held for the request's time, beside others or alone.
enum Turn<'a> {
    Shared { _guard: RwLockReadGuard<'a, ()> },
    Alone { _guard: RwLockWriteGuard<'a, ()> },
}

impl ClientSlots {
    /// `unanswered`: what the dispatcher knows of the client's last attempt.
    pub(super) fn new(share: usize, unanswered: bool) -> Self {
        Self {
            share: Semaphore::new(share),
            alone: RwLock::new(()),
            unanswered: AtomicBool::new(unanswered),
        }
    }

    /// Waits for a slot: one of the share, and the endpoint to itself if it does not
    /// answer. `None` once the slots are closed.
    pub(super) async fn acquire(&self) -> Option<ClientSlot<'_>> {
        let share = self.share.acquire().await.ok()?;
        let turn = if self.unanswered.load(Ordering::Acquire) {
            Turn::Alone {
                _guard: self.alone.write().await,
            }
        } else {
            Turn::Shared {
                _guard: self.alone.read().await,
            }
        };
        Some(ClientSlot {
            _share: share,
            _turn: turn,
        })
    }

    /// What an attempt's answer says of the endpoint; told before its slot is given back,
    /// so the request waiting for that slot knows it.
    pub(super) fn answered(&self, unanswered: bool) {
        self.unanswered.store(unanswered, Ordering::Release);
    }

    /// Slots of the share free now.
    #[cfg(test)]
    pub(super) fn free(&self) -> usize {
        self.share.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[test]
    fn an_answering_endpoint_gets_its_share_at_once() {
        let slots = ClientSlots::new(2, false);
        let first = slots.acquire().now_or_never().flatten();
        let second = slots.acquire().now_or_never().flatten();
        assert!(first.is_some() && second.is_some());
        assert!(slots.acquire().now_or_never().is_none(), "beyond its share");
    }

    #[test]
    fn once_an_attempt_got_no_answer_the_next_request_waits_for_those_out() {
        let slots = ClientSlots::new(2, false);
        let first = slots.acquire().now_or_never().flatten();
        let second = slots.acquire().now_or_never().flatten();
        // The first times out: its slot is free, but the second is still out.
        slots.answered(true);
        drop(first);
        let mut third = Box::pin(slots.acquire());
        assert!(
            (&mut third).now_or_never().is_none(),
            "not beside one still out"
        );
        drop(second);
        let third = third.now_or_never().flatten().expect("alone now");
        // And nothing goes beside it.
        let mut fourth = Box::pin(slots.acquire());
        assert!((&mut fourth).now_or_never().is_none());
        // It is answered: the endpoint is back, and its share with it once the one that
        // began waiting alone has gone.
        slots.answered(false);
        drop(third);
        drop(fourth.now_or_never().flatten().expect("its turn"));
        let fifth = slots.acquire().now_or_never().flatten();
        let sixth = slots.acquire().now_or_never().flatten();
        assert!(fifth.is_some() && sixth.is_some());
    }

    #[test]
    fn a_client_known_not_to_answer_starts_one_at_a_time() {
        let slots = ClientSlots::new(2, true);
        let first = slots.acquire().now_or_never().flatten();
        assert!(first.is_some());
        assert!(slots.acquire().now_or_never().is_none());
        assert_eq!(
            slots.free(),
            1,
            "the share's other slot is free all the same"
        );
    }
}
