//! `/metrics` of a fresh latch: every family is there at the first scrape, before anything
//! happened, and the README lists exactly the families the code records.

use std::collections::BTreeSet;
use std::path::Path;

use crate::utils::Process;
use crate::utils::{database_url, unique};

/// The families of the README's Metrics list, with every part configured.
const FAMILIES: &[&str] = &[
    "latch_readings_accepted_total",
    "latch_readings_rejected_total",
    "latch_delivery_attempts_total",
    "latch_notifications_total",
    "latch_notifications_pending",
    "latch_delivery_latency_seconds",
    "latch_delivery_attempt_seconds",
    "latch_commit_seconds",
    "latch_commit_readings",
    "latch_commit_failures_total",
    "latch_sensors_lost",
    "latch_sensors_lost_total",
    "latch_source_up",
    "latch_source_reconnects_total",
    "latch_amqp_dead_lettered_total",
    "latch_amqp_duplicates_total",
    "latch_mqtt_retained_ignored_total",
    "latch_mqtt_duplicates_total",
    "latch_store_timeouts_total",
    "latch_history_spool_rows",
    "latch_history_shipped_rows_total",
    "latch_history_ship_failures_total",
    "latch_history_ship_seconds",
    "latch_clickhouse_up",
    "latch_clients_disabled",
    "latch_http_rate_limit_total",
    "latch_cluster_partitions_owned",
    "latch_cluster_takeovers_total",
    "latch_cluster_forwarded_readings_total",
    "latch_cluster_forward_failures_total",
    "latch_cluster_fenced_commits_total",
];

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

/// Names given to `counter!`, `gauge!` and `histogram!` anywhere under `dir`.
fn recorded_in(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            recorded_in(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for mac in ["counter!(", "gauge!(", "histogram!("] {
                for (i, _) in text.match_indices(mac) {
                    let arg = text[i + mac.len()..].trim_start();
                    if let Some(lit) = arg.strip_prefix('"')
                        && lit.starts_with("latch_")
                    {
                        out.insert(lit[..lit.find('"').unwrap()].to_string());
                    }
                }
            }
        }
    }
}

#[test]
fn the_readme_lists_exactly_the_families_the_code_records() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = readme
        .find("- **Metrics**")
        .expect("a Metrics item in the README");
    let len = readme[start + 1..]
        .find("\n- **")
        .unwrap_or(readme.len() - start - 1);
    let listed = names(&readme[start..start + 1 + len]);
    let expected: BTreeSet<String> = FAMILIES.iter().map(|s| s.to_string()).collect();
    assert_eq!(listed, expected, "the README's Metrics list");
    let mut recorded = BTreeSet::new();
    recorded_in(&root.join("src"), &mut recorded);
    assert_eq!(recorded, expected, "the families the code records");
}

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
    let missing: Vec<&str> = FAMILIES
        .iter()
        .copied()
        // PostgreSQL's: the store's timeouts and the cluster's (a PostgreSQL node is one).
        .filter(|f| {
            on_postgres || !(*f == "latch_store_timeouts_total" || f.starts_with("latch_cluster_"))
        })
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
