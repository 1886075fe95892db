//! Sites (issue #50) through a running latch, at the size: a fleet that goes dark
//! in its sites is one `site.connection_lost` per client and site, naming only that
//! client's sensors, and no sensor-level loss for them; a sensor lost alone in a site that
//! stays up is its own loss after the grace; a lost gateway takes its site down; the
//! sites' return is one `site.connection_restored` per client told, listing what is back
//! and what is still lost. On one node and the store under test, and on three nodes one
//! of which is killed. A silence over the outage keeps a client's alarms `silenced`.
//!
//! The fleet is registered through the store before latch starts (`site_fleet`), as
//! `latch bench` does; everything after goes through the running service.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use latch::clock::Clock;
use latch::domain::silence::SETTLE_MS;
use latch::domain::time::{self, now_ms};

use crate::utils::site_fleet::{
    CLIENTS, Fleet, Place, Site, by_type, ids, once_per_site, readings, send_until_accepted,
    sensors_of,
};
use crate::utils::{Receiver, TestServer, eventually, test_config};

/// The fleet on one latch on the store under test, with the test's clock: a heartbeat
/// timeout of 5 s and a grace of 10 s; every sensor has reported once, at 0 s.
struct OneNode {
    s: TestServer,
    clock: Clock,
    receivers: Vec<Receiver>,
    fleet: Fleet,
    /// The sensors of the lone and gateway sites that keep reporting.
    keep_alive: Vec<String>,
    _tmp: tempfile::TempDir,
}

impl OneNode {
    async fn start() -> Self {
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
            send_until_accepted(&s, r).await;
        }
        let (lone, gate) = (fleet.site(Place::Lone), fleet.site(Place::Gate));
        let keep_alive = lone.sensors[1..]
            .iter()
            .chain(&gate.sensors[1..])
            .cloned()
            .collect();
        Self {
            s,
            clock,
            receivers,
            fleet,
            keep_alive,
            _tmp: tmp,
        }
    }

    /// `n` seconds on, one at a time: the lone and gateway sites' other sensors report,
    /// and every engine shard has run a round at each second.
    async fn tick(&self, n: u64) {
        for _ in 0..n {
            self.clock.advance(Duration::from_secs(1));
            for r in readings(&self.keep_alive, 1) {
                send_until_accepted(&self.s, r).await;
            }
            self.s.engine_round().await;
        }
    }
}

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
    let one = OneNode::start().await;
    let (s, receivers, fleet) = (&one.s, &one.receivers, &one.fleet);
    let lone = fleet.site(Place::Lone).clone();
    let gate = fleet.site(Place::Gate).clone();
    let tick = |n| one.tick(n);
    // Lost at 5 s; the grace runs to 15 s. At 14 s, all is still held.
    tick(14).await;
    s.dispatcher_round().await;
    for r in receivers {
        assert!(
            r.received().is_empty(),
            "nothing before the grace ran out: {:?}",
            r.received().first().map(|g| &g.body)
        );
    }
    tick(2).await;
    let got = settled(receivers, |c| expected_lost(fleet, c)).await;
    for (c, got) in got.iter().enumerate() {
        check_lost(fleet, c, got);
    }
    // Each site's loss is found by its site, and says which site it is about.
    let client = &fleet.clients[0].0;
    for site in told_sites(fleet, 0) {
        let found = s
            .notifications(&format!("client_id={client}&site_id={}", site.id))
            .await;
        let kinds: Vec<_> = found.iter().map(|n| (&n["type"], &n["site_id"])).collect();
        assert_eq!(kinds, [(&json!("site.connection_lost"), &json!(site.id))]);
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
        send_until_accepted(s, r).await;
    }
    tick(2).await;
    let got = settled(receivers, |c| {
        expected_lost(fleet, c) + expected_restored(fleet, c)
    })
    .await;
    for (c, got) in got.iter().enumerate() {
        check_restored(fleet, c, got);
    }
    // The ones still lost come back on their own: each its own restoration.
    let last: Vec<&String> = fleet.dark().map(|x| &x.sensors[0]).collect();
    for r in readings(last, 1) {
        send_until_accepted(s, r).await;
    }
    tick(2).await;
    let got = settled(receivers, |c| {
        expected_lost(fleet, c) + expected_restored(fleet, c) + firsts(fleet, c).len()
    })
    .await;
    for (c, got) in got.iter().enumerate() {
        let mut own = firsts(fleet, c);
        if fleet.clients[c].1.contains(&lone.sensors[0]) {
            own.push(lone.sensors[0].clone());
        }
        own.sort();
        assert_eq!(
            sensors_of(got, "sensor.connection_restored"),
            own,
            "client {c}"
        );
        check_restored(fleet, c, got);
    }
    for site in [&fleet.sites[0], &gate] {
        let (_, read) = s.get(&format!("/v1/sites/{}", site.id)).await;
        assert_eq!(read["status"]["state"], "up", "{read}");
    }
    // Nothing more comes of it: every notification was made once.
    s.dispatcher_round().await;
    let again: Vec<_> = receivers.iter().map(by_type).collect();
    assert_eq!(again, got, "nothing after the last return");
    one.s.stop().await;
}

/// A maintenance window at the same size: client 3's silence covers the outage, so its
/// sites' losses are made and kept `silenced`, never sent, while the other clients get
/// theirs; at the window's end, the sites still down, client 3 is brought up to date once
/// as the others were: one `site.connection_lost` per site naming its sensors still lost
/// (a building pages once, not once per door), and nothing more in the rounds after.
#[tokio::test]
async fn a_silence_over_a_dark_fleet_holds_its_alarms_and_tells_each_loss_once_at_its_end() {
    let one = OneNode::start().await;
    let (s, receivers, fleet) = (&one.s, &one.receivers, &one.fleet);
    let quiet = 3;
    let client = &fleet.clients[quiet].0;
    let ends = one.clock.now() + 18_000;
    let (code, body) = s
        .post(
            "/v1/silences",
            json!({"match": {"client_id": client}, "ends_at": time::format(ends),
                   "comment": "uplink replaced"}),
        )
        .await;
    assert_eq!(code, StatusCode::CREATED, "{body}");
    let silence = body["id"].as_str().unwrap().to_string();
    one.tick(17).await;
    let others = |c| {
        if c == quiet {
            0
        } else {
            expected_lost(fleet, c)
        }
    };
    let got = settled(receivers, others).await;
    for (c, got) in got.iter().enumerate().filter(|(c, _)| *c != quiet) {
        check_lost(fleet, c, got);
    }
    assert!(got[quiet].is_empty(), "{:?}", got[quiet]);
    let kept = s
        .notifications(&format!("client_id={client}&status=silenced"))
        .await;
    let sites: Vec<&Value> = kept.iter().map(|n| &n["type"]).collect();
    assert_eq!(
        sites,
        vec!["site.connection_lost"; told_sites(fleet, quiet).len()],
        "its sites' losses, kept"
    );

    // Past the end and the settling after it: reconciled.
    one.tick(((ends + SETTLE_MS + 1_500 - one.clock.now()) as u64).div_ceil(1_000))
        .await;
    let n = expected_lost(fleet, quiet);
    let got = settled(receivers, |c| others(c) + if c == quiet { n } else { 0 }).await;
    check_lost(fleet, quiet, &got[quiet]);
    assert_eq!(
        got[quiet].values().map(Vec::len).sum::<usize>(),
        n,
        "nothing but those: {:?}",
        got[quiet].keys()
    );
    one.tick(2).await;
    s.dispatcher_round().await;
    let again: Vec<_> = receivers.iter().map(by_type).collect();
    assert_eq!(again, got, "reconciled once");
    let (_, read) = s.get(&format!("/v1/silences/{silence}")).await;
    assert_eq!(read["state"], "ended", "{read}");
    one.s.stop().await;
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

/// The return of the sites `back` as a cluster decides it, their sensors' readings landing
/// in several group commits (on several nodes): each of them client `c` was told of is
/// back once (and no other site), listing each sensor its loss named once, back or still
/// lost (a dark site's first sensor never came back: still lost); each listed still lost
/// that came back since returns on its own, once, and no other sensor does but the lone
/// one. `None` while a site's return is missing; else the sensors' own returns to expect.
fn returns_split(
    fleet: &Fleet,
    c: usize,
    got: &BTreeMap<String, Vec<Value>>,
    back: &[&Site],
) -> Option<Vec<String>> {
    let restored = once_per_site(got, "site.connection_restored");
    let told: Vec<&Site> = told_sites(fleet, c)
        .into_iter()
        .filter(|x| back.iter().any(|b| b.id == x.id))
        .collect();
    if restored.len() < told.len() {
        return None;
    }
    let unexpected: Vec<&String> = restored
        .keys()
        .filter(|id| !told.iter().any(|x| x.id == **id))
        .collect();
    assert!(
        unexpected.is_empty(),
        "client {c}: returns of sites still down: {unexpected:?}"
    );
    let lone = &fleet.site(Place::Lone).sensors[0];
    let mut own: Vec<String> = fleet.clients[c]
        .1
        .contains(lone)
        .then(|| lone.clone())
        .into_iter()
        .collect();
    for site in told {
        let e = restored[&site.id];
        let (back, still) = (ids(&e["restored"]), ids(&e["still_lost"]));
        let mut listed: Vec<String> = back.iter().chain(&still).cloned().collect();
        listed.sort();
        let named = match site.place {
            Place::Gate => vec![site.sensors[0].clone()],
            _ => fleet.mine(c, site),
        };
        assert_eq!(
            listed, named,
            "client {c}, {}: each named once, back or still lost",
            site.id
        );
        let first = &site.sensors[0];
        if site.place != Place::Gate && named.contains(first) {
            assert!(
                still.contains(first),
                "client {c}, {}: {first} never came back",
                site.id
            );
        }
        own.extend(still.into_iter().filter(|id| id != first));
    }
    own.sort();
    Some(own)
}

/// The same fleet on three `latch` processes, on the wall clock: its 10,000 sensors are
/// spread over the nodes' partitions, and one node is killed (`kill -9`) as the grace
/// runs out, while the nodes' rounds take the sites (which node decides is whichever
/// round comes first, so the one killed is the decider in some runs and holds a third of
/// the held losses in all). Each (client, site) is still told once (a repeat after the
/// kill carries the same `webhook-id`), nothing before the grace, no sensor-level loss of
/// a site's sensor; and the return once per (client, site).
#[tokio::test]
async fn a_cluster_tells_each_site_once_though_a_node_is_killed_as_it_decides() {
    use crate::utils::cluster::{Cluster, post_until_accepted};
    const TIMEOUT_S: u64 = 8;
    const GRACE_S: u64 = 4;
    const RETURNING: usize = 5;
    let receivers: Vec<Receiver> =
        futures::future::join_all((0..CLIENTS).map(|_| Receiver::start())).await;
    let urls: Vec<String> = receivers.iter().map(|r| r.url.clone()).collect();
    let env = [("LATCH_SITE_GRACE", format!("{GRACE_S}s"))];
    let fleet = std::sync::Arc::new(tokio::sync::Mutex::new(Fleet::plan()));
    let prepare = |config| {
        let fleet = fleet.clone();
        let urls = urls.clone();
        async move {
            let timeout = Some(TIMEOUT_S as u32);
            fleet.lock().await.import(&config, &urls, timeout).await;
        }
    };
    let Some(mut c) = Cluster::start_prepared(3, &env, prepare).await else {
        return;
    };
    let fleet = fleet.lock().await;
    let bases = c.live();
    let first_reading = std::time::Instant::now();
    let every: Vec<&String> = fleet.sites.iter().flat_map(|x| &x.sensors).collect();
    for r in readings(every, 1) {
        post_until_accepted(&c.http, &bases, r.as_array().unwrap().clone(), 60).await;
    }
    let read = std::time::Instant::now();
    let (lone, gate) = (fleet.site(Place::Lone), fleet.site(Place::Gate));
    let keep_alive: Vec<String> = lone.sensors[1..]
        .iter()
        .chain(&gate.sensors[1..])
        .cloned()
        .collect();
    let feeding = {
        let (http, bases) = (c.http.clone(), bases.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let r = readings(&keep_alive, 1).remove(0);
                post_until_accepted(&http, &bases, r.as_array().unwrap().clone(), 60).await;
            }
        })
    };
    // Lost from `TIMEOUT_S` after their readings, decided `GRACE_S` after the first loss.
    let due = read + Duration::from_secs(TIMEOUT_S + GRACE_S);
    tokio::time::sleep_until((due + Duration::from_millis(300)).into()).await;
    c.kill9(2);
    let got = settled(&receivers, |c| expected_lost(&fleet, c)).await;
    let grace_out = first_reading + Duration::from_secs(TIMEOUT_S + GRACE_S);
    for (k, r) in receivers.iter().enumerate() {
        let early: Vec<_> = r
            .received()
            .into_iter()
            .filter(|g| g.at < grace_out)
            .collect();
        assert!(
            early.is_empty(),
            "client {k}: before the grace ran out: {:?}",
            early[0].body
        );
        check_lost(&fleet, k, &got[k]);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again: Vec<_> = receivers.iter().map(by_type).collect();
    assert_eq!(again, got, "each told once, and nothing more");
    let live = c.live();
    // A few sites come back (quickly: the rest of the fleet stays lost, and what comes back
    // is lost again a timeout later), but for their first sensors; the gateway and the
    // lone sensor too.
    let sites_back: Vec<&Site> = fleet.dark().take(RETURNING).chain([gate]).collect();
    let back: Vec<&String> = fleet
        .dark()
        .take(RETURNING)
        .flat_map(|x| &x.sensors[1..])
        .chain([&gate.sensors[0], &lone.sensors[0]])
        .collect();
    for r in readings(back.clone(), 0) {
        post_until_accepted(&c.http, &live, r.as_array().unwrap().clone(), 60).await;
    }
    // Kept alive from then on, so a slow machine does not see them lost a second time.
    let feeding_back = {
        let (http, live) = (c.http.clone(), live.clone());
        let back: Vec<String> = back.into_iter().cloned().collect();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                for r in readings(&back, 0) {
                    post_until_accepted(&http, &live, r.as_array().unwrap().clone(), 60).await;
                }
            }
        })
    };
    for (k, r) in receivers.iter().enumerate() {
        eventually(60, &format!("client {k}'s returns"), || async {
            let got = by_type(r);
            let own = returns_split(&fleet, k, &got, &sites_back)?;
            (sensors_of(&got, "sensor.connection_restored").len() >= own.len()).then_some(())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (k, r) in receivers.iter().enumerate() {
        let got = by_type(r);
        check_lost(&fleet, k, &got);
        let own = returns_split(&fleet, k, &got, &sites_back).unwrap();
        assert_eq!(
            sensors_of(&got, "sensor.connection_restored"),
            own,
            "client {k}: own returns"
        );
    }
    let site = &fleet.sites[0].id;
    let read = c.get(&live[0], &format!("/v1/sites/{site}")).await;
    assert_eq!(read["status"]["state"], "up", "{read}");
    assert!(
        !feeding.is_finished(),
        "the lone and gateway sites' feed kept up"
    );
    feeding.abort();
    feeding_back.abort();
}
