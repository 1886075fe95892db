//! `latch bench fleet`: memory per tracked sensor, restart time, and a whole fleet going
//! silent at once.
//!
//! 1. Import N sensors (linked to one client), start latch, feed each sensor one reading,
//!    and measure RSS growth per sensor (after handing freed heap back to the OS).
//! 2. Restart latch with a short heartbeat timeout: time to ready with N sensors is the
//!    restart figure. Every sensor's deadline is now `resumed_at + timeout`, so all expire
//!    together; the lag is from that deadline (the lost events' own `at`) to the moment the
//!    last `connection_lost` notification is committed to the outbox. Meanwhile a feed of
//!    other sensors (`--ingest-rate`, with a long timeout of their own) goes on, and its
//!    requests' latency during the outage says what the expiry costs ingest. Then it waits
//!    for the receiver to answer every `connection_lost` webhook: what the client sees.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Keep, Receiver, Report, percentile, reached, rss_bytes, trim_heap};
use latch::domain::{SensorId, time};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Sensors in the fleet.
    #[arg(long, default_value_t = 1_000_000)]
    pub sensors: usize,
    /// Heartbeat timeout after the restart.
    #[arg(long, default_value = "10s", value_parser = latch::config::parse_duration)]
    pub timeout: Duration,
    /// Readings a second fed to other sensors during phase 2 (0: none).
    #[arg(long, default_value_t = 10_000)]
    pub ingest_rate: u32,
    /// The client batches up to this many notifications a request (0: one a request).
    #[arg(long, default_value_t = 0)]
    pub batch_max_events: u32,
    /// How long a batch's first notification waits for others (with `--batch-max-events`).
    #[arg(long, default_value = "100ms", value_parser = latch::config::parse_duration)]
    pub batch_max_wait: Duration,
    /// The sensors in this many sites (consecutive ids, equal shares): the outage is then
    /// one `site.connection_lost` per site, and the figures count those (0: no sites).
    #[arg(long, default_value_t = 0)]
    pub sites: usize,
    /// `LATCH_SITE_GRACE` for the run with sites.
    #[arg(long, default_value = "2s", value_parser = latch::config::parse_duration)]
    pub site_grace: Duration,
}

/// Sensors the phase-2 feed reports for, in requests of [`FEED_BATCH`].
const FEED_SENSORS: usize = 10_000;
const FEED_BATCH: usize = 1_000;

/// Posts `rate` readings a second over [`FEED_SENSORS`] sensors until `stop`, each
/// request on its own (a slow answer does not slow the offered rate), returning each
/// request's start (ms since the epoch), latency (ms) and whether it was accepted.
async fn feed(
    http: reqwest::Client,
    url: String,
    rate: u32,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<(i64, f64, bool)> {
    let names: Vec<String> = (0..FEED_SENSORS).map(|i| format!("i{i:07}")).collect();
    let period = Duration::from_secs_f64(FEED_BATCH as f64 / rate as f64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut requests = Vec::new();
    for chunk in names.chunks(FEED_BATCH).cycle() {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => break,
        }
        let items: Vec<_> = chunk
            .iter()
            .map(|id| json!({"sensor_id": id, "data": 1}))
            .collect();
        let post = http.post(&url).json(&items);
        requests.push(tokio::spawn(async move {
            let (at, t) = (time::now_ms(), Instant::now());
            let ok = post.send().await.is_ok_and(|r| r.status().as_u16() == 202);
            (at, t.elapsed().as_secs_f64() * 1000.0, ok)
        }));
    }
    let mut out = Vec::with_capacity(requests.len());
    for r in requests {
        if let Ok(done) = r.await {
            out.push(done);
        }
    }
    out
}

/// Waits until latch has no notification pending: every one made for the outage answered,
/// so the counts by type are final.
async fn settle(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let give_up = Instant::now() + Duration::from_secs(300);
    loop {
        let fleet: serde_json::Value = http
            .get(format!("{base}/v1/fleet"))
            .send()
            .await?
            .json()
            .await?;
        if fleet["notifications_pending"] == 0 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < give_up, "still pending: {fleet}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    let (dir, _tmp) = super::data_dir(None)?;
    let receiver = Receiver::start_keeping(Keep::Stats).await?;
    let client = latch::domain::Client {
        batch: (args.batch_max_events > 0).then_some(latch::domain::client::Batch {
            max_events: args.batch_max_events,
            max_wait_ms: args.batch_max_wait.as_millis() as u32,
        }),
        ..super::client(&receiver.url)
    };
    let ids = super::sensor_ids(args.sensors);
    let t = Instant::now();
    // Unlinked at first: phase 1 measures tracking alone, not a million pending webhooks.
    if args.sites > 0 {
        super::create_sites(&super::config(&dir), args.sites).await?;
    }
    super::import_sited(&super::config(&dir), &ids, &[], None, args.sites).await?;
    let import_secs = t.elapsed().as_secs_f64();

    // Phase 1: memory per tracked sensor.
    let mut config = super::config(&dir);
    config.heartbeat_timeout = Duration::from_secs(24 * 3600);
    config.sqlite_synchronous = latch::store::sqlite::Synchronous::Normal;
    let rss_empty = super::rss_of_an_empty_latch().await?;
    let t = Instant::now();
    let server = super::start(config.clone()).await?;
    let start_secs = t.elapsed().as_secs_f64();
    let http = reqwest::Client::new();
    let url = format!("{}/v1/readings", server.base);
    let t = Instant::now();
    let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    for chunk in names.chunks(10_000) {
        let items: Vec<_> = chunk
            .iter()
            .map(|id| json!({"sensor_id": id, "data": 1}))
            .collect();
        super::post_readings(&http, &url, &items).await?;
    }
    drop(names);
    let feed_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    trim_heap();
    let rss_full = rss_bytes();
    let per_sensor = (rss_full.saturating_sub(rss_empty)) as f64 / args.sensors as f64;
    server.stop().await?;

    // Phase 2: link every sensor (in its site, with sites), restart with a short timeout;
    // all expire together.
    super::import_sited(
        &super::config(&dir),
        &ids,
        std::slice::from_ref(&client),
        None,
        args.sites,
    )
    .await?;
    let feed_ids: Vec<SensorId> = (0..FEED_SENSORS)
        .map(|i| SensorId::parse(&format!("i{i:07}")).expect("valid id"))
        .collect();
    if args.ingest_rate > 0 {
        // An hour of their own: the feed's sensors are never part of the outage.
        super::import(&super::config(&dir), &feed_ids, &[], Some(3600)).await?;
    }
    config.heartbeat_timeout = args.timeout;
    config.site_grace = args.site_grace;
    let t = Instant::now();
    let server = super::start(config).await?;
    let ready_secs = t.elapsed().as_secs_f64();
    let cpu_at_ready = super::cpu_seconds();
    let commits_at_ready = super::Commits::read(&server.base).await?;
    let stop_feed = tokio_util::sync::CancellationToken::new();
    let feeding = (args.ingest_rate > 0).then(|| {
        tokio::spawn(feed(
            http.clone(),
            format!("{}/v1/readings", server.base),
            args.ingest_rate,
            stop_feed.clone(),
        ))
    });
    let before = latch::engine::lost_total();
    let all_lost_at = reached(
        || latch::engine::lost_total() - before,
        args.sensors as u64,
        args.timeout + Duration::from_secs(600),
        "sensors went lost",
    )
    .await?;
    let cpu_at_all_lost = super::cpu_seconds();
    let commits_at_all_lost = super::Commits::read(&server.base).await?;
    let ev: serde_json::Value = http
        .get(format!("{}/v1/sensors/{}/events", server.base, ids[0]))
        .send()
        .await?
        .json()
        .await?;
    let deadline = ev["items"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["type"] == "sensor.connection_lost"))
        .and_then(|e| time::parse(e["at"].as_str()?))
        .ok_or_else(|| anyhow::anyhow!("no connection_lost event found"))?;
    let lag = (all_lost_at - deadline) as f64 / 1000.0;
    // What a client notices: every lost webhook answered. Delivery runs while the outage is
    // enqueued (its claims and results share the writer) and after it. With sites, what a
    // client waits for is one event per site (and only those are counted: a sensor lost
    // after its site's decision is its own loss).
    let waited_for = || {
        if args.sites > 0 {
            receiver.events_of("site.connection_lost")
        } else {
            receiver.events_ok()
        }
    };
    let delivered_at_all_lost = waited_for();
    let expected = if args.sites > 0 {
        args.sites
    } else {
        args.sensors
    };
    let all_delivered_at = reached(
        waited_for,
        expected as u64,
        Duration::from_secs(600 + args.sensors as u64 / 2_000),
        "connection_lost webhooks answered",
    )
    .await?;
    if args.sites > 0 {
        settle(&http, &server.base).await?;
    }
    stop_feed.cancel();
    let fed = match feeding {
        Some(task) => task.await?,
        None => Vec::new(),
    };
    server.stop().await?;
    // The feed while the outage was worked off: from the deadline to the last lost.
    let during: Vec<&(i64, f64, bool)> = fed
        .iter()
        .filter(|(at, _, _)| (deadline..all_lost_at).contains(at))
        .collect();
    let mut lat: Vec<f64> = during.iter().map(|(_, ms, _)| *ms).collect();
    lat.sort_by(f64::total_cmp);
    let accepted = during.iter().filter(|(_, _, ok)| *ok).count() * FEED_BATCH;
    let window_s = (all_lost_at - deadline) as f64 / 1000.0;

    let mut r = Report::new("fleet");
    r.add("sensors", args.sensors as f64, "sensors");
    r.add("import_seconds", import_secs, "s");
    r.add("start_seconds", start_secs, "s");
    r.add("feed_seconds", feed_secs, "s");
    r.add(
        "feed_readings_per_s",
        (args.sensors as f64 / feed_secs).round(),
        "readings/s",
    );
    r.add("rss_empty_mib", rss_empty as f64 / 1048576.0, "MiB");
    r.add("rss_tracking_mib", rss_full as f64 / 1048576.0, "MiB");
    r.add("bytes_per_sensor", per_sensor.round(), "bytes");
    r.add("restart_ready_seconds", ready_secs, "s");
    r.add("all_lost_enqueued_after_deadline_s", lag, "s");
    let delivered_s = (all_delivered_at - deadline) as f64 / 1000.0;
    r.add("all_lost_delivered_after_deadline_s", delivered_s, "s");
    r.add(
        "delivered_per_s_while_enqueuing",
        (delivered_at_all_lost as f64 / window_s.max(1e-3)).round(),
        "webhooks/s",
    );
    r.add(
        "delivered_per_s_after_enqueued",
        ((expected as u64).saturating_sub(delivered_at_all_lost) as f64
            / ((all_delivered_at - all_lost_at) as f64 / 1000.0).max(1e-3))
        .round(),
        "webhooks/s",
    );
    r.add(
        "duplicate_webhooks",
        receiver.duplicates() as f64,
        "requests",
    );
    r.add(
        "batch_max_events",
        f64::from(args.batch_max_events),
        "events",
    );
    r.add("webhook_requests", receiver.requests() as f64, "requests");
    r.add("sites", args.sites as f64, "sites");
    r.add(
        "site_lost_webhooks",
        receiver.events_of("site.connection_lost") as f64,
        "webhooks",
    );
    r.add(
        "sensor_lost_webhooks",
        receiver.events_of("sensor.connection_lost") as f64,
        "webhooks",
    );
    r.add(
        "site_grace_s",
        if args.sites > 0 {
            args.site_grace.as_secs_f64()
        } else {
            0.0
        },
        "s",
    );
    r.add(
        "cpu_seconds_ready_to_all_lost",
        cpu_at_all_lost - cpu_at_ready,
        "s",
    );
    // Near 1: the group commits ran back to back from the deadline on, and bound the
    // lag (the feed's small commits before the deadline count too, a few percent).
    r.add(
        "commit_busy_share_after_deadline",
        (commits_at_all_lost.seconds - commits_at_ready.seconds) / window_s.max(1e-3),
        "x",
    );
    r.add(
        "commits_ready_to_all_lost",
        commits_at_all_lost.count - commits_at_ready.count,
        "commits",
    );
    if args.ingest_rate > 0 {
        r.add(
            "ingest_during_outage_per_s",
            (accepted as f64 / window_s).round(),
            "readings/s",
        );
        r.add(
            "ingest_during_outage_failed",
            during.iter().filter(|(_, _, ok)| !ok).count() as f64,
            "requests",
        );
        r.add("ingest_during_outage_p50_ms", percentile(&lat, 50.0), "ms");
        r.add("ingest_during_outage_p99_ms", percentile(&lat, 99.0), "ms");
        r.add(
            "ingest_during_outage_max_ms",
            lat.last().copied().unwrap_or(f64::NAN),
            "ms",
        );
    }
    r.notes.push(format!(
        "Sensors unlinked while memory is measured, then each linked to one client for the \
         restart. bytes_per_sensor = (RSS with the fleet tracked − RSS \
         of an empty latch) / sensors, measured in one process after malloc_trim; it includes \
         SQLite's page cache. Restart: {} sensors with state; timeout after restart {:?}. \
         cpu_seconds_ready_to_all_lost: this process's CPU time (latch, the receiver and the \
         bench's clients) from ready to the last lost. commit_busy_share_after_deadline: \
         seconds in group commits from ready to the last lost over the seconds from the \
         deadline to it (claims and recorded results use the same writer and are not \
         counted). Ingest during the outage: {} readings/s \
         offered to {} other sensors in requests of {} (0: none), counted from the deadline \
         to the last lost. all_lost_delivered_after_deadline_s: from the deadline to the \
         receiver's answer to the last lost webhook (one client, in this process); the \
         delivered_per_s figures split that delivery at the last lost enqueued; with \
         batch_max_events > 0 the client batches (max_wait {:?}) and these count events, \
         webhook_requests the requests that carried them. With sites > 0 the sensors are in \
         that many sites (consecutive ids) and the delivery figures count the sites' \
         site.connection_lost events (one per site), decided site_grace_s after the first \
         loss of each; sensor_lost_webhooks are sensors' own losses, of sensors whose loss \
         was committed after their site's decision (counted once nothing is pending).",
        args.sensors, args.timeout, args.ingest_rate, FEED_SENSORS, FEED_BATCH, args.batch_max_wait
    ));
    Ok(r)
}
