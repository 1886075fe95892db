//! Sites (issue #50) through a running latch, at the size: a fleet that goes dark
//! in its sites is one `site.connection_lost` per client and site, naming only that
//! client's sensors, and no sensor-level loss for them; a sensor lost alone in a site that
//! stays up is its own loss after the grace; a lost gateway takes its site down; the
//! sites' return is one `site.connection_restored` per client told, listing what is back
//! and what is still lost. On one node and the store under test, and on three nodes one
//! of which is killed.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::time::now_ms;

use crate::utils::site_fleet::{
    CLIENTS, Fleet, Place, Site, by_type, ids, once_per_site, readings, sensors_of,
};
use crate::utils::{Receiver, TestServer, eventually, test_config};

/// The size on one node, on the store under test: 10,000 sensors in 50 sites go
/// silent at once, one sensor of a site of ten does, and a site's gateway does; four
/// clients each linked to a different share of them. Time is the test's (a manual clock),
/// so the grace is exact: nothing reaches anyone before it runs out; then each client gets
/// one `site.connection_lost` per site it has lost sensors in, naming exactly those, and
/// no sensor-level loss of them; the lone sensor's own loss; the gateway's site down. Back
/// but for one sensor each, every site is one `site.connection_restored` per client told,
/// listing its sensors back and still lost; those come back on their own.
#[tokio::test]
async fn ten_thousand_sensors_in_fifty_dark_sites_are_one_alarm_per_client_and_site() {
    let tmp = tempfile::tempdir().unwrap();
    let clock = Clock::manual(now_ms());
    let tweak = |c: &mut latch::config::Config| {
        c.heartbeat_timeout = Duration::from_secs(5);
        c.site_grace = Duration::from_secs(10);
    };
    let receivers: Vec<Receiver> =
        futures::future::join_all((0..CLIENTS).map(|_| Receiver::start())).await;
    let urls: Vec<String> = receivers.iter().map(|r| r.url.clone()).collect();
    let mut fleet = Fleet::plan();
    fleet
        .import(&test_config(tmp.path()).await, &urls, None)
        .await;
    let s = TestServer::start_clocked(tmp.path(), tweak, clock.clone()).await;
    let every: Vec<&String> = fleet.sites.iter().flat_map(|x| &x.sensors).collect();
    for r in readings(every, 1) {
        s.readings(r).await;
    }
    let lone = fleet.site(Place::Lone).clone();
    let gate = fleet.site(Place::Gate).clone();
    let keep_alive: Vec<&String> = lone.sensors[1..].iter().chain(&gate.sensors[1..]).collect();
    let tick = |n: u64| {
        let (s, clock, keep_alive) = (&s, &clock, &keep_alive);
        async move {
            for _ in 0..n {
                clock.advance(Duration::from_secs(1));
                for r in readings(keep_alive.iter().copied(), 1) {
                    s.readings(r).await;
                }
                s.engine_round().await;
            }
        }
    };
    // Lost at 5 s; the grace runs to 15 s. At 14 s, all is still held.
    tick(14).await;
    s.dispatcher_round().await;
    for r in &receivers {
        assert!(
            r.received().is_empty(),
            "nothing before the grace ran out: {:?}",
            r.received().first().map(|g| &g.body)
        );
    }
    tick(2).await;
    let got = settled(&receivers, |c| expected_lost(&fleet, c)).await;
    for (c, got) in got.iter().enumerate() {
        check_lost(&fleet, c, got);
    }
    for site in [&fleet.sites[0], &gate] {
        let (_, read) = s.get(&format!("/v1/sites/{}", site.id)).await;
        assert_eq!(read["status"]["state"], "down", "{read}");
    }
    let (_, read) = s.get(&format!("/v1/sites/{}", lone.id)).await;
    assert_eq!(read["status"]["state"], "up", "{read}");
    assert_eq!(read["status"]["lost"], 1, "{read}");

    // Back, but for the first sensor of each dark site; the gateway and the lone sensor too.
    let back: Vec<&String> = fleet
        .dark()
        .flat_map(|x| &x.sensors[1..])
        .chain([&gate.sensors[0], &lone.sensors[0]])
        .collect();
    for r in readings(back, 0) {
        s.readings(r).await;
    }
    tick(2).await;
    let got = settled(&receivers, |c| {
        expected_lost(&fleet, c) + expected_restored(&fleet, c)
    })
    .await;
    for (c, got) in got.iter().enumerate() {
        check_restored(&fleet, c, got);
    }
    // The ones still lost come back on their own: each its own restoration.
    let last: Vec<&String> = fleet.dark().map(|x| &x.sensors[0]).collect();
    for r in readings(last, 1) {
        s.readings(r).await;
    }
    tick(2).await;
    let got = settled(&receivers, |c| {
        expected_lost(&fleet, c) + expected_restored(&fleet, c) + firsts(&fleet, c).len()
    })
    .await;
    for (c, got) in got.iter().enumerate() {
        let mut own = firsts(&fleet, c);
        if fleet.clients[c].1.contains(&lone.sensors[0]) {
            own.push(lone.sensors[0].clone());
        }
        own.sort();
        assert_eq!(
            sensors_of(got, "sensor.connection_restored"),
            own,
            "client {c}"
        );
        check_restored(&fleet, c, got);
    }
    for site in [&fleet.sites[0], &gate] {
        let (_, read) = s.get(&format!("/v1/sites/{}", site.id)).await;
        assert_eq!(read["status"]["state"], "up", "{read}");
    }
    // Nothing more comes of it: every notification was made once.
    s.dispatcher_round().await;
    let again: Vec<_> = receivers.iter().map(by_type).collect();
    assert_eq!(again, got, "nothing after the last return");
    s.stop().await;
}

/// Waits until each client has received `want(c)` notifications and answers what each got
/// (each notification once), a moment later so that one too many would be seen.
async fn settled(
    receivers: &[Receiver],
    want: impl Fn(usize) -> usize,
) -> Vec<BTreeMap<String, Vec<Value>>> {
    for (c, r) in receivers.iter().enumerate() {
        let n = want(c);
        eventually(60, &format!("client {c}'s {n} notifications"), || async {
            let got = by_type(r);
            (got.values().map(Vec::len).sum::<usize>() >= n).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    receivers.iter().map(by_type).collect()
}

/// Client `c`'s dark sites' first sensors.
fn firsts(fleet: &Fleet, c: usize) -> Vec<String> {
    fleet
        .dark()
        .map(|x| x.sensors[0].clone())
        .filter(|id| fleet.clients[c].1.contains(id))
        .collect()
}

/// The sites whose loss client `c` is told of: the dark ones it has sensors in, and the
/// gateway's if it is linked to the gateway.
fn told_sites(fleet: &Fleet, c: usize) -> Vec<&Site> {
    let gate = fleet.site(Place::Gate);
    fleet
        .dark()
        .filter(|x| !fleet.mine(c, x).is_empty())
        .chain(
            fleet.clients[c]
                .1
                .contains(&gate.sensors[0])
                .then_some(gate),
        )
        .collect()
}

/// How many notifications the outage makes for client `c`: a site's loss per site it
/// is told of, and the lone sensor's own.
fn expected_lost(fleet: &Fleet, c: usize) -> usize {
    let lone = &fleet.site(Place::Lone).sensors[0];
    told_sites(fleet, c).len() + usize::from(fleet.clients[c].1.contains(lone))
}

/// What the return makes for client `c`: a site's return per site told of, and the lone
/// sensor's own.
fn expected_restored(fleet: &Fleet, c: usize) -> usize {
    expected_lost(fleet, c)
}

/// Each site client `c` is told of once, naming exactly its sensors of the site that are
/// lost (of the gateway's site, the gateway), with how many of its sensors the site has;
/// no sensor-level loss but the lone sensor's.
fn check_lost(fleet: &Fleet, c: usize, got: &BTreeMap<String, Vec<Value>>) {
    let lost = once_per_site(got, "site.connection_lost");
    let told = told_sites(fleet, c);
    let want: Vec<&str> = told.iter().map(|x| x.id.as_str()).collect();
    assert_eq!(
        lost.keys().map(String::as_str).collect::<Vec<_>>(),
        {
            let mut w = want.clone();
            w.sort();
            w
        },
        "client {c}: the sites it is told of"
    );
    for site in told {
        let e = lost[&site.id];
        let mine = fleet.mine(c, site);
        let named = match site.place {
            Place::Gate => vec![site.sensors[0].clone()],
            _ => mine.clone(),
        };
        assert_eq!(
            ids(&e["sensors"]),
            named,
            "client {c}, {}: only its own lost sensors",
            site.id
        );
        assert_eq!(e["sensors_total"], mine.len(), "client {c}, {}", site.id);
    }
    let lone = &fleet.site(Place::Lone).sensors[0];
    let own: Vec<String> = fleet.clients[c]
        .1
        .contains(lone)
        .then(|| lone.clone())
        .into_iter()
        .collect();
    assert_eq!(
        sensors_of(got, "sensor.connection_lost"),
        own,
        "client {c}: no sensor-level loss but the lone one's"
    );
}

/// Each site client `c` was told of is back once, listing its sensors back and still lost.
fn check_restored(fleet: &Fleet, c: usize, got: &BTreeMap<String, Vec<Value>>) {
    check_lost(fleet, c, got);
    let restored = once_per_site(got, "site.connection_restored");
    let told = told_sites(fleet, c);
    assert_eq!(
        restored.len(),
        told.len(),
        "client {c}: one return per site told"
    );
    for site in told {
        let e = restored[&site.id];
        let (back, still): (Vec<String>, Vec<String>) = match site.place {
            Place::Gate => (vec![site.sensors[0].clone()], Vec::new()),
            _ => fleet
                .mine(c, site)
                .into_iter()
                .partition(|id| *id != site.sensors[0]),
        };
        assert_eq!(ids(&e["restored"]), back, "client {c}, {}", site.id);
        assert_eq!(ids(&e["still_lost"]), still, "client {c}, {}", site.id);
    }
}

/// Three nodes: a site's 20 sensors spread over their partitions go silent, and the node
/// that owns a third of them is killed (`kill -9`) while the site's grace runs. The
/// survivors decide the site once: one `site.connection_lost` naming all 20, no sensor's
/// own loss, and nothing more in the seconds after.
#[tokio::test]
async fn a_cluster_decides_a_site_once_though_a_node_is_killed() {
    use crate::utils::cluster::{Cluster, post_until_accepted};
    use crate::utils::unique;
    let env = [("LATCH_SITE_GRACE", "5s".to_string())];
    let Some(mut c) = Cluster::start_env(3, &env).await else {
        return;
    };
    let r = Receiver::start().await;
    let site = unique("bldg-");
    c.post(c.base(0), "/v1/sites", json!({"id": site})).await;
    let (_, ids) = c
        .fleet(
            "k",
            20,
            &r.url,
            json!({"heartbeat_timeout_s": 3, "site_id": site}),
        )
        .await;
    let readings: Vec<Value> = ids
        .iter()
        .map(|id| json!({"sensor_id": id, "data": 1}))
        .collect();
    post_until_accepted(&c.http, &c.live(), readings, 20).await;
    eventually(20, "the first states", || async {
        (r.received().len() >= 20).then_some(())
    })
    .await;
    // Lost after 3 s; killed at 4.5 s, inside the 5 s grace.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    c.kill9(2);
    let via = c.live()[0].clone();
    let lost = eventually(40, "the site's loss", || async {
        by_type(&r).get("site.connection_lost").cloned()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let t = by_type(&r);
    assert_eq!(t["site.connection_lost"].len(), 1, "decided once: {lost:?}");
    assert_eq!(lost[0]["sensors"].as_array().unwrap().len(), 20);
    assert!(!t.contains_key("sensor.connection_lost"), "{t:?}");
    let read = c.get(&via, &format!("/v1/sites/{site}")).await;
    assert_eq!(read["status"]["state"], "down", "{read}");
}
