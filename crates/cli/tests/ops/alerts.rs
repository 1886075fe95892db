//! The alert rules of `deploy/prometheus`: promtool's unit tests of every alert, and a
//! real Prometheus that scrapes a latch whose webhook receiver goes away.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

use crate::utils::{self, Latch, Proc, eventually, free_port, run, tool};

/// The alert names of the rules file, in order.
fn alerts(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_alert_passes_promtool_unit_tests_that_make_it_fire_and_keep_it_quiet() {
    let Some(promtool) = tool("promtool", "prometheus") else {
        return;
    };
    let dir = utils::repo().join("deploy/prometheus");
    run(Command::new(&promtool)
        .current_dir(&dir)
        .args(["check", "rules", "latch-rules.yml"]));
    run(Command::new(&promtool)
        .current_dir(&dir)
        .args(["test", "rules", "latch-rules.test.yml"]));

    // Each alert has a case where it fires (expected labels) and one where it does not.
    let rules = std::fs::read_to_string(dir.join("latch-rules.yml")).expect("the rules");
    let tests = std::fs::read_to_string(dir.join("latch-rules.test.yml")).expect("their tests");
    let cases: Vec<(&str, bool)> = tests
        .split("alertname: ")
        .skip(1)
        .map(|case| {
            let case = case.split("- eval_time").next().unwrap_or(case);
            let name = case.split_whitespace().next().unwrap_or("");
            (name, case.contains("exp_labels"))
        })
        .collect();
    let names = alerts(&rules);
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        assert!(
            cases.contains(&(name.as_str(), true)),
            "{name}: no test where it fires"
        );
        assert!(
            cases.contains(&(name.as_str(), false)),
            "{name}: no test where it stays quiet"
        );
    }
}

/// A webhook receiver that can go away: after [`Hook::stop`] its port refuses connections.
struct Hook {
    url: String,
    answered: Arc<AtomicU64>,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

impl Hook {
    async fn start() -> Self {
        let answered = Arc::new(AtomicU64::new(0));
        let count = answered.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move || {
                count.fetch_add(1, Ordering::Relaxed);
                async {}
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/hook", listener.local_addr().expect("address"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Self {
            url,
            answered,
            stop,
            served,
        }
    }

    /// Stops listening and closes its connections.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.served.await.expect("the receiver stops");
    }
}

/// A Prometheus of the test's own, on a free port, killed when dropped.
struct Prometheus {
    _proc: Proc,
    api: String,
}

impl Prometheus {
    /// Scrapes `target` every second as job `latch` and evaluates `rules` every second.
    fn start(binary: &std::path::Path, dir: &std::path::Path, target: &str, rules: &str) -> Self {
        std::fs::write(dir.join("latch-rules.yml"), rules).expect("rules written");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [latch-rules.yml]\n\
             scrape_configs:\n  - job_name: latch\n    static_configs:\n      - targets: ['{target}']\n"
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("config written");
        let port = free_port();
        let proc = Proc::spawn(
            Command::new(binary)
                .arg(format!(
                    "--config.file={}",
                    dir.join("prometheus.yml").display()
                ))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn"),
            dir.join("prometheus.log"),
        );
        Self {
            _proc: proc,
            api: format!("http://127.0.0.1:{port}/api/v1"),
        }
    }

    async fn get(&self, http: &reqwest::Client, path: &str) -> Option<Value> {
        let resp = http.get(format!("{}{path}", self.api)).send().await.ok()?;
        let body: Value = resp.json().await.ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// The value of an instant query giving one number.
    async fn number(&self, http: &reqwest::Client, query: &str) -> Option<f64> {
        let url = format!("/query?query={}", urlencode(query));
        let data = self.get(http, &url).await?;
        data["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// The active alerts.
    async fn alerts(&self, http: &reqwest::Client) -> Vec<Value> {
        let data = self.get(http, "/alerts").await.unwrap_or_default();
        data["alerts"].as_array().cloned().unwrap_or_default()
    }
}

fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The real rules, except that every `for:` is 0s: a test cannot wait 10 minutes, and
/// what is checked live is that the expressions select latch's real series.
fn without_durations(rules: &str) -> String {
    rules
        .lines()
        .map(|l| match l.split_once("for: ") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: 0s"),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_real_prometheus_fires_the_delivery_alert_once_the_receiver_goes_away() {
    let Some(prometheus) = tool("prometheus", "prometheus") else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary folder");
    let http = reqwest::Client::new();
    let hook = Hook::start().await;
    // Retries close together, so failures pile up within seconds of the receiver leaving.
    let latch = Latch::start(
        &utils::latch_binary(),
        &dir.path().join("latch"),
        &[
            ("LATCH_RETRY_BASE", "100ms".into()),
            ("LATCH_RETRY_MAX_DELAY", "300ms".into()),
            ("LATCH_RETRY_MAX_ATTEMPTS", "1000".into()),
        ],
    );
    latch.ready(&http).await;
    let rules = std::fs::read_to_string(utils::repo().join("deploy/prometheus/latch-rules.yml"))
        .expect("the rules");
    let target = latch.base.trim_start_matches("http://");
    let prom = Prometheus::start(&prometheus, dir.path(), target, &without_durations(&rules));

    // Webhooks answered: Prometheus sees deliveries and every rule evaluates without error,
    // and the delivery alert stays quiet.
    let walk = utils::walk_through(&http, &latch.base, &hook.url).await;
    let delivered = r#"sum(latch_delivery_attempts_total{job="latch", outcome="delivered"})"#;
    eventually(60, "Prometheus scraping a delivered webhook", || async {
        (prom.number(&http, delivered).await? >= 1.0).then_some(())
    })
    .await;
    assert!(hook.answered.load(Ordering::Relaxed) >= 1);
    let seen = chrono::Utc::now();
    let groups = eventually(30, "a rule evaluation after the deliveries", || async {
        let groups = prom.get(&http, "/rules").await?["groups"].clone();
        let evaluated = groups[0]["lastEvaluation"].as_str()?;
        let at = chrono::DateTime::parse_from_rfc3339(evaluated).ok()?;
        (at > seen).then_some(groups)
    })
    .await;
    let evaluated = groups[0]["rules"].as_array().expect("rules");
    assert_eq!(evaluated.len(), alerts(&rules).len(), "every rule loaded");
    for rule in evaluated {
        assert_eq!(rule["health"], "ok", "{rule}");
    }
    let quiet = prom.alerts(&http).await;
    assert!(
        !quiet
            .iter()
            .any(|a| a["labels"]["alertname"] == "LatchDeliveryFailing"),
        "{quiet:?}"
    );

    // The receiver goes away; the next change's attempts fail, and the alert fires.
    hook.stop().await;
    let (status, _) = utils::post(
        &http,
        &format!("{}/v1/readings", latch.base),
        serde_json::json!({"sensor_id": walk.sensor, "data": 1}),
    )
    .await;
    assert_eq!(status, 202);
    let firing = eventually(120, "LatchDeliveryFailing firing", || async {
        prom.alerts(&http)
            .await
            .into_iter()
            .find(|a| a["labels"]["alertname"] == "LatchDeliveryFailing" && a["state"] == "firing")
    })
    .await;
    assert_eq!(firing["labels"]["instance"], target);
    assert_eq!(firing["labels"]["job"], "latch");
    assert_eq!(firing["labels"]["severity"], "warning");
    let failed = r#"sum(latch_delivery_attempts_total{job="latch", outcome="connection_error"})"#;
    assert!(prom.number(&http, failed).await.unwrap_or(0.0) >= 1.0);
}
