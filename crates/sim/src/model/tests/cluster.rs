//! The cluster's calls, as `store/postgres/cluster/tests.rs` checks them on PostgreSQL.

use std::collections::BTreeSet;

use latch::domain::partition::{Partitioning, Scheme};
use latch::domain::{Connection, Event, EventKind, Sensor, Source};
use latch::store::conformance;
use latch::store::prelude::*;
use latch::store::{
    CommitBatch, Error, Fence, NotificationFilter, PageRequest, ReadingRecord, SourceLink,
    StateUpdate, TimeRange,
};

use super::*;

#[tokio::test]
async fn the_shared_secret_is_made_once_and_disagreeing_nodes_are_named() {
    let (_, clock, store) = shared(4);
    assert!(matches!(
        store.shared_secret("early").await,
        Err(Error::NotFound("cluster row"))
    ));
    store.partitions(4).await.unwrap();
    assert_eq!(store.shared_secret("first").await.unwrap(), "first");
    assert_eq!(
        store.shared_secret("second").await.unwrap(),
        "first",
        "kept"
    );
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
    let n2 = others("n2", "v2-c", "v2-").await.unwrap();
    assert_eq!(n2, [pair("n1", "v2-a"), pair("n3", "v2-b")]);
    // Only live nodes count.
    clock.advance(Duration::from_millis(2500));
    store.heartbeat("n3", "http://x", LONG).await.unwrap();
    assert_eq!(others("n3", "v2-b", "v2-").await.unwrap().len(), 2);
    let recent = store.secret_fingerprints("n3", "v2-b", "v2-", RECENT);
    assert!(recent.await.unwrap().is_empty());
}

#[tokio::test]
async fn rate_slots_are_leased_once_each_across_nodes() {
    let (model, clock, a) = shared(4);
    let (b, c) = (model.for_node("b"), model.for_node("c"));
    let leases = [
        a.grant_rate("c1", 5, 20_000).await.unwrap(),
        b.grant_rate("c1", 5, 20_000).await.unwrap(),
        c.grant_rate("c1", 5, 20_000).await.unwrap(),
    ];
    let now_us = START * 1_000;
    assert_eq!(leases[0], (now_us, now_us), "the first starts now");
    for w in leases.windows(2) {
        assert_eq!(w[1].0 - w[0].0, 100_000, "one after another: {leases:?}");
    }
    // Another client has a schedule of its own.
    assert_eq!(a.grant_rate("c2", 1, 1_000_000).await.unwrap().0, now_us);
    // Slots in the past are not leased: after the schedule ran out, a lease starts now.
    clock.advance(Duration::from_millis(400));
    let (first, now) = a.grant_rate("c1", 1, 20_000).await.unwrap();
    assert_eq!((first, now), (now_us + 400_000, now_us + 400_000));
}

#[tokio::test]
async fn partitions_are_fixed_by_the_first_caller() {
    let (model, _, a) = shared(4);
    let b = model.for_node("b");
    let fixed = a.partitions(8).await.unwrap();
    assert_eq!(fixed, Partitioning::exchange(8), "a new database");
    assert_eq!(b.partitions(16).await.unwrap(), fixed, "fixed at first use");
    let rows: Vec<u32> = model.read(|t| t.partitions().iter().map(|p| p.partition).collect());
    assert_eq!(rows, (0..8).collect::<Vec<_>>());

    // The first sensor fixes it too, with the configured count.
    let (model, _, a) = shared(4);
    a.create_sensor(conformance::sensor("fx1")).await.unwrap();
    assert_eq!(
        model.read(|t| t.partitioning()),
        Some(Partitioning::exchange(4))
    );
    assert_eq!(a.partitions(32).await.unwrap().count, 4);
}

#[tokio::test]
async fn two_nodes_acquire_disjoint_sets_that_cover_all() {
    let (_, _, store) = shared(16);
    store.partitions(16).await.unwrap();
    let a = parts(&store.acquire("a", 10, LONG, false).await.unwrap());
    let b = parts(&store.acquire("b", 10, LONG, false).await.unwrap());
    let (sa, sb): (BTreeSet<u32>, BTreeSet<u32>) =
        (a.iter().copied().collect(), b.iter().copied().collect());
    assert!(sa.is_disjoint(&sb), "{a:?} {b:?}");
    assert_eq!(sa.union(&sb).count(), 16);
    assert_eq!(a, (0..10).collect::<Vec<_>>(), "lowest first");
}

#[tokio::test]
async fn a_lease_moves_only_after_it_runs_out_and_renew_shows_what_is_left() {
    let (_, clock, store) = shared(4);
    store.partitions(4).await.unwrap();
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
    clock.advance(lease);
    assert!(
        store
            .acquire("b", 4, lease, false)
            .await
            .unwrap()
            .is_empty(),
        "at its very end a lease is not free yet"
    );
    clock.advance(Duration::from_millis(500));
    let taken = store.acquire("b", 1, LONG, false).await.unwrap();
    assert_eq!(
        taken,
        vec![Lease {
            partition: 0,
            epoch: first[0].epoch + 1
        }]
    );
    // Expired but not taken: still a's at its epoch, so renewed.
    assert_eq!(store.renew("a", LONG).await.unwrap(), first[1..].to_vec());
    assert!(store.acquire("b", 4, LONG, false).await.unwrap().is_empty());
    assert_eq!(store.renew("b", LONG).await.unwrap(), taken);
}

#[tokio::test]
async fn reclaim_own_takes_back_unexpired_leases_under_new_epochs() {
    let (_, _, store) = shared(4);
    store.partitions(4).await.unwrap();
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
    let (_, clock, store) = shared(1);
    store.partitions(1).await.unwrap();
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
    assert_eq!(floor("a", 1_000).await, 1_000, "first owner: its takeover");
    assert_eq!(floor("b", 5_000).await, 1_000, "handed over: a's deadlines");
    assert_eq!(floor("c", 9_000).await, 1_000, "and on");
    assert_eq!(
        floor("c", 9_500).await,
        9_500,
        "back to the node that gave it up"
    );
    // Released longer ago than `within`: nobody served it meanwhile.
    let got = store.acquire("d", 1, LONG, false).await.unwrap();
    clock.advance(Duration::from_millis(20));
    let f = store
        .deadline_floors("d", &got, 12_000, Duration::from_millis(10))
        .await
        .unwrap();
    assert_eq!(f, vec![(0, 12_000)]);
    // A crash: d's lease runs out, e takes over.
    store.renew("d", Duration::from_millis(1)).await.unwrap();
    clock.advance(Duration::from_millis(20));
    assert_eq!(
        floor("e", 20_000).await,
        20_000,
        "after a crash: the takeover"
    );
    // A lease not held at that epoch gets no floor.
    let stale = Lease {
        partition: 0,
        epoch: 0,
    };
    let none = store.deadline_floors("e", &[stale], 1, LONG).await.unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn release_frees_at_once_only_what_is_held_at_that_epoch() {
    let (_, _, store) = shared(4);
    store.partitions(4).await.unwrap();
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
    let (_, clock, store) = shared(4);
    store.partitions(4).await.unwrap();
    store.heartbeat("old", "http://old/", LONG).await.unwrap();
    clock.advance(Duration::from_millis(2500));
    let live = store.heartbeat("b", "http://b/", LONG).await.unwrap();
    assert_eq!(live, vec!["b", "old"]);
    store.heartbeat("a", "http://a/", LONG).await.unwrap();
    let live = store.heartbeat("a", "http://a2/", RECENT).await.unwrap();
    assert_eq!(live, vec!["a", "b"], "old is past the window");
    store.acquire("a", 3, LONG, false).await.unwrap();
    store.acquire("b", 3, LONG, false).await.unwrap();

    let nodes = store.nodes(RECENT).await.unwrap();
    let shown: Vec<(&str, &str, u32, i64)> = nodes
        .iter()
        .map(|n| {
            (
                n.id.as_str(),
                n.address.as_str(),
                n.partitions,
                n.heartbeat_at,
            )
        })
        .collect();
    let at = START + 2500;
    assert_eq!(
        shown,
        vec![("a", "http://a2/", 3, at), ("b", "http://b/", 1, at)]
    );
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
    // An owner without a registration cannot be reached: not shown as one.
    store.leave("a").await.unwrap();
    assert!(store.owners().await.unwrap().is_empty());
}

fn fenced_change(id: SensorId, at: i64, fence: Vec<Fence>) -> CommitBatch {
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
    let (model, _, store) = shared(4);
    store.partitions(4).await.unwrap();
    let id = sid("fenced1");
    store
        .create_sensor(conformance::sensor("fenced1"))
        .await
        .unwrap();
    store
        .create_client(conformance::client("c", "http://c/"))
        .await
        .unwrap();
    store.link("c".into(), id, 1).await.unwrap();
    let p = model.read(|t| t.partitioning()).unwrap().of(id);
    let other = (p + 1) % 4;
    let held = store.acquire("a", 4, LONG, false).await.unwrap();
    let now = |p: u32| held[p as usize];
    let stale = Fence {
        partition: p,
        epoch: now(p).epoch - 1,
    };
    for fence in [vec![now(other), stale], vec![stale, now(other)]] {
        let err = store.commit(fenced_change(id, 10_000, fence), 10_000).await;
        assert!(
            matches!(&err, Err(Error::Fenced(f)) if f == &vec![p]),
            "{err:?}"
        );
    }
    // Released: the old epoch no longer holds it either.
    store.release("a", &[now(other)]).await.unwrap();
    let err = store
        .commit(fenced_change(id, 10_000, vec![now(other), now(p)]), 10_000)
        .await;
    assert!(
        matches!(&err, Err(Error::Fenced(f)) if f == &vec![other]),
        "{err:?}"
    );
    let all = PageRequest {
        limit: 100,
        after: None,
    };
    let readings = store.list_readings(id, TimeRange::default(), all.clone());
    assert!(readings.await.unwrap().items.is_empty());
    let events = store.list_events(id, TimeRange::default(), all.clone());
    assert!(events.await.unwrap().items.is_empty());
    let notes = store.list_notifications(NotificationFilter::default(), all);
    assert!(notes.await.unwrap().items.is_empty());
    let (_, status) = store.get_sensor(id).await.unwrap().unwrap();
    assert_eq!(status.data, None, "no state written");

    let created = store
        .commit(fenced_change(id, 10_000, vec![now(p)]), 10_000)
        .await
        .unwrap();
    assert_eq!(created.len(), 1);
    let (_, status) = store.get_sensor(id).await.unwrap().unwrap();
    assert_eq!(status.data, Some(true));
}

#[tokio::test]
async fn load_partitions_returns_exactly_the_sensors_of_those_partitions() {
    let (model, _, store) = shared(8);
    store.partitions(8).await.unwrap();
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
            battery_low_pct: latch::domain::signals::DEFAULT_BATTERY_LOW_PCT,
            labels: Default::default(),
            hold_alarms: Default::default(),
            flap: None,
            armed: None,
        })
        .collect();
    store.import(sensors, Vec::new(), 1_000).await.unwrap();
    let scheme = model.read(|t| t.partitioning()).unwrap();
    assert_eq!(scheme.scheme, Scheme::Exchange);
    let wanted = [1u32, 3, 6];
    let inside = *ids
        .iter()
        .find(|&&id| wanted.contains(&scheme.of(id)))
        .unwrap();
    store
        .commit(fenced_change(inside, 5_000, Vec::new()), 5_000)
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

/// Per source, down while any live node's link is down, else up since the latest
/// reconnect; a node that is gone no longer counts.
#[tokio::test]
async fn source_links_are_down_while_any_live_nodes_link_is() {
    let (_, _, store) = shared(4);
    let link = |source, up, at| SourceLink { source, up, at };
    let links = || async { store.source_links(LONG).await.unwrap() };
    assert!(links().await.is_empty());
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
        links().await,
        [
            link(Source::Amqp, true, 1_500),
            link(Source::Mqtt, false, 1_000)
        ]
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
        links().await,
        [
            link(Source::Amqp, false, 2_000),
            link(Source::Mqtt, true, 2_100)
        ]
    );
    store.leave("b").await.unwrap();
    assert_eq!(
        links().await,
        [
            link(Source::Amqp, true, 1_500),
            link(Source::Mqtt, true, 2_100)
        ]
    );
    store
        .set_source_link("ghost", Source::Amqp, false, 3_000)
        .await
        .unwrap();
    assert_eq!(links().await[0], link(Source::Amqp, true, 1_500));
}

/// As SQLite: one node, no cluster side, no fences; opening the store again releases every
/// lease (whoever held them is gone).
#[tokio::test]
async fn one_node_has_no_cluster_side_and_reopening_releases_leases() {
    let clock = Clock::manual(START);
    let model = ModelStore::healthy(Mode::Single, clock);
    let store = model.for_node("n");
    assert!(!model.shared());
    assert!(matches!(store.partitions(4).await, Err(Error::Backend(_))));
    assert!(matches!(
        store.acquire("n", 4, LONG, false).await,
        Err(Error::Backend(_))
    ));
    let fence = vec![Fence {
        partition: 0,
        epoch: 1,
    }];
    let err = store.commit(fenced_change(sid("x1"), 1, fence), 1).await;
    assert!(matches!(err, Err(Error::Backend(_))), "{err:?}");
    assert_eq!(store.registry_changes(0).await.unwrap(), (0, vec![]));

    store
        .create_sensor(conformance::sensor("rl1"))
        .await
        .unwrap();
    store
        .create_client(conformance::client("rl-a", "http://a/"))
        .await
        .unwrap();
    store.link("rl-a".into(), sid("rl1"), 1).await.unwrap();
    let n = store
        .commit(conformance::change("rl1", true, None, 10), 10)
        .await
        .unwrap()
        .remove(0);
    store
        .claim(vec![n.id.clone()], "n".into(), 10, START * 2, None)
        .await
        .unwrap();
    let leased = |m: &ModelStore| m.read(|t| t.notification(&n.id).unwrap().lease_until);
    assert_eq!(leased(&model), Some(START * 2));
    store.kill();
    let _restarted = model.for_node("n");
    assert_eq!(leased(&model), None, "released at open");
}

/// As PostgreSQL's `a_sensor_deleted_and_made_again_is_listed_deleted_first`.
#[tokio::test]
async fn a_sensor_deleted_and_made_again_is_listed_deleted_first() {
    let (_, _, store) = shared(4);
    store
        .create_sensor(conformance::sensor("rc1"))
        .await
        .unwrap();
    let after = store.newest_registry_change().await.unwrap();
    assert!(store.delete_sensor(sid("rc1"), START).await.unwrap());
    store
        .create_sensor(conformance::sensor("rc1"))
        .await
        .unwrap();
    let (_, changes) = store.registry_changes(after).await.unwrap();
    let seen: Vec<(SensorId, bool)> = changes
        .iter()
        .map(|(id, now)| (*id, now.is_some()))
        .collect();
    assert_eq!(seen, [(sid("rc1"), false), (sid("rc1"), true)]);
}
