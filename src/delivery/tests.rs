//! The dispatcher's core driven by hand: notifications in, attempts answered, time moved
//! by the test. What matters here is what it keeps in memory once the work is done.

use super::*;
use crate::delivery::retry::Kind;

/// How much the core holds, map by map.
#[derive(Debug, Default, PartialEq)]
struct Sizes {
    lanes: usize,
    timers: usize,
    ready: usize,
    client_inflight: usize,
    client_waiting: usize,
    client_sends: usize,
    finished: usize,
    inflight: usize,
    pending: usize,
}

impl Core {
    fn sizes(&self) -> Sizes {
        Sizes {
            lanes: self.lanes.len(),
            timers: self.timers.len(),
            ready: self.ready.len(),
            client_inflight: self.client_inflight.len(),
            client_waiting: self.client_waiting.len(),
            client_sends: self.client_sends.len(),
            finished: self.finished.as_ref().map_or(0, RecentlyFinished::len),
            inflight: self.inflight,
            pending: self.pending,
        }
    }
}

struct Harness {
    core: Core,
    claims: mpsc::UnboundedReceiver<Admitted>,
    _outcomes: mpsc::UnboundedReceiver<Outcome>,
    seq: i64,
    now: Millis,
}

const HOUR: Duration = Duration::from_secs(3600);

impl Harness {
    /// A core on a shared store or not; retries wait `retry` (capped there), up to 100.
    fn new(shared: bool, retry: Duration) -> Self {
        let settings = Settings {
            policy: RetryPolicy {
                kind: Kind::Exponential { base: retry },
                max_delay: retry,
                max_attempts: 100,
            },
            timeout: Duration::from_secs(1),
            concurrency: 8,
            client_concurrency: 2,
            node: "test".into(),
        };
        let (rec_tx, outcomes) = mpsc::unbounded_channel();
        let (claims_tx, claims) = mpsc::unbounded_channel();
        Self {
            core: Core::new(Arc::new(settings), rec_tx, claims_tx, shared),
            claims,
            _outcomes: outcomes,
            seq: 0,
            now: 1_800_000_000_000,
        }
    }

    /// One state change of `sensor` for `client`, due now.
    fn change(&mut self, client: usize, sensor: usize) {
        self.seq += 1;
        let r = NotificationRef {
            id: ulid::Ulid::new().to_string(),
            seq: self.seq,
            client_id: format!("client{client}"),
            sensor_id: SensorId::parse(&format!("s{sensor:07}")).unwrap(),
            kind: EventKind::StateChanged,
            due_at: self.now,
            attempts: 0,
        };
        self.core.enqueue(vec![r], self.now);
    }

    /// Sends what the limits admit and answers every attempt with `status`, until nothing
    /// more is ready now. Returns the attempts made.
    fn answer_all(&mut self, status: u16) -> usize {
        let mut attempts = 0;
        for _ in 0..1_000_000 {
            self.core.fire_timers(self.now);
            self.core.pump();
            let mut any = false;
            while let Ok(a) = self.claims.try_recv() {
                any = true;
                attempts += 1;
                let result = Finished::Attempted(AttemptResult {
                    at: self.now,
                    status_code: Some(status),
                    error: None,
                    duration: Duration::ZERO,
                    retry_after: None,
                });
                let done = Done {
                    lane: a.lane,
                    id: a.id,
                    result,
                };
                self.core.finish(done, self.now);
            }
            if !any {
                return attempts;
            }
        }
        panic!("the core never ran out of ready heads");
    }
}

#[test]
fn delivered_notifications_leave_nothing_behind_on_an_embedded_store() {
    let mut h = Harness::new(false, Duration::from_secs(1));
    let mut delivered = 0;
    for _ in 0..50 {
        for client in 0..4 {
            for sensor in 0..50 {
                h.change(client, sensor);
            }
        }
        delivered += h.answer_all(200);
        h.now += 10;
    }
    assert_eq!(delivered, 10_000);
    // Nothing grows with the work done: all of it is over, so all of it is forgotten.
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn on_a_shared_store_finished_ids_are_forgotten_after_a_while() {
    let mut h = Harness::new(true, Duration::from_secs(1));
    for sensor in 0..100 {
        h.change(0, sensor);
    }
    assert_eq!(h.answer_all(200), 100);
    // Kept, for the sweeps that may still read them as pending.
    assert_eq!(h.core.sizes().finished, 100);
    h.now += FINISHED_MEMORY_MS + 1;
    for sensor in 0..10 {
        h.change(0, sensor);
    }
    assert_eq!(h.answer_all(200), 10);
    assert_eq!(
        h.core.sizes(),
        Sizes {
            finished: 10,
            ..Sizes::default()
        },
        "only the ones of the last {FINISHED_MEMORY_MS} ms are remembered"
    );
}

#[test]
fn superseded_retries_leave_no_pile_of_stale_timers() {
    // A dead client, a flapping sensor: every change fails once, waits an hour for its
    // retry, and the next change supersedes it. Each leaves a timer an hour out.
    let mut h = Harness::new(false, HOUR);
    for _ in 0..5_000 {
        h.change(0, 0);
        assert_eq!(h.answer_all(500), 1);
        h.now += 1;
    }
    let sizes = h.core.sizes();
    assert_eq!((sizes.lanes, sizes.pending), (1, 1));
    assert!(
        sizes.timers <= 2 * sizes.lanes + TIMER_SLACK,
        "stale timers are dropped: {sizes:?}"
    );
    // The last one's retry still comes, and then nothing is left.
    h.now += 2 * HOUR.as_millis() as Millis;
    assert_eq!(h.answer_all(200), 1);
    assert_eq!(h.core.sizes(), Sizes::default());
}

#[test]
fn a_due_head_behind_a_stale_timer_is_still_sent() {
    // The head's retry timer goes stale when a newer state replaces it; the replacement
    // is sent at once and, failing too, gets a timer of its own that does fire.
    let mut h = Harness::new(false, Duration::from_millis(50));
    h.change(0, 0);
    assert_eq!(h.answer_all(500), 1);
    h.change(0, 0);
    assert_eq!(h.answer_all(500), 1);
    h.now += 1_000;
    assert_eq!(h.answer_all(200), 1);
    assert_eq!(h.core.sizes(), Sizes::default());
}
