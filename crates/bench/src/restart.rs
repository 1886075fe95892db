//! `latch bench restart`: time from start to ready with N sensors and P pending
//! notifications — the store loaded into the engine's fleet and the dispatcher's lanes.
//!
//! The pending notifications are real: P state changes are posted while every webhook
//! fails (503), so they wait in the outbox for their retry when latch stops. Baseline: the
//! start of an empty latch in the same run.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Keep, Receiver, Report};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Sensors in the store.
    #[arg(long, default_value_t = 1_000_000)]
    pub sensors: usize,
    /// Pending notifications in the outbox (at most one per sensor).
    #[arg(long, default_value_t = 100_000)]
    pub pending: usize,
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    anyhow::ensure!(
        args.pending <= args.sensors,
        "--pending is at most --sensors (one state change per sensor)"
    );
    let (dir, _tmp) = super::data_dir(None)?;
    let receiver = Receiver::start_keeping(Keep::Stats).await?;
    receiver.fail_per_10k(10_000);
    let client = super::client(&receiver.url);
    let ids = super::sensor_ids(args.sensors);
    let mut config = super::config(&dir);
    // Retries far off: the pending ones stay pending through the restart.
    config.retry_base = Duration::from_secs(3600);
    config.retry_max_delay = Duration::from_secs(3600);
    super::import(
        &config,
        &ids[..args.pending],
        std::slice::from_ref(&client),
        None,
    )
    .await?;
    super::import(&config, &ids[args.pending..], &[], None).await?;

    let server = super::start(config.clone()).await?;
    let http = reqwest::Client::new();
    for chunk in ids[..args.pending].chunks(10_000) {
        let items: Vec<_> = chunk
            .iter()
            .map(|id| json!({"sensor_id": id.to_string(), "data": 1}))
            .collect();
        super::post_readings(&http, &format!("{}/v1/readings", server.base), &items).await?;
    }
    server.stop().await?;

    let empty = tempfile::tempdir()?;
    let t = Instant::now();
    super::start(super::config(empty.path()))
        .await?
        .stop()
        .await?;
    let empty_secs = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let server = super::start(config).await?;
    let ready_secs = t.elapsed().as_secs_f64();
    let (_, _, pending) = super::changes::outbox_counts(&server.base, &http).await?;
    server.stop().await?;

    let mut r = Report::new("restart");
    r.add("sensors", args.sensors as f64, "sensors");
    r.add("pending_notifications", pending as f64, "notifications");
    r.add("ready_seconds", ready_secs, "s");
    r.add("empty_ready_seconds", empty_secs, "s");
    r.notes.push(format!(
        "{} sensors, {} of them with a pending state notification (their webhooks answered \
         503, retry an hour off); ready = /readyz answering 200 after start, in process. \
         Baseline: an empty latch started in the same run.",
        args.sensors, args.pending
    ));
    Ok(r)
}
