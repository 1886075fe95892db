//! Tests of what is particular to the PostgreSQL store; the conformance suite covers the
//! rest.

use super::*;
use crate::store::prelude::*;

/// The test database (`TEST_DATABASE_URL`, else the local one).
pub(crate) fn base_url() -> String {
    std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// `base` with its `search_path` set to `schema`.
pub(crate) fn schema_url(base: &str, schema: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}options=-c%20search_path%3D{schema}")
}

/// A fresh, empty schema of the test database, or `None` (outside CI) without one.
pub(crate) async fn fresh_schema() -> Option<String> {
    let base = base_url();
    let schema = format!("latch_t_{}", ulid::Ulid::new().to_string().to_lowercase());
    let admin = match tokio_postgres::connect(&base, tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(conn);
            client
        }
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
                panic!("PostgreSQL is required in CI and not reachable: {e}");
            }
            eprintln!("SKIPPED: PostgreSQL not reachable ({e}); CI runs this test.");
            return None;
        }
    };
    admin
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .unwrap();
    Some(schema)
}

/// A store on a fresh schema of the test database, or `None` (outside CI) without one.
pub(crate) async fn fresh() -> Option<(PgStore, String)> {
    let schema = fresh_schema().await?;
    let url = schema_url(&base_url(), &schema);
    Some((
        PgStore::connect(&url, Duration::from_secs(5))
            .await
            .unwrap()
            .keyed(test_keys())
            .await
            .unwrap(),
        schema,
    ))
}

/// The key the backend's tests seal clients' secrets with.
pub(crate) fn test_keys() -> std::sync::Arc<crate::secrets::Keyring> {
    std::sync::Arc::new(crate::secrets::Keyring::with_keys(&[[42u8; 32]]))
}

#[tokio::test]
async fn errors_carry_the_servers_message_and_sqlstate() {
    let Some((store, _)) = fresh().await else {
        return;
    };
    let c = store.db.unbounded().await.unwrap();
    let e = c
        .execute("INSERT INTO no_such_table VALUES (1)", &[])
        .await
        .unwrap_err();
    let shown = Error::from(e).to_string();
    assert!(shown.contains("SQLSTATE 42P01"), "{shown}");
    assert!(shown.contains("no_such_table"), "{shown}");
}

#[test]
fn urls_asking_for_tls_are_refused_not_sent_in_plaintext() {
    let t = Duration::from_secs(5);
    for mode in ["require", "verify-ca", "verify-full"] {
        let err = settings(&format!("postgres://u@db/x?sslmode={mode}"), t, t)
            .unwrap_err()
            .to_string();
        assert!(err.contains("database_url") && err.contains("TLS"), "{err}");
    }
    for url in [
        "postgres://u@db/x",
        "postgres://u@db/x?sslmode=disable",
        "postgres://u@db/x?sslmode=prefer",
        "postgresql://u@db/x?application_name=a&sslmode=allow",
    ] {
        let pg = settings(url, t, t).unwrap();
        assert_eq!(
            pg.get_ssl_mode(),
            tokio_postgres::config::SslMode::Disable,
            "{url}"
        );
        assert_eq!(pg.get_connect_timeout(), Some(&t));
        assert!(pg.get_keepalives());
    }
}

/// A transaction left idle (its process stopped mid-commit) is ended by the server, so
/// the lease rows a commit's fence locks never outlive the lease.
#[tokio::test]
async fn a_transaction_left_idle_is_ended_by_the_server() {
    let Some((_, schema)) = fresh().await else {
        return;
    };
    let url = format!(
        "{}{}options=-c%20search_path%3D{schema}",
        base_url(),
        if base_url().contains('?') { '&' } else { '?' }
    );
    let store = PgStore::connect_with(&url, Duration::from_secs(5), Duration::from_millis(300))
        .await
        .unwrap();
    let mut c = store.db.unbounded().await.unwrap();
    let path: String = c.query_one("SHOW search_path", &[]).await.unwrap().get(0);
    assert_eq!(path, schema, "the URL's own options are kept");
    let tx = c.transaction().await.unwrap();
    tx.execute("SELECT 1", &[]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let err = tx.execute("SELECT 1", &[]).await.unwrap_err();
    assert!(
        err.is_closed() || Error::from(err).to_string().contains("25P03"),
        "the server ended the idle transaction"
    );
}

/// Whether `schema` has the table `name`.
async fn has_table(store: &PgStore, schema: &str, name: &str) -> bool {
    let c = store.db.unbounded().await.unwrap();
    c.query_one(
        "SELECT to_regclass(format('%I.%I', $1::text, $2::text)) IS NOT NULL",
        &[&schema, &name],
    )
    .await
    .unwrap()
    .get(0)
}

/// `maintain` on the served store creates partitions beyond the start's reach.
#[tokio::test]
async fn upkeep_creates_the_partitions_of_months_the_start_did_not_reach() {
    use chrono::{Datelike, TimeZone, Utc};
    let Some((store, schema)) = fresh().await else {
        return;
    };
    store.migrate().await.unwrap();
    // Two months past the last one the start created: a node running that long.
    let now = Utc::now();
    let month0 = now.year() * 12 + now.month0() as i32 + MONTHS_AHEAD + 2;
    let (year, month) = (month0.div_euclid(12), month0.rem_euclid(12) as u32 + 1);
    let then = Utc
        .with_ymd_and_hms(year, month, 15, 0, 0, 0)
        .single()
        .unwrap()
        .timestamp_millis();
    let name = format!("{year:04}_{month:02}");
    for table in ["readings", "events"] {
        let part = format!("{table}_{name}");
        assert!(!has_table(&store, &schema, &part).await, "{part} before");
    }
    // Through the store as a server opens it: upkeep must reach PostgreSQL whatever the
    // wiring puts around the backend (a wrapper once forwarded every call but this one).
    let dir = tempfile::tempdir().unwrap();
    let mut config = crate::config::Config::load_from(None, &[]).unwrap();
    config.data_dir = dir.path().to_path_buf();
    config.database_url = Some(schema_url(&base_url(), &schema));
    // The key `fresh` sealed with: a node of this database is given it.
    config.secret_key = Some(crate::secrets::SecretKeys(vec![[42u8; 32]]));
    let served = crate::store::connect(&config).await.unwrap();
    served.maintain(then, Retention::default()).await.unwrap();
    served.maintain(then, Retention::default()).await.unwrap();
    for table in ["readings", "events"] {
        let part = format!("{table}_{name}");
        assert!(
            has_table(&store, &schema, &part).await,
            "{part} after upkeep"
        );
    }
}

#[tokio::test]
async fn migrations_are_idempotent_and_partitions_exist() {
    let Some((store, schema)) = fresh().await else {
        return;
    };
    store.migrate().await.unwrap();
    store.migrate().await.unwrap();
    let c = store.db.unbounded().await.unwrap();
    let n: i64 = c
        .query_one(
            "SELECT COUNT(*) FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent \
             JOIN pg_namespace ns ON ns.oid = p.relnamespace \
             WHERE p.relname = 'readings' AND ns.nspname = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        n >= (MONTHS_AHEAD + 2) as i64,
        "monthly partitions and the default: {n}"
    );
    let v: i32 = c
        .query_one("SELECT MAX(version) FROM latch_migrations", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(v as usize, MIGRATIONS.len());
}

/// A fresh schema brought back to `version`: its tables go, the first `version`
/// migrations return. A connection to it and its URL, or `None` (outside CI) without a
/// database.
pub(crate) async fn schema_at(version: usize) -> Option<(tokio_postgres::Client, String)> {
    let (_, schema) = fresh().await?;
    let url = schema_url(&base_url(), &schema);
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    c.batch_execute(&format!(
        "DROP SCHEMA {schema} CASCADE; CREATE SCHEMA {schema}; \
         CREATE TABLE latch_migrations (version INTEGER PRIMARY KEY, \
         applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    ))
    .await
    .unwrap();
    for (i, sql) in MIGRATIONS[..version].iter().enumerate() {
        c.batch_execute(sql).await.unwrap();
        c.execute(
            "INSERT INTO latch_migrations (version) VALUES ($1)",
            &[&(i as i32 + 1)],
        )
        .await
        .unwrap();
    }
    Some((c, url))
}

/// Sensors registered before cluster mode get their hash when the column is added, so a
/// node loads them by partition like new ones.
#[tokio::test]
async fn a_version_5_database_gains_the_hash_of_its_sensors() {
    let Some((c, url)) = schema_at(5).await else {
        return;
    };
    c.execute(
        "INSERT INTO sensors (id, address, created_at) VALUES ('old1', 'here', 1)",
        &[],
    )
    .await
    .unwrap();

    PgStore::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let hash: i64 = c
        .query_one("SELECT hash FROM sensors WHERE id = 'old1'", &[])
        .await
        .unwrap()
        .get(0);
    let id = crate::domain::SensorId::parse("old1").unwrap();
    assert_eq!(hash, crate::domain::partition::hash32(id) as i64);
}

/// Two nodes' lanes may each hold part of one (client, sensor) lane around a takeover:
/// the claim keeps the order the lanes alone keep on one node.
#[tokio::test]
async fn claims_keep_a_lanes_order_across_nodes() {
    use crate::domain::{Claim, Outcome, Status, Verdict};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, schema)) = fresh().await else {
        return;
    };
    s.create_sensor(sensor("ord1")).await.unwrap();
    s.create_client(client("ord-c", "http://a/")).await.unwrap();
    s.link("ord-c".into(), sensor("ord1").id, 1).await.unwrap();
    let n1 = s
        .commit(change("ord1", true, None, 1_000), 1_000)
        .await
        .unwrap()[0]
        .clone();
    // Node A sends the first state (its lease runs to 90 s) when the sensor's partition
    // moves to node B, which commits the next state: the first, leased, is not superseded.
    let claimed = s
        .claim(vec![n1.id.clone()], "a".into(), 1_000, 90_000, None)
        .await
        .unwrap();
    assert!(matches!(claimed[0], Claim::Send(_)));
    let n2 = s
        .commit(change("ord1", false, Some(true), 2_000), 2_000)
        .await
        .unwrap()[0]
        .clone();

    // B waits for A's attempt rather than overtake it, asking again within a second (not
    // at the end of A's lease), so it goes on as soon as A records the outcome…
    match &s
        .claim(vec![n2.id.clone()], "b".into(), 2_000, 60_000, None)
        .await
        .unwrap()[0]
    {
        Claim::Later { at, .. } => assert_eq!(*at, 2_000 + crate::domain::policy::RECHECK_MS),
        other => panic!("expected to wait behind A's attempt: {other:?}"),
    }
    // …while A's own lane, which holds both in order, goes on.
    assert!(matches!(
        s.claim(vec![n2.id.clone()], "a".into(), 2_000, 60_000, None)
            .await
            .unwrap()[0],
        Claim::Send(_)
    ));
    let delivered = |n: &crate::domain::NotificationRef| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: None,
        attempts: 1,
        verdict: Verdict::Delivered,
        node: "a".into(),
        batch_id: None,
    };
    s.record(vec![delivered(&n2)], 3_000, i64::MAX / 2)
        .await
        .unwrap();
    // A died before recording the first: once its lease ran out (by the database's
    // clock, which judges leases: moved here by hand), the older state is superseded,
    // never sent after the newer one the client has.
    let (admin, conn) =
        tokio_postgres::connect(&schema_url(&base_url(), &schema), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(conn);
    admin
        .execute(
            "UPDATE notifications SET lease_until = lease_until - 90000 WHERE id = $1",
            &[&n1.id],
        )
        .await
        .unwrap();
    match &s
        .claim(vec![n1.id.clone()], "b".into(), 95_000, 150_000, None)
        .await
        .unwrap()[0]
    {
        Claim::Done { status, .. } => assert_eq!(*status, Status::Superseded),
        other => panic!("expected superseded: {other:?}"),
    }
    let (n, _) = s.get_notification(n1.id.clone()).await.unwrap().unwrap();
    assert_eq!(n.status, Status::Superseded);
}

/// Outbox leases are judged by the database's clock, as partition leases are: a node
/// whose clock runs ahead (by more than the lease, here a minute) does not take over a
/// notification whose attempt another node has in flight, nor supersede it.
#[tokio::test]
async fn a_node_whose_clock_runs_ahead_leaves_a_live_lease_alone() {
    use crate::domain::{Claim, Outcome, Status, Verdict, time::now_ms};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, _)) = fresh().await else {
        return;
    };
    s.create_sensor(sensor("sk1")).await.unwrap();
    s.create_client(client("sk-c", "http://a/")).await.unwrap();
    s.link("sk-c".into(), sensor("sk1").id, 1).await.unwrap();
    let now = now_ms();
    let n = s.commit(change("sk1", true, None, now), now).await.unwrap()[0].clone();
    // Node A sends it: its lease runs 35 s.
    let lease = 35_000;
    let claimed = s
        .claim(vec![n.id.clone()], "a".into(), now, now + lease, None)
        .await
        .unwrap();
    assert!(matches!(claimed[0], Claim::Send(_)));
    // Node B, its clock a minute ahead: by that clock A's lease ran out long ago.
    let ahead = now + 60_000;
    let by_b = s
        .claim(vec![n.id.clone()], "b".into(), ahead, ahead + lease, None)
        .await
        .unwrap();
    assert!(
        matches!(by_b[0], Claim::Leased { .. }),
        "B takes over an attempt in flight: {:?}",
        by_b[0]
    );
    // B's failed attempt (or a head its lane dropped) is not written over A's.
    let failed = Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: None,
        attempts: 0,
        verdict: Verdict::Superseded,
        node: "b".into(),
        batch_id: None,
    };
    s.record(vec![failed], ahead, i64::MAX / 2).await.unwrap();
    let (stored, _) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(
        stored.status,
        Status::Pending,
        "A's attempt is the one kept"
    );
    // Nor does a newer state B commits supersede it while A's attempt is out.
    s.commit(change("sk1", false, Some(true), ahead), ahead)
        .await
        .unwrap();
    let (stored, _) = s.get_notification(n.id.clone()).await.unwrap().unwrap();
    assert_eq!(stored.status, Status::Pending, "in flight: not superseded");
}

/// Fails unless `notifications_pending` lists exactly the pending notifications.
async fn assert_pending_listed(s: &PgStore, step: &str) {
    let c = s.db.unbounded().await.unwrap();
    let odd: i64 = c
        .query_one(
            "SELECT count(*) FROM notifications_pending p FULL JOIN \
             (SELECT seq FROM notifications WHERE status = 'pending') n USING (seq) \
             WHERE p.seq IS NULL OR n.seq IS NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        odd, 0,
        "after {step}: the list differs from the pending notifications"
    );
}

/// Every change of status into or out of pending keeps `notifications_pending` — which
/// claims, the commit's supersede and a restart read — the same as the outbox.
#[tokio::test]
async fn the_pending_list_follows_every_change_of_status() {
    use crate::domain::{Claim, Outcome, Status, Verdict};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, _)) = fresh().await else {
        return;
    };
    for id in ["pl1", "pl2"] {
        s.create_sensor(sensor(id)).await.unwrap();
    }
    for c in ["pl-a", "pl-b"] {
        s.create_client(client(c, "http://a/")).await.unwrap();
        for id in ["pl1", "pl2"] {
            s.link(c.into(), sensor(id).id, 1).await.unwrap();
        }
    }
    let outcome = |n: &crate::domain::NotificationRef, verdict| Outcome {
        notification_id: n.id.clone(),
        client_id: n.client_id.clone(),
        attempt: None,
        attempts: 1,
        verdict,
        node: "n".into(),
        batch_id: None,
    };
    let ids = |ns: &[crate::domain::NotificationRef]| ns.iter().map(|n| n.id.clone()).collect();

    let first = s
        .commit(change("pl1", true, None, 1_000), 1_000)
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    assert_pending_listed(&s, "a commit").await;
    let second = s
        .commit(change("pl1", false, Some(true), 2_000), 2_000)
        .await
        .unwrap();
    assert_pending_listed(&s, "a supersede").await;
    assert_eq!(
        s.count_pending().await.unwrap(),
        2,
        "the first two superseded"
    );

    // A retry stays listed; delivered leaves.
    s.claim(ids(&second), "n".into(), 3_000, 60_000, None)
        .await
        .unwrap();
    s.record(
        vec![
            outcome(&second[0], Verdict::Retry { next_at: 4_000 }),
            outcome(&second[1], Verdict::Delivered),
        ],
        3_000,
        i64::MAX / 2,
    )
    .await
    .unwrap();
    assert_pending_listed(&s, "a retry and a delivery").await;
    assert_eq!(s.count_pending().await.unwrap(), 1);
    // Failed leaves; a replay brings it back.
    s.claim(vec![second[0].id.clone()], "n".into(), 4_000, 60_000, None)
        .await
        .unwrap();
    s.record(
        vec![outcome(&second[0], Verdict::Failed)],
        4_000,
        i64::MAX / 2,
    )
    .await
    .unwrap();
    assert_pending_listed(&s, "a failure").await;
    assert_eq!(s.count_pending().await.unwrap(), 0);
    s.retry_notification(second[0].id.clone(), 5_000)
        .await
        .unwrap();
    assert_pending_listed(&s, "a replay").await;
    let back = s.load_pending(0).await.unwrap();
    assert_eq!(ids(&back), vec![second[0].id.clone()] as Vec<String>);
    // A claim cancels it once its client no longer owns the sensor.
    s.unlink(second[0].client_id.clone(), sensor("pl1").id)
        .await
        .unwrap();
    let done = s
        .claim(vec![second[0].id.clone()], "n".into(), 6_000, 60_000, None)
        .await
        .unwrap();
    assert!(
        matches!(
            &done[0],
            Claim::Done {
                status: Status::Cancelled,
                ..
            }
        ),
        "{done:?}"
    );
    assert_pending_listed(&s, "a cancelled claim").await;
    // Deleting a client, then a sensor, cancels theirs.
    let third = s
        .commit(change("pl2", true, None, 7_000), 7_000)
        .await
        .unwrap();
    assert_eq!(third.len(), 2);
    s.delete_client("pl-b".into(), 8_000).await.unwrap();
    assert_pending_listed(&s, "a client's delete").await;
    assert_eq!(s.count_pending().await.unwrap(), 1);
    s.delete_sensor(sensor("pl2").id, 9_000).await.unwrap();
    assert_pending_listed(&s, "a sensor's delete").await;
    assert_eq!(s.count_pending().await.unwrap(), 0);
}

/// A database of schema v10 keeps its pending notifications through the move to their
/// own list: they are loaded and counted after the upgrade, the finished ones are not.
#[tokio::test]
async fn a_version_10_outbox_lists_its_pending_notifications() {
    let Some((c, url)) = schema_at(10).await else {
        return;
    };
    for (id, status) in [("old-pending", "pending"), ("old-done", "delivered")] {
        c.execute(
            "INSERT INTO notifications (id, client_id, sensor_id, kind, data, occurred_at, \
             status, next_attempt_at, created_at, updated_at) \
             VALUES ($1, 'c1', 's1', 'sensor.state_changed', true, 1, $2, 1, 1, 1)",
            &[&id, &status],
        )
        .await
        .unwrap();
    }

    let store = PgStore::connect(&url, Duration::from_secs(5))
        .await
        .unwrap();
    let pending = store.load_pending(0).await.unwrap();
    assert_eq!(
        pending.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(),
        ["old-pending"]
    );
    assert_eq!(store.count_pending().await.unwrap(), 1);
    assert_pending_listed(&store, "the upgrade").await;
}

/// A latch older than the schema would write rows the newer schema keeps differently; it
/// refuses to start instead.
#[tokio::test]
async fn a_schema_newer_than_this_latch_is_refused() {
    let Some((store, _)) = fresh().await else {
        return;
    };
    let c = store.db.unbounded().await.unwrap();
    c.execute(
        "INSERT INTO latch_migrations (version) VALUES ($1)",
        &[&(MIGRATIONS.len() as i32 + 1)],
    )
    .await
    .unwrap();
    let err = store.migrate().await.unwrap_err().to_string();
    assert!(err.contains("newer than this latch"), "{err}");
}

/// Retention drops whole months of history, keeps the month it falls in, and forgets
/// nodes silent for an hour.
#[tokio::test]
async fn retention_drops_past_months_and_forgets_silent_nodes() {
    use crate::store::conformance::{change, sensor};
    let Some((store, schema)) = fresh().await else {
        return;
    };
    let now = crate::domain::time::now_ms();
    let day = 86_400_000;
    // A node that ran two years ago created its months then.
    let then = now - 730 * day;
    ensure_partitions(&store.db.unbounded().await.unwrap(), then)
        .await
        .unwrap();
    let month = chrono::DateTime::from_timestamp_millis(then)
        .unwrap()
        .format("%Y_%m")
        .to_string();
    store.create_sensor(sensor("pd1")).await.unwrap();
    store
        .commit(change("pd1", true, None, then), now)
        .await
        .unwrap();
    store
        .commit(change("pd1", false, Some(true), now - 1_000), now)
        .await
        .unwrap();
    let c = store.db.unbounded().await.unwrap();
    c.batch_execute(
        "INSERT INTO latch_nodes (id, address, heartbeat_at) VALUES \
         ('gone', 'http://gone', now() - interval '2 hours'), ('here', 'http://here', now())",
    )
    .await
    .unwrap();

    let pruned = store
        .maintain(
            now,
            Retention {
                history_before: Some(now - 90 * day),
                notifications_before: None,
            },
        )
        .await
        .unwrap();
    assert!(pruned.partitions >= 2, "{pruned:?}");
    for table in ["readings", "events"] {
        let part = format!("{table}_{month}");
        assert!(!has_table(&store, &schema, &part).await, "{part} dropped");
        let this_month = chrono::Utc::now().format("%Y_%m").to_string();
        let part = format!("{table}_{this_month}");
        assert!(has_table(&store, &schema, &part).await, "{part} kept");
    }
    let ts: Vec<i64> = store
        .list_readings(
            crate::store::conformance::sid("pd1"),
            crate::store::TimeRange::default(),
            crate::store::PageRequest {
                limit: 10,
                after: None,
            },
        )
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| r.row.ts)
        .collect();
    assert_eq!(ts, [now - 1_000]);
    let nodes: Vec<String> = c
        .query("SELECT id FROM latch_nodes ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(nodes, ["here"]);
}

/// A recording of attempts for several clients takes their rows in id order, the order
/// resealing (`latch rotate-key`) walks them in: a transaction holding the first client
/// keeps the recorder from taking any, and the second stays free. (In outcome order the
/// recorder held the second while it waited for the first: a deadlock with the resealer.)
#[tokio::test]
async fn a_recorder_takes_its_clients_rows_in_id_order() {
    use crate::domain::{Attempt, Claim, Outcome, Verdict};
    use crate::store::conformance::{change, client, sensor};
    let Some((s, schema)) = fresh().await else {
        return;
    };
    let s = std::sync::Arc::new(s);
    let mut outcomes = Vec::new();
    for (c, sensor_id) in [("lock-b", "lk2"), ("lock-a", "lk1")] {
        s.create_sensor(sensor(sensor_id)).await.unwrap();
        s.create_client(client(c, "http://a/")).await.unwrap();
        s.link(c.into(), sensor(sensor_id).id, 1).await.unwrap();
        let n = s
            .commit(change(sensor_id, true, None, 1_000), 1_000)
            .await
            .unwrap()[0]
            .clone();
        let claimed = s
            .claim(vec![n.id.clone()], "a".into(), 1_000, 90_000, None)
            .await
            .unwrap();
        assert!(matches!(claimed[0], Claim::Send(_)));
        outcomes.push(Outcome {
            notification_id: n.id.clone(),
            client_id: n.client_id.clone(),
            attempt: Some(Attempt {
                notification_id: n.id.clone(),
                at: 1_500,
                status_code: Some(500),
                error: Some("HTTP 500".into()),
                duration_ms: 3,
            }),
            attempts: 1,
            verdict: Verdict::Failed,
            node: "a".into(),
            batch_id: None,
        });
    }
    let url = schema_url(&base_url(), &schema);
    let (mut holder, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let (watch, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let tx = holder.transaction().await.unwrap();
    tx.execute("SELECT 1 FROM clients WHERE id = 'lock-a' FOR UPDATE", &[])
        .await
        .unwrap();
    let recording = tokio::spawn({
        let s = s.clone();
        async move { s.record(outcomes, 2_000, i64::MAX / 2).await }
    });
    // Until the recorder waits for a row lock.
    let mut waited = false;
    for _ in 0..200 {
        let n: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(waited, "the recorder never waited for the held client");
    tx.batch_execute("SET LOCAL lock_timeout = '3s'")
        .await
        .unwrap();
    tx.execute("SELECT 1 FROM clients WHERE id = 'lock-b' FOR UPDATE", &[])
        .await
        .expect("the recorder holds the second client while it waits for the first");
    tx.commit().await.unwrap();
    recording.await.unwrap().unwrap();
    // Both failures counted once the holder let go.
    let streaks: Vec<i64> = watch
        .query(
            "SELECT failures_since_success FROM clients ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(streaks, vec![1, 1]);
}
