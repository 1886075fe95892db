//! What the limits let through: a client's concurrency (one request at a time while its
//! endpoint does not answer), its rate of requests, on one node and leased across a
//! cluster.

use super::*;

#[test]
fn a_client_at_its_limit_waits_and_others_go_ahead() {
    // 2 requests per client, claimed ahead CLAIM_AHEAD times over: that many heads of a
    // client out at most.
    let ahead = 2 * super::CLAIM_AHEAD as usize;
    let mut h = Harness::new(false, Duration::from_secs(1));
    for sensor in 0..ahead + 2 {
        h.change(0, sensor);
    }
    h.change(1, 0);
    let out = h.admit();
    let per_client =
        |out: &[(LaneKey, String)], c: &str| out.iter().filter(|(lane, _)| &*lane.0 == c).count();
    assert_eq!(per_client(&out, "client0"), ahead);
    assert_eq!(per_client(&out, "client1"), 1);
    assert_eq!(h.core.inflight(), ahead + 1);
    assert!(h.core.client_busy("client1"));
    // One of client0's ends: one of its waiting lanes goes.
    let first = out.iter().find(|(lane, _)| &*lane.0 == "client0").cloned();
    h.finish(first.unwrap(), answer(200, h.now));
    assert_eq!(per_client(&h.admit(), "client0"), 1);
}

#[test]
fn a_rate_limited_client_is_sent_evenly_spaced_requests() {
    let mut h = Harness::new(false, HOUR);
    h.core.set_rate(&format!("client{}", 1), Some(4));
    for sensor in 0..3 {
        h.change(1, sensor);
    }
    h.change(2, 9);
    let first = h.admit();
    // One of client 1 (one token) and client 2's, which has no limit.
    assert_eq!(first.len(), 2);
    assert!(h.admit().is_empty(), "no token before 250 ms");
    for head in first {
        h.finish(head, answer(200, h.now));
    }
    let start = h.now;
    let mut sent = Vec::new();
    while sent.len() < 2 {
        h.now += 1;
        for head in h.admit() {
            sent.push(h.now - start);
            h.finish(head, answer(200, h.now));
        }
    }
    assert_eq!(sent, vec![250, 500]);
    h.core.set_rate("client1", None);
    h.change(1, 5);
    h.change(1, 6);
    assert_eq!(h.admit().len(), 2, "no limit once lifted");
}

#[test]
fn a_cluster_wide_rate_sends_only_in_the_slots_leased() {
    let mut h = Harness::new(true, HOUR);
    h.core.share_rates();
    h.core.set_rate("client1", Some(10));
    for sensor in 0..3 {
        h.change(1, sensor);
    }
    assert!(h.admit().is_empty(), "no slot leased yet");
    let wanted = h.core.rates_wanted();
    assert_eq!(wanted.len(), 1, "one lease asked for: {wanted:?}");
    assert_eq!((wanted[0].tokens, wanted[0].interval_us), (1, 100_000));
    assert!(
        h.admit().is_empty() && h.core.rates_wanted().is_empty(),
        "asked once"
    );
    // Another node holds the next 200 ms: this one's slot starts after them.
    let first_us = (h.now + 200) * 1000;
    let lease = Lease {
        first_us,
        db_now_us: h.now * 1000,
        received_us: h.now * 1000,
        tokens: 1,
    };
    h.core.rate_granted("client1", Some(lease));
    assert!(h.admit().is_empty(), "not before its slot");
    h.now += 200;
    let sent = h.admit();
    assert_eq!(sent.len(), 1);
    for head in sent {
        h.finish(head, answer(200, h.now));
    }
    assert!(h.admit().is_empty(), "the lease is used up");
    assert_eq!(h.core.rates_wanted().len(), 1, "the next one asked for");
}

#[test]
fn a_backlog_behind_a_rate_limit_waits_in_one_queue_not_on_a_timer_a_lane() {
    let mut h = Harness::new(false, HOUR);
    h.core.set_rate("client1", Some(4));
    for sensor in 0..1000 {
        h.change(1, sensor);
    }
    let first = h.admit();
    assert_eq!(first.len(), 1, "one token");
    // The 999 others wait in the client's queue with one wake-up for its next slot, not
    // with a timer each that every slot would fire.
    assert_eq!(h.core.sizes().timers, 0);
    assert_eq!(h.core.rate_wakes.len(), 1);
    assert_eq!(h.core.rate_waiting["client1"].len(), 999);
    for head in first {
        h.finish(head, answer(200, h.now));
    }
    let start = h.now;
    let mut sent = Vec::new();
    while sent.len() < 3 {
        h.now += 1;
        for head in h.admit() {
            sent.push(h.now - start);
            h.finish(head, answer(200, h.now));
        }
        assert!(
            h.core.rate_wakes.len() <= 2,
            "stale wake-ups do not pile up"
        );
    }
    assert_eq!(sent, vec![250, 500, 750], "still one request a slot");
    // A newer state of a waiting sensor supersedes the waiting one, as before.
    h.change(1, 999);
    assert_eq!(h.core.pending(), 996);
    // Lifting the limit readies every waiting lane at once, each once.
    h.core.set_rate("client1", None);
    let rest = h.admit();
    assert_eq!(
        rest.len(),
        rest.iter()
            .map(|(k, _)| k.clone())
            .collect::<std::collections::HashSet<_>>()
            .len()
    );
    assert!(h.core.rate_waiting.is_empty());
}

/// An attempt that got no answer: it timed out.
fn timed_out(now: Millis) -> Finished {
    Finished::Attempted(AttemptResult::failed(
        now,
        Failure::Timeout,
        "timed out after 10s".into(),
        Duration::from_secs(10),
    ))
}

#[test]
fn a_client_whose_endpoint_does_not_answer_is_sent_one_request_at_a_time_until_it_does() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    for sensor in 0..40 {
        h.change(0, sensor);
    }
    let ahead = 2 * CLAIM_AHEAD as usize;
    let out = h.admit();
    assert_eq!(out.len(), ahead, "its share of claims ahead");
    for head in out {
        h.finish(head, timed_out(h.now));
    }
    let probe = h.admit();
    assert_eq!(probe.len(), 1, "one at a time once nothing answers");
    assert!(h.admit().is_empty());
    // Another client is not held back by it.
    for sensor in 0..5 {
        h.change(1, sensor);
    }
    assert_eq!(h.admit().len(), 5);
    // An answer, even an error, lifts it: its share goes out again.
    h.finish(probe.into_iter().next().unwrap(), answer(500, h.now));
    assert_eq!(h.admit().len(), ahead);
}

#[test]
fn heads_waiting_for_their_clients_slot_go_once_the_client_has_one_free() {
    // Client 0's endpoint stopped answering: one head at a time, the others wait for its
    // slot. The client then batches: the next head gathers rather than taking the slot,
    // and the ones behind it must not wait for a slot nobody will free.
    let mut h = Harness::new(false, Duration::from_secs(1));
    for sensor in 0..20 {
        h.change(0, sensor);
    }
    let first = h.admit();
    assert_eq!(first.len(), 2 * CLAIM_AHEAD as usize);
    for head in first {
        h.finish(head, timed_out(h.now));
    }
    let probe = h.admit();
    assert_eq!(probe.len(), 1);
    h.core.set_batch(
        "client0",
        Some(crate::domain::client::Batch {
            max_events: 10,
            max_wait_ms: 0,
        }),
    );
    h.finish(probe.into_iter().next().unwrap(), timed_out(h.now));
    h.now += 60_000;
    assert!(h.admit().is_empty(), "batched: nothing goes alone");
    let batches = h.core.admit_batches(h.now);
    let heads: usize = batches.iter().map(|b| b.members.len()).sum();
    assert_eq!(heads, 20, "every head of the client gathered: {batches:?}");
}
