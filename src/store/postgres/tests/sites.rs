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
