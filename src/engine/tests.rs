//! The engine against a committer the test plays: partial commits, and deadlines that
//! meet readings queued behind a full round, on a clock moved by hand.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::*;
use crate::domain::{Connection, EventKind, RejectCode, Source};

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

/// A sensor online since `seen`, with the default timeout.
pub(super) fn online(seen: Millis) -> SensorState {
    SensorState {
        data: Some(true),
        changed_at: Some(seen),
        last_ts: Some(seen),
        last_seen_at: Some(seen),
        connection: Connection::Online,
        heartbeat_timeout_s: None,
        ..SensorState::new(None)
    }
}

fn reading(id: SensorId) -> Reading {
    Reading {
        sensor_id: id,
        data: true,
        ts: None,
        signals: Default::default(),
    }
}

/// Enqueues valid readings and waits until they are durable.
async fn submit(engine: &Engine, readings: Vec<Reading>, at: Millis) -> Result<Report, Error> {
    let items = readings.into_iter().map(Ok).collect();
    engine.enqueue(items, at, Source::Http).await?.wait().await
}

/// An engine with a 10 s default timeout whose commits the test answers.
fn engine(
    shards: usize,
    batch_max: usize,
    clock: Clock,
    sensors: Vec<(SensorId, SensorState)>,
) -> (Engine, mpsc::Receiver<CommitRequest>, CancellationToken) {
    let (tx, rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let tuning = Tuning {
        shards,
        batch_max,
        default_timeout: Duration::from_secs(10),
        default_debounce: Duration::ZERO,
        lost_reminder: None,
        clock,
        partitions: crate::domain::partition::Partitioning::md5(16),
        supervisor: Default::default(),
    };
    let engine = Engine::launch(tuning, sensors, tx, stop.clone(), &TaskTracker::new());
    (engine, rx, stop)
}

/// Answers every commit as `answer` says, keeping the batches it was given.
fn committer(
    mut rx: mpsc::Receiver<CommitRequest>,
    answer: impl Fn(&CommitBatch) -> Result<(), CommitFailure> + Send + 'static,
) -> Arc<std::sync::Mutex<Vec<CommitBatch>>> {
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = log.clone();
    tokio::spawn(async move {
        while let Some(r) = rx.recv().await {
            let _ = r.reply.send(answer(&r.batch));
            kept.lock().unwrap().push(r.batch);
        }
    });
    log
}

#[tokio::test]
async fn a_failed_shard_rejects_its_own_readings_and_the_others_stand() {
    let ids: Vec<SensorId> = (0..32).map(|i| sid(&format!("p{i}"))).collect();
    let sensors = ids.iter().map(|&i| (i, SensorState::new(None))).collect();
    let (engine, rx, stop) = engine(2, 100, Clock::manual(0), sensors);
    let ok = ids[0];
    let bad = *ids[1..]
        .iter()
        .find(|&&i| engine.shard(i) != engine.shard(ok))
        .expect("32 sensors over 2 shards");
    // The shard of `bad` commits in a round of its own that fails; `ok`'s succeeds.
    committer(rx, move |b| {
        if b.readings.iter().any(|r| r.sensor_id == bad) {
            Err(CommitFailure::Refused("disk full".into()))
        } else {
            Ok(())
        }
    });

    let report = submit(&engine, vec![reading(ok), reading(bad), reading(ok)], 1000)
        .await
        .expect("one shard committed: the request is answered reading by reading");
    assert_eq!(report.accepted, 2);
    let [(1, rejected)] = &report.rejected[..] else {
        panic!("only the failed shard's reading is rejected: {report:?}");
    };
    assert_eq!(rejected.code, RejectCode::StoreUnavailable);
    assert!(rejected.message.contains("disk full"), "{rejected}");

    // Nothing committed at all: the whole request failed, as before.
    let all_failed = submit(&engine, vec![reading(bad)], 2000).await;
    assert!(
        matches!(all_failed, Err(Error::Commit(_))),
        "{all_failed:?}"
    );
    stop.cancel();
}

/// The state a batch wrote for `id`, as the store would read it back.
fn written(b: &CommitBatch, id: SensorId) -> SensorRuntime {
    let u = b.states.iter().find(|u| u.sensor_id == id).expect("state");
    let state = SensorState {
        data: u.data,
        changed_at: u.changed_at,
        last_ts: u.last_ts,
        last_seen_at: u.last_seen_at,
        connection: u.connection,
        last_source: u.last_source,
        debounce: u.debounce,
        lost_since: u.lost_since,
        reminders: u.reminders,
        ..SensorState::new(None)
    };
    (id, state)
}

/// A commit whose answer was lost (PostgreSQL timed out after sending `COMMIT`): when the
/// read-back shows it landed, the resent reading is a repeat and notifies nobody again;
/// when it shows it did not, the resent reading is the change it always was.
#[tokio::test]
async fn a_commit_whose_answer_was_lost_follows_what_the_store_read_back() {
    for landed in [true, false] {
        let id = sid("door");
        let (engine, rx, stop) =
            engine(1, 100, Clock::manual(0), vec![(id, SensorState::new(None))]);
        let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let log = committer(rx, move |b| {
            if !first.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Ok(());
            }
            let back = if landed {
                written(b, id)
            } else {
                (id, SensorState::new(None))
            };
            Err(CommitFailure::Unknown {
                message: "the database did not answer (commit)".into(),
                landed: Some(vec![back]),
            })
        });
        let lost_answer = submit(&engine, vec![reading(id)], 1_000).await;
        assert!(
            matches!(lost_answer, Err(Error::Unknown(_))),
            "{lost_answer:?}"
        );
        // The sender was told to try again, and does.
        let again = submit(&engine, vec![reading(id)], 2_000).await.unwrap();
        assert!(again.rejected.is_empty());
        let batches = log.lock().unwrap();
        let changes = batches[1]
            .events
            .iter()
            .filter(|e| e.kind == EventKind::StateChanged)
            .count();
        assert_eq!(
            changes,
            usize::from(!landed),
            "landed = {landed}: the resent reading changes state only if the first did not land"
        );
        drop(batches);
        stop.cancel();
    }
}

#[tokio::test]
async fn readings_queued_behind_a_full_round_come_before_silence() {
    let clock = Clock::manual(0);
    let (s, o) = (sid("silent"), sid("other"));
    // `s` is due at 10 s; `o` at 18 s.
    let sensors = vec![(s, online(0)), (o, online(8_000))];
    let (engine, mut rx, stop) = engine(1, 1, clock.clone(), sensors);

    // The shard waits on a slow commit while readings queue up behind it: one of `o`
    // that fills the next round, then `s`'s, which arrived before its deadline.
    let slow = engine
        .enqueue(vec![Ok(reading(o))], 9_000, Source::Http)
        .await
        .unwrap();
    let held = rx.recv().await.unwrap();
    let fills = engine
        .enqueue(vec![Ok(reading(o))], 9_100, Source::Http)
        .await
        .unwrap();
    let in_time = engine
        .enqueue(vec![Ok(reading(s))], 9_200, Source::Http)
        .await
        .unwrap();
    clock.set(15_000);
    held.reply.send(Ok(())).unwrap();
    let log = committer(rx, |_| Ok(()));
    for sub in [slow, fills, in_time] {
        assert!(sub.wait().await.unwrap().rejected.is_empty());
    }

    let events: Vec<(SensorId, EventKind)> = log
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b.events.iter().map(|e| (e.sensor_id, e.kind)))
        .collect();
    assert!(
        !events.iter().any(|(id, _)| *id == s),
        "its reading came in time, so it was never lost: {events:?}"
    );
    stop.cancel();
}

#[tokio::test]
async fn a_full_round_still_declares_sensors_silent_before_its_readings() {
    let clock = Clock::manual(0);
    let (s, o) = (sid("silent"), sid("other"));
    let sensors = vec![(s, online(0)), (o, online(8_000))];
    let (engine, mut rx, stop) = engine(1, 1, clock.clone(), sensors);

    // As above, but the readings waiting came after `s`'s deadline: it is lost in the
    // round they fill, however busy the shard stays.
    let slow = engine
        .enqueue(vec![Ok(reading(o))], 9_000, Source::Http)
        .await
        .unwrap();
    let held = rx.recv().await.unwrap();
    let fills = engine
        .enqueue(vec![Ok(reading(o))], 12_000, Source::Http)
        .await
        .unwrap();
    let more = engine
        .enqueue(vec![Ok(reading(o))], 12_100, Source::Http)
        .await
        .unwrap();
    clock.set(15_000);
    held.reply.send(Ok(())).unwrap();
    let log = committer(rx, |_| Ok(()));
    for sub in [slow, fills, more] {
        sub.wait().await.unwrap();
    }
    let batches = log.lock().unwrap();
    let lost = &batches[0].events;
    assert_eq!(lost.len(), 1, "{batches:?}");
    assert_eq!(
        (lost[0].sensor_id, lost[0].kind),
        (s, EventKind::ConnectionLost)
    );
    assert_eq!(lost[0].at, 10_000);
    assert_eq!(batches[0].readings[0].received_at, 12_000);
    stop.cancel();
}

/// Answers every forward as accepted, keeping where each went.
#[derive(Default)]
struct Forwarded(std::sync::Mutex<Vec<(Arc<str>, Vec<Reading>)>>);

impl Forwarder for Forwarded {
    fn forward(
        &self,
        to: Arc<str>,
        readings: Vec<Reading>,
        _sequence: Option<Sequence>,
        _source: Source,
        _keyed: Option<crate::store::Keyed>,
    ) -> VerdictsRx {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(Ok(vec![None; readings.len()]));
        self.0.lock().unwrap().push((to, readings));
        rx
    }
}

/// A cluster node's engine serving nothing yet, with 16 partitions.
fn leased(
    clock: Clock,
) -> (
    Engine,
    Arc<Routing>,
    Arc<Forwarded>,
    mpsc::Receiver<CommitRequest>,
    CancellationToken,
) {
    let (tx, rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let forwarded = Arc::new(Forwarded::default());
    let routing = Arc::new(Routing::new(16, forwarded.clone()));
    let tuning = Tuning {
        shards: 2,
        batch_max: 100,
        default_timeout: Duration::from_secs(10),
        default_debounce: Duration::ZERO,
        lost_reminder: None,
        clock,
        partitions: crate::domain::partition::Partitioning::md5(16),
        supervisor: Default::default(),
    };
    let engine = Engine::launch_leased(
        tuning,
        tx,
        stop.clone(),
        &TaskTracker::new(),
        routing.clone(),
    );
    (engine, routing, forwarded, rx, stop)
}

/// Three sensors in three different partitions.
fn three_partitions(engine: &Engine) -> [(SensorId, u32); 3] {
    let mut found: Vec<(SensorId, u32)> = Vec::new();
    for i in 0.. {
        let id = sid(&format!("c{i}"));
        let p = engine.partition(id);
        if found.iter().all(|(_, q)| *q != p) {
            found.push((id, p));
        }
        if found.len() == 3 {
            break;
        }
    }
    [found[0], found[1], found[2]]
}

#[tokio::test]
async fn a_cluster_node_applies_its_partitions_forwards_others_and_fences_its_commits() {
    let (engine, routing, forwarded, rx, stop) = leased(Clock::manual(1_000));
    let [(here, p_here), (away, p_away), (moving, _)] = three_partitions(&engine);
    engine
        .acquire(
            p_here,
            Some(7),
            vec![(here, SensorState::new(None))],
            1_000,
            1_000,
        )
        .await
        .unwrap();
    let mut routes = vec![Route::Nobody; 16];
    routes[p_here as usize] = Route::Here;
    routes[p_away as usize] = Route::Node(Arc::from("http://other:8080"));
    routing.set(routes);
    let log = committer(rx, |_| Ok(()));

    let report = submit(
        &engine,
        vec![reading(here), reading(away), reading(moving)],
        2_000,
    )
    .await
    .unwrap();
    assert_eq!(report.accepted, 2, "{report:?}");
    let [(2, rej)] = &report.rejected[..] else {
        panic!("the reading of a partition nobody serves is refused: {report:?}");
    };
    assert!(rej.code.is_transient(), "send it again: {rej}");

    let sent = forwarded.0.lock().unwrap().clone();
    assert_eq!(sent.len(), 1);
    assert_eq!(&*sent[0].0, "http://other:8080");
    assert_eq!(sent[0].1, vec![reading(away)]);

    let batches = log.lock().unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].readings[0].sensor_id, here);
    assert_eq!(
        batches[0].fence,
        vec![crate::store::Fence {
            partition: p_here,
            epoch: 7
        }],
        "the commit names the partition it writes and the lease's epoch"
    );
    stop.cancel();
}

#[tokio::test]
async fn after_a_takeover_silence_counts_from_the_takeover() {
    let clock = Clock::manual(50_000);
    let (engine, _routing, _fwd, rx, stop) = leased(clock.clone());
    let [(s, p), ..] = three_partitions(&engine);
    // Last seen at 0 under the old owner: by its own deadline (10 s) long silent, but
    // nobody served it since; the new owner gives it a full timeout from the takeover.
    engine
        .acquire(p, Some(2), vec![(s, online(0))], 50_000, 50_000)
        .await
        .unwrap();
    let log = committer(rx, |_| Ok(()));
    clock.set(59_999);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        log.lock().unwrap().is_empty(),
        "not lost before takeover + timeout"
    );
    clock.set(60_000);
    let lost = eventually_events(&log).await;
    assert_eq!(lost, vec![(s, EventKind::ConnectionLost, 60_000)]);
    stop.cancel();
}

#[tokio::test]
async fn a_released_partition_is_flushed_first_then_refused() {
    let (engine, _routing, _fwd, rx, stop) = leased(Clock::manual(1_000));
    let [(s, p), ..] = three_partitions(&engine);
    engine
        .acquire(p, Some(1), vec![(s, SensorState::new(None))], 1_000, 1_000)
        .await
        .unwrap();
    let log = committer(rx, |_| Ok(()));
    let queued = engine
        .enqueue_here(vec![Ok(reading(s))], 1_500, Source::Http, None, None)
        .await
        .unwrap();
    engine.release(p, true).await.unwrap();
    assert!(
        queued.wait().await.unwrap().rejected.is_empty(),
        "queued before: committed"
    );
    assert_eq!(log.lock().unwrap().len(), 1);
    let after = submit(&engine, vec![reading(s)], 2_000).await;
    let rejected = match after {
        Ok(r) => r.rejected,
        Err(e) => panic!("answered per reading: {e}"),
    };
    assert_eq!(rejected.len(), 1);
    assert!(rejected[0].1.code.is_transient(), "{:?}", rejected[0].1);
    stop.cancel();
}

/// The events committed so far, waiting up to a second for the first.
async fn eventually_events(
    log: &Arc<std::sync::Mutex<Vec<CommitBatch>>>,
) -> Vec<(SensorId, EventKind, Millis)> {
    for _ in 0..100 {
        let events: Vec<_> = log
            .lock()
            .unwrap()
            .iter()
            .flat_map(|b| b.events.iter().map(|e| (e.sensor_id, e.kind, e.at)))
            .collect();
        if !events.is_empty() {
            return events;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Vec::new()
}

#[tokio::test]
async fn right_after_a_takeover_an_unknown_sensor_is_send_again_not_unknown() {
    let (engine, routing, _fwd, rx, stop) = leased(Clock::manual(10_000));
    let [(known, p), ..] = three_partitions(&engine);
    let mut routes = vec![Route::Nobody; 16];
    routes[p as usize] = Route::Here;
    routing.set(routes);
    // Another sensor of the same partition, registered while its sensors were loading.
    let late = (0..)
        .map(|i| sid(&format!("late{i}")))
        .find(|&id| engine.partition(id) == p)
        .unwrap();
    engine
        .acquire(
            p,
            Some(3),
            vec![(known, SensorState::new(None))],
            10_000,
            10_000 + TAKEOVER_GRACE_MS,
        )
        .await
        .unwrap();
    committer(rx, |_| Ok(()));
    let soon = submit(&engine, vec![reading(late)], 12_000).await.unwrap();
    assert!(soon.rejected[0].1.code.is_transient(), "{soon:?}");
    let later = submit(&engine, vec![reading(late)], 16_000).await.unwrap();
    assert_eq!(later.rejected[0].1.code, RejectCode::UnknownSensor);
    stop.cancel();
}

#[tokio::test]
async fn an_outage_is_declared_lost_in_sensor_id_order() {
    let clock = Clock::manual(0);
    // Last seen in the reverse of id order, and spread over the partitions: a batch in
    // deadline or partition order would be scattered over the ids the store is keyed by.
    let ids: Vec<SensorId> = (0..40).map(|i| sid(&format!("s{i:02}"))).collect();
    let sensors = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, online(1_000 - 10 * i as Millis)))
        .collect();
    let (_engine, rx, stop) = engine(1, 100, clock.clone(), sensors);
    let log = committer(rx, |_| Ok(()));
    clock.set(20_000);
    let mut lost = eventually_events(&log).await;
    for _ in 0..100 {
        if lost.len() == ids.len() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        lost = eventually_events(&log).await;
    }
    assert_eq!(lost.iter().map(|e| e.0).collect::<Vec<_>>(), ids);
    for (i, (_, kind, at)) in lost.iter().enumerate() {
        assert_eq!(*kind, EventKind::ConnectionLost);
        assert_eq!(*at, 11_000 - 10 * i as Millis, "each at its own deadline");
    }
    stop.cancel();
}

/// A sensor waiting in the due queue whose reading arrives before its turn is not declared
/// lost when its turn comes: each queued sensor is checked again when taken.
#[tokio::test]
async fn a_queued_sensor_seen_before_its_turn_is_not_declared_lost() {
    let clock = Clock::manual(0);
    let n = 2 * EXPIRE_BATCH + 1;
    let ids: Vec<SensorId> = (0..n).map(|i| sid(&format!("q{i:06}"))).collect();
    let last = ids[n - 1];
    let sensors = ids.iter().map(|&id| (id, online(1_000))).collect();
    let (engine, mut rx, stop) = engine(1, 100, clock.clone(), sensors);
    let mut lost = Vec::new();
    let mut answer = |r: CommitRequest| {
        let events = r.batch.events.iter();
        lost.extend(
            events
                .filter(|e| e.kind == EventKind::ConnectionLost)
                .map(|e| e.sensor_id),
        );
        let _ = r.reply.send(Ok(()));
    };
    clock.set(20_000);
    // Round one declares the first batch lost. While it commits, `last` (two batches on in
    // the queue) reports, so round two applies its reading and takes the second batch.
    let first = rx.recv().await.unwrap();
    let seen = engine
        .enqueue(vec![Ok(reading(last))], 20_000, Source::Http)
        .await
        .unwrap();
    answer(first);
    answer(rx.recv().await.unwrap());
    seen.wait().await.unwrap();
    // Round three, at the same time: `last`'s turn in the queue comes.
    let other = engine
        .enqueue(vec![Ok(reading(ids[0]))], 20_000, Source::Http)
        .await
        .unwrap();
    answer(rx.recv().await.unwrap());
    other.wait().await.unwrap();
    assert_eq!(lost.len(), n - 1, "all but the one that reported");
    assert!(
        !lost.contains(&last),
        "seen while queued, yet declared lost"
    );
    stop.cancel();
}

#[tokio::test]
async fn nothing_of_a_sequence_commits_behind_a_reading_of_it_that_did_not() {
    let x = sid("x");
    let (engine, mut rx, stop) = engine(1, 1, Clock::manual(0), vec![(x, online(0))]);
    let seq = Sequence::new();
    let batch = |data| {
        vec![Ok(Reading {
            sensor_id: x,
            data,
            ts: None,
            signals: Default::default(),
        })]
    };
    // The first batch's commit fails while the second waits behind it in the shard.
    let first = engine
        .enqueue_in(batch(false), 1_000, Source::Http, &seq)
        .await
        .unwrap();
    let held = rx.recv().await.unwrap();
    let second = engine
        .enqueue_in(batch(true), 1_100, Source::Http, &seq)
        .await
        .unwrap();
    held.reply
        .send(Err(CommitFailure::Refused("disk full".into())))
        .unwrap();
    let log = committer(rx, |_| Ok(()));
    assert!(first.wait().await.is_err());
    let report = second.wait().await.expect("answered, reading by reading");
    assert_eq!(
        report.accepted, 0,
        "not applied behind the failure: {report:?}"
    );
    assert_eq!(report.rejected[0].1.code, RejectCode::StoreUnavailable);
    assert!(seq.is_cut());
    assert!(log.lock().unwrap().is_empty(), "nothing more was committed");
    // Readings of no sequence (HTTP), and of a new one, go on.
    assert_eq!(
        submit(&engine, vec![reading(x)], 1_200)
            .await
            .unwrap()
            .accepted,
        1
    );
    let fresh = Sequence::new();
    let report = engine
        .enqueue_in(batch(false), 1_300, Source::Amqp, &fresh)
        .await
        .unwrap();
    assert_eq!(report.wait().await.unwrap().accepted, 1);
    stop.cancel();
}
