//! One conformance suite for every `Store` backend: each check states a behaviour callers
//! rely on. A backend's tests call [`run_all`] on a fresh, empty store.

use std::sync::Arc;

use super::*;
use crate::domain::{Event, time::now_ms};

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn page(limit: u32) -> PageRequest {
    PageRequest { limit, after: None }
}

fn sensor(id: &str) -> Sensor {
    Sensor {
        id: sid(id),
        address: format!("address of {id}"),
        heartbeat_timeout_s: None,
        created_at: 1_000,
    }
}

fn client(id: &str, url: &str) -> Client {
    Client {
        id: id.into(),
        name: format!("client {id}"),
        url: url.into(),
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        created_at: 2_000,
    }
}

fn change(id: &str, data: bool, previous: Option<bool>, at: Millis) -> CommitBatch {
    CommitBatch {
        readings: vec![ReadingRecord {
            sensor_id: sid(id),
            data,
            ts: at,
            received_at: at,
            late: false,
        }],
        states: vec![StateUpdate {
            sensor_id: sid(id),
            data: Some(data),
            changed_at: Some(at),
            last_ts: Some(at),
            last_seen_at: Some(at),
            connection: Connection::Online,
        }],
        events: vec![Event {
            sensor_id: sid(id),
            kind: EventKind::StateChanged,
            at,
            data: Some(data),
            previous,
            last_seen_at: None,
        }],
    }
}

/// Runs every check on `store`, which must be empty.
pub async fn run_all(store: Arc<dyn Store>) {
    sensors_crud_and_pagination(&*store).await;
    clients_and_links(&*store).await;
    commit_creates_state_history_and_outbox(&*store).await;
    claim_reads_registry_and_cancels_orphans(&*store).await;
    record_and_retry(&*store).await;
    leases_exclude_other_nodes(&*store).await;
    deletes_cancel_pending(&*store).await;
    lost_state_survives_and_filters(&*store).await;
    import_skips_what_exists(&*store).await;
    archive_keeps_reads_whole(&*store).await;
    registry_changes_follow_create_change_delete(&*store).await;
    spool_ships_only_what_the_sink_took(&*store).await;
}

async fn sensors_crud_and_pagination(s: &dyn Store) {
    for i in 0..25 {
        s.create_sensor(sensor(&format!("pg{i:02}"))).await.unwrap();
    }
    assert!(matches!(
        s.create_sensor(sensor("pg00")).await,
        Err(Error::Conflict(_))
    ));
    let mut seen = vec![];
    let mut req = page(10);
    loop {
        let p = s.list_sensors(None, req.clone()).await.unwrap();
        seen.extend(p.items.iter().map(|(x, _)| x.id.to_string()));
        match p.next {
            Some(n) => req.after = Some(n),
            None => break,
        }
    }
    let expected: Vec<String> = (0..25).map(|i| format!("pg{i:02}")).collect();
    assert_eq!(seen, expected, "pages cover every sensor once, in id order");

    let (got, status) = s.get_sensor(sid("pg03")).await.unwrap().unwrap();
    assert_eq!(got.address, "address of pg03");
    assert_eq!(status, SensorStatus::default());
    let replaced = s
        .replace_sensor(sid("pg03"), "new place".into(), Some(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(replaced.0.address, "new place");
    assert_eq!(replaced.0.heartbeat_timeout_s, Some(60));
    assert!(
        s.replace_sensor(sid("nope"), "x".into(), None)
            .await
            .unwrap()
            .is_none()
    );
    assert!(s.delete_sensor(sid("pg03"), 5).await.unwrap());
    assert!(!s.delete_sensor(sid("pg03"), 5).await.unwrap());
    assert!(s.get_sensor(sid("pg03")).await.unwrap().is_none());
    let unknown = s
        .list_sensors(Some(Connection::Unknown), page(1000))
        .await
        .unwrap();
    assert_eq!(unknown.items.len(), 24);
    let online = s
        .list_sensors(Some(Connection::Online), page(1000))
        .await
        .unwrap();
    assert!(online.items.is_empty());
    assert!(matches!(
        s.list_readings(
            sid("pg01"),
            TimeRange::default(),
            PageRequest {
                limit: 5,
                after: Some("junk".into())
            }
        )
        .await,
        Err(Error::BadCursor)
    ));
}

async fn clients_and_links(s: &dyn Store) {
    s.create_client(client("cA", "http://a/")).await.unwrap();
    s.create_client(client("cB", "http://b/")).await.unwrap();
    s.create_sensor(sensor("ln1")).await.unwrap();
    assert!(matches!(
        s.link("cX".into(), sid("ln1"), 1).await,
        Err(Error::NotFound("client"))
    ));
    assert!(matches!(
        s.link("cA".into(), sid("zz"), 1).await,
        Err(Error::NotFound("sensor"))
    ));
    s.link("cA".into(), sid("ln1"), 1).await.unwrap();
    s.link("cA".into(), sid("ln1"), 1).await.unwrap(); // idempotent
    s.link("cB".into(), sid("ln1"), 1).await.unwrap();
    let clients = s.list_sensor_clients(sid("ln1"), page(10)).await.unwrap();
    assert_eq!(
        clients
            .items
            .iter()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        ["cA", "cB"]
    );
    let sensors = s.list_client_sensors("cA".into(), page(10)).await.unwrap();
    assert_eq!(sensors.items.len(), 1);
    s.unlink("cB".into(), sid("ln1")).await.unwrap();
    s.unlink("cB".into(), sid("ln1")).await.unwrap(); // idempotent
    assert_eq!(
        s.list_sensor_clients(sid("ln1"), page(10))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    let mut c = s.get_client("cB".into()).await.unwrap().unwrap();
    c.url = "http://b2/".into();
    assert!(s.replace_client(c).await.unwrap());
    assert_eq!(
        s.get_client("cB".into()).await.unwrap().unwrap().url,
        "http://b2/"
    );
    assert!(!s.replace_client(client("cZ", "http://z/")).await.unwrap());
    assert!(matches!(
        s.list_client_sensors("cZ".into(), page(10)).await,
        Err(Error::NotFound("client"))
    ));
}

async fn commit_creates_state_history_and_outbox(s: &dyn Store) {
    s.create_sensor(sensor("cm1")).await.unwrap();
    s.create_client(client("cm-a", "http://a/")).await.unwrap();
    s.create_client(client("cm-b", "http://b/")).await.unwrap();
    s.link("cm-a".into(), sid("cm1"), 1).await.unwrap();
    s.link("cm-b".into(), sid("cm1"), 1).await.unwrap();

    let created = s
        .commit(change("cm1", true, None, 10_000), 10_000)
        .await
        .unwrap();
    assert_eq!(created.len(), 2, "one notification per linked client");
    assert!(created[0].seq < created[1].seq);
    let (_, status) = s.get_sensor(sid("cm1")).await.unwrap().unwrap();
    assert_eq!(status.data, Some(true));
    assert_eq!(status.changed_at, Some(10_000));
    assert_eq!(status.connection, Connection::Online);

    // A state write without a change leaves changed_at as stored.
    let mut repeat = change("cm1", true, None, 10_500);
    repeat.events.clear();
    repeat.readings.clear();
    repeat.states[0].changed_at = None;
    s.commit(repeat, 10_500).await.unwrap();
    let (_, status) = s.get_sensor(sid("cm1")).await.unwrap().unwrap();
    assert_eq!(status.changed_at, Some(10_000), "kept when unchanged");
    assert_eq!(status.last_seen_at, Some(10_500));

    // A newer change supersedes the older pending, unleased ones.
    let newer = s
        .commit(change("cm1", false, Some(true), 20_000), 20_000)
        .await
        .unwrap();
    let first = s
        .get_notification(created[0].id.clone())
        .await
        .unwrap()
        .unwrap()
        .0;
    assert_eq!(first.status, Status::Superseded);
    let pending = s.load_pending(i64::MIN).await.unwrap();
    let newest = s.load_pending(newer[0].seq).await.unwrap();
    assert_eq!(
        newest.iter().map(|p| p.seq).collect::<Vec<_>>(),
        vec![newer[1].seq],
        "a sweep after a seq sees only what came later"
    );
    let ids: Vec<&str> = pending.iter().map(|p| p.id.as_str()).collect();
    assert!(ids.contains(&newer[0].id.as_str()) && !ids.contains(&created[0].id.as_str()));

    let rt = s.load_runtime().await.unwrap();
    let cm = rt.iter().find(|r| r.id == sid("cm1")).unwrap();
    assert_eq!(cm.data, Some(false));
    assert_eq!(cm.last_ts, Some(20_000));

    let readings = s
        .list_readings(sid("cm1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert_eq!(readings.items.len(), 2);
    let ranged = s
        .list_readings(
            sid("cm1"),
            TimeRange {
                from: Some(15_000),
                to: None,
            },
            page(10),
        )
        .await
        .unwrap();
    assert_eq!(ranged.items.len(), 1);
    assert!(!ranged.items[0].row.data);
    let events = s
        .list_events(sid("cm1"), TimeRange::default(), page(1))
        .await
        .unwrap();
    assert_eq!(events.items.len(), 1);
    let rest = s
        .list_events(
            sid("cm1"),
            TimeRange::default(),
            PageRequest {
                limit: 1,
                after: events.next,
            },
        )
        .await
        .unwrap();
    assert_eq!(rest.items[0].row.previous, Some(true));
    assert_eq!(rest.next, None);

    // Filters of the notification list.
    let f = NotificationFilter {
        client_id: Some("cm-a".into()),
        sensor_id: Some(sid("cm1")),
        status: Some(Status::Superseded),
    };
    let listed = s.list_notifications(f, page(10)).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].id, created[0].id);
}

async fn claim_reads_registry_and_cancels_orphans(s: &dyn Store) {
    s.create_sensor(sensor("cl1")).await.unwrap();
    s.create_client(client("cl-a", "http://old/"))
        .await
        .unwrap();
    s.create_client(client("cl-b", "http://b/")).await.unwrap();
    s.link("cl-a".into(), sid("cl1"), 1).await.unwrap();
    s.link("cl-b".into(), sid("cl1"), 1).await.unwrap();
    let created = s.commit(change("cl1", true, None, 1), 1).await.unwrap();
    // The URL changes after the notification was written; the claim sees the new one.
    let mut a = s.get_client("cl-a".into()).await.unwrap().unwrap();
    a.url = "http://new/".into();
    s.replace_client(a).await.unwrap();
    s.unlink("cl-b".into(), sid("cl1")).await.unwrap();
    let now = now_ms();
    let claims = s
        .claim(
            created.iter().map(|c| c.id.clone()).collect(),
            "n1".into(),
            now,
            now + 60_000,
        )
        .await
        .unwrap();
    match &claims[0] {
        Claim::Send(x) => {
            assert_eq!(x.url, "http://new/");
            assert_eq!(x.address, "address of cl1");
            assert_eq!(x.notification.data, Some(true));
        }
        other => panic!("expected a send, got {other:?}"),
    }
    assert_eq!(
        claims[1],
        Claim::Done {
            id: created[1].id.clone(),
            status: Status::Cancelled
        }
    );
    assert_eq!(
        s.get_notification(created[1].id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Cancelled
    );
    // A leased head in flight is not superseded by a newer change.
    s.commit(change("cl1", false, Some(true), 2), 2)
        .await
        .unwrap();
    assert_eq!(
        s.get_notification(created[0].id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Pending
    );
}

async fn record_and_retry(s: &dyn Store) {
    s.create_sensor(sensor("rc1")).await.unwrap();
    s.create_client(client("rc-a", "http://a/")).await.unwrap();
    s.link("rc-a".into(), sid("rc1"), 1).await.unwrap();
    let n = s
        .commit(change("rc1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let attempt = |code: Option<u16>| {
        Some(Attempt {
            notification_id: n.id.clone(),
            at: 5,
            status_code: code,
            error: code.is_none().then(|| "connection refused".to_string()),
            duration_ms: 3,
        })
    };
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            attempt: attempt(None),
            attempts: 1,
            verdict: Verdict::Retry { next_at: 99 },
        }],
        5,
    )
    .await
    .unwrap();
    let (got, attempts) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(
        (got.status, got.attempts, got.next_attempt_at),
        (Status::Pending, 1, Some(99))
    );
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].error.as_deref(), Some("connection refused"));
    assert!(matches!(
        s.retry_notification(n.id.clone(), 6).await,
        Err(Error::Conflict(_))
    ));
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            attempt: attempt(Some(500)),
            attempts: 2,
            verdict: Verdict::Failed,
        }],
        7,
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_notification(n.id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Failed
    );
    let again = s.retry_notification(n.id.clone(), 8).await.unwrap();
    assert_eq!((again.attempts, again.due_at), (0, 8));
    let (got, attempts) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(got.status, Status::Pending);
    assert_eq!(attempts.len(), 2, "the attempt log keeps every round");
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            attempt: attempt(Some(200)),
            attempts: 1,
            verdict: Verdict::Delivered,
        }],
        9,
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_notification(n.id.clone())
            .await
            .unwrap()
            .unwrap()
            .0
            .status,
        Status::Delivered
    );
    assert!(matches!(
        s.retry_notification("missing".into(), 1).await,
        Err(Error::NotFound(_))
    ));

    // A failed state notification cannot be replayed once a newer state went out.
    let old = s
        .commit(change("rc1", false, Some(true), 10), 10)
        .await
        .unwrap()
        .remove(0);
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            attempt: attempt(Some(500)),
            attempts: 10,
            verdict: Verdict::Failed,
        }]
        .into_iter()
        .map(|mut o| {
            o.notification_id = old.id.clone();
            o
        })
        .collect(),
        11,
    )
    .await
    .unwrap();
    s.commit(change("rc1", true, Some(false), 12), 12)
        .await
        .unwrap();
    assert!(matches!(
        s.retry_notification(old.id.clone(), 13).await,
        Err(Error::Conflict(_))
    ));
}

async fn leases_exclude_other_nodes(s: &dyn Store) {
    s.create_sensor(sensor("ls1")).await.unwrap();
    s.create_client(client("ls-a", "http://a/")).await.unwrap();
    s.link("ls-a".into(), sid("ls1"), 1).await.unwrap();
    let n = s
        .commit(change("ls1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let first = s
        .claim(vec![n.id.clone()], "node-1".into(), 100, 10_000)
        .await
        .unwrap();
    assert!(matches!(first[0], Claim::Send(_)));
    let second = s
        .claim(vec![n.id.clone()], "node-2".into(), 200, 10_200)
        .await
        .unwrap();
    assert_eq!(
        second[0],
        Claim::Leased {
            id: n.id.clone(),
            until: 10_000
        }
    );
    // Once the lease ran out, another node takes over.
    let third = s
        .claim(vec![n.id.clone()], "node-2".into(), 10_001, 20_000)
        .await
        .unwrap();
    assert!(matches!(third[0], Claim::Send(_)));
}

async fn deletes_cancel_pending(s: &dyn Store) {
    s.create_sensor(sensor("dl1")).await.unwrap();
    s.create_sensor(sensor("dl2")).await.unwrap();
    s.create_client(client("dl-a", "http://a/")).await.unwrap();
    s.create_client(client("dl-b", "http://b/")).await.unwrap();
    s.link("dl-a".into(), sid("dl1"), 1).await.unwrap();
    s.link("dl-b".into(), sid("dl2"), 1).await.unwrap();
    let a = s
        .commit(change("dl1", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    let b = s
        .commit(change("dl2", true, None, 1), 1)
        .await
        .unwrap()
        .remove(0);
    assert!(s.delete_sensor(sid("dl1"), 2).await.unwrap());
    assert!(s.delete_client("dl-b".into(), 2).await.unwrap());
    for id in [a.id, b.id] {
        assert_eq!(
            s.get_notification(id).await.unwrap().unwrap().0.status,
            Status::Cancelled
        );
    }
    assert!(
        s.list_readings(sid("dl1"), TimeRange::default(), page(10))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // A batch for a sensor deleted meanwhile does not bring its state back.
    s.commit(change("dl1", false, Some(true), 3), 3)
        .await
        .unwrap();
    assert!(s.get_sensor(sid("dl1")).await.unwrap().is_none());
    assert!(
        s.load_runtime()
            .await
            .unwrap()
            .iter()
            .all(|r| r.id != sid("dl1"))
    );
}

async fn lost_state_survives_and_filters(s: &dyn Store) {
    s.create_sensor(sensor("lv1")).await.unwrap();
    s.create_client(client("lv-a", "http://a/")).await.unwrap();
    s.link("lv-a".into(), sid("lv1"), 1).await.unwrap();
    s.commit(change("lv1", true, None, 1_000), 1_000)
        .await
        .unwrap();
    let lost = CommitBatch {
        readings: vec![],
        states: vec![StateUpdate {
            sensor_id: sid("lv1"),
            data: Some(true),
            changed_at: Some(1_000),
            last_ts: Some(1_000),
            last_seen_at: Some(1_000),
            connection: Connection::Lost,
        }],
        events: vec![Event {
            sensor_id: sid("lv1"),
            kind: EventKind::ConnectionLost,
            at: 61_000,
            data: Some(true),
            previous: None,
            last_seen_at: Some(1_000),
        }],
    };
    let created = s.commit(lost, 61_000).await.unwrap();
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].kind, EventKind::ConnectionLost);
    let (n, _) = s
        .get_notification(created[0].id.clone())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((n.data, n.last_seen_at), (Some(true), Some(1_000)));
    let rt = s.load_runtime().await.unwrap();
    assert_eq!(
        rt.iter().find(|r| r.id == sid("lv1")).unwrap().connection,
        Connection::Lost
    );
    let lost = s
        .list_sensors(Some(Connection::Lost), page(1000))
        .await
        .unwrap();
    assert!(lost.items.iter().any(|(x, _)| x.id == sid("lv1")));
    let events = s
        .list_events(sid("lv1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert_eq!(
        events.items.last().unwrap().row.kind,
        EventKind::ConnectionLost
    );
    assert_eq!(events.items.last().unwrap().row.last_seen_at, Some(1_000));
}

async fn import_skips_what_exists(s: &dyn Store) {
    s.create_client(client("im-a", "http://a/")).await.unwrap();
    s.create_sensor(sensor("im0")).await.unwrap();
    let sensors: Vec<Sensor> = (0..3).map(|i| sensor(&format!("im{i}"))).collect();
    let links = vec![
        ("im-a".to_string(), sid("im1")),
        ("nobody".to_string(), sid("im2")),
        ("im-a".to_string(), sid("imX")),
    ];
    s.import(sensors, links).await.unwrap();
    for i in 0..3 {
        assert!(
            s.get_sensor(sid(&format!("im{i}")))
                .await
                .unwrap()
                .is_some()
        );
    }
    let linked = s
        .list_client_sensors("im-a".into(), page(10))
        .await
        .unwrap();
    assert_eq!(linked.items.len(), 1);
    assert_eq!(linked.items[0].0.id, sid("im1"));
}

/// Every reading of a sensor, `limit` per page.
async fn every_reading(s: &dyn Store, id: &str, limit: u32) -> Vec<Stored<ReadingRecord>> {
    let mut out = Vec::new();
    let mut req = page(limit);
    loop {
        let p = s
            .list_readings(sid(id), TimeRange::default(), req.clone())
            .await
            .unwrap();
        out.extend(p.items);
        match p.next {
            Some(n) => req.after = Some(n),
            None => return out,
        }
    }
}

async fn archive_keeps_reads_whole(s: &dyn Store) {
    s.create_sensor(sensor("ar1")).await.unwrap();
    for i in 0..5 {
        let at = 60_000 + i * 1_000;
        s.commit(change("ar1", i % 2 == 0, None, at), at)
            .await
            .unwrap();
    }
    let before = every_reading(s, "ar1", 2).await;
    assert_eq!(before.len(), 5);
    // Moved in two steps, then two more arrive in the journal: pages run across both.
    s.archive_history(3).await.unwrap();
    s.archive_history(1_000_000).await.unwrap();
    assert_eq!(
        every_reading(s, "ar1", 2).await,
        before,
        "moving changes no answer"
    );
    for i in 5..7 {
        let at = 60_000 + i * 1_000;
        s.commit(change("ar1", i % 2 == 0, None, at), at)
            .await
            .unwrap();
    }
    let after = every_reading(s, "ar1", 3).await;
    assert_eq!(after.len(), 7);
    assert_eq!(&after[..5], &before[..]);
    let ranged = s
        .list_readings(
            sid("ar1"),
            TimeRange {
                from: Some(63_000),
                to: Some(66_000),
            },
            page(10),
        )
        .await
        .unwrap();
    let ts: Vec<i64> = ranged.items.iter().map(|r| r.row.ts).collect();
    assert_eq!(ts, vec![63_000, 64_000, 65_000]);
    // A deleted sensor takes its archived readings along.
    assert!(s.delete_sensor(sid("ar1"), 70_000).await.unwrap());
    s.create_sensor(sensor("ar1")).await.unwrap();
    assert!(every_reading(s, "ar1", 10).await.is_empty());
}

async fn registry_changes_follow_create_change_delete(s: &dyn Store) {
    let start = s.newest_registry_change().await.unwrap();
    s.create_sensor(sensor("rg1")).await.unwrap();
    s.replace_sensor(sid("rg1"), "moved".into(), Some(90))
        .await
        .unwrap();
    s.create_sensor(sensor("rg2")).await.unwrap();
    s.delete_sensor(sid("rg2"), 1).await.unwrap();
    let (newest, changes) = s.registry_changes(start).await.unwrap();
    if !s.shared() {
        // One process per store: its engine saw every change itself.
        assert!(changes.is_empty());
        return;
    }
    assert!(newest > start);
    let rg1 = changes.iter().find(|(id, _)| *id == sid("rg1")).unwrap();
    assert_eq!(
        rg1.1.unwrap().heartbeat_timeout_s,
        Some(90),
        "its state now"
    );
    let rg2 = changes.iter().find(|(id, _)| *id == sid("rg2")).unwrap();
    assert_eq!(rg2.1, None, "deleted");
    assert_eq!(changes.len(), 2, "one entry per sensor");
    let (same, none) = s.registry_changes(newest).await.unwrap();
    assert_eq!((same, none.len()), (newest, 0));
    s.prune_registry_changes(i64::MAX).await.unwrap();
    assert!(s.registry_changes(start).await.unwrap().1.is_empty());
}

/// A sink that keeps what it is given, or refuses while `fail` is set.
#[derive(Default)]
struct Collect {
    fail: std::sync::atomic::AtomicBool,
    got: std::sync::Mutex<Vec<HistoryBatch>>,
}

#[async_trait]
impl HistorySink for Collect {
    async fn insert(&self, batch: &HistoryBatch) -> std::result::Result<(), String> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("refused".into());
        }
        self.got.lock().unwrap().push(batch.clone());
        Ok(())
    }
}

/// Runs last: it drains the spool of everything the earlier checks wrote.
async fn spool_ships_only_what_the_sink_took(s: &dyn Store) {
    s.create_sensor(sensor("sp1")).await.unwrap();
    s.commit(change("sp1", true, None, 50_000), 50_000)
        .await
        .unwrap();
    s.commit(change("sp1", false, Some(true), 51_000), 51_000)
        .await
        .unwrap();
    let depth = s.spool_depth().await.unwrap();
    assert!(depth >= 4, "two readings and two events wait, got {depth}");

    let sink = Collect::default();
    sink.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(matches!(
        s.ship_history(100_000, &sink).await,
        Err(Error::Sink(_))
    ));
    assert_eq!(s.spool_depth().await.unwrap(), depth, "a refusal keeps all");
    let before = s
        .list_readings(sid("sp1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert_eq!(before.items.len(), 2);

    // A small limit takes the oldest rows of each kind first.
    sink.fail.store(false, std::sync::atomic::Ordering::Relaxed);
    let first = s.ship_history(1, &sink).await.unwrap();
    assert!(
        (1..=3).contains(&first),
        "one row of each kind at most, got {first}"
    );
    let shipped = first + s.ship_history(100_000, &sink).await.unwrap();
    assert_eq!(shipped as u64, depth);
    assert_eq!(s.spool_depth().await.unwrap(), 0);
    assert_eq!(s.ship_history(100_000, &sink).await.unwrap(), 0);

    let got = sink.got.lock().unwrap().clone();
    let readings: Vec<&Stored<ReadingRecord>> = got.iter().flat_map(|b| &b.readings).collect();
    let ids: Vec<i64> = readings.iter().map(|r| r.id).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(ids, sorted, "readings ship once each, oldest first");
    let ours: Vec<&Stored<ReadingRecord>> = readings
        .iter()
        .copied()
        .filter(|r| r.row.sensor_id == sid("sp1"))
        .collect();
    assert_eq!(ours.len(), 2);
    assert_eq!(
        ours.iter().map(|r| r.id).collect::<Vec<_>>(),
        before.items.iter().map(|r| r.id).collect::<Vec<_>>(),
        "a row keeps its id in the sink"
    );
    assert!(
        got.iter()
            .flat_map(|b| &b.events)
            .any(|e| e.row.sensor_id == sid("sp1") && e.row.previous == Some(true))
    );
    // Attempts recorded earlier ship with what they were about, and stay in the outbox.
    let attempt = got
        .iter()
        .flat_map(|b| &b.attempts)
        .next()
        .expect("earlier checks recorded attempts");
    assert!(!attempt.client_id.is_empty() && !attempt.sensor_id.is_empty());
    let (_, kept) = s
        .get_notification(attempt.attempt.notification_id.clone())
        .await
        .unwrap()
        .unwrap();
    assert!(kept.contains(&attempt.attempt));

    // Shipped rows left the store; new ones never reuse their ids.
    assert!(
        s.list_readings(sid("sp1"), TimeRange::default(), page(10))
            .await
            .unwrap()
            .items
            .is_empty()
    );
    s.commit(change("sp1", true, Some(false), 52_000), 52_000)
        .await
        .unwrap();
    let fresh = s
        .list_readings(sid("sp1"), TimeRange::default(), page(10))
        .await
        .unwrap();
    assert!(fresh.items[0].id > *ids.last().unwrap());
}
