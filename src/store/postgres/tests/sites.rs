//! Sites' rounds on PostgreSQL, where a round walks the due sites a few per transaction.

use super::*;

/// A site whose decision fails whatever is tried (here a sensor row no id parses from)
/// does not hold back the due sites after it: the round passes it and decides them, and
/// the next round tries it again.
#[tokio::test]
async fn a_site_that_fails_to_decide_does_not_hold_back_the_others() {
    use crate::domain::site::Site;
    use crate::domain::site::decide::Rules;
    use crate::domain::{EventKind, Sensor};
    use crate::store::Sites;
    use crate::store::conformance::{liveness, sensor};
    let Some((store, _schema)) = fresh().await else {
        return;
    };
    let sites = ["pa", "pb", "pc"];
    for id in sites {
        let site = Site {
            id: id.into(),
            name: None,
            address: None,
            gateway_sensor_id: None,
            created_at: 1_000,
            updated_at: 1_000,
        };
        store.create_site(site).await.unwrap();
        for n in 1..=4 {
            let s = Sensor {
                site_id: Some(id.into()),
                ..sensor(&format!("{id}{n}"))
            };
            store.create_sensor(s).await.unwrap();
            store
                .commit(
                    liveness(&format!("{id}{n}"), EventKind::ConnectionLost, 5_000),
                    5_000,
                )
                .await
                .unwrap();
        }
    }
    let c = store.db.unbounded().await.unwrap();
    c.execute("UPDATE sensors SET id = 'not an id!' WHERE id = 'pa4'", &[])
        .await
        .unwrap();
    let rules = Rules {
        grace: 30_000,
        ratio: 0.5,
        min_sensors: 3,
    };
    let decided = store.decide_sites(rules, 36_000).await.unwrap();
    let changed: Vec<&str> = decided.changed.iter().map(|e| e.site_id.as_str()).collect();
    assert_eq!(
        changed,
        ["pb", "pc"],
        "pa fails, and the others are decided"
    );
    assert!(!decided.in_doubt);
    let err = store.decide_sites(rules, 37_000).await;
    assert!(err.is_err(), "pa alone is due, and fails again: {err:?}");
    c.execute("UPDATE sensors SET id = 'pa4' WHERE id = 'not an id!'", &[])
        .await
        .unwrap();
    let decided = store.decide_sites(rules, 38_000).await.unwrap();
    let changed: Vec<&str> = decided.changed.iter().map(|e| e.site_id.as_str()).collect();
    assert_eq!(changed, ["pa"], "decided once it can be");
}

/// A group commit that waited for a site's decision in flight judges its events by what
/// that decision left (issue #68): a return after the site came back goes out, rather
/// than being held on a site up, where no round would ever decide it. The decision here
/// is its statements, run by hand and held open until the commit waits for the site.
#[tokio::test]
async fn a_commit_that_waited_for_a_decision_reads_what_it_left() {
    use crate::domain::site::Site;
    use crate::domain::site::decide::Rules;
    use crate::domain::{EventKind, Sensor};
    use crate::store::conformance::{client, liveness, sensor, sid};
    use crate::store::{Registry, Sites};
    let Some((store, _schema)) = fresh().await else {
        return;
    };
    let site = Site {
        id: "ps".into(),
        name: None,
        address: None,
        gateway_sensor_id: None,
        created_at: 1_000,
        updated_at: 1_000,
    };
    store.create_site(site).await.unwrap();
    store
        .create_client(client("pc", "http://r/"))
        .await
        .unwrap();
    for n in 1..=4 {
        let id = format!("ps{n}");
        let s = Sensor {
            site_id: Some("ps".into()),
            ..sensor(&id)
        };
        store.create_sensor(s).await.unwrap();
        store.link("pc".into(), sid(&id), 1).await.unwrap();
    }
    for n in 1..=3 {
        let lost = liveness(&format!("ps{n}"), EventKind::ConnectionLost, 5_000);
        store.commit(lost, 5_000).await.unwrap();
    }
    let rules = Rules {
        grace: 30_000,
        ratio: 0.5,
        min_sensors: 3,
    };
    assert_eq!(
        store
            .decide_sites(rules, 36_000)
            .await
            .unwrap()
            .changed
            .len(),
        1
    );
    for (kind, at) in [
        (EventKind::ConnectionRestored, 40_000),
        (EventKind::ConnectionLost, 45_000),
    ] {
        let made = store.commit(liveness("ps1", kind, at), at).await.unwrap();
        assert!(made.is_empty(), "held: the site's loss told pc of ps1");
    }
    // The decision: the site back up, what it held consumed; not committed yet.
    let decision = store.db.unbounded().await.unwrap();
    decision
        .batch_execute(
            "BEGIN; SELECT id FROM sites WHERE id = 'ps' FOR UPDATE; \
             DELETE FROM site_held WHERE site_id = 'ps'; \
             UPDATE sites SET down = false, since = 46000, told = ',', told_clients = ',', \
             released = 0 WHERE id = 'ps'",
        )
        .await
        .unwrap();
    let xid: String = decision
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0);
    let store = std::sync::Arc::new(store);
    let committing = tokio::spawn({
        let store = store.clone();
        async move {
            let back = liveness("ps1", EventKind::ConnectionRestored, 47_000);
            store.commit(back, 47_000).await
        }
    });
    // Until the commit waits for the decision's row lock.
    let watch = store.db.unbounded().await.unwrap();
    loop {
        let waiting: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE NOT granted \
                 AND locktype = 'transactionid' AND transactionid::text = $1",
                &[&xid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(!committing.is_finished(), "the commit did not wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    decision.batch_execute("COMMIT").await.unwrap();
    let made = committing.await.unwrap().unwrap();
    assert_eq!(
        made.len(),
        1,
        "the site is up and holds nothing of ps1: its return goes out"
    );
    assert_eq!(store.site_totals().await.unwrap().held, 0, "nothing held");
}
