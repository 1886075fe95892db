//! Retention through the service: what a round deletes (readings and events past
//! `retention_readings`, finished notifications past `retention_notifications`) and what
//! it keeps (newer history, pending notifications), and how far back `GET /v1/fleet` says
//! history goes. Time is a manual clock: a day passes in a call.

use std::time::Duration;

use axum::http::StatusCode;
use latch::clock::Clock;
use serde_json::json;

use crate::utils::{Answer, Receiver, TestServer, eventually, unique};

const DAY: Duration = Duration::from_secs(86_400);

#[tokio::test]
async fn a_round_deletes_what_is_past_retention_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Clock::manual(chrono::Utc::now().timestamp_millis());
    let s = TestServer::start_clocked(
        dir.path(),
        |c| {
            c.retention_readings = DAY;
            c.retention_notifications = DAY;
            // No sensor goes lost over the days the clock moves.
            c.heartbeat_timeout = 30 * DAY;
        },
        clock.clone(),
    )
    .await;
    let happy = Receiver::start().await;
    let gone = Receiver::start().await;
    gone.always(Answer::status(410));
    let (a, b) = (unique("rta"), unique("rtb"));
    let delivered_to = s.client(&happy.url).await;
    let disabled = s.client(&gone.url).await;
    for id in [&a, &b] {
        s.sensor(id).await;
        s.link(&delivered_to, id).await;
    }
    // A year old (on PostgreSQL: outside every monthly partition).
    let old = chrono::DateTime::from_timestamp_millis(clock.now() - 400 * 86_400_000).unwrap();
    s.readings(json!({"sensor_id": a, "data": 1, "ts": old.to_rfc3339()}))
        .await;
    happy.wait_for(1, 10).await;
    // `disabled` answers 410 to its first webhook; what follows waits for it, pending.
    s.link(&disabled, &b).await;
    s.readings(json!({"sensor_id": b, "data": 1})).await;
    eventually(10, "the client disabled by 410", || async {
        let (_, c) = s.get(&format!("/v1/clients/{disabled}")).await;
        c["disabled_at"].is_string().then_some(())
    })
    .await;
    // b's 1 out first, so its 0 does not supersede it.
    happy.wait_for(2, 10).await;
    s.readings(json!({"sensor_id": b, "data": 0})).await;
    let delivered = eventually(10, "a's and b's delivered", || async {
        let n = s
            .notifications(&format!("client_id={delivered_to}&status=delivered"))
            .await;
        (n.len() == 3).then_some(n)
    })
    .await;
    let pending = s
        .notifications(&format!("client_id={disabled}&status=pending"))
        .await;
    assert_eq!(pending.len(), 1, "{pending:?}");

    // Two days on: a round runs (the clock woke it) and deletes what is a day old; a's
    // reading of now stays.
    let b_at = clock.now();
    clock.advance(2 * DAY);
    s.readings(json!({"sensor_id": a, "data": 0})).await;
    // PostgreSQL drops whole months: b's readings of this month stay until all of it is
    // past retention; a year-old reading fell outside every monthly partition and goes.
    // Unless their month ended before the cut-off too: run in a month's last day, the
    // month is dropped whole.
    let cut = clock.now() - DAY.as_millis() as i64;
    let month_kept =
        std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") && month_end(b_at) > cut;
    eventually(20, "history past retention deleted", || async {
        let gone = s.reading_count(&a).await == 1
            && s.reading_count(&b).await == if month_kept { 2 } else { 0 };
        gone.then_some(())
    })
    .await;
    let (_, events) = s.get(&format!("/v1/sensors/{a}/events")).await;
    assert_eq!(events["items"].as_array().unwrap().len(), 1, "{events}");
    eventually(
        20,
        "finished notifications past retention deleted",
        || async {
            let mut gone = true;
            for n in &delivered {
                let (st, _) = s
                    .get(&format!("/v1/notifications/{}", n["id"].as_str().unwrap()))
                    .await;
                gone &= st == StatusCode::NOT_FOUND;
            }
            gone.then_some(())
        },
    )
    .await;
    let recent = s
        .notifications(&format!("client_id={delivered_to}&sensor_id={a}"))
        .await;
    assert_eq!(recent.len(), 1, "made after the cut-off: kept");
    let still = s
        .notifications(&format!("client_id={disabled}&status=pending"))
        .await;
    assert_eq!(still, pending, "pending notifications are never deleted");

    // How far back history goes: the oldest reading kept.
    let (_, kept_a) = s.get(&format!("/v1/sensors/{a}/readings")).await;
    let (_, kept_b) = s.get(&format!("/v1/sensors/{b}/readings")).await;
    let oldest = [&kept_a["items"][0]["ts"], &kept_b["items"][0]["ts"]]
        .into_iter()
        .filter_map(|t| t.as_str())
        .min()
        .map(|t| json!(t))
        .unwrap();
    eventually(20, "history_from follows retention", || async {
        let (_, fleet) = s.get("/v1/fleet").await;
        (fleet["history_from"] == oldest).then_some(())
    })
    .await;
    s.stop().await;
}

/// The first instant (ms, UTC) of the month after the one `at` is in: where a PostgreSQL
/// monthly partition holding `at` ends.
fn month_end(at: i64) -> i64 {
    use chrono::{Datelike, TimeZone};
    let t = chrono::DateTime::from_timestamp_millis(at).unwrap();
    let (y, m) = match t.month() {
        12 => (t.year() + 1, 1),
        m => (t.year(), m + 1),
    };
    chrono::Utc
        .with_ymd_and_hms(y, m, 1, 0, 0, 0)
        .unwrap()
        .timestamp_millis()
}
