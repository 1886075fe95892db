//! `latch bench silences`: ingest with many active silences of many sensors each, beside
//! ingest with none (issue #69 item 10).
//!
//! Two latches in this process on the same fleet, every sensor linked to one client (a
//! receiver here): one with no silence, one with `--silences` active silences that each
//! name `--silence-size` sensors (made over the API, timed). Readings go to the first
//! `--sensors` sensors; the last `--hit` of those are among the sensors the silences name,
//! so their changes are silenced by the commit and matching is exercised, while the rest of
//! the named sensors (a pool of `--pool`, each silence a window of it) get no readings.
//! The load alternates between the two latches, `--rounds` times for `--phase` each, and
//! the figure is the rate with silences over the rate without.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Keep, Receiver, Report, Server, percentile};
use latch::domain::time;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Sensors readings go to.
    #[arg(long, default_value_t = 10_000)]
    pub sensors: usize,
    /// Active silences on the latch with silences.
    #[arg(long, default_value_t = 300)]
    pub silences: usize,
    /// Sensors each silence names.
    #[arg(long, default_value_t = 10_000)]
    pub silence_size: usize,
    /// Sensors the silences name between them (each one a window of them, spread evenly).
    #[arg(long, default_value_t = 30_000)]
    pub pool: usize,
    /// Of the sensors readings go to, how many are in the pool (their changes silenced).
    #[arg(long, default_value_t = 1_000)]
    pub hit: usize,
    /// How long each turn of load on one latch lasts.
    #[arg(long, default_value = "5s", value_parser = latch::config::parse_duration)]
    pub phase: Duration,
    /// Turns on each latch, alternated.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Readings per HTTP request.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Share of readings that change their sensor's state.
    #[arg(long, default_value_t = 0.1)]
    pub change_ratio: f64,
    /// Run on PostgreSQL (a fresh schema of this database for each latch) instead of SQLite.
    #[arg(long)]
    pub database_url: Option<String>,
}

/// Request bodies each worker prepares and sends in turn.
const PRESET_BODIES: usize = 16;

pub async fn run(args: Args) -> anyhow::Result<Report> {
    anyhow::ensure!(args.hit <= args.sensors, "--hit is more than --sensors");
    anyhow::ensure!(
        args.silence_size <= args.pool,
        "--silence-size is more than --pool"
    );
    // Readings to the first `sensors`; the pool starts at the last `hit` of them.
    let ids = super::sensor_ids(args.sensors - args.hit + args.pool);
    let pool = &ids[args.sensors - args.hit..];
    let receiver = Receiver::start_keeping(Keep::Counts).await?;
    let client = super::client(&receiver.url);
    let (dir, _tmp) = super::data_dir(None)?;
    let mut servers = Vec::new();
    let mut schemas = Vec::new();
    for name in ["none", "silenced"] {
        let (config, pg) =
            super::store_config(&dir.join(name), args.database_url.as_deref()).await?;
        std::fs::create_dir_all(&config.data_dir)?;
        super::import(&config, &ids, std::slice::from_ref(&client), None).await?;
        servers.push(super::start(config).await?);
        schemas.extend(pg);
    }
    let http = reqwest::Client::new();

    // The silences, each a window of the pool that starts `stride` after the last one's.
    let stride = (args.pool / args.silences.max(1)).max(1);
    let ends_at = time::format(time::now_ms() + 24 * 3600 * 1000);
    let mut made = Vec::with_capacity(args.silences);
    for k in 0..args.silences {
        let named: Vec<String> = (0..args.silence_size)
            .map(|j| pool[(k * stride + j) % args.pool].to_string())
            .collect();
        let body = json!({"match": {"sensor_ids": named}, "ends_at": ends_at, "comment": "bench"});
        let t = Instant::now();
        let r = http
            .post(format!("{}/v1/silences", servers[1].base))
            .json(&body)
            .send()
            .await?;
        anyhow::ensure!(
            r.status().as_u16() == 201,
            "silence refused: {}",
            r.status()
        );
        made.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    made.sort_by(f64::total_cmp);

    let readers: Arc<Vec<String>> =
        Arc::new(ids[..args.sensors].iter().map(|i| i.to_string()).collect());
    let bodies: Vec<Arc<Vec<String>>> = (0..args.workers)
        .map(|w| {
            let mine = readers
                .iter()
                .skip(w)
                .step_by(args.workers)
                .cloned()
                .collect();
            let mut maker = super::Bodies::new(mine, w as u64 + 1, args.change_ratio);
            Arc::new((0..PRESET_BODIES).map(|_| maker.body(args.batch)).collect())
        })
        .collect();
    // A short turn on each first, not counted: caches and connections warm.
    for s in &servers {
        drive(&http, s, &bodies, Duration::from_secs(1)).await?;
    }
    let mut totals = [(0u64, 0f64); 2];
    let mut r = Report::new("silences");
    for round in 0..args.rounds {
        let mut rates = [0f64; 2];
        for (i, s) in servers.iter().enumerate() {
            let (n, secs) = drive(&http, s, &bodies, args.phase).await?;
            totals[i].0 += n;
            totals[i].1 += secs;
            rates[i] = n as f64 / secs;
        }
        r.add(
            format!("round{}_ratio", round + 1),
            rates[1] / rates[0],
            "x",
        );
    }
    let metrics = reqwest::get(format!("{}/metrics", servers[1].base))
        .await?
        .text()
        .await?;
    let silenced = metrics
        .lines()
        .find_map(|l| l.strip_prefix("latch_notifications_total{status=\"silenced\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    for s in servers {
        s.stop().await?;
    }
    for pg in schemas {
        pg.drop().await?;
    }

    let rate = |(n, secs): (u64, f64)| n as f64 / secs;
    r.add("silences", args.silences as f64, "silences");
    r.add("sensors_each_names", args.silence_size as f64, "sensors");
    r.add("silence_create_p50_ms", percentile(&made, 50.0), "ms");
    r.add("silence_create_max_ms", percentile(&made, 100.0), "ms");
    r.add(
        "readings_per_s_without",
        rate(totals[0]).round(),
        "readings/s",
    );
    r.add("readings_per_s_with", rate(totals[1]).round(), "readings/s");
    r.add(
        "ratio_with_to_without",
        rate(totals[1]) / rate(totals[0]),
        "x",
    );
    r.add("notifications_silenced", silenced, "notifications");
    r.add("webhooks_answered", receiver.events_ok() as f64, "webhooks");
    r.notes.push(format!(
        "Store: {}. {} sensors get readings (batches of {}, {} workers, {:.0} % changes), each \
         linked to one client; on one latch {} active silences each name {} of a pool of {} \
         sensors (windows {stride} apart, so each pooled sensor is named by about {} of them), \
         of which {} get readings. Load alternates between the latch without and the one with \
         silences, {} turns of {:?} each (after a 1 s turn each, not counted); \
         ratio_with_to_without is the rate over all turns with silences over the rate without, \
         roundN_ratio each round's. silence_create_*: POST /v1/silences of {} sensors.",
        if args.database_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        },
        args.sensors,
        args.batch,
        args.workers,
        args.change_ratio * 100.0,
        args.silences,
        args.silence_size,
        args.pool,
        (args.silences * args.silence_size).div_ceil(args.pool),
        args.hit,
        args.rounds,
        args.phase,
        args.silence_size,
    ));
    Ok(r)
}

/// One turn of load on `server` for `phase`: each worker sends its bodies in turn.
/// Answers the readings accepted and the seconds the turn took.
async fn drive(
    http: &reqwest::Client,
    server: &Server,
    bodies: &[Arc<Vec<String>>],
    phase: Duration,
) -> anyhow::Result<(u64, f64)> {
    let url = format!("{}/v1/readings", server.base);
    let accepted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + phase;
    let errors = super::workers(bodies.len(), |w| {
        let (http, url, accepted, bodies) = (
            http.clone(),
            url.clone(),
            accepted.clone(),
            bodies[w].clone(),
        );
        async move {
            let mut errors = 0u64;
            let mut turn = 0;
            while Instant::now() < until {
                let body = bodies[turn % bodies.len()].clone();
                turn += 1;
                let r = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                match r {
                    Ok(r) if r.status().as_u16() == 202 => {
                        let v: serde_json::Value = r.json().await.unwrap_or_default();
                        accepted.fetch_add(v["accepted"].as_u64().unwrap_or(0), Ordering::Relaxed);
                    }
                    _ => errors += 1,
                }
            }
            errors
        }
    })
    .await;
    let secs = started.elapsed().as_secs_f64();
    let errors: u64 = errors.iter().sum();
    anyhow::ensure!(errors == 0, "{errors} requests refused");
    Ok((accepted.load(Ordering::Relaxed), secs))
}
