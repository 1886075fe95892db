//! The dispatcher's loop driven by hand: admission hands heads to the claimer with their
//! client's permits, and what is due at start goes out without anything else arriving.

use super::*;
use crate::domain::{EventKind, SensorId};
use claimer::{Admission, Admitted};
use lanes::{Done, Finished};

/// Three tries a second apart, two requests at a time per client.
fn settings(clock: Clock) -> Settings {
    Settings {
        policy: RetryPolicy {
            kind: retry::Kind::Fixed(vec![Duration::from_secs(1)]),
            max_delay: Duration::from_secs(1),
            max_attempts: 3,
        },
        timeout: Duration::from_secs(1),
        concurrency: 8,
        client_concurrency: 2,
        node: "test".into(),
        clock,
        shared: false,
        guard: Arc::default(),
        disable_after: Duration::from_secs(3600),
        serves: None,
        rate_grants: None,
        recent: None,
        transport: None,
    }
}

#[test]
fn a_clients_permits_are_dropped_once_nothing_of_it_is_out() {
    let settings = settings(Clock::manual(0));
    let (rec_tx, mut outcomes) = mpsc::unbounded_channel();
    let (claims_tx, mut claims) = mpsc::unbounded_channel();
    let mut core = Core::new(
        &settings,
        rec_tx,
        claims_tx,
        false,
        CancellationToken::new(),
    );
    let now = 1_800_000_000_000;
    let refs = (0..3)
        .map(|n| NotificationRef {
            id: ulid::Ulid::new().to_string(),
            seq: n,
            client_id: "c".into(),
            sensor_id: SensorId::parse(&format!("s{n:07}")).unwrap(),
            kind: EventKind::StateChanged,
            due_at: now,
            attempts: 0,
            batch_id: None,
        })
        .collect();
    core.add(refs, now);
    core.lanes.fire_timers(now);
    core.pump();
    assert_eq!(core.client_sends.len(), 1);
    let mut out = Vec::new();
    while let Ok(a) = claims.try_recv() {
        out.push(one(a));
    }
    assert_eq!(out.len(), 3);
    assert!(Arc::ptr_eq(&out[0].client_sends, &out[2].client_sends));
    for a in out {
        let result = Finished::Gone(crate::domain::Status::Cancelled);
        let (lane, id) = (a.lane, a.id);
        assert_eq!(core.client_sends.len(), 1, "held while any is out");
        core.finish(Done { lane, id, result }, now);
    }
    assert!(core.client_sends.is_empty());
    assert!(
        outcomes.try_recv().is_err(),
        "nothing to record for gone ones"
    );
}

/// A restart after a crash loads notifications that are due already (never tried, or
/// a retry overdue): they are sent at once, not when the next reading wakes the loop.
#[tokio::test]
async fn notifications_due_at_start_are_sent_without_anything_else_arriving() {
    let settings = settings(Clock::wall());
    let (rec_tx, _outcomes) = mpsc::unbounded_channel();
    let (claims_tx, mut claims) = mpsc::unbounded_channel();
    let mut core = Core::new(
        &settings,
        rec_tx,
        claims_tx,
        false,
        CancellationToken::new(),
    );
    let now = settings.clock.now();
    core.add(
        vec![NotificationRef {
            id: ulid::Ulid::new().to_string(),
            seq: 1,
            client_id: "c".into(),
            sensor_id: SensorId::parse("s1").unwrap(),
            kind: EventKind::StateChanged,
            due_at: now - 5_000,
            attempts: 0,
            batch_id: None,
        }],
        now,
    );
    // The command channel stays open and silent.
    let (_cmds, rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let run = tokio::spawn(core.run(rx, stop.clone(), Duration::ZERO));
    let admitted = tokio::time::timeout(Duration::from_secs(10), claims.recv()).await;
    stop.cancel();
    let _ = run.await;
    let admitted = admitted.expect("the due head was never handed to the claimer");
    assert_eq!(
        admitted.map(|a| one(a).lane.1.to_string()),
        Some("s1".into())
    );
}

/// A dispatcher core on a manual clock, on a store `shared` or not (its outcomes go
/// nowhere), and what it hands the claimer.
fn core_and_claims(shared: bool) -> (Core, mpsc::UnboundedReceiver<Admission>) {
    let settings = settings(Clock::manual(0));
    let (rec_tx, _outcomes) = mpsc::unbounded_channel();
    let (claims_tx, claims) = mpsc::unbounded_channel();
    let core = Core::new(
        &settings,
        rec_tx,
        claims_tx,
        shared,
        CancellationToken::new(),
    );
    (core, claims)
}

/// Queues `refs` (due at `now`) and returns the heads the core hands the claimer.
fn admit(
    core: &mut Core,
    claims: &mut mpsc::UnboundedReceiver<Admission>,
    refs: Vec<NotificationRef>,
    now: Millis,
) -> Vec<Admitted> {
    core.add(refs, now);
    core.lanes.fire_timers(now);
    core.pump();
    let mut out = Vec::new();
    while let Ok(a) = claims.try_recv() {
        out.push(one(a));
    }
    out
}

/// A head admitted alone (these tests have no batched client).
fn one(a: Admission) -> Admitted {
    match a {
        Admission::One(a) => a,
        Admission::Batch(b) => panic!("a batch of {} was admitted", b.batch.members.len()),
    }
}

/// A deleted client's heads handed to the claimer but not sent are withdrawn; another
/// client's are not.
#[test]
fn a_deleted_clients_admitted_heads_are_withdrawn() {
    let (mut core, mut claims) = core_and_claims(false);
    let now = 1_800_000_000_000;
    let refs = ["gone", "kept"]
        .into_iter()
        .enumerate()
        .map(|(n, client)| NotificationRef {
            id: ulid::Ulid::new().to_string(),
            seq: n as i64,
            client_id: client.into(),
            sensor_id: SensorId::parse("s1").unwrap(),
            kind: EventKind::StateChanged,
            due_at: now,
            attempts: 0,
            batch_id: None,
        })
        .collect();
    let out = admit(&mut core, &mut claims, refs, now);
    assert_eq!(out.len(), 2);
    core.handle(Cmd::ClientGone(Arc::from("gone")));
    for a in &out {
        assert_eq!(
            a.withdrawn.is_cancelled(),
            &*a.lane.0 == "gone",
            "{}",
            a.lane.0
        );
    }
}

/// On a store of its own, a head handed to the claimer is withdrawn when a newer state of
/// its lane comes (it comes back unsent, to be superseded, unless it is on its way); the
/// head of another lane is not. On a shared store nothing is withdrawn.
#[test]
fn an_admitted_state_is_withdrawn_when_a_newer_one_comes_on_a_store_of_its_own() {
    for shared in [false, true] {
        let (mut core, mut claims) = core_and_claims(shared);
        let now = 1_800_000_000_000;
        let state = |seq: i64, sensor: &str| NotificationRef {
            id: ulid::Ulid::new().to_string(),
            seq,
            client_id: "c".into(),
            sensor_id: SensorId::parse(sensor).unwrap(),
            kind: EventKind::StateChanged,
            due_at: now,
            attempts: 0,
            batch_id: None,
        };
        let out = admit(
            &mut core,
            &mut claims,
            vec![state(1, "s1"), state(2, "s2")],
            now,
        );
        assert_eq!(out.len(), 2);
        core.add(vec![state(3, "s1")], now);
        for a in &out {
            let want = !shared && a.lane.1.to_string() == "s1";
            assert_eq!(
                a.withdrawn.is_cancelled(),
                want,
                "shared {shared}, {}",
                a.lane.1
            );
        }
    }
}
