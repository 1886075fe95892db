//! `latch bench sites`: many sites, some of them dark at once, and their return.
//!
//! Sites of `--per-site` sensors each (consecutive ids), every sensor linked to one
//! client. After one reading from every sensor, a feed keeps the sensors of the lit sites
//! reporting (each well within the heartbeat timeout) while those of the first
//! `--dark` sites fall silent: each dark site is one `site.connection_lost`, and no lit
//! site may go down. Then every dark sensor reports again at once, and the figure that
//! matters is how long until the client has every dark site's `site.connection_restored`:
//! a round decides sites every second, so that time says in how many rounds the sites
//! still down (more than one round's batch of them) were all decided (issue #68).

use std::time::Duration;

use serde_json::json;

use super::{Keep, Receiver, Report, reached};
use latch::domain::{SensorId, time};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Sites in all.
    #[arg(long, default_value_t = 10_000)]
    pub sites: usize,
    /// Of those, how many go dark.
    #[arg(long, default_value_t = 2_000)]
    pub dark: usize,
    /// Sensors in each site.
    #[arg(long, default_value_t = 5)]
    pub per_site: usize,
    /// Heartbeat timeout.
    #[arg(long, default_value = "20s", value_parser = latch::config::parse_duration)]
    pub timeout: Duration,
    /// `LATCH_SITE_GRACE`.
    #[arg(long, default_value = "2s", value_parser = latch::config::parse_duration)]
    pub site_grace: Duration,
}

/// Readings a request carries.
const CHUNK: usize = 5_000;

/// Posts a reading of `data` for each of `ids`, in requests of [`CHUNK`].
async fn report(
    http: &reqwest::Client,
    url: &str,
    ids: &[SensorId],
    data: u8,
) -> anyhow::Result<()> {
    for chunk in ids.chunks(CHUNK) {
        let items: Vec<_> = chunk
            .iter()
            .map(|id| json!({"sensor_id": id.to_string(), "data": data}))
            .collect();
        super::post_readings(http, url, &items).await?;
    }
    Ok(())
}

/// Keeps `ids` reporting until `stop`: all of them every `every`.
async fn keep_alive(
    http: reqwest::Client,
    url: String,
    ids: Vec<SensorId>,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.cancelled() => return Ok(()),
        }
        report(&http, &url, &ids, 1).await?;
    }
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    anyhow::ensure!(args.dark <= args.sites, "--dark is more than --sites");
    let (dir, _tmp) = super::data_dir(None)?;
    let receiver = Receiver::start_keeping(Keep::Stats).await?;
    let client = super::client(&receiver.url);
    let ids = super::sensor_ids(args.sites * args.per_site);
    super::create_sites(&super::config(&dir), args.sites).await?;
    super::import_sited(
        &super::config(&dir),
        &ids,
        std::slice::from_ref(&client),
        None,
        args.sites,
    )
    .await?;
    let (dark, lit) = ids.split_at(args.dark * args.per_site);

    let mut config = super::config(&dir);
    config.heartbeat_timeout = args.timeout;
    config.site_grace = args.site_grace;
    config.sqlite_synchronous = latch::store::sqlite::Synchronous::Normal;
    let server = super::start(config).await?;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/readings", server.base);
    report(&http, &url, &ids, 1).await?;
    let went_dark = time::now_ms();
    let stop = tokio_util::sync::CancellationToken::new();
    let feed = tokio::spawn(keep_alive(
        http.clone(),
        url.clone(),
        lit.to_vec(),
        args.timeout / 4,
        stop.clone(),
    ));
    let patience = args.timeout + Duration::from_secs(300);
    let losses = || receiver.events_of("site.connection_lost");
    let all_down = reached(losses, args.dark as u64, patience, "site losses").await?;
    // A few rounds more: a lit site going down would show now.
    tokio::time::sleep(args.site_grace + Duration::from_secs(3)).await;
    let lost_sites = losses();

    let back_at = time::now_ms();
    report(&http, &url, dark, 0).await?;
    let reported = time::now_ms();
    let returns = || receiver.events_of("site.connection_restored");
    let all_back = reached(returns, args.dark as u64, patience, "site returns").await?;
    stop.cancel();
    feed.await??;
    server.stop().await?;

    let mut r = Report::new("sites");
    r.add("sites", args.sites as f64, "sites");
    r.add("dark_sites", args.dark as f64, "sites");
    r.add("sensors", ids.len() as f64, "sensors");
    r.add(
        "losses_told_after_dark_s",
        (all_down - went_dark) as f64 / 1000.0,
        "s",
    );
    r.add("site_lost_webhooks", lost_sites as f64, "webhooks");
    r.add(
        "return_readings_posted_s",
        (reported - back_at) as f64 / 1000.0,
        "s",
    );
    let back_s = (all_back - back_at) as f64 / 1000.0;
    r.add("returns_told_after_readings_s", back_s, "s");
    r.add("returns_told_within_rounds", back_s.ceil(), "rounds");
    r.add("site_restored_webhooks", returns() as f64, "webhooks");
    r.add(
        "sensor_lost_webhooks",
        receiver.events_of("sensor.connection_lost") as f64,
        "webhooks",
    );
    r.add(
        "sensor_restored_webhooks",
        receiver.events_of("sensor.connection_restored") as f64,
        "webhooks",
    );
    r.add(
        "duplicate_webhooks",
        receiver.duplicates() as f64,
        "requests",
    );
    r.notes.push(format!(
        "{} sites of {} sensors, each linked to one client; timeout {:?}, site grace {:?}. \
         The first {} sites' sensors fall silent while a feed keeps the others reporting \
         every timeout/4. losses_told_after_dark_s: from their last reading to the \
         client's answer to the last site.connection_lost (a timeout plus the grace \
         plus delivery); site_lost_webhooks counted a grace and 3 s later (more than \
         dark_sites: a lit site went down). Then every dark sensor reports at once: \
         returns_told_after_readings_s is from the first of those readings to the answer \
         to the last site.connection_restored; a round runs every second, so \
         returns_told_within_rounds bounds the rounds it took. sensor_*_webhooks: sensors' \
         own events (0 expected: each site's events stand for them).",
        args.sites, args.per_site, args.timeout, args.site_grace, args.dark
    ));
    Ok(r)
}
