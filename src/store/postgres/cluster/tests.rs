//! Leases, fencing and partition loads against a real PostgreSQL, each test on its own
//! schema. Lease expiry is judged by the database's clock; the tests sleep past it.

use crate::store::prelude::*;
use std::collections::BTreeSet;
use std::time::Duration;

use super::super::tests::{base_url, fresh, schema_url};
use super::*;
use crate::domain::{Connection, Event, EventKind, Sensor, SensorId};
use crate::store::conformance;
use crate::store::{
    CommitBatch, Error, Fence, NotificationFilter, PageRequest, ReadingRecord, StateUpdate,
    TimeRange,
};

const LONG: Duration = Duration::from_secs(60);
/// A liveness window that the node which beat 2.5 s ago is out of.
const RECENT: Duration = Duration::from_secs(2);

fn sid(s: &str) -> SensorId {
    SensorId::parse(s).unwrap()
}

fn parts(leases: &[Lease]) -> Vec<u32> {
    leases.iter().map(|l| l.partition).collect()
}

/// A store with `p` partitions fixed (a new database: the exchange's function).
async fn cluster(p: u32) -> Option<PgStore> {
    let (store, _) = fresh().await?;
    assert_eq!(
        store.partitions(p).await.unwrap(),
        partition::Partitioning::exchange(p)
    );
    Some(store)
}

#[tokio::test]
async fn the_shared_secret_is_made_once_and_disagreeing_nodes_are_named() {
    let Some(store) = cluster(4).await else {
        return;
    };
    let (a, b) = tokio::join!(store.shared_secret("first"), store.shared_secret("second"));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "two nodes asking at once get one secret");
    assert_eq!(store.shared_secret("third").await.unwrap(), a, "kept");

    for n in ["n1", "n2", "n3"] {
        store.heartbeat(n, "http://x", LONG).await.unwrap();
    }
    let others = |n: &'static str, f: &'static str, form: &'static str| {
        store.secret_fingerprints(n, f, form, LONG)
    };
    let pair = |n: &str, f: &str| (n.to_string(), f.to_string());
    assert!(others("n1", "v1-a", "v1-").await.unwrap().is_empty());
    assert_eq!(
        others("n2", "v1-a", "v1-").await.unwrap(),
        [pair("n1", "v1-a")]
    );
    // A newer form forgets the older ones; n3 never recorded one: not listed.
    assert!(others("n3", "v2-b", "v2-").await.unwrap().is_empty());
    assert_eq!(
        others("n1", "v2-a", "v2-").await.unwrap(),
        [pair("n3", "v2-b")]
    );
    // A node restarted records anew.
    let n2 = others("n2", "v2-c", "v2-").await.unwrap();
    assert_eq!(n2, [pair("n1", "v2-a"), pair("n3", "v2-b")]);
    // Only live nodes count.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    store.heartbeat("n3", "http://x", LONG).await.unwrap();
    assert_eq!(others("n3", "v2-b", "v2-").await.unwrap().len(), 2);
    let recent = store.secret_fingerprints("n3", "v2-b", "v2-", RECENT);
    assert!(recent.await.unwrap().is_empty());
}

#[tokio::test]
async fn rate_slots_are_leased_once_each_across_nodes() {
    let Some(store) = cluster(4).await else {
        return;
    };
    // Three nodes lease five slots of 20 ms each at once: the leases follow one another.
    let (a, b, c) = tokio::join!(
        store.grant_rate("c1", 5, 20_000),
        store.grant_rate("c1", 5, 20_000),
        store.grant_rate("c1", 5, 20_000)
    );
    let delay = |(first, now): (i64, i64)| first - now;
    // Each statement reads the clock before it waits for the schedule's lock, so a later
    // lease may carry an earlier "now": order the leases by where they start.
    let mut leases = vec![a.unwrap(), b.unwrap(), c.unwrap()];
    leases.sort_unstable();
    assert!(
        delay(leases[0]) < 50_000,
        "the first starts about now: {leases:?}"
    );
    for w in leases.windows(2) {
        let ((start, _), (next, now)) = (w[0], w[1]);
        // A lease starts where the one before it ends (100 ms on), or now if that end has
        // already passed by the time it was asked: never overlapping, never later.
        assert!(
            next - start == 100_000 || (next - start > 100_000 && next == now),
            "{leases:?}"
        );
    }
    // Another client has a schedule of its own.
    assert!(delay(store.grant_rate("c2", 1, 1_000_000).await.unwrap()) < 50_000);
    // Slots in the past are not leased: after the schedule ran out, a lease starts now.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(delay(store.grant_rate("c1", 1, 20_000).await.unwrap()), 0);
}

#[tokio::test]
async fn partitions_are_fixed_by_the_first_caller() {
    let Some((store, schema)) = fresh().await else {
        return;
    };
    // Two nodes starting at once agree on one count.
    let other = PgStore::connect(&schema_url(&base_url(), &schema), LONG)
        .await
        .unwrap();
    let (a, b) = tokio::join!(store.partitions(8), other.partitions(16));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    assert_eq!(a.scheme, partition::Scheme::Exchange, "a new database");
    let a = a.count;
    assert!(a == 8 || a == 16);
    let third = PgStore::connect(&schema_url(&base_url(), &schema), LONG)
        .await
        .unwrap();
    assert_eq!(
        third.partitions(32).await.unwrap().count,
        a,
        "fixed at first use"
    );
    let c = store.db.unbounded().await.unwrap();
    let rows: Vec<i32> = c
        .query(
            "SELECT partition FROM latch_partitions ORDER BY partition",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, (0..a as i32).collect::<Vec<_>>());
}

#[tokio::test]
async fn two_nodes_acquire_disjoint_sets_that_cover_all() {
    let Some(store) = cluster(16).await else {
        return;
    };
    let (a, b) = tokio::join!(
        store.acquire("a", 10, LONG, false),
        store.acquire("b", 10, LONG, false)
    );
    let (mut a, mut b) = (parts(&a.unwrap()), parts(&b.unwrap()));
    // What the first round left (a row one node skipped while the other held it).
    a.extend(parts(&store.acquire("a", 16, LONG, false).await.unwrap()));
    b.extend(parts(&store.acquire("b", 16, LONG, false).await.unwrap()));
    let (sa, sb): (BTreeSet<u32>, BTreeSet<u32>) =
        (a.iter().copied().collect(), b.iter().copied().collect());
    assert_eq!(sa.len(), a.len());
    assert!(sa.is_disjoint(&sb), "{a:?} {b:?}");
    assert_eq!(sa.union(&sb).count(), 16, "{a:?} {b:?}");
    assert!(!a.is_empty() && !b.is_empty());
}

#[tokio::test]
async fn a_lease_moves_only_after_it_runs_out_and_renew_shows_what_is_left() {
    let Some(store) = cluster(4).await else {
        return;
    };
    let lease = Duration::from_secs(2);
    let first = store.acquire("a", 4, lease, false).await.unwrap();
    assert_eq!(parts(&first), vec![0, 1, 2, 3], "lowest first");
    assert!(
        store
            .acquire("b", 4, lease, false)
            .await
            .unwrap()
            .is_empty()
    );

    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let taken = store.acquire("b", 1, LONG, false).await.unwrap();
    assert_eq!(
        taken,
        vec![Lease {
            partition: 0,
            epoch: first[0].epoch + 1
        }]
    );
    // Expired but not taken: still a's at its epoch, so renewed.
    let renewed = store.renew("a", LONG).await.unwrap();
    assert_eq!(renewed, first[1..].to_vec());
    assert!(store.acquire("b", 4, LONG, false).await.unwrap().is_empty());
    assert_eq!(store.renew("b", LONG).await.unwrap(), taken);
}

#[tokio::test]
async fn reclaim_own_takes_back_unexpired_leases_under_new_epochs() {
    let Some(store) = cluster(4).await else {
        return;
    };
    let held = store.acquire("a", 2, LONG, false).await.unwrap();
    assert_eq!(parts(&held), vec![0, 1]);
    let more = store.acquire("a", 4, LONG, false).await.unwrap();
    assert_eq!(
        parts(&more),
        vec![2, 3],
        "its own unexpired ones are not free"
    );
    let again = store.acquire("a", 2, LONG, true).await.unwrap();
    assert_eq!(parts(&again), vec![0, 1]);
    for (old, new) in held.iter().zip(&again) {
        assert!(new.epoch > old.epoch, "{old:?} {new:?}");
    }
    assert!(store.acquire("b", 4, LONG, true).await.unwrap().is_empty());
}

/// A partition handed over by a live node keeps the deadlines it had; one taken after a
/// crash, after nobody served it, or back by the node that gave it up counts from the
/// takeover.
#[tokio::test]
async fn a_handover_carries_the_deadline_floor_a_takeover_does_not() {
    let Some(store) = cluster(1).await else {
        return;
    };
    let floor = |node: &'static str, since| {
        let store = &store;
        async move {
            let got = store.acquire(node, 1, LONG, false).await.unwrap();
            assert_eq!(got.len(), 1, "{node} takes the partition");
            let f = store
                .deadline_floors(node, &got, since, LONG)
                .await
                .unwrap();
            store.release(node, &got).await.unwrap();
            f[0].1
        }
    };
    assert_eq!(
        floor("a", 1_000).await,
        1_000,
        "first owner: from its takeover"
    );
    assert_eq!(floor("b", 5_000).await, 1_000, "handed over: a's deadlines");
    assert_eq!(floor("c", 9_000).await, 1_000, "and on");
    assert_eq!(
        floor("c", 9_500).await,
        9_500,
        "back to the node that gave it up"
    );
    // Released longer ago than `within`: nobody served it meanwhile.
    let got = store.acquire("d", 1, LONG, false).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let f = store
        .deadline_floors("d", &got, 12_000, Duration::from_millis(10))
        .await
        .unwrap();
    assert_eq!(f, vec![(0, 12_000)]);
    // A crash: d's lease runs out, e takes over.
    store.renew("d", Duration::from_millis(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        floor("e", 20_000).await,
        20_000,
        "after a crash: from the takeover"
    );
}

#[tokio::test]
async fn release_frees_at_once_only_what_is_held_at_that_epoch() {
    let Some(store) = cluster(4).await else {
        return;
    };
    let held = store.acquire("a", 4, LONG, false).await.unwrap();
    let stale = Lease {
        partition: 2,
        epoch: held[2].epoch - 1,
    };
    store
        .release("a", &[held[0], held[1], stale])
        .await
        .unwrap();
    // Another node's name on a's lease frees nothing.
    store.release("b", &[held[3]]).await.unwrap();
    let taken = store.acquire("b", 4, LONG, false).await.unwrap();
    assert_eq!(parts(&taken), vec![0, 1]);
    assert_eq!(
        taken[0].epoch,
        held[0].epoch + 2,
        "bumped by release and take"
    );
    assert_eq!(parts(&store.renew("a", LONG).await.unwrap()), vec![2, 3]);
}

#[tokio::test]
async fn nodes_and_owners_show_heartbeats_leases_and_addresses() {
    let Some(store) = cluster(4).await else {
        return;
    };
    let c = store.db.unbounded().await.unwrap();
    let db_now = || async {
        c.query_one("SELECT (extract(epoch FROM now()) * 1000)::int8", &[])
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    store.heartbeat("old", "http://old/", LONG).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = db_now().await;
    let live = store.heartbeat("b", "http://b/", LONG).await.unwrap();
    assert_eq!(live, vec!["b", "old"]);
    store.heartbeat("a", "http://a/", LONG).await.unwrap();
    store
        .heartbeat("a", "http://a2/", RECENT)
        .await
        .map(|live| assert_eq!(live, vec!["a", "b"], "old is past the window"))
        .unwrap();
    let after = db_now().await;
    store.acquire("a", 3, LONG, false).await.unwrap();
    store.acquire("b", 3, LONG, false).await.unwrap();

    let nodes = store.nodes(RECENT).await.unwrap();
    let shown: Vec<(&str, &str, u32)> = nodes
        .iter()
        .map(|n| (n.id.as_str(), n.address.as_str(), n.partitions))
        .collect();
    assert_eq!(shown, vec![("a", "http://a2/", 3), ("b", "http://b/", 1)]);
    for n in &nodes {
        assert!(
            (before..=after).contains(&n.heartbeat_at),
            "{n:?} in {before}..={after}"
        );
    }
    let owners = store.owners().await.unwrap();
    let shown: Vec<(u32, &str, &str)> = owners
        .iter()
        .map(|o| (o.partition, o.node.as_str(), o.address.as_str()))
        .collect();
    assert_eq!(
        shown,
        vec![
            (0, "a", "http://a2/"),
            (1, "a", "http://a2/"),
            (2, "a", "http://a2/"),
            (3, "b", "http://b/")
        ]
    );

    let mine = store.renew("b", LONG).await.unwrap();
    store.release("b", &mine).await.unwrap();
    store.leave("b").await.unwrap();
    let ids: Vec<String> = store
        .nodes(LONG)
        .await
        .unwrap()
        .into_iter()
        .map(|n| n.id)
        .collect();
    assert_eq!(ids, vec!["a", "old"]);
    assert_eq!(store.owners().await.unwrap().len(), 3);
}

fn change(id: SensorId, at: i64, fence: Vec<Fence>) -> CommitBatch {
    CommitBatch {
        readings: vec![ReadingRecord {
            sensor_id: id,
            data: true,
            ts: at,
            received_at: at,
            late: false,
            signals: Default::default(),
        }],
        states: vec![StateUpdate {
            sensor_id: id,
            data: Some(true),
            changed_at: Some(at),
            last_ts: Some(at),
            last_seen_at: Some(at),
            connection: Connection::Online,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            signals: Default::default(),
            hold: None,
            flapping: None,
            seen_only: false,
        }],
        events: vec![Event {
            sensor_id: id,
            kind: EventKind::StateChanged,
            at,
            data: Some(true),
            previous: None,
            last_seen_at: None,
            detail: Default::default(),
        }],
        fence,
        keyed: vec![],
    }
}

#[tokio::test]
async fn a_stale_fence_writes_nothing_and_the_current_one_commits() {
    let Some(store) = cluster(4).await else {
        return;
    };
    let id = sid("fenced1");
    store
        .create_sensor(conformance::sensor(&id.to_string()))
        .await
        .unwrap();
    store
        .create_client(conformance::client("c", "http://c/"))
        .await
        .unwrap();
    store.link("c".into(), id, 1).await.unwrap();
    let p = store.partitioning().await.unwrap().of(id);
    let other = (p + 1) % 4;
    let held = store.acquire("a", 4, LONG, false).await.unwrap();
    let now = |p: u32| held[p as usize];
    let stale = Fence {
        partition: p,
        epoch: now(p).epoch - 1,
    };

    for fence in [vec![now(other), stale], vec![stale, now(other)]] {
        let err = store.commit(change(id, 10_000, fence), 10_000).await;
        assert!(
            matches!(&err, Err(Error::Fenced(f)) if f == &vec![p]),
            "{err:?}"
        );
    }
    // Released: the old epoch no longer holds it either.
    store.release("a", &[now(other)]).await.unwrap();
    let err = store
        .commit(change(id, 10_000, vec![now(other), now(p)]), 10_000)
        .await;
    assert!(
        matches!(&err, Err(Error::Fenced(f)) if f == &vec![other]),
        "{err:?}"
    );

    let all = PageRequest {
        limit: 100,
        after: None,
    };
    let readings = store
        .list_readings(id, TimeRange::default(), all.clone())
        .await
        .unwrap();
    let events = store
        .list_events(id, TimeRange::default(), all.clone())
        .await
        .unwrap();
    let notes = store
        .list_notifications(NotificationFilter::default(), all)
        .await
        .unwrap();
    let (_, status) = store.get_sensor(id).await.unwrap().unwrap();
    assert!(readings.items.is_empty() && events.items.is_empty() && notes.items.is_empty());
    assert_eq!(status.data, None, "no state written");

    let created = store
        .commit(change(id, 10_000, vec![now(p)]), 10_000)
        .await
        .unwrap();
    assert_eq!(created.len(), 1);
    let (_, status) = store.get_sensor(id).await.unwrap().unwrap();
    assert_eq!(status.data, Some(true));
}

#[tokio::test]
async fn load_partitions_returns_exactly_the_sensors_of_those_partitions() {
    let Some(store) = cluster(8).await else {
        return;
    };
    let ids: Vec<SensorId> = (0..60).map(|i| sid(&format!("lp{i}"))).collect();
    let sensors = ids
        .iter()
        .map(|&id| Sensor {
            id,
            address: "here".into(),
            heartbeat_timeout_s: Some(30),
            debounce_s: None,
            site_id: None,
            created_at: 1,
            battery_low_pct: crate::domain::signals::DEFAULT_BATTERY_LOW_PCT,
            labels: Default::default(),
            hold_alarms: Default::default(),
            flap: None,
            armed: None,
        })
        .collect();
    store.import(sensors, Vec::new(), 1_000).await.unwrap();

    // The database's hash is the one the nodes compute: in the range of the exchange's
    // bucket for the sensor.
    let scheme = store.partitioning().await.unwrap();
    let c = store.db.unbounded().await.unwrap();
    for r in c.query("SELECT id, hash FROM sensors", &[]).await.unwrap() {
        let id = sid(r.get(0));
        assert_eq!(r.get::<_, i64>(1), i64::from(scheme.hash(id)), "{id}");
    }

    let wanted = [1u32, 3, 6];
    let inside = *ids
        .iter()
        .find(|&&id| wanted.contains(&scheme.of(id)))
        .unwrap();
    store
        .commit(change(inside, 5_000, Vec::new()), 5_000)
        .await
        .unwrap();

    let loaded = store.load_partitions(&[6, 1, 3, 1], 8).await.unwrap();
    let got: BTreeSet<SensorId> = loaded.iter().map(|(id, _)| *id).collect();
    let expected: BTreeSet<SensorId> = ids
        .iter()
        .copied()
        .filter(|&id| wanted.contains(&scheme.of(id)))
        .collect();
    assert_eq!(loaded.len(), got.len(), "each sensor once");
    assert_eq!(got, expected);
    assert!(!expected.is_empty() && expected.len() < ids.len());
    let state = &loaded.iter().find(|(id, _)| *id == inside).unwrap().1;
    assert_eq!(
        (state.data, state.heartbeat_timeout_s),
        (Some(true), Some(30))
    );
    assert!(store.load_partitions(&[], 8).await.unwrap().is_empty());
}

/// A commit in flight holds its partitions' advisory locks shared (as `commit` does,
/// through the same function): a release waits for it to end, an acquire passes them over,
/// a renew does not wait for it, and every cluster call is bounded by the database timeout
/// like the store's own calls.
#[tokio::test]
async fn a_commit_in_flight_holds_its_partitions_and_cluster_calls_are_bounded() {
    let Some((_, schema)) = fresh().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::config::Config::load_from(None, &[]).unwrap();
    config.database_url = Some(schema_url(&base_url(), &schema));
    config.data_dir = dir.path().to_path_buf();
    config.database_timeout = Duration::from_secs(1);
    // The key `fresh` sealed with: a node of this database is given it.
    config.secret_key = Some(crate::secrets::SecretKeys(vec![[42u8; 32]]));
    let opened = crate::store::connect_cluster(&config).await.unwrap();
    assert!(
        opened.journal.is_none(),
        "PostgreSQL has no journal to move"
    );
    let (store, cluster) = (opened.store, opened.cluster);
    let cluster = cluster.expect("PostgreSQL has a cluster side");
    assert_eq!(cluster.partitions(4).await.unwrap().count, 4);
    let held = cluster.acquire("a", 4, LONG, false).await.unwrap();

    let pg = PgStore::connect(config.database_url.as_deref().unwrap(), LONG)
        .await
        .unwrap();
    let mut c = pg
        .db
        .get_for("test", super::super::db::Bound::Bulk)
        .await
        .unwrap();
    let tx = c.transaction().await.unwrap();
    let lost = super::super::commit::fenced(&tx, &held[..2]).await.unwrap();
    assert!(lost.is_empty());
    let renewed = cluster.renew("a", LONG).await.unwrap();
    assert_eq!(renewed, held, "a commit in flight holds up no renew");
    // A row lock on partition 0's lease (as another node's acquire or release holds one
    // for a moment) is what a renew waits for.
    tx.execute(
        "SELECT 1 FROM latch_partitions WHERE partition = 0 FOR UPDATE",
        &[],
    )
    .await
    .unwrap();

    // On a pool of its own: a call that ran out of time still waits in the server, and
    // a pooled connection handed out next would queue behind it.
    let release = {
        let pg = pg.clone();
        let lease = held[0];
        tokio::spawn(async move { pg.release("a", &[lease]).await })
    };
    let err = cluster.renew("a", LONG).await.unwrap_err();
    assert!(err.to_string().contains("did not answer within"), "{err}");
    assert!(
        !release.is_finished(),
        "a release waits for the commit holding its partition"
    );
    let taken = pg.acquire("a", 4, LONG, true).await.unwrap();
    assert_eq!(
        parts(&taken),
        vec![2, 3],
        "an acquire passes partitions being written over"
    );
    tx.commit().await.unwrap();
    drop(c);
    release.await.unwrap().unwrap();
    let fenced = store
        .commit(
            CommitBatch {
                fence: vec![held[1], held[0]],
                ..Default::default()
            },
            1,
        )
        .await;
    assert!(
        matches!(&fenced, Err(Error::Fenced(f)) if f == &vec![0]),
        "{fenced:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::config::Config::load_from(None, &[]).unwrap();
    config.data_dir = dir.path().to_path_buf();
    let opened = crate::store::connect_cluster(&config).await.unwrap();
    assert!(opened.cluster.is_none(), "SQLite stays one node");
    assert!(!opened.shared());
    assert!(
        opened.journal.is_some(),
        "SQLite moves its journal into its archive"
    );
}

async fn links(store: &PgStore) -> Vec<crate::store::SourceLink> {
    let mut l = store.source_links(LONG).await.unwrap();
    l.sort_by_key(|l| l.source.index());
    l
}

/// The broker links every node follows: per source, down while any live node's link is
/// down, else up since the latest reconnect; a node that is gone no longer counts.
#[tokio::test]
async fn source_links_are_down_while_any_live_nodes_link_is() {
    use crate::domain::Source;
    let Some(store) = cluster(4).await else {
        return;
    };
    let link = |source, up, at| crate::store::SourceLink { source, up, at };
    assert!(links(&store).await.is_empty());
    for n in ["a", "b"] {
        store.heartbeat(n, "http://x", LONG).await.unwrap();
    }
    store
        .set_source_link("a", Source::Mqtt, false, 1_000)
        .await
        .unwrap();
    store
        .set_source_link("a", Source::Amqp, true, 1_500)
        .await
        .unwrap();
    store
        .set_source_link("b", Source::Amqp, true, 1_200)
        .await
        .unwrap();
    assert_eq!(
        links(&store).await,
        [
            link(Source::Amqp, true, 1_500),
            link(Source::Mqtt, false, 1_000)
        ],
        "up since the latest reconnect"
    );
    store
        .set_source_link("b", Source::Amqp, false, 2_000)
        .await
        .unwrap();
    store
        .set_source_link("a", Source::Mqtt, true, 2_100)
        .await
        .unwrap();
    assert_eq!(
        links(&store).await,
        [
            link(Source::Amqp, false, 2_000),
            link(Source::Mqtt, true, 2_100)
        ],
        "b's connection down is the cluster's link down, whatever a's is"
    );
    // A node that left (or whose heartbeat is older than the lease) counts no more.
    store.leave("b").await.unwrap();
    assert_eq!(
        links(&store).await,
        [
            link(Source::Amqp, true, 1_500),
            link(Source::Mqtt, true, 2_100)
        ]
    );
    // Recorded by a node never registered: nobody's.
    store
        .set_source_link("ghost", Source::Amqp, false, 3_000)
        .await
        .unwrap();
    assert_eq!(links(&store).await[0], link(Source::Amqp, true, 1_500));
}
