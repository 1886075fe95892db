//! `/metrics` of a fresh latch: every family is there at the first scrape, before anything
//! happened, and the book's metrics reference lists exactly the families the code records.

use std::collections::BTreeSet;
use std::path::Path;

use crate::utils::Process;
use crate::utils::{database_url, unique};

/// Every family latch records.
fn families() -> BTreeSet<String> {
    latch::telemetry::families::ALL
        .iter()
        .map(|f| f.name.to_string())
        .collect()
}

/// `latch_*` names in `text`.
fn names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("latch_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// Files under `dir` that name a metric family in a string of their own, outside the one
/// module that names them all.
fn naming_families(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            naming_families(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.ends_with("telemetry/families.rs")
        {
            let text = std::fs::read_to_string(&path).unwrap();
            for mac in ["counter!(", "gauge!(", "histogram!("] {
                if text.contains(&format!("{mac}\"latch_")) {
                    out.push(path.display().to_string());
                }
            }
        }
    }
}

#[test]
fn the_book_lists_exactly_the_families_the_code_records() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(root.join("docs/src/reference/metrics.md")).unwrap();
    let rows: String = page
        .lines()
        .filter(|l| l.starts_with("| `latch_"))
        .map(|l| l.split('|').nth(1).unwrap())
        .collect();
    assert_eq!(names(&rows), families(), "the book's metrics reference");
    let mut elsewhere = Vec::new();
    naming_families(&root.join("src"), &mut elsewhere);
    assert!(
        elsewhere.is_empty(),
        "metric names belong in src/telemetry/families.rs: {elsewhere:?}"
    );
}

/// Families only the embedded store (SQLite) records.
const EMBEDDED_ONLY: [&str; 3] = [
    "latch_store_writer_wait_seconds",
    "latch_wal_checkpoint_seconds",
    "latch_history_archive_seconds",
];

/// A port nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_fresh_latch_shows_every_family_at_its_first_scrape() {
    // Its own process: the in-process servers of other tests share one recorder. Every
    // part is configured, its far end unreachable, so nothing is ever received, sent or
    // shipped: whatever shows was registered at start.
    let dir = tempfile::tempdir().unwrap();
    let database = database_url(dir.path()).await;
    // PostgreSQL's own family shows only when that is the store.
    let on_postgres = database.is_some();
    let p = Process::start_env(
        dir.path(),
        database,
        &[
            (
                "LATCH_AMQP_URL",
                format!("amqp://guest:guest@127.0.0.1:{}/%2f", closed_port()),
            ),
            (
                "LATCH_MQTT_URL",
                format!(
                    "mqtt://127.0.0.1:{}?client_id={}",
                    closed_port(),
                    unique("metrics")
                ),
            ),
            (
                "LATCH_CLICKHOUSE_URL",
                format!("http://127.0.0.1:{}", closed_port()),
            ),
            ("LATCH_RATE_LIMIT", "200/s burst 400".to_string()),
        ],
    );
    let http = reqwest::Client::new();
    p.alive(&http).await;
    let text = http
        .get(format!("{}/metrics", p.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let all = families();
    let missing: Vec<&str> = all
        .iter()
        .map(String::as_str)
        // PostgreSQL's: the store's timeouts, its commits in doubt and the cluster's (a
        // PostgreSQL node is one).
        .filter(|f| {
            on_postgres
                || !(*f == "latch_store_timeouts_total"
                    || *f == "latch_commits_in_doubt_total"
                    || f.starts_with("latch_cluster_"))
        })
        // The embedded store's: its writer, write-ahead log and archive.
        .filter(|f| !on_postgres || !EMBEDDED_ONLY.iter().any(|e| e == f))
        .filter(|f| !text.contains(&format!("# TYPE {f} ")))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} in:\n{text}");
    // Labelled series are there with their known labels, at zero.
    for series in [
        r#"latch_readings_accepted_total{source="http"} 0"#,
        r#"latch_readings_accepted_total{source="mqtt"} 0"#,
        r#"latch_readings_rejected_total{source="amqp",reason="unknown_sensor"} 0"#,
        r#"latch_delivery_attempts_total{outcome="timeout"} 0"#,
        r#"latch_notifications_total{status="failed"} 0"#,
        r#"latch_amqp_dead_lettered_total{reason="invalid_data"} 0"#,
        "latch_notifications_pending 0",
        "latch_delivery_latency_seconds_count 0",
        r#"latch_http_rate_limit_total{outcome="limited"} 0"#,
    ] {
        assert!(text.contains(series), "no `{series}` in:\n{text}");
    }
    drop(p);
}
