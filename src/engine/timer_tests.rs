//! The engine on a clock moved by hand, with a committer the test plays: debounce windows
//! end and reminders come exactly when due, and a broker link that is down holds back
//! "lost" for the sensors heard through it.

use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::tests::online;
use super::*;
use crate::domain::{Connection, EventKind};

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

/// An engine of one shard with a 10 s timeout, `debounce` and `reminder`, whose commits
/// the test answers one by one.
fn engine(
    clock: Clock,
    debounce: Duration,
    reminder: Option<Duration>,
    sensors: Vec<(SensorId, SensorState)>,
) -> (Engine, mpsc::Receiver<CommitRequest>, CancellationToken) {
    let (tx, rx) = mpsc::channel(16);
    let stop = CancellationToken::new();
    let tuning = Tuning {
        shards: 1,
        batch_max: 100,
        default_timeout: Duration::from_secs(10),
        default_debounce: debounce,
        lost_reminder: reminder,
        clock,
        partitions: crate::domain::partition::Partitioning::md5(4),
        supervisor: Default::default(),
    };
    let engine = Engine::launch(tuning, sensors, tx, stop.clone(), &TaskTracker::new());
    (engine, rx, stop)
}

/// The next commit, answered as durable.
async fn next(rx: &mut mpsc::Receiver<CommitRequest>) -> CommitBatch {
    let r = rx.recv().await.expect("a commit");
    let _ = r.reply.send(Ok(()));
    r.batch
}

fn reading(id: SensorId, data: bool) -> Result<Reading, Rejection> {
    Ok(Reading {
        sensor_id: id,
        data,
        ts: None,
        signals: Default::default(),
    })
}

/// Enqueues one reading and lets its commit through.
async fn send(
    engine: &Engine,
    rx: &mut mpsc::Receiver<CommitRequest>,
    r: Result<Reading, Rejection>,
    at: Millis,
    source: Source,
) -> CommitBatch {
    let ticket = engine.enqueue(vec![r], at, source).await.unwrap();
    let batch = next(rx).await;
    assert!(ticket.wait().await.unwrap().rejected.is_empty());
    batch
}

fn kinds(b: &CommitBatch) -> Vec<(SensorId, EventKind)> {
    b.events.iter().map(|e| (e.sensor_id, e.kind)).collect()
}

#[tokio::test]
async fn a_debounced_change_is_notified_when_its_window_ends() {
    let clock = Clock::manual(0);
    let (door, other) = (sid("door"), sid("other"));
    let sensors = vec![(door, online(0)), (other, online(0))];
    let (engine, mut rx, stop) = engine(clock.clone(), Duration::from_secs(5), None, sensors);

    // `online` is data 1: 0, 1, 0 flip within the window; the window restarts each time.
    for (i, d) in [false, true, false].into_iter().enumerate() {
        let t = 1_000 * (i as Millis + 1);
        clock.set(t);
        let b = send(&engine, &mut rx, reading(door, d), t, Source::Http).await;
        assert!(b.events.is_empty(), "held: {b:?}");
        let st = b.states.iter().find(|s| s.sensor_id == door).unwrap();
        assert_eq!(st.data, Some(d), "the state follows at once");
        assert_eq!(
            st.debounce.unwrap().flips,
            i as u32 + 1,
            "durable with each commit"
        );
    }
    // A millisecond before the window ends, a round for another sensor notifies nothing.
    clock.set(7_999);
    let b = send(&engine, &mut rx, reading(other, true), 7_999, Source::Http).await;
    assert!(b.events.is_empty(), "{b:?}");
    clock.set(8_000);
    let b = next(&mut rx).await;
    assert_eq!(kinds(&b), [(door, EventKind::StateChanged)]);
    let e = &b.events[0];
    assert_eq!((e.data, e.previous, e.at), (Some(false), Some(true), 3_000));
    assert_eq!(e.detail.flips_suppressed, Some(2));
    assert_eq!(b.states[0].debounce, None, "the window is closed durably");
    stop.cancel();
}

#[tokio::test]
async fn a_window_open_at_a_restart_ends_on_time_after_it() {
    let clock = Clock::manual(20_000);
    let door = sid("door");
    let held = SensorState {
        data: Some(false),
        debounce: Some(crate::domain::sensor::Debounce {
            from: Some(true),
            at: 14_000,
            since: 15_000,
            flips: 1,
        }),
        ..online(15_000)
    };
    let (_engine, mut rx, stop) = engine(
        clock.clone(),
        Duration::from_secs(10),
        None,
        vec![(door, held)],
    );
    clock.set(25_000);
    let b = next(&mut rx).await;
    assert_eq!(kinds(&b), [(door, EventKind::StateChanged)]);
    assert_eq!((b.events[0].at, b.events[0].previous), (14_000, Some(true)));
    stop.cancel();
}

#[tokio::test]
async fn a_lost_sensor_is_reminded_once_per_interval() {
    let clock = Clock::manual(0);
    let door = sid("door");
    let (engine, mut rx, stop) = engine(
        clock.clone(),
        Duration::ZERO,
        Some(Duration::from_secs(60)),
        vec![(door, online(0))],
    );
    clock.set(10_000);
    let b = next(&mut rx).await;
    assert_eq!(kinds(&b), [(door, EventKind::ConnectionLost)]);
    assert_eq!(
        (b.states[0].lost_since, b.states[0].reminders),
        (Some(10_000), Some(0))
    );
    clock.set(70_000);
    let b = next(&mut rx).await;
    assert_eq!(kinds(&b), [(door, EventKind::StillLost)]);
    let e = &b.events[0];
    assert_eq!(
        (e.at, e.detail.reminder, e.detail.lost_since),
        (70_000, Some(1), Some(10_000))
    );
    assert_eq!(b.states[0].reminders, Some(1));
    // Nothing more within the interval: a round for a reading notifies only its restore.
    clock.set(129_999);
    let b = send(&engine, &mut rx, reading(door, true), 129_999, Source::Http).await;
    assert_eq!(kinds(&b), [(door, EventKind::ConnectionRestored)]);
    assert_eq!(b.states[0].connection, Connection::Online);
    clock.set(10_000_000);
    let b = next(&mut rx).await;
    assert_eq!(
        kinds(&b),
        [(door, EventKind::ConnectionLost)],
        "lost again, reminders anew"
    );
    stop.cancel();
}

#[tokio::test]
async fn a_broker_link_down_holds_back_lost_until_it_is_back() {
    let clock = Clock::manual(0);
    let (m, h) = (sid("viaMqtt"), sid("viaHttp"));
    let sensors = vec![(m, online(0)), (h, online(0))];
    let (engine, mut rx, stop) = engine(clock.clone(), Duration::ZERO, None, sensors);
    clock.set(1_000);
    send(&engine, &mut rx, reading(m, true), 1_000, Source::Mqtt).await;
    send(&engine, &mut rx, reading(h, true), 1_000, Source::Http).await;
    engine.set_link(Source::Mqtt, false, 2_000);
    clock.set(60_000);
    let b = next(&mut rx).await;
    assert_eq!(
        kinds(&b),
        [(h, EventKind::ConnectionLost)],
        "only the HTTP one"
    );
    engine.set_link(Source::Mqtt, true, 100_000);
    // A round a millisecond before its new deadline: still not lost.
    clock.set(109_999);
    let b = send(&engine, &mut rx, reading(h, true), 109_999, Source::Http).await;
    assert_eq!(kinds(&b), [(h, EventKind::ConnectionRestored)]);
    clock.set(110_000);
    let b = next(&mut rx).await;
    assert_eq!(kinds(&b), [(m, EventKind::ConnectionLost)]);
    assert_eq!(b.events[0].at, 110_000, "reconnected_at + timeout");
    stop.cancel();
}

/// Once a stop began (readings are no longer taken), no sensor is declared lost, whatever
/// it was heard through and whatever its link does after: the silence is latch's
/// downtime, as after a restart (simulation seed 2011053, with its site rounds' loop run
/// once more at the stop, which kept the engine running past a deadline).
#[tokio::test]
async fn no_sensor_is_declared_lost_once_a_stop_began() {
    let clock = Clock::manual(0);
    let (m, h, x) = (sid("viaMqtt"), sid("viaHttp"), sid("other"));
    let sensors = vec![(m, online(0)), (h, online(0)), (x, online(0))];
    let (engine, mut rx, stop) = engine(clock.clone(), Duration::ZERO, None, sensors);
    clock.set(1_000);
    send(&engine, &mut rx, reading(m, true), 1_000, Source::Mqtt).await;
    send(&engine, &mut rx, reading(h, true), 1_000, Source::Http).await;
    send(&engine, &mut rx, reading(x, true), 1_000, Source::Http).await;
    engine.stop_hearing();
    // A link that goes down and comes back meanwhile (a cluster's round follows another
    // node's reconnect) does not make it hear again.
    engine.set_link(Source::Mqtt, false, 2_000);
    engine.set_link(Source::Mqtt, true, 3_000);
    clock.set(60_000);
    // A reading still queued when the stop began is applied; nothing is lost.
    let b = send(&engine, &mut rx, reading(x, false), 60_000, Source::Http).await;
    assert_eq!(kinds(&b), [(x, EventKind::StateChanged)]);
    stop.cancel();
}

/// A door open (1) since `since`, heard then, with a timeout of an hour and an alarm after
/// 30 s held open, reminding every minute.
fn open_door(since: Millis, hold: Option<crate::domain::hold::Hold>) -> SensorState {
    use crate::domain::hold::{HoldAlarm, HoldAlarms};
    SensorState {
        data: Some(true),
        heartbeat_timeout_s: Some(3600),
        hold_alarms: HoldAlarms::from_list(&[HoldAlarm {
            data: 1,
            after_s: 30,
            remind_every_s: Some(60),
        }])
        .unwrap(),
        hold,
        ..online(since)
    }
}

#[tokio::test]
async fn a_door_held_open_alarms_reminds_and_clears_when_it_closes() {
    use crate::domain::hold::Hold;
    let clock = Clock::manual(0);
    let door = sid("door");
    let (engine, mut rx, stop) = engine(
        clock.clone(),
        Duration::ZERO,
        None,
        vec![(door, open_door(0, Some(Hold::new(0))))],
    );
    clock.set(30_000);
    let b = next(&mut rx).await;
    assert_eq!(kinds(&b), [(door, EventKind::StateHeld)]);
    let e = &b.events[0];
    assert_eq!(
        (e.at, e.data, e.detail.reminder),
        (30_000, Some(true), None)
    );
    assert_eq!(e.detail.lost_since, Some(0), "since the state began");
    assert_eq!(
        b.states[0].hold,
        Some(Hold { since: 0, sent: 1 }),
        "committed with it"
    );
    clock.set(90_000);
    let b = next(&mut rx).await;
    assert_eq!(kinds(&b), [(door, EventKind::StateHeld)]);
    assert_eq!(
        (b.events[0].at, b.events[0].detail.reminder),
        (90_000, Some(1))
    );
    // Closed: the change, then the clearing of what was open.
    let b = send(
        &engine,
        &mut rx,
        reading(door, false),
        100_000,
        Source::Http,
    )
    .await;
    assert_eq!(
        kinds(&b),
        [
            (door, EventKind::StateChanged),
            (door, EventKind::StateHeldCleared)
        ]
    );
    let c = &b.events[1];
    assert_eq!(
        (c.data, c.previous, c.at),
        (Some(false), Some(true), 100_000)
    );
    assert_eq!(
        crate::domain::hold::held_s(c.detail.lost_since.unwrap(), c.at),
        100
    );
    assert_eq!(
        b.states[0].hold,
        Some(Hold::new(100_000)),
        "closed has no alarm"
    );
    stop.cancel();
}

#[tokio::test]
async fn a_hold_that_fell_due_while_latch_was_down_alarms_once_at_start() {
    use crate::domain::hold::Hold;
    let clock = Clock::manual(1_000_000);
    let door = sid("door");
    let (_engine, mut rx, stop) = engine(
        clock.clone(),
        Duration::ZERO,
        None,
        vec![(door, open_door(0, Some(Hold::new(0))))],
    );
    let b = next(&mut rx).await;
    assert_eq!(
        kinds(&b),
        [(door, EventKind::StateHeld)],
        "one, not a burst"
    );
    assert_eq!(b.events[0].at, 30_000);
    // Reminders go on from the interval after now: 30 s + 17 minutes.
    clock.set(1_049_999);
    clock.set(1_050_000);
    let b = next(&mut rx).await;
    assert_eq!(
        (b.events[0].at, b.events[0].detail.reminder),
        (1_050_000, Some(17))
    );
    stop.cancel();
}

#[tokio::test]
async fn alarms_set_on_a_door_already_open_time_it_from_then_and_a_lost_one_makes_none() {
    use crate::domain::hold::{Hold, HoldAlarms};
    let clock = Clock::manual(0);
    let (door, gone) = (sid("door"), sid("gone"));
    let lost = SensorState {
        connection: Connection::Lost,
        ..open_door(0, Some(Hold::new(0)))
    };
    let plain = SensorState {
        hold_alarms: HoldAlarms::default(),
        hold: None,
        ..open_door(0, None)
    };
    let (engine, mut rx, stop) = engine(
        clock.clone(),
        Duration::ZERO,
        None,
        vec![(door, plain), (gone, lost)],
    );
    clock.set(5_000);
    let settings = Settings::of(&open_door(0, None));
    engine.upsert_sensor(door, settings).await.unwrap();
    let b = next(&mut rx).await;
    assert!(b.events.is_empty());
    assert_eq!(
        b.states[0].hold,
        Some(Hold::new(5_000)),
        "timed from the setting"
    );
    clock.set(34_999);
    clock.set(35_000);
    let b = next(&mut rx).await;
    assert_eq!(
        kinds(&b),
        [(door, EventKind::StateHeld)],
        "not the lost one"
    );
    stop.cancel();
}
