//! `latch bench` at tiny sizes: it runs end to end through the real binary, and its counts
//! add up. Speeds are never asserted here; they live in BENCHMARKS.md.

use std::process::Command;

use serde_json::Value;

/// Runs `latch bench <args> --no-record` and returns its JSON results line.
fn bench(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_latch"))
        .arg("bench")
        .args(args)
        .arg("--no-record")
        .output()
        .expect("latch bench runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "latch bench {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON line in:\n{stdout}"));
    let v: Value = serde_json::from_str(line).expect("JSON results");
    v["results"].clone()
}

/// Whether the ClickHouse benches cannot run here (outside CI only: in CI it fails).
fn clickhouse_server_missing() -> bool {
    !latch_bench::clickhouse_server::installed()
        && crate::utils::service_missing("clickhouse-server", "not installed")
}

/// A figure of the results, which must be there.
fn num(r: &Value, k: &str) -> f64 {
    r[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {r}"))
}

#[test]
fn deliver_bench_accounts_for_every_notification() {
    let r = bench(&[
        "deliver",
        "--sensors",
        "50",
        "--clients",
        "2",
        "--changes",
        "300",
        "--fail-ratio",
        "0.2",
        "--baseline-requests",
        "256",
        "--drain",
        "60s",
    ]);
    let n = |k: &str| num(&r, k);
    assert_eq!(n("notifications_expected"), 600.0);
    // Every notification ended one way or another, none twice.
    assert_eq!(
        n("delivered") + n("failed") + n("superseded") + n("pending_left"),
        600.0,
        "{r}"
    );
    assert_eq!(n("pending_left"), 0.0, "{r}");
    assert_eq!(n("duplicate_deliveries"), 0.0, "{r}");
    // A fifth of the requests failed, so there were retries beyond the deliveries.
    assert!(n("webhook_requests") > n("delivered"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_bench_delivers_a_backlog_to_a_receiver_outside_it_and_the_bare_client_too() {
    let receiver = latch_testkit::Receiver::start_keeping(latch_testkit::Keep::Stats)
        .await
        .expect("a receiver");
    let url = receiver.url.clone();
    let r = tokio::task::spawn_blocking(move || {
        bench(&[
            "deliver",
            "--sensors",
            "300",
            "--changes",
            "300",
            "--receiver",
            &url,
            "--backlog",
            "--baseline-requests",
            "256",
            "--drain",
            "60s",
        ])
    })
    .await
    .expect("the bench ran");
    let n = |k: &str| num(&r, k);
    // Counted by latch, as a receiver outside the bench counts nothing for it.
    assert_eq!(n("delivered"), 300.0, "{r}");
    assert_eq!(n("pending_left"), 0.0, "{r}");
    assert!(n("backlog_seconds") > 0.0, "{r}");
    assert!(n("cpu_us_per_webhook") > 0.0, "{r}");
    assert!(n("bare_cpu_us_per_request") > 0.0, "{r}");
    // The receiver got latch's 300 and the bare client's warm-up (64) and timed (256)
    // requests: the baseline posts to the same receiver.
    assert_eq!(receiver.ok(), 300 + 64 + 256, "{r}");
}

/// `--auth oauth2,mtls`: the plain client's backlog, then each authenticated one's (a
/// token; a client certificate to an HTTPS receiver that demands it), each delivered whole
/// and measured apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_bench_measures_authenticated_backlogs_beside_a_plain_one() {
    let r = tokio::task::spawn_blocking(move || {
        bench(&[
            "deliver",
            "--sensors",
            "200",
            "--changes",
            "200",
            "--backlog",
            "--auth",
            "oauth2,mtls",
            "--baseline-requests",
            "128",
            "--drain",
            "60s",
        ])
    })
    .await
    .expect("the bench ran");
    let n = |k: &str| num(&r, k);
    assert_eq!(n("notifications_expected"), 600.0, "{r}");
    assert_eq!(n("delivered"), 600.0, "{r}");
    assert_eq!(n("pending_left"), 0.0, "{r}");
    assert!(n("cpu_us_per_webhook") > 0.0, "{r}");
    for kind in ["oauth2", "mtls"] {
        assert!(n(&format!("{kind}_cpu_us_per_webhook")) > 0.0, "{r}");
        assert!(n(&format!("{kind}_delivered_per_s")) > 0.0, "{r}");
        assert!(n(&format!("{kind}_rate_ratio_to_plain")) > 0.0, "{r}");
    }
}

#[test]
fn soak_bench_delivers_everything_and_reads_rss_three_times() {
    let r = bench(&[
        "soak",
        "--notifications",
        "2000",
        "--warmup",
        "400",
        "--sensors",
        "500",
        "--clients",
        "2",
        "--window",
        "200",
        "--batch",
        "50",
        "--drain",
        "60s",
    ]);
    let n = |k: &str| num(&r, k);
    assert_eq!(n("notifications"), 2000.0, "{r}");
    // Every notification ended, and each request was a delivery: none sent twice.
    assert_eq!(n("delivered") + n("ended_otherwise"), 2000.0, "{r}");
    assert_eq!(n("pending_left"), 0.0, "{r}");
    assert_eq!(n("webhook_requests"), n("delivered"), "{r}");
    // The readings are where they were asked for: after the warm-up, halfway through the
    // rest, at the end.
    assert_eq!(n("warmup_notifications"), 400.0, "{r}");
    assert_eq!(n("middle_at_notifications"), 1200.0, "{r}");
    assert_eq!(n("end_at_notifications"), 2000.0, "{r}");
    let (start, middle, end) = (n("rss_start_mib"), n("rss_middle_mib"), n("rss_end_mib"));
    assert!(start > 0.0 && middle > 0.0 && end > 0.0, "{r}");
    // The growth figures are the readings' own, to the rounding of the MiB figures (each
    // printed to 0.05 MiB, which moves a ratio of small figures by more than a point).
    assert_growth_matches(start, end, n("rss_growth_start_to_end_pct"), &r);
    assert_growth_matches(middle, end, n("rss_growth_middle_to_end_pct"), &r);
    let (start, end) = (n("rss_anon_start_mib"), n("rss_anon_end_mib"));
    assert!(start > 0.0 && start < n("rss_start_mib"), "{r}");
    assert_growth_matches(start, end, n("rss_anon_growth_start_to_end_pct"), &r);
    assert!(n("heap_in_use_start_mib") > 0.0, "{r}");
    assert!(n("delivered_per_s") > 0.0, "{r}");
}

#[test]
fn soak_bench_in_passes_reads_rss_after_each_pass() {
    let r = bench(&[
        "soak",
        "--passes",
        "4",
        "--sensors",
        "300",
        "--clients",
        "2",
        "--window",
        "200",
        "--batch",
        "50",
        "--drain",
        "60s",
    ]);
    let n = |k: &str| num(&r, k);
    // Four passes of one change a sensor, to two clients each.
    assert_eq!(n("notifications"), 2400.0, "{r}");
    assert_eq!(n("delivered") + n("ended_otherwise"), 2400.0, "{r}");
    assert_eq!(n("pending_left"), 0.0, "{r}");
    assert_eq!(n("webhook_requests"), n("delivered"), "{r}");
    // Compared: after the first quarter of the passes, after half of them, after the last.
    assert_eq!(n("warmup_notifications"), 600.0, "{r}");
    assert_eq!(n("middle_at_notifications"), 1200.0, "{r}");
    assert_eq!(n("end_at_notifications"), 2400.0, "{r}");
    assert!(n("rss_max_from_start_mib") >= n("rss_end_mib"), "{r}");
    assert_growth_matches(
        n("rss_start_mib"),
        n("rss_end_mib"),
        n("rss_growth_start_to_end_pct"),
        &r,
    );
}

/// Checks that `reported` (a percentage from unrounded figures) lies within what the
/// MiB figures, each rounded to one decimal, allow.
fn assert_growth_matches(from: f64, to: f64, reported: f64, r: &Value) {
    let half = 0.05;
    let low = ((to - half) / (from + half) - 1.0) * 100.0;
    let high = ((to + half) / (from - half) - 1.0) * 100.0;
    // The reported percentage is itself printed to one decimal.
    assert!(
        reported >= low - 0.05 && reported <= high + 0.05,
        "{reported} outside [{low:.2}, {high:.2}] for {from} -> {to}: {r}"
    );
}

#[test]
fn ingest_bench_counts_accepted_readings() {
    let r = bench(&[
        "ingest",
        "--sensors",
        "100",
        "--batch",
        "50",
        "--workers",
        "2",
        "--duration",
        "1s",
    ]);
    let n = |k: &str| num(&r, k);
    assert!(n("readings_accepted") >= 50.0, "{r}");
    assert_eq!(n("readings_accepted") % 50.0, 0.0, "whole batches: {r}");
    assert_eq!(n("request_errors"), 0.0, "{r}");
}

#[test]
fn ingest_bench_stops_at_its_count() {
    let r = bench(&[
        "ingest",
        "--sensors",
        "100",
        "--batch",
        "50",
        "--workers",
        "3",
        "--count",
        "500",
        "--duration",
        "60s",
    ]);
    assert_eq!(r["readings_accepted"].as_f64(), Some(500.0), "{r}");
}

#[test]
fn ingest_with_clickhouse_ships_everything_by_the_stop() {
    if clickhouse_server_missing() {
        return;
    }
    let r = bench(&[
        "ingest",
        "--clickhouse",
        "--sensors",
        "100",
        "--batch",
        "50",
        "--workers",
        "2",
        "--count",
        "2000",
        "--duration",
        "60s",
    ]);
    assert_eq!(r["readings_accepted"].as_f64(), Some(2000.0), "{r}");
    // A graceful stop makes one last shipment: nothing accepted waits for the next start.
    assert_eq!(
        r["readings_in_clickhouse_at_stop"].as_f64(),
        Some(2000.0),
        "{r}"
    );
}

#[test]
fn fleet_bench_sees_every_sensor_lost_and_every_lost_webhook_answered() {
    // The bench itself fails unless all 200 went lost and the receiver answered 200
    // webhooks.
    let r = bench(&["fleet", "--sensors", "200", "--timeout", "1s"]);
    let n = |k: &str| num(&r, k);
    assert_eq!(n("sensors"), 200.0);
    assert!(n("all_lost_enqueued_after_deadline_s") >= 0.0, "{r}");
    assert!(n("all_lost_delivered_after_deadline_s") > 0.0, "{r}");
    assert_eq!(n("duplicate_webhooks"), 0.0, "{r}");
}

#[test]
fn holds_bench_tells_every_open_sensor_once_and_no_closed_one() {
    // The bench fails unless the receiver answered a state_held for each open sensor.
    let r = bench(&[
        "holds",
        "--sensors",
        "3000",
        "--open",
        "300",
        "--after",
        "2s",
    ]);
    let n = |k: &str| num(&r, k);
    assert_eq!(n("checks_failed"), 0.0, "{r}");
    assert_eq!(n("state_held_webhooks"), 300.0, "{r}");
    assert_eq!(n("open_sensors_with_state_held"), 300.0, "{r}");
    assert_eq!(n("closed_sensors_with_state_held"), 0.0, "{r}");
    assert_eq!(n("other_notifications"), 0.0, "{r}");
    assert_eq!(n("duplicate_webhooks"), 0.0, "{r}");
    // Never made before it was due.
    assert!(
        n("lag_max_ms") >= n("lag_p50_ms") && n("lag_p50_ms") >= 0.0,
        "{r}"
    );
}

#[test]
fn sites_bench_tells_each_dark_site_once_and_its_return_once() {
    // The bench fails unless every dark site's loss and return reached the receiver.
    let r = bench(&[
        "sites",
        "--sites",
        "30",
        "--dark",
        "6",
        "--timeout",
        "2s",
        "--site-grace",
        "1s",
    ]);
    let n = |k: &str| num(&r, k);
    assert_eq!(n("site_lost_webhooks"), 6.0, "no lit site went down: {r}");
    assert_eq!(n("site_restored_webhooks"), 6.0, "{r}");
    assert_eq!(n("sensor_lost_webhooks"), 0.0, "{r}");
    assert_eq!(n("sensor_restored_webhooks"), 0.0, "{r}");
    assert!(n("returns_told_after_readings_s") > 0.0, "{r}");
    assert_eq!(n("duplicate_webhooks"), 0.0, "{r}");
}

#[test]
fn silences_bench_silences_some_readings_and_compares_both_latches() {
    let r = bench(&[
        "silences",
        "--sensors",
        "200",
        "--silences",
        "4",
        "--silence-size",
        "100",
        "--pool",
        "300",
        "--hit",
        "50",
        "--phase",
        "1s",
        "--rounds",
        "2",
        "--batch",
        "50",
        "--workers",
        "2",
    ]);
    let n = |k: &str| num(&r, k);
    assert!(n("notifications_silenced") > 0.0, "matching ran: {r}");
    assert!(n("readings_per_s_without") > 0.0, "{r}");
    assert!(n("readings_per_s_with") > 0.0, "{r}");
    assert!(n("round2_ratio") > 0.0, "{r}");
    assert!(n("ratio_with_to_without") > 0.0, "{r}");
}

#[test]
fn fleet_bench_with_batches_gets_every_lost_event_in_fewer_requests() {
    let r = bench(&[
        "fleet",
        "--sensors",
        "300",
        "--timeout",
        "1s",
        "--batch-max-events",
        "100",
    ]);
    let n = |k: &str| num(&r, k);
    assert!(n("all_lost_delivered_after_deadline_s") > 0.0, "{r}");
    assert_eq!(n("duplicate_webhooks"), 0.0, "{r}");
    // 300 lost events in batches of at most 100 (and the feed's own nothing).
    assert!((3.0..300.0).contains(&n("webhook_requests")), "{r}");
}

#[test]
fn broker_benches_take_every_message() {
    // The bench itself fails unless latch accepted every message it published.
    for (via, port) in [("amqp", 5672), ("mqtt", 1883)] {
        if let Err(e) = std::net::TcpStream::connect(("127.0.0.1", port))
            && crate::utils::service_missing(via, e)
        {
            continue;
        }
        let r = bench(&[
            "ingest",
            "--via",
            via,
            "--messages",
            "400",
            "--sensors",
            "50",
        ]);
        let n = |k: &str| num(&r, k);
        assert_eq!(n("messages"), 400.0, "{via}: {r}");
        assert!(n("readings_per_s") > 0.0, "{via}: {r}");
    }
}

#[test]
fn restart_bench_restarts_with_the_pending_outbox() {
    let r = bench(&["restart", "--sensors", "300", "--pending", "120"]);
    let n = |k: &str| num(&r, k);
    assert_eq!(n("sensors"), 300.0);
    assert_eq!(n("pending_notifications"), 120.0, "{r}");
    assert!(n("ready_seconds") > 0.0, "{r}");
}

#[test]
fn history_bench_ships_the_whole_backlog_and_catches_up() {
    if clickhouse_server_missing() {
        return;
    }
    let r = bench(&[
        "history",
        "--sensors",
        "100",
        "--backlog",
        "5000",
        "--rate",
        "2000",
        "--before",
        "1s",
        "--outage",
        "2s",
    ]);
    let n = |k: &str| num(&r, k);
    assert_eq!(n("backlog_readings"), 5000.0, "{r}");
    // Every backlog reading, plus the events its state changes made, is in ClickHouse.
    assert!(n("backlog_history_rows") > 5000.0, "{r}");
    assert!(
        n("shipped_rows_per_s") > 0.0 && n("catch_up_s") > 0.0,
        "{r}"
    );
    assert!(n("spool_readings_at_restart") > 0.0, "{r}");
}

/// The PostgreSQL database the cluster bench may use; `None` when the test does not run
/// here: in the PostgreSQL pass (it always uses PostgreSQL, so it runs in the first), or
/// without PostgreSQL outside CI.
fn cluster_database() -> Option<String> {
    if std::env::var("TEST_STORE").ok().as_deref() == Some("postgres") {
        return None;
    }
    let base = std::env::var("TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let rt = tokio::runtime::Runtime::new().unwrap();
    match rt.block_on(tokio_postgres::connect(&base, tokio_postgres::NoTls)) {
        Ok(_) => Some(base),
        Err(e) => {
            crate::utils::service_missing("PostgreSQL", e);
            None
        }
    }
}

/// The delivery bench runs on PostgreSQL too: a shared store needs a key to seal clients'
/// secrets from outside the data folder, which the bench makes for its schema (without it
/// latch refused to start and the bench measured nothing).
#[test]
fn deliver_bench_runs_on_postgresql() {
    let Some(url) = cluster_database() else {
        return;
    };
    let r = bench(&[
        "deliver",
        "--database-url",
        &url,
        "--sensors",
        "40",
        "--changes",
        "200",
        "--baseline-requests",
        "64",
        "--drain",
        "60s",
    ]);
    let n = |k: &str| num(&r, k);
    // Every change ended delivered or superseded by a newer one of its sensor.
    assert_eq!(n("delivered") + n("superseded"), 200.0, "{r}");
    assert!(
        n("delivered") >= 40.0,
        "each sensor's last change is delivered: {r}"
    );
    assert_eq!(n("pending_left"), 0.0, "{r}");
}

#[test]
fn cluster_bench_measures_both_runs_and_the_takeover() {
    let Some(url) = cluster_database() else {
        return;
    };
    let r = bench(&[
        "cluster",
        "--nodes",
        "2",
        "--database-url",
        &url,
        "--partitions",
        "8",
        "--lease",
        "2s",
        "--sensors",
        "40",
        "--readings",
        "400",
        "--batch",
        "20",
        "--workers",
        "2",
        "--changes",
        "50",
        "--drain",
        "30s",
    ]);
    let n = |k: &str| num(&r, k);
    for run in ["single", "cluster"] {
        // Nothing moves while the nodes stay up: every reading sent is accepted, and each
        // change is one webhook.
        assert_eq!(n(&format!("{run}_readings_accepted")), 400.0, "{r}");
        assert_eq!(n(&format!("{run}_readings_refused")), 0.0, "{r}");
        assert_eq!(n(&format!("{run}_webhooks_delivered")), 50.0, "{r}");
    }
    assert_eq!(n("single_forwarded_readings"), 0.0, "{r}");
    assert!(n("cluster_forwarded_readings") > 0.0, "{r}");
    assert!(n("takeover_owned_seconds") > 0.0, "{r}");
    assert!(n("takeover_reading_accepted_seconds") > 0.0, "{r}");
    assert!(n("ingest_ratio") > 0.0 && n("delivery_ratio") > 0.0, "{r}");
}
