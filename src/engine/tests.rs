//! The engine against a committer the test plays: partial commits, and deadlines that
//! meet readings queued behind a full round, on a clock moved by hand.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::*;
use crate::domain::{Connection, EventKind, RejectCode};

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn online(seen: Millis) -> SensorState {
    SensorState {
        data: Some(true),
        changed_at: Some(seen),
        last_ts: Some(seen),
        last_seen_at: Some(seen),
        connection: Connection::Online,
        heartbeat_timeout_s: None,
    }
}

fn reading(id: SensorId) -> Reading {
    Reading {
        sensor_id: id,
        data: true,
        ts: None,
    }
}

/// Enqueues valid readings and waits until they are durable.
async fn submit(engine: &Engine, readings: Vec<Reading>, at: Millis) -> Result<Report, Error> {
    let items = readings.into_iter().map(Ok).collect();
    engine.enqueue(items, at).await?.wait().await
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
        clock,
        partitions: 16,
    };
    let engine = Engine::launch(tuning, sensors, tx, stop.clone(), &TaskTracker::new());
    (engine, rx, stop)
}

/// Answers every commit as `answer` says, keeping the batches it was given.
fn committer(
    mut rx: mpsc::Receiver<CommitRequest>,
    answer: impl Fn(&CommitBatch) -> Result<(), String> + Send + 'static,
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
            Err("disk full".into())
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

#[tokio::test]
async fn readings_queued_behind_a_full_round_come_before_silence() {
    let clock = Clock::manual(0);
    let (s, o) = (sid("silent"), sid("other"));
    // `s` is due at 10 s; `o` at 18 s.
    let sensors = vec![(s, online(0)), (o, online(8_000))];
    let (engine, mut rx, stop) = engine(1, 1, clock.clone(), sensors);

    // The shard waits on a slow commit while readings queue up behind it: one of `o`
    // that fills the next round, then `s`'s, which arrived before its deadline.
    let slow = engine.enqueue(vec![Ok(reading(o))], 9_000).await.unwrap();
    let held = rx.recv().await.unwrap();
    let fills = engine.enqueue(vec![Ok(reading(o))], 9_100).await.unwrap();
    let in_time = engine.enqueue(vec![Ok(reading(s))], 9_200).await.unwrap();
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
    let slow = engine.enqueue(vec![Ok(reading(o))], 9_000).await.unwrap();
    let held = rx.recv().await.unwrap();
    let fills = engine.enqueue(vec![Ok(reading(o))], 12_000).await.unwrap();
    let more = engine.enqueue(vec![Ok(reading(o))], 12_100).await.unwrap();
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
