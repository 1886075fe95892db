//! Query plans of the statements that run once per webhook: each must find its rows by
//! key, whatever the backlog. (What a plan costs is measured by `latch bench deliver`; a
//! plan that walks a client's whole backlog per claim made the backlog's delivery
//! quadratic, BENCHMARKS.md.)

use rusqlite::Connection;

use super::*;
use crate::store::rows::{CLAIM_COLS, CLAIM_FROM, NOTIF_COLS};

fn plan(c: &Connection, sql: &str) -> Vec<String> {
    let mut q = c.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    q.query_map([""], |r| r.get::<_, String>(3))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A claim reads whether an older site notification naming the sensor waits, and whether
/// a newer one told the client of its connection, from the sensor's rows of
/// `notification_sensors` (a few), never from the client's notifications (its backlog).
#[test]
fn a_claim_reads_a_sensors_site_events_from_the_sensor_not_the_clients_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let _store = SqliteStore::open(dir.path(), Synchronous::Normal).unwrap();
    let c = Connection::open(dir.path().join("latch.db")).unwrap();
    let steps = plan(
        &c,
        &format!("SELECT {NOTIF_COLS}, {CLAIM_COLS} FROM {CLAIM_FROM} WHERE n.id = ?1"),
    );
    let text = steps.join("\n");
    assert!(
        !text.contains("notifications_by_client"),
        "a claim walks the client's notifications:\n{text}"
    );
    for bound in ["seq<?", "seq>?"] {
        assert!(
            steps.iter().any(
                |s| s.contains("SEARCH ns USING PRIMARY KEY (sensor_id=? AND") && s.contains(bound)
            ),
            "no look-up of the sensor's site events by key ({bound}):\n{text}"
        );
    }
}
