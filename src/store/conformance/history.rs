//! Checks of history: readings listed across the archive, and the spool shipped to a sink.

use super::*;
use async_trait::async_trait;

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

pub(super) async fn archive_keeps_reads_whole(s: &Subject) {
    s.create_sensor(sensor("ar1")).await.unwrap();
    for i in 0..5 {
        let at = 60_000 + i * 1_000;
        s.commit(change("ar1", i % 2 == 0, None, at), at)
            .await
            .unwrap();
    }
    let before = every_reading(&**s, "ar1", 2).await;
    assert_eq!(before.len(), 5);
    // Moved in two steps, then two more arrive in the journal: pages run across both.
    if let Some(journal) = &s.journal {
        journal.archive_history(3).await.unwrap();
        journal.archive_history(1_000_000).await.unwrap();
    }
    assert_eq!(
        every_reading(&**s, "ar1", 2).await,
        before,
        "moving changes no answer"
    );
    for i in 5..7 {
        let at = 60_000 + i * 1_000;
        s.commit(change("ar1", i % 2 == 0, None, at), at)
            .await
            .unwrap();
    }
    let after = every_reading(&**s, "ar1", 3).await;
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
    assert!(every_reading(&**s, "ar1", 10).await.is_empty());
}

/// A sink that keeps what it is given, or refuses while `fail` is set.
#[derive(Default)]
pub struct Collect {
    pub fail: std::sync::atomic::AtomicBool,
    pub got: std::sync::Mutex<Vec<HistoryBatch>>,
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

pub(super) async fn spool_ships_only_what_the_sink_took(s: &Subject) {
    s.create_sensor(sensor("sp1")).await.unwrap();
    s.create_client(client("sp-a", "http://a/")).await.unwrap();
    s.link("sp-a".into(), sid("sp1"), 1).await.unwrap();
    let n = s
        .commit(change("sp1", true, None, 50_000), 50_000)
        .await
        .unwrap()
        .remove(0);
    s.record(
        vec![Outcome {
            notification_id: n.id.clone(),
            client_id: n.client_id.clone(),
            attempt: Some(Attempt {
                notification_id: n.id,
                at: 50_500,
                status_code: Some(503),
                error: None,
                duration_ms: 3,
            }),
            attempts: 1,
            verdict: Verdict::Retry { next_at: 60_000 },
            node: "n1".into(),
            batch_id: None,
        }],
        50_500,
        NEVER,
    )
    .await
    .unwrap();
    s.commit(change("sp1", false, Some(true), 51_000), 51_000)
        .await
        .unwrap();
    let depth = s.spool_depth().await.unwrap();
    assert_eq!(depth, 5, "two readings, two events and one attempt wait");

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
    // The attempt ships with what it was about, and stays in the outbox.
    let attempt = got
        .iter()
        .flat_map(|b| &b.attempts)
        .next()
        .expect("the attempt recorded above");
    assert_eq!(
        (attempt.client_id.as_str(), attempt.sensor_id.as_str()),
        ("sp-a", "sp1")
    );
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
