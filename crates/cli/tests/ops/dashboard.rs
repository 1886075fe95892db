//! The Grafana dashboard and the alert rules name only metrics latch exports: a metric
//! renamed in the code breaks this test, not an operator's dashboard or alerts.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::utils::{self, Latch, free_port};

/// Every `latch_*` name in `text`.
fn latch_names(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\blatch_[a-z0-9_]+").expect("a valid pattern");
    re.find_iter(text).map(|m| m.as_str().to_string()).collect()
}

/// The queries of a dashboard: each panel target's `expr` and each variable's query.
fn queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => queries(v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| queries(i, out)),
        _ => {}
    }
}

/// The sample names of a `/metrics` text (a summary's `_sum` and `_count` included).
fn exported(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// `latch`'s /metrics page, once it answers (within a minute).
async fn scrape(http: &reqwest::Client, latch: &Latch, what: &str) -> String {
    let url = format!("{}/metrics", latch.base);
    utils::eventually(60, what, || async {
        let resp = http.get(&url).send().await.ok()?;
        resp.status().is_success().then_some(())?;
        resp.text().await.ok()
    })
    .await
}

#[tokio::test]
async fn every_metric_the_dashboard_and_the_alerts_name_is_exported() {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(utils::repo().join("deploy/grafana/latch.json"))
            .expect("the dashboard"),
    )
    .expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    queries(&dashboard, &mut exprs);
    let charted = latch_names(&exprs.join("\n"));
    assert!(charted.len() >= 30, "{charted:?}");
    let rules = std::fs::read_to_string(utils::repo().join("deploy/prometheus/latch-rules.yml"))
        .expect("the rules");
    let alerted = latch_names(&rules);

    // Every part that has metrics of its own, configured: PostgreSQL (the cluster's), both
    // brokers, ClickHouse and the rate limit. The families are registered at start, so
    // brokers and ClickHouse that do not answer (a closed port) still show theirs.
    let Some(pg) = utils::postgres().await else {
        return;
    };
    let closed = free_port();
    let dir = tempfile::tempdir().expect("a temporary folder");
    let latch = Latch::start(
        &utils::latch_binary(),
        dir.path(),
        &[
            ("LATCH_DATABASE_URL", pg.url.clone()),
            // A shared store's key comes from outside the data folder.
            (
                "LATCH_SECRET_KEY",
                "ZGFzaGJvYXJkLXRlc3Qta2V5LW9mLTMyLWJ5dGVzISE=".into(),
            ),
            (
                "LATCH_AMQP_URL",
                format!("amqp://guest:guest@127.0.0.1:{closed}/%2f"),
            ),
            (
                "LATCH_MQTT_URL",
                format!("mqtt://127.0.0.1:{closed}?client_id=latch-ops"),
            ),
            ("LATCH_CLICKHOUSE_URL", format!("http://127.0.0.1:{closed}")),
            ("LATCH_RATE_LIMIT", "100/s".into()),
        ],
    );
    let http = reqwest::Client::new();
    let metrics = scrape(&http, &latch, "latch's /metrics").await;
    drop(latch);
    let _ = pg.drop().await;
    // And the embedded store, whose writer, log and archive have families of their own.
    let embedded_dir = tempfile::tempdir().expect("a temporary folder");
    let embedded = Latch::start(&utils::latch_binary(), embedded_dir.path(), &[]);
    let embedded_metrics = scrape(&http, &embedded, "the embedded latch's /metrics").await;
    drop(embedded);
    let metrics = format!("{metrics}\n{embedded_metrics}");
    let names = exported(&metrics);

    let missing: Vec<_> = charted
        .union(&alerted)
        .filter(|n| !names.contains(*n))
        .collect();
    assert!(
        missing.is_empty(),
        "not exported: {missing:?}; exported: {names:?}"
    );
    // And the other way round: a family nobody charts is a gap in the dashboard.
    let families: BTreeSet<String> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    let uncharted: Vec<_> = families
        .iter()
        .filter(|f| {
            ![f.to_string(), format!("{f}_sum"), format!("{f}_count")]
                .iter()
                .any(|n| charted.contains(n))
        })
        .collect();
    assert!(
        uncharted.is_empty(),
        "families no panel shows: {uncharted:?}"
    );
}
