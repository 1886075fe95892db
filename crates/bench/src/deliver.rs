//! `latch bench deliver`: state changes in, webhooks out.
//!
//! Every reading flips its sensor, and the sensors are many, so each change is delivered
//! rather than superseded. Latency is from `occurred_at` (the reading's receive time) to
//! the receiver. Baseline: the same receiver hammered directly with the same payloads and
//! concurrency — what the receiver and HTTP stack can take at all. `--to mqtt|amqp`
//! delivers to a broker destination instead ([`super::deliver_broker`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

pub use super::changes::Args;
use super::changes::{drain, outbox_counts, send_changes};
use super::{Keep, Receiver, Report, percentile};

pub async fn run(args: Args) -> anyhow::Result<Report> {
    match args.to.as_str() {
        "http" => {}
        "mqtt" | "amqp" => return super::deliver_broker::run(args).await,
        other => anyhow::bail!("--to takes http, mqtt or amqp, not {other:?}"),
    }
    let (dir, _tmp) = super::data_dir(None)?;
    let mut receivers = Vec::new();
    for _ in 0..args.clients {
        let r = Receiver::start_keeping(Keep::Stats).await?;
        r.fail_per_10k((args.fail_ratio * 10_000.0) as u64);
        receivers.push(r);
    }
    let clients: Vec<_> = receivers.iter().map(|r| super::client(&r.url)).collect();
    let ids = super::sensor_ids(args.sensors);
    let (mut config, pg) = super::store_config(&dir, args.database_url.as_deref()).await?;
    super::import(&config, &ids, &clients, None).await?;
    let concurrency = config.delivery_client_concurrency as usize;
    config.retry_base = Duration::from_millis(100);
    config.retry_max_delay = Duration::from_secs(2);
    let server = super::start(config).await?;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/readings", server.base);

    let states = receivers.clone();
    let progress = super::progress("deliver", "webhooks delivered", move || {
        states.iter().map(Receiver::ok).sum()
    });
    // The dispatcher's backlog: notifications held in its lanes, sampled while it runs.
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let (http, url, peak) = (
            http.clone(),
            format!("{}/metrics", server.base),
            peak.clone(),
        );
        tokio::spawn(async move {
            loop {
                if let Ok(r) = http.get(&url).send().await
                    && let Ok(text) = r.text().await
                {
                    let n = super::metric_sum(&text, "latch_notifications_pending") as u64;
                    peak.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    let started = Instant::now();
    let send_secs = send_changes(&args, &http, &url, ids, started).await?;
    let pass = args.changes.saturating_sub(1) / args.sensors.max(1);
    let expected = (args.changes * args.clients) as u64;
    drain(&http, &server.base, expected, args.drain).await?;
    let total_secs = started.elapsed().as_secs_f64();
    let metrics_url = format!("{}/metrics", server.base);
    progress.abort();
    sampler.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let lanes = (args.sensors.min(args.changes) * args.clients) as f64;
    // What bounds ingest of changes: each group commit's time and size.
    let text = http.get(&metrics_url).send().await?.text().await?;
    let commits = super::metric_sum(&text, "latch_commit_seconds_count");
    let commit_ms =
        1000.0 * super::metric_sum(&text, "latch_commit_seconds_sum") / commits.max(1.0);
    let delivered_n: u64 = receivers.iter().map(Receiver::ok).sum();
    let requests: u64 = receivers.iter().map(Receiver::requests).sum();
    let counts = outbox_counts(&server.base, &http).await?;
    server.stop().await?;
    if let Some(pg) = pg {
        pg.drop().await?;
    }

    let mut lat: Vec<f64> = receivers.iter().flat_map(Receiver::latencies).collect();
    lat.sort_by(f64::total_cmp);
    let duplicates: u64 = receivers.iter().map(Receiver::duplicates).sum();
    // Connections opened and the receiver warm before either is timed; then the same
    // concurrency latch may use towards one client, and a wide one.
    hammer(&receivers[0], 256, args.baseline_requests / 4).await?;
    let baseline = hammer(&receivers[0], concurrency, args.baseline_requests).await?;
    let baseline_wide = hammer(&receivers[0], 256, args.baseline_requests).await?;
    let rate = delivered_n as f64 / total_secs;

    let mut r = Report::new("deliver");
    r.add("changes_sent", args.changes as f64, "changes");
    r.add("notifications_expected", expected as f64, "notifications");
    r.add("delivered", delivered_n as f64, "notifications");
    r.add("failed", counts.0 as f64, "notifications");
    r.add("superseded", counts.1 as f64, "notifications");
    r.add("pending_left", counts.2 as f64, "notifications");
    r.add("webhook_requests", requests as f64, "requests");
    r.add("duplicate_deliveries", duplicates as f64, "notifications");
    r.add("send_seconds", send_secs, "s");
    // Delivery cannot outrun this: the changes as fast as latch accepted them.
    r.add(
        "changes_accepted_per_s",
        (args.changes as f64 / send_secs).round(),
        "changes/s",
    );
    r.add("group_commits", commits, "commits");
    r.add("commit_mean_ms", (commit_ms * 10.0).round() / 10.0, "ms");
    r.add("delivered_per_s", rate.round(), "webhooks/s");
    r.add("pending_peak", peak as f64, "notifications");
    r.add(
        "pending_peak_per_lane",
        (100.0 * peak as f64 / lanes).round() / 100.0,
        "notifications",
    );
    r.add("latency_p50_ms", percentile(&lat, 50.0), "ms");
    r.add("latency_p99_ms", percentile(&lat, 99.0), "ms");
    r.add("latency_p999_ms", percentile(&lat, 99.9), "ms");
    r.add(
        "baseline_direct_requests_per_s",
        baseline.round(),
        "requests/s",
    );
    r.add("ratio_to_direct", rate / baseline, "x");
    r.add(
        "baseline_direct_256_requests_per_s",
        baseline_wide.round(),
        "requests/s",
    );
    r.add("ratio_to_direct_256", rate / baseline_wide, "x");
    r.notes.push(format!(
        "Store: {}. {} sensors x {} clients, {} changes from {} senders, rate {}, fail ratio {}; latency from occurred_at \
         (receive time of the reading) to the receiver; baseline: the receiver hammered \
         directly by as many concurrent requests as latch may send one client ({}), and by \
         256 (`_256`). Passes over the fleet: {}.",
        if args.database_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        },
        args.sensors,
        args.clients,
        args.changes,
        args.senders.max(1),
        if args.rate == 0 {
            "max".to_string()
        } else {
            format!("{}/s", args.rate)
        },
        args.fail_ratio,
        concurrency,
        pass + 1
    ));
    Ok(r)
}

/// Requests/s the receiver takes when posted to directly.
async fn hammer(r: &Receiver, concurrency: usize, total: usize) -> anyhow::Result<f64> {
    r.fail_per_10k(0);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let body = Arc::new(
        json!({"id": "01JD0Y3Q6T3S8W0KZ9X7M2V4QH", "type": "sensor.state_changed",
               "occurred_at": latch::domain::time::format(latch::domain::time::now_ms()),
               "sensor": {"id": "b0000000", "address": "bench street 1"}, "data": 1, "previous": 0})
        .to_string(),
    );
    let started = Instant::now();
    let per = total.div_ceil(concurrency);
    super::workers(concurrency, |_| {
        let (http, url, body) = (http.clone(), r.url.clone(), body.clone());
        async move {
            for _ in 0..per {
                let _ = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.as_str().to_owned())
                    .send()
                    .await;
            }
        }
    })
    .await;
    Ok((per * concurrency) as f64 / started.elapsed().as_secs_f64())
}
