//! The clients' endpoints: each answers as the faults tell it (at once, slowly, never,
//! with 5xx, 429 and `Retry-After`, 410, or by cutting the connection), and every request
//! is checked against the lane promises as it arrives — never two requests of one
//! (client, sensor) at once, never an older state after a newer one, never a notification
//! twice in one request, never a batch's retry with an event its request before did not
//! hold — and against isolation: a healthy client's requests are never late, and an
//! endpoint that did not answer is sent one request at a time.
//!
//! [`SimTransport`] is latch's [`Transport`] for one node: what its dispatcher sends
//! arrives here. A node that is killed has its connections closed (its requests end
//! here) and sends nothing more; a frozen node's requests are answered but it reads the
//! answers only once thawed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use latch::delivery::attempt::{AttemptResult, Failure, payload};
use latch::delivery::retry::RetryPolicy;
use latch::delivery::transport::Transport;
use latch::domain::{EventKind, Millis, Notification, Sendable, SensorId};

use crate::world::{Life, World, alive};

/// How an endpoint answers now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// 2xx within a few milliseconds.
    Fast,
    /// 2xx, after up to twice the delivery timeout.
    Slow,
    /// Accepts the connection and never answers.
    Hang,
    /// Answers this status at once (5xx, 410).
    Status(u16),
    /// 429 with `Retry-After` of this many seconds.
    Throttle(u64),
    /// Cuts the connection mid-request.
    Cut,
}

/// The book's promise for an endpoint that does not answer.
const ONE_AT_A_TIME: &str =
    "a client whose last attempt got no answer is sent one request at a time";

/// One request as an endpoint sees it.
#[derive(Debug)]
struct Request {
    node: String,
    lanes: Vec<(String, SensorId)>,
    begun: Millis,
}

/// What the endpoints have seen.
#[derive(Default)]
struct Seen {
    modes: BTreeMap<String, Mode>,
    /// Clients that stay fast and are never faulted: the isolation check's subjects.
    healthy: BTreeSet<String>,
    /// Requests in flight, by request number.
    inflight: BTreeMap<u64, Request>,
    /// Per lane, the request in flight.
    lane_inflight: BTreeMap<(String, SensorId), u64>,
    /// Per lane and kind class, the newest notification seq answered 2xx.
    delivered_seq: BTreeMap<(String, SensorId, bool), i64>,
    /// Per batch id, the notifications its last request held.
    batches: BTreeMap<String, BTreeSet<String>>,
    /// Notifications answered 2xx: when, and by which node's request.
    answered_ok: BTreeMap<String, (Millis, String)>,
    /// Notifications put back by a manual retry: they may come after newer ones.
    replayed: BTreeSet<String>,
    next: u64,
    /// Per node, clients whose last request from it ended without an answer.
    unanswered: BTreeSet<(String, String)>,
    /// Per notification, how its last request ended without a 2xx: what its next attempt
    /// waits for (book: Retries). Taken out as a request begins, so a request that never
    /// ended here (its node died, a stop cut it off) leaves nothing to judge the next by.
    failed: BTreeMap<String, Unsent>,
    /// When each client was last enabled: its pending notifications go at once then.
    enabled: BTreeMap<String, Millis>,
    /// Each hold notification (issue #72) as it first arrived, by id.
    holds: BTreeMap<String, HoldBody>,
}

/// A `sensor.state_held` or `sensor.state_held_cleared` as an endpoint got it: what its
/// notification said, and the body it came in.
#[derive(Debug, Clone)]
pub struct HoldBody {
    pub client: String,
    pub sensor: SensorId,
    pub kind: EventKind,
    pub data: Option<bool>,
    pub previous: Option<bool>,
    pub occurred_at: Millis,
    /// When the held state began (the notification's `detail.lost_since`).
    pub since: Option<Millis>,
    pub reminder: Option<u32>,
    pub body: serde_json::Value,
}

/// A request of a notification that ended without a 2xx.
#[derive(Debug, Clone, Copy)]
struct Unsent {
    /// When the answer came (or the request timed out or was cut).
    at: Millis,
    /// The attempts the notification had made before that request.
    attempts: u32,
    /// The status answered (`None`: no answer).
    status: Option<u16>,
    /// A 429's `Retry-After`, in seconds.
    retry_after: Option<u64>,
}

/// Says what the store holds of a notification's lease, for the trace.
pub type LeaseOf = Arc<dyn Fn(&str) -> String + Send + Sync>;

/// Judges a notification a request holds against what the store did (its client's
/// deletion): the invariant it breaks and why, if it may not be sent now.
pub type Vet = Arc<dyn Fn(&Notification, Millis) -> Option<(&'static str, String)> + Send + Sync>;

/// Every endpoint of the simulation.
pub struct Receivers {
    world: Arc<World>,
    seen: Mutex<Seen>,
    /// What the store says of a notification (its lease), for the trace of a request.
    pub lease_of: Mutex<Option<LeaseOf>>,
    /// What the store says of whether a notification may be sent now.
    pub vet: Mutex<Option<Vet>>,
    /// The dispatcher's delivery timeout.
    timeout: Duration,
    /// The retry policy the nodes run.
    policy: RetryPolicy,
}

impl Receivers {
    pub fn new(world: Arc<World>, timeout: Duration, policy: RetryPolicy) -> Arc<Self> {
        Arc::new(Self {
            world,
            seen: Mutex::new(Seen::default()),
            lease_of: Mutex::new(None),
            vet: Mutex::new(None),
            timeout,
            policy,
        })
    }

    /// The endpoint of `client` answers as `mode` from now on.
    pub fn set_mode(&self, client: &str, mode: Mode) {
        self.world.trace(format!("endpoint {client} {mode:?}"));
        self.seen
            .lock()
            .unwrap()
            .modes
            .insert(client.to_string(), mode);
    }

    /// `client` is healthy: always fast, watched for isolation.
    pub fn set_healthy(&self, client: &str) {
        let mut seen = self.seen.lock().unwrap();
        seen.healthy.insert(client.to_string());
        seen.modes.insert(client.to_string(), Mode::Fast);
    }

    pub fn is_healthy(&self, client: &str) -> bool {
        self.seen.lock().unwrap().healthy.contains(client)
    }

    /// Every endpoint answers at once again.
    pub fn heal(&self) {
        let mut seen = self.seen.lock().unwrap();
        for m in seen.modes.values_mut() {
            *m = Mode::Fast;
        }
    }

    /// `id` was put back to pending by a manual retry.
    pub fn replayed(&self, id: &str) {
        self.seen.lock().unwrap().replayed.insert(id.to_string());
    }

    /// An operator enabled `client`: its pending notifications may go at once.
    pub fn enabled(&self, client: &str) {
        let now = self.world.now();
        self.seen
            .lock()
            .unwrap()
            .enabled
            .insert(client.to_string(), now);
    }

    /// When and through which node each notification was answered 2xx.
    pub fn answered_ok(&self) -> BTreeMap<String, (Millis, String)> {
        self.seen.lock().unwrap().answered_ok.clone()
    }

    /// Every hold notification the endpoints got, by id (once each, however often sent).
    pub fn hold_bodies(&self) -> BTreeMap<String, HoldBody> {
        self.seen.lock().unwrap().holds.clone()
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> usize {
        self.seen.lock().unwrap().inflight.len()
    }

    /// `node` was killed: its connections close, so its requests end here now.
    pub fn node_died(&self, node: &str) {
        let mut seen = self.seen.lock().unwrap();
        let gone: Vec<u64> = seen
            .inflight
            .iter()
            .filter(|(_, r)| r.node == node)
            .map(|(n, _)| *n)
            .collect();
        for n in gone {
            end(&mut seen, n);
        }
    }

    /// A request arrives: checked against the lane promises, then in flight.
    fn begin(&self, node: &str, sends: &[&Sendable], batch: Option<&str>) -> u64 {
        let now = self.world.now();
        let mut seen = self.seen.lock().unwrap();
        let mut ids = BTreeSet::new();
        let mut lanes = Vec::new();
        let mut problems: Vec<(&'static str, String, Vec<String>)> = Vec::new();
        for s in sends {
            let n = &s.notification;
            let lane = (n.client_id.clone(), n.sensor_id);
            let keys = vec![n.id.clone(), lane_key(&lane)];
            if !ids.insert(n.id.clone()) {
                problems.push((
                    "a request holds a notification once",
                    format!("{} twice in one request from {node}", n.id),
                    keys.clone(),
                ));
            }
            // Per node: each node learns of its own attempts.
            if seen
                .unanswered
                .contains(&(node.to_string(), n.client_id.clone()))
                && let Some((other, _)) = seen.inflight.iter().find(|(_, r)| {
                    r.node == node && r.lanes.first().is_some_and(|l| l.0 == n.client_id)
                })
                && !problems.iter().any(|p| p.0 == ONE_AT_A_TIME)
            {
                problems.push((
                    ONE_AT_A_TIME,
                    format!(
                        "{} from {node} while request #{other} of {} is out, after one went unanswered",
                        n.id, n.client_id
                    ),
                    keys.clone(),
                ));
            }
            if let Some(other) = seen.lane_inflight.get(&lane) {
                problems.push((
                    "one request of a (client, sensor) in flight",
                    format!(
                        "{} from {node} while request #{other} ({}) is in flight",
                        n.id,
                        seen.inflight.get(other).map_or("?", |r| r.node.as_str())
                    ),
                    keys.clone(),
                ));
            }
            // A notification answered 2xx before comes again after a process died before
            // its outcome was written (book: it goes again, same `webhook-id`): a
            // duplicate the receiver drops by that id, not an older state after a newer.
            if !seen.replayed.contains(&n.id)
                && !seen.answered_ok.contains_key(&n.id)
                && let Some(&newest) =
                    seen.delivered_seq
                        .get(&(lane.0.clone(), lane.1, class(n.kind)))
                && n.seq < newest
            {
                problems.push((
                    "never an older state after a newer one",
                    format!(
                        "{} ({} seq {}) from {node} after seq {newest} was delivered",
                        n.id,
                        n.kind.as_str(),
                        n.seq
                    ),
                    keys.clone(),
                ));
            }
            if let Some(problem) = self.retried_early(&mut seen, n, now) {
                problems.push((
                    problem.0,
                    format!("{} from {node}: {}", n.id, problem.1),
                    keys,
                ));
            }
            lanes.push(lane);
        }
        if let Some(b) = batch {
            if let Some(before) = seen.batches.get(b) {
                let extra: Vec<&String> = ids.iter().filter(|i| !before.contains(*i)).collect();
                if !extra.is_empty() {
                    problems.push((
                        "a batch's retry holds only what its request before held",
                        format!("batch {b} again with {extra:?}"),
                        extra
                            .iter()
                            .map(|s| s.to_string())
                            .chain([b.to_string()])
                            .collect(),
                    ));
                }
            }
            seen.batches.insert(b.to_string(), ids.clone());
        }
        seen.next += 1;
        let n = seen.next;
        for lane in &lanes {
            seen.lane_inflight.insert(lane.clone(), n);
        }
        seen.inflight.insert(
            n,
            Request {
                node: node.to_string(),
                lanes,
                begun: now,
            },
        );
        let mode = sends
            .first()
            .and_then(|s| seen.modes.get(&s.notification.client_id).copied())
            .unwrap_or(Mode::Fast);
        drop(seen);
        if let Some(vet) = self.vet.lock().unwrap().clone() {
            for s in sends {
                let n = &s.notification;
                if let Some((inv, why)) = vet(n, now) {
                    let keys = vec![n.id.clone(), lane_key(&(n.client_id.clone(), n.sensor_id))];
                    problems.push((inv, format!("{} from {node}: {why}", n.id), keys));
                }
            }
        }
        let what: Vec<String> = sends
            .iter()
            .map(|s| {
                let n = &s.notification;
                let lease = self
                    .lease_of
                    .lock()
                    .unwrap()
                    .as_ref()
                    .map(|f| f(&n.id))
                    .unwrap_or_default();
                format!(
                    "{}:{}#{}@{}{lease}",
                    lane_key(&(n.client_id.clone(), n.sensor_id)),
                    n.kind.as_str(),
                    n.seq,
                    n.id
                )
            })
            .collect();
        self.world.trace(format!(
            "request #{n} {node} {} {mode:?} [{}]",
            batch.unwrap_or("-"),
            what.join(" ")
        ));
        for (inv, detail, keys) in problems {
            self.world.violate(inv, detail, keys);
        }
        n
    }

    /// Judges an attempt of `n` beginning `now` against how its last request ended
    /// (book: Retries): after a `410 Gone` no attempt follows; after a 429 the next waits
    /// its `Retry-After` (within `retry_max_delay`); after any other failure it waits the
    /// policy's delay for its attempt number, less the 10 % jitter; and no notification is
    /// tried more than `retry_max_attempts` times. A notification replayed starts over; one
    /// of a client enabled since goes at once. Only an outcome latch recorded counts: the
    /// next attempt carries one attempt more than the one that failed.
    fn retried_early(
        &self,
        seen: &mut Seen,
        n: &Notification,
        now: Millis,
    ) -> Option<(&'static str, String)> {
        let last = seen.failed.remove(&n.id);
        if seen.replayed.contains(&n.id) {
            return None;
        }
        if n.attempts >= self.policy.max_attempts {
            return Some((
                "a notification is tried at most retry_max_attempts times",
                format!(
                    "attempt {} of at most {}",
                    n.attempts + 1,
                    self.policy.max_attempts
                ),
            ));
        }
        let last = last.filter(|l| n.attempts == l.attempts + 1)?;
        if last.status == Some(410) {
            return Some((
                "410 Gone fails a notification at once",
                format!("tried again after a 410 {} ms ago", now - last.at),
            ));
        }
        if seen
            .enabled
            .get(&n.client_id)
            .is_some_and(|&at| at >= last.at)
        {
            return None;
        }
        let wait = match (last.status, last.retry_after) {
            (Some(429), Some(secs)) => self.policy.retry_after(Duration::from_secs(secs)),
            // The shortest the jitter makes it.
            _ => self.policy.jittered(n.attempts, 0.0),
        };
        let earliest = last.at + wait.as_millis() as Millis - 1;
        (now < earliest).then(|| {
            (
                "a retry waits its delay",
                format!(
                    "attempt {} {} ms after the last ended ({:?}), {} ms before its delay ran out",
                    n.attempts + 1,
                    now - last.at,
                    last.status,
                    earliest - now
                ),
            )
        })
    }

    /// A request ends with `status` (`None`: no answer).
    fn finish(
        &self,
        n: u64,
        sends: &[&Sendable],
        status: Option<u16>,
        retry_after: Option<u64>,
        node: &str,
    ) {
        let now = self.world.now();
        let mut seen = self.seen.lock().unwrap();
        if !seen.inflight.contains_key(&n) {
            return; // Ended already: its node was killed.
        }
        if let Some(s) = sends.first() {
            let key = (node.to_string(), s.notification.client_id.clone());
            if status.is_none() {
                seen.unanswered.insert(key);
            } else {
                seen.unanswered.remove(&key);
            }
        }
        end(&mut seen, n);
        if !status.is_some_and(|s| (200..300).contains(&s)) {
            for s in sends {
                let nt = &s.notification;
                let unsent = Unsent {
                    at: now,
                    attempts: nt.attempts,
                    status,
                    retry_after,
                };
                seen.failed.insert(nt.id.clone(), unsent);
            }
        } else {
            for s in sends {
                let nt = &s.notification;
                let key = (nt.client_id.clone(), nt.sensor_id, class(nt.kind));
                let newest = seen.delivered_seq.entry(key).or_insert(i64::MIN);
                *newest = (*newest).max(nt.seq);
                seen.answered_ok
                    .entry(nt.id.clone())
                    .or_insert((now, node.to_string()));
            }
        }
        drop(seen);
        self.world.trace(format!("answer #{n} {status:?}"));
    }

    /// When the current request of `client` is answered, and with what: from its mode.
    fn plan(&self, client: &str) -> (Duration, Answer) {
        let mode = self
            .seen
            .lock()
            .unwrap()
            .modes
            .get(client)
            .copied()
            .unwrap_or(Mode::Fast);
        let t = self.timeout.as_millis() as u64;
        let ms = |lo: u64, hi: u64| Duration::from_millis(self.world.between(lo, hi));
        match mode {
            Mode::Fast => (ms(1, 20), Answer::Status(200)),
            Mode::Slow => (ms(t / 2, 2 * t), Answer::Status(200)),
            Mode::Hang => (Duration::MAX, Answer::Status(200)),
            Mode::Status(code) => (ms(1, 50), Answer::Status(code)),
            Mode::Throttle(secs) => (ms(1, 50), Answer::Throttle(secs)),
            Mode::Cut => (ms(1, t), Answer::Cut),
        }
    }

    /// The whole exchange of one request from `node`.
    async fn exchange(
        &self,
        node: &str,
        sends: &[&Sendable],
        batch: Option<&str>,
        timeout: Duration,
        at: Millis,
    ) -> AttemptResult {
        alive(&self.world, node).await;
        // The bodies these would be on the wire, each held to its type's schema in the
        // event catalog, as the integration tests hold every body they receive.
        for s in sends {
            let body = payload(s);
            if let Err(why) = latch_testkit::check_body(&body) {
                let keys = vec![s.notification.id.clone()];
                self.world.violate("body_schema", why, keys);
            }
            let n = &s.notification;
            if n.kind.is_hold() {
                let got = HoldBody {
                    client: n.client_id.clone(),
                    sensor: n.sensor_id,
                    kind: n.kind,
                    data: n.data,
                    previous: n.previous,
                    occurred_at: n.occurred_at,
                    since: n.detail.lost_since,
                    reminder: n.detail.reminder,
                    body: serde_json::from_slice(&body).unwrap_or_default(),
                };
                let mut seen = self.seen.lock().unwrap();
                seen.holds.entry(n.id.clone()).or_insert(got);
            }
        }
        let client = sends
            .first()
            .map(|s| s.notification.client_id.clone())
            .unwrap_or_default();
        let n = self.begin(node, sends, batch);
        // A request the dispatcher drops (a stop cut it off) ends here as it is dropped.
        let mut guard = EndOnDrop {
            receivers: self,
            n,
            node,
            armed: true,
        };
        let (latency, answer) = self.plan(&client);
        let waited = latency.min(timeout);
        let killed = self.world.wait_life(node, |l| l == Life::Dead);
        tokio::select! {
            biased;
            _ = killed => {
                guard.armed = false;
                self.node_died(node);
                std::future::pending::<()>().await;
            }
            _ = tokio::time::sleep(waited) => {}
        }
        guard.armed = false;
        let elapsed = Duration::from_millis((self.world.now() - at).max(0) as u64);
        let out = if latency >= timeout {
            self.finish(n, sends, None, None, node);
            let why = format!("timed out after {timeout:?}");
            AttemptResult::failed(at, Failure::Timeout, why, elapsed)
        } else {
            match answer {
                Answer::Status(code) => {
                    self.finish(n, sends, Some(code), None, node);
                    AttemptResult::answered(at, code, elapsed, None)
                }
                Answer::Throttle(secs) => {
                    self.finish(n, sends, Some(429), Some(secs), node);
                    AttemptResult::answered(at, 429, elapsed, Some(Duration::from_secs(secs)))
                }
                Answer::Cut => {
                    self.finish(n, sends, None, None, node);
                    let why = "request failed: connection reset by peer".into();
                    AttemptResult::failed(at, Failure::Connection, why, elapsed)
                }
            }
        };
        // A frozen node reads the answer once it is thawed.
        alive(&self.world, node).await;
        out
    }
}

#[derive(Debug, Clone, Copy)]
enum Answer {
    Status(u16),
    Throttle(u64),
    Cut,
}

/// Ends a request that is dropped before its answer (the dispatcher cut it off).
struct EndOnDrop<'a> {
    receivers: &'a Receivers,
    n: u64,
    node: &'a str,
    armed: bool,
}

impl Drop for EndOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let mut seen = self.receivers.seen.lock().unwrap();
            end(&mut seen, self.n);
            drop(seen);
            self.receivers
                .world
                .trace(format!("cut #{} {}", self.n, self.node));
        }
    }
}

fn end(seen: &mut Seen, n: u64) {
    if let Some(r) = seen.inflight.remove(&n) {
        for lane in r.lanes {
            if seen.lane_inflight.get(&lane) == Some(&n) {
                seen.lane_inflight.remove(&lane);
            }
        }
        let _ = r.begun;
    }
}

/// States order among states; lost, restored and reminders among themselves.
fn class(kind: EventKind) -> bool {
    kind == EventKind::StateChanged
}

pub fn lane_key(lane: &(String, SensorId)) -> String {
    format!("{}/{}", lane.0, lane.1)
}

/// latch's transport for one simulated node.
pub struct SimTransport {
    pub node: String,
    pub receivers: Arc<Receivers>,
}

#[async_trait]
impl Transport for SimTransport {
    async fn send(&self, s: &Sendable, timeout: Duration, at: Millis) -> AttemptResult {
        self.receivers
            .exchange(&self.node, &[s], None, timeout, at)
            .await
    }

    async fn send_batch(
        &self,
        id: &str,
        sends: &[Box<Sendable>],
        timeout: Duration,
        at: Millis,
    ) -> AttemptResult {
        let sends: Vec<&Sendable> = sends.iter().map(|s| s.as_ref()).collect();
        self.receivers
            .exchange(&self.node, &sends, Some(id), timeout, at)
            .await
    }
}
