//! Cluster mode through real `latch serve` processes on one PostgreSQL schema: readings
//! entering any node give what one node gives, and a node killed, paused past its lease,
//! stopped or joining under load loses nothing accepted, commits nothing for partitions it
//! lost, and leaves the notifications in order; dead letters replayed through any node go
//! out at once.

use std::time::{Duration, Instant};

use latch::domain::time;
use serde_json::{Value, json};

use crate::utils::cluster::{
    Cluster, LEASE, Load, Outcome, PARTITIONS, Sent, check_consistent, post_readings,
    post_until_accepted, reading, value,
};
use crate::utils::{Receiver, eventually};

#[tokio::test]
async fn readings_through_every_node_give_what_one_node_gives() {
    let Some(c) = Cluster::start(3).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("a", 60, &r.url, json!({})).await;
    let live = c.live();
    let base = time::now_ms() - 3_600_000;
    let mut sent = Sent::new();
    let mut requests = 0;
    // Twenty rounds, one reading per sensor each, ten to a request, each request to the
    // next node; the round after starts once this one is in.
    for round in 0..20 {
        let readings: Vec<Value> = sensors
            .iter()
            .enumerate()
            .map(|(i, id)| reading(id, value(i, round), base + round as i64 * 1000))
            .collect();
        for chunk in readings.chunks(10) {
            let target = &live[requests % live.len()];
            requests += 1;
            // Nothing moves in a steady cluster: every reading goes in at the first try.
            let out = post_readings(&c.http, target, chunk).await;
            assert!(
                out.iter().all(|o| *o == Outcome::Accepted),
                "refused by {target}: {out:?}"
            );
        }
        for (i, id) in sensors.iter().enumerate() {
            sent.entry(id.clone())
                .or_default()
                .push((base + round as i64 * 1000, value(i, round)));
        }
    }
    for via in &live {
        check_consistent(&c, via, &client, &sent, &r).await;
    }
    // Two readings in three entered a node that does not own their partition.
    assert!(c.metric("latch_cluster_forwarded_readings_total").await > 0.0);
    assert_eq!(
        c.metric("latch_cluster_partitions_owned").await,
        f64::from(PARTITIONS)
    );
}

#[tokio::test]
async fn a_sensor_registered_through_one_node_takes_readings_through_every_node_at_once() {
    // Right as the partitions are spread: readings of a partition still being taken up may
    // be refused with `store_unavailable` (sent again here), but a registered sensor is
    // never unknown.
    let Some(c) = Cluster::start_spread(3, &[]).await else {
        return;
    };
    let live = c.live();
    let mut refused = Vec::new();
    for i in 0..30 {
        let id = crate::utils::unique("r");
        let made = &live[i % 3];
        c.post(made, "/v1/sensors", json!({"id": id, "address": "a"}))
            .await;
        for k in 1..3 {
            let via = &live[(i + k) % 3];
            let one = [json!({"sensor_id": id, "data": k % 2})];
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let (status, body) = post_raw(&c, via, &one).await;
                if body["accepted"] == 1 {
                    break;
                }
                let moving = status == 503 || body["rejected"][0]["code"] == "store_unavailable";
                if !moving || Instant::now() > deadline {
                    refused.push(format!(
                        "{id} made on {made}, then to {via} at {}: {status} {body}",
                        time::format(time::now_ms())
                    ));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        refused.is_empty(),
        "refused right after registration:\n{}",
        refused.join("\n")
    );
}

/// Sessions of the test database idle in a transaction, with their last statement: a
/// paused node's, if it was paused inside one.
async fn open_transactions() -> Vec<String> {
    let base = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let Ok((client, conn)) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await else {
        return Vec::new();
    };
    tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT extract(epoch FROM now() - state_change)::float8, left(query, 160) \
             FROM pg_stat_activity WHERE state = 'idle in transaction'",
            &[],
        )
        .await
        .unwrap_or_default();
    rows.iter()
        .map(|r| format!("{:.1}s: {}", r.get::<_, f64>(0), r.get::<_, String>(1)))
        .collect()
}

/// Posts readings and returns the answer as it is.
async fn post_raw(c: &Cluster, base: &str, readings: &[Value]) -> (u16, Value) {
    let resp = c
        .http
        .post(format!("{base}/v1/readings"))
        .json(&readings)
        .send()
        .await
        .unwrap();
    (
        resp.status().as_u16(),
        resp.json().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_killed_nodes_partitions_move_and_nothing_accepted_is_lost() {
    let Some(mut c) = Cluster::start(3).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("k", 30, &r.url, json!({})).await;
    let load = Load::start(c.http.clone(), sensors, c.live());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let takeovers = c
        .node_metric(c.base(0), "latch_cluster_takeovers_total")
        .await
        + c.node_metric(c.base(1), "latch_cluster_takeovers_total")
            .await;

    let killed = Instant::now();
    eprintln!("kill -9 {} at {}", c.base(2), time::format(time::now_ms()));
    c.kill9(2);
    *load.targets.lock().unwrap() = c.live();
    let limit = LEASE + Duration::from_secs(5);
    c.balanced(2, limit.as_secs()).await;
    eprintln!(
        "partitions owned again {:?} after kill -9",
        killed.elapsed()
    );
    assert!(
        c.metric("latch_cluster_takeovers_total").await > takeovers,
        "the survivors count their takeovers"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (sent, rounds) = load.stop().await;
    assert!(rounds > 2, "the producer kept going: {rounds} rounds");
    check_consistent(&c, c.base(0), &client, &sent, &r).await;
}

#[tokio::test]
async fn a_node_paused_past_its_lease_commits_nothing_for_what_it_lost() {
    let Some(c) = Cluster::start(3).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("p", 30, &r.url, json!({})).await;
    // Probes: 32 more sensors, so the paused node's partitions hold some.
    let probe_r = Receiver::start().await;
    let (probe_client, probes) = c.fleet("q", 32, &probe_r.url, json!({})).await;
    let (n0, n1, n2) = (
        c.base(0).to_string(),
        c.base(1).to_string(),
        c.base(2).to_string(),
    );
    let others = vec![n0.clone(), n1.clone()];
    let base = time::now_ms() - 3_600_000;
    let probe_round = |data: u8, k: i64| -> Vec<Value> {
        probes
            .iter()
            .map(|id| reading(id, data, base + k * 1000))
            .collect()
    };
    post_until_accepted(&c.http, &c.live(), probe_round(0, 0), 20).await;
    let load = Load::start(c.http.clone(), sensors, c.live());
    tokio::time::sleep(Duration::from_secs(1)).await;

    let paused = Instant::now();
    c.pause(2);
    // The other two see it gone and hold every partition.
    let deadline = paused + LEASE + Duration::from_secs(5);
    loop {
        let v = c.view(&n0).await.unwrap_or(Value::Null);
        let held: u64 = v["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| n["address"] != n2.as_str())
            .filter_map(|n| n["partitions"].as_u64())
            .sum();
        if held == u64::from(PARTITIONS) {
            break;
        }
        if Instant::now() > deadline {
            // How late, for the report: keep looking a while.
            let mut last = v.clone();
            while paused.elapsed() < Duration::from_secs(30) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                last = c.view(&n0).await.unwrap_or(Value::Null);
                let held: u64 = last["nodes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|n| n["address"] != n2.as_str())
                    .filter_map(|n| n["partitions"].as_u64())
                    .sum();
                if held == u64::from(PARTITIONS) {
                    break;
                }
            }
            panic!(
                "the paused node's partitions were not all held by the others within lease + \
                 5 s; at lease + 5 s: {v:#}; {:?} after the pause: {last:#}; open transactions: \
                 {:#?}",
                paused.elapsed(),
                open_transactions().await
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The new owners apply 1; then the paused node is sent 0, a second later. It answers
    // once resumed, and must not commit it on the state it still remembers (0: no change).
    post_until_accepted(&c.http, &others, probe_round(1, 1), 20).await;
    let stale = {
        let (http, body, n2) = (c.http.clone(), probe_round(0, 2), n2.clone());
        tokio::spawn(async move { post_readings(&http, &n2, &body).await })
    };
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(paused.elapsed())).await;
    c.resume(2);
    let out = stale.await.unwrap();
    let again: Vec<Value> = probe_round(0, 2)
        .into_iter()
        .zip(out)
        .filter(|(_, o)| *o == Outcome::Again)
        .map(|(r, _)| r)
        .collect();
    post_until_accepted(&c.http, &others, again, 20).await;

    // It rejoins, and the partitions spread over three again.
    c.balanced(3, 20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (sent, _) = load.stop().await;
    check_consistent(&c, &n1, &client, &sent, &r).await;
    let mut probe_sent = Sent::new();
    for id in &probes {
        probe_sent.insert(
            id.clone(),
            vec![(base, 0), (base + 1000, 1), (base + 2000, 0)],
        );
    }
    check_consistent(&c, &n0, &probe_client, &probe_sent, &probe_r).await;
}

#[tokio::test]
async fn a_node_joining_under_load_takes_its_share() {
    let Some(mut c) = Cluster::start(2).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("j", 30, &r.url, json!({})).await;
    let load = Load::start(c.http.clone(), sensors, c.live());
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.add().await;
    *load.targets.lock().unwrap() = c.live();
    c.balanced(3, 20).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (sent, _) = load.stop().await;
    check_consistent(&c, c.base(2), &client, &sent, &r).await;
}

#[tokio::test]
async fn a_node_stopped_with_sigterm_hands_its_partitions_over_at_once() {
    // A lease far longer than the wait below: only a handover, not an expiry, fits.
    let Some(mut c) = Cluster::start_env(3, &[("LATCH_CLUSTER_LEASE", "30s".into())]).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("t", 30, &r.url, json!({})).await;
    let load = Load::start(c.http.clone(), sensors, vec![c.base(0).to_string()]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(c.terminate(2).await, "a stopped node exits cleanly");
    c.balanced(2, 10).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (sent, _) = load.stop().await;
    check_consistent(&c, c.base(1), &client, &sent, &r).await;
}

#[tokio::test]
async fn a_silent_sensor_whose_owner_dies_is_lost_once() {
    let Some(mut c) = Cluster::start(3).await else {
        return;
    };
    let r = Receiver::start().await;
    let timeout_s: u32 = 4;
    let (_, ids) = c
        .fleet("s", 2, &r.url, json!({"heartbeat_timeout_s": timeout_s}))
        .await;
    let (silent, talking) = (ids[0].clone(), ids[1].clone());
    let owner = c.owner_of(&silent, 1).await;
    let survivors: Vec<String> = c
        .live()
        .into_iter()
        .filter(|b| b != c.base(owner))
        .collect();
    // The other sensor reports every half second throughout, through the survivors.
    let talk = {
        let (http, targets, id) = (c.http.clone(), survivors.clone(), talking.clone());
        tokio::spawn(async move {
            for k in 0..40 {
                let one = vec![json!({"sensor_id": id, "data": k % 2})];
                post_until_accepted(&http, &targets, one, 20).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = time::now_ms();
    c.kill9(owner);
    let via = survivors[0].clone();
    eventually(
        LEASE.as_secs() + 15 + u64::from(timeout_s),
        "the silent sensor lost",
        || async {
            let ev = c.get(&via, &format!("/v1/sensors/{silent}/events")).await;
            ev["items"]
                .as_array()?
                .iter()
                .any(|e| e["type"] == "sensor.connection_lost")
                .then_some(())
        },
    )
    .await;
    talk.await.unwrap();

    let ev = c.get(&via, &format!("/v1/sensors/{silent}/events")).await;
    let lost: Vec<&Value> = ev["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "sensor.connection_lost")
        .collect();
    assert_eq!(lost.len(), 1, "lost once across the cluster: {ev}");
    // Its deadline counts from the takeover, which came after the kill.
    let at = time::parse(lost[0]["at"].as_str().unwrap()).unwrap();
    assert!(
        at >= killed_at + i64::from(timeout_s) * 1000 - 250,
        "lost at {at}, before kill + timeout ({killed_at} + {timeout_s}s)"
    );
    let ev = c.get(&via, &format!("/v1/sensors/{talking}/events")).await;
    assert!(
        !ev["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["type"] == "sensor.connection_lost"),
        "a sensor that kept reporting is never lost: {ev}"
    );
    let lost_sent: std::collections::HashSet<String> = r
        .received()
        .iter()
        .filter(|g| g.body["type"] == "sensor.connection_lost")
        .map(|g| {
            assert_eq!(g.body["sensor"]["id"], silent.as_str(), "{}", g.body);
            g.body["id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(lost_sent.len(), 1, "one connection_lost notification");
}

#[test]
fn cluster_settings_are_refused_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_latch"))
        .arg("serve")
        .env_remove("LATCH_DATABASE_URL")
        .env("LATCH_DATA_DIR", dir.path())
        .env("LATCH_LISTEN", "127.0.0.1:0")
        .env("LATCH_CLUSTER_LEASE", "5s")
        .output()
        .expect("latch runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "latch started on SQLite with a lease"
    );
    assert!(
        stderr.contains("cluster_lease"),
        "names the setting: {stderr}"
    );
}

/// A client's `rate_limit` is the cluster's, not each node's: its sensors spread over
/// three nodes, each with a backlog of its changes, and it receives no more than its limit.
///
/// Over 10 s rather than a minute: the slots the nodes lease are one schedule, so any
/// window of W seconds holds at most W × rate of them (one more at its edge), and the bound
/// — 55/s, 10 % over the limit — scales with the window; paced per node, three nodes sent
/// about three times the limit in any window of a second or more.
#[tokio::test]
async fn a_clients_rate_limit_holds_for_the_whole_cluster() {
    const LIMIT: usize = 50;
    const WINDOW: Duration = Duration::from_secs(10);
    let Some(c) = Cluster::start(3).await else {
        return;
    };
    let r = Receiver::start().await;
    let (client, sensors) = c.fleet("r", 150, &r.url, json!({})).await;
    let limited = json!({"name": "c", "url": r.url, "rate_limit": LIMIT});
    let resp = c
        .http
        .put(format!("{}/v1/clients/{client}", c.base(1)))
        .json(&limited)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    // Every sensor changes twice a second, through each node in turn: far more than the
    // limit, on every node (150 sensors over 16 partitions over three nodes).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let (http, live, stop) = (c.http.clone(), c.live(), stop.clone());
        tokio::spawn(async move {
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let readings: Vec<Value> = sensors
                    .iter()
                    .map(|id| json!({"sensor_id": id, "data": round % 2}))
                    .collect();
                post_readings(&http, &live[round % live.len()], &readings).await;
                round += 1;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let first = eventually(30, "the first webhook", || async {
        r.received().first().map(|g| g.at)
    })
    .await;
    tokio::time::sleep_until((first + WINDOW).into()).await;
    let received = r
        .received()
        .iter()
        .filter(|g| g.at < first + WINDOW)
        .count();
    let pending = c.get(c.base(0), "/v1/fleet").await["notifications_pending"].clone();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    producer.await.unwrap();
    let most = LIMIT * 11 / 10 * WINDOW.as_secs() as usize;
    assert!(
        received <= most,
        "{received} webhooks in {WINDOW:?}: more than {most} ({LIMIT}/s + 10 %)"
    );
    // The limit, not a want of work, held them back.
    assert!(pending.as_u64() > Some(0), "a backlog was left: {pending}");
}

/// Dead letters replayed through one node go out at once, also those of sensors another
/// node serves: the node that took the replay sends them itself (its claims keep their
/// lanes in order), rather than leaving them to the serving node's next full sweep of the
/// outbox (a minute).
#[tokio::test]
async fn dead_letters_replayed_through_any_node_go_out_at_once() {
    let Some(c) = Cluster::start_env(2, &[("LATCH_RETRY_MAX_ATTEMPTS", "1".to_string())]).await
    else {
        return;
    };
    let r = Receiver::start().await;
    r.always(latch_testkit::Answer::status(500));
    // Eight sensors: the second node serves some of them, but for one chance in 256.
    let (client, sensors) = c.fleet("dl", 8, &r.url, json!({})).await;
    let live = c.live();
    let now = time::now_ms();
    let readings = sensors.iter().map(|id| reading(id, 1, now)).collect();
    post_until_accepted(&c.http, &live, readings, 20).await;
    let query = format!("/v1/notifications?client_id={client}&status=failed");
    let failed: Vec<String> = eventually(20, "every first notification a dead letter", || async {
        let page = c.get(&live[0], &query).await;
        let ids: Vec<String> = page["items"]
            .as_array()?
            .iter()
            .filter_map(|n| n["id"].as_str().map(str::to_string))
            .collect();
        (ids.len() == sensors.len()).then_some(ids)
    })
    .await;
    r.always(latch_testkit::Answer::status(204));
    let before = r.ok();
    for id in &failed {
        c.post(
            &live[0],
            &format!("/v1/notifications/{id}/retry"),
            json!({}),
        )
        .await;
    }
    // Within a few seconds, not at a sweep a minute after the nodes started.
    eventually(10, "every replayed dead letter delivered", || async {
        (r.ok() - before == failed.len() as u64).then_some(())
    })
    .await;
    assert_eq!(r.duplicates(), 0, "a replayed dead letter went out twice");
    // The receiver counts a 2xx before latch has written it down: the other node lists
    // them delivered once that write is done.
    let delivered = format!("/v1/notifications?client_id={client}&status=delivered");
    eventually(
        10,
        "every replayed dead letter listed delivered by the other node",
        || async {
            let page = c.get(&live[1], &delivered).await;
            (page["items"].as_array()?.len() == failed.len()).then_some(())
        },
    )
    .await;
}
