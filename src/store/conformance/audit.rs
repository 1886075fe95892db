//! The audit trail: a change made through the API keeps the record it was given in its own
//! transaction — a change refused or finding nothing keeps none, and a call outside a
//! request (an import, a round) makes none; the trail reads newest first, filtered and
//! paged; retention prunes it with the notifications.

use super::*;
use crate::domain::audit::{Record, TokenRef};
use crate::store::audit::{AuditFilter, scope};

fn record(method: &str, resource: &str, at: Millis) -> Record {
    Record {
        at,
        token: Some(TokenRef {
            id: "t1".into(),
            name: "ops desk".into(),
        }),
        method: method.into(),
        path: format!("/v1/{resource}"),
        resource: resource.into(),
        before: None,
        after: Some(serde_json::json!({"address": "x"})),
    }
}

async fn trail(s: &Subject, f: AuditFilter) -> Vec<(String, String)> {
    s.list_audit(
        f,
        PageRequest {
            limit: 100,
            after: None,
        },
    )
    .await
    .unwrap()
    .items
    .into_iter()
    .map(|e| (e.record.method, e.record.resource))
    .collect()
}

fn pair(m: &str, r: &str) -> (String, String) {
    (m.to_string(), r.to_string())
}

pub(super) async fn a_change_keeps_its_record_and_a_refused_one_none(s: &Subject) {
    // Made: kept, with the id of what a create made.
    let (made, taken) = scope(record("POST", "sensors", 10), s.create_sensor(sensor("d1"))).await;
    made.unwrap();
    assert!(taken, "the create took the record");
    // Refused (the id is taken): no record.
    let (again, _) = scope(record("POST", "sensors", 11), s.create_sensor(sensor("d1"))).await;
    assert!(matches!(again, Err(Error::Conflict(_))), "{again:?}");
    // Nothing to change: no record.
    let (gone, _) = scope(
        record("DELETE", "sensors/nobody", 12),
        s.delete_sensor(sid("nobody"), 12),
    )
    .await;
    assert!(!gone.unwrap());
    let (gone, _) = scope(
        record("DELETE", "schedules/none", 12),
        s.delete_schedule("none".into()),
    )
    .await;
    assert!(!gone.unwrap());
    // Outside a request: no record.
    s.create_client(client("c1", "http://127.0.0.1:9/"))
        .await
        .unwrap();
    let (linked, _) = scope(
        record("PUT", "clients/c1/sensors/d1", 13),
        s.link("c1".into(), sid("d1"), 13),
    )
    .await;
    linked.unwrap();
    let (deleted, _) = scope(
        record("DELETE", "sensors/d1", 14),
        s.delete_sensor(sid("d1"), 14),
    )
    .await;
    assert!(deleted.unwrap());

    assert_eq!(
        trail(s, AuditFilter::default()).await,
        [
            pair("DELETE", "sensors/d1"),
            pair("PUT", "clients/c1/sensors/d1"),
            pair("POST", "sensors/d1"),
        ],
        "newest first; the refused, the missing and the unscoped left none"
    );
    let page = s
        .list_audit(
            AuditFilter::default(),
            PageRequest {
                limit: 1,
                after: None,
            },
        )
        .await
        .unwrap();
    let e = &page.items[0];
    assert_eq!(e.record.token, record("", "", 0).token);
    assert_eq!(e.record.at, 14);
    assert_eq!(e.record.after, Some(serde_json::json!({"address": "x"})));
    let rest = s
        .list_audit(
            AuditFilter::default(),
            PageRequest {
                limit: 10,
                after: page.next.clone(),
            },
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 2, "the next page: {:?}", page.next);
    assert!(rest.items[0].id < e.id);
}

pub(super) async fn the_trail_filters_by_resource_token_and_time(s: &Subject) {
    s.create_client(client("c1", "http://127.0.0.1:9/"))
        .await
        .unwrap();
    s.create_client(client("c10", "http://127.0.0.1:9/"))
        .await
        .unwrap();
    for (id, at) in [("d1", 100), ("d10", 200)] {
        let (r, _) = scope(record("POST", "sensors", at), s.create_sensor(sensor(id))).await;
        r.unwrap();
    }
    let mut by_other = record("PUT", "clients/c1/sensors/d1", 300);
    by_other.token = None;
    let (r, _) = scope(by_other, s.link("c1".into(), sid("d1"), 300)).await;
    r.unwrap();
    let (r, _) = scope(
        record("PUT", "clients/c10/sensors/d1", 400),
        s.link("c10".into(), sid("d1"), 400),
    )
    .await;
    r.unwrap();

    let of = |resource: &str| AuditFilter {
        resource: Some(resource.into()),
        ..Default::default()
    };
    // A resource is itself and what is below it, not another id it begins.
    assert_eq!(
        trail(s, of("sensors/d1")).await,
        [pair("POST", "sensors/d1")]
    );
    assert_eq!(trail(s, of("sensors")).await.len(), 2);
    assert_eq!(
        trail(s, of("clients/c1")).await,
        [pair("PUT", "clients/c1/sensors/d1")]
    );
    let by = AuditFilter {
        token_id: Some("t1".into()),
        ..Default::default()
    };
    assert_eq!(
        trail(s, by).await.len(),
        3,
        "the open API's change has no token"
    );
    let window = AuditFilter {
        range: TimeRange {
            from: Some(200),
            to: Some(400),
        },
        ..Default::default()
    };
    assert_eq!(
        trail(s, window).await,
        [
            pair("PUT", "clients/c1/sensors/d1"),
            pair("POST", "sensors/d10")
        ],
        "from inclusive, to exclusive"
    );

    // Retention takes the records as old as the notifications it takes.
    let pruned = s
        .maintain(
            1_000,
            Retention {
                history_before: None,
                notifications_before: Some(250),
                audit_unshipped_kept: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(pruned.audit, 2);
    assert_eq!(trail(s, AuditFilter::default()).await.len(), 2);
}

pub(super) async fn the_trail_ships_once_and_stays_readable(s: &Subject) {
    for (id, at) in [("d1", 100), ("d2", 200)] {
        let (r, _) = scope(record("POST", "sensors", at), s.create_sensor(sensor(id))).await;
        r.unwrap();
    }
    // With ClickHouse set, retention keeps what has not shipped yet, however old.
    let keep = Retention {
        history_before: None,
        notifications_before: Some(1_000),
        audit_unshipped_kept: true,
    };
    assert_eq!(s.maintain(2_000, keep).await.unwrap().audit, 0);
    let sink = Collect::default();
    // A sink that refuses keeps every record for the next shipment.
    sink.fail.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(s.ship_history(100, &sink).await.is_err());
    sink.fail.store(false, std::sync::atomic::Ordering::Relaxed);
    s.ship_history(100, &sink).await.unwrap();
    let shipped: Vec<String> = sink
        .got
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b.audit.iter().map(|e| e.record.resource.clone()))
        .collect();
    assert_eq!(shipped, ["sensors/d1", "sensors/d2"], "oldest first");
    s.ship_history(100, &sink).await.unwrap();
    let again: usize = sink.got.lock().unwrap().iter().map(|b| b.audit.len()).sum();
    assert_eq!(again, 2, "each record ships once");
    assert_eq!(
        trail(s, AuditFilter::default()).await.len(),
        2,
        "the store still answers for what shipped"
    );
    // Shipped, they go at their time.
    assert_eq!(s.maintain(2_000, keep).await.unwrap().audit, 2);
}
