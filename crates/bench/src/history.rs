//! `latch bench history`: shipping the spool to ClickHouse, on a private ClickHouse server
//! this bench starts and kills.
//!
//! 1. Drain: `--backlog` readings accepted while ClickHouse is down, then shipped once it is
//!    up. Baseline: the same number of rows inserted into ClickHouse directly by the same
//!    client code, in batches of the same size.
//! 2. Outage: readings at `--rate` for `--before`, ClickHouse killed for `--outage`, then up
//!    again: how long until everything accepted before it came back is in ClickHouse, and
//!    whether ingest kept its rate meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::Report;
use super::clickhouse_server::LocalClickHouse;
use latch::domain::{SensorId, time};
use latch::history::clickhouse::{ClickHouse, Target};
use latch::history::shipper::BATCH;
use latch::store::{HistoryBatch, ReadingRecord, Stored};

/// Readings per HTTP request.
const REQUEST: usize = 1000;
/// Requests in flight at once.
const SENDERS: usize = 4;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Registered sensors readings are spread over.
    #[arg(long, default_value_t = 10_000)]
    pub sensors: usize,
    /// Readings accepted while ClickHouse is down, for the drain measurement.
    #[arg(long, default_value_t = 1_000_000)]
    pub backlog: u64,
    /// Readings per second during the outage scenario.
    #[arg(long, default_value_t = 10_000)]
    pub rate: u64,
    /// Steady load before ClickHouse goes down.
    #[arg(long, default_value = "10s", value_parser = latch::config::parse_duration)]
    pub before: Duration,
    /// How long ClickHouse stays down.
    #[arg(long, default_value = "60s", value_parser = latch::config::parse_duration)]
    pub outage: Duration,
    /// Run on PostgreSQL (a fresh schema of this database) instead of SQLite.
    #[arg(long)]
    pub database_url: Option<String>,
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    let (dir, _tmp) = super::data_dir(None)?;
    let mut ch = LocalClickHouse::start(&dir.join("clickhouse")).await?;
    let (mut config, pg) =
        super::store_config(&dir.join("latch"), args.database_url.as_deref()).await?;
    let ids = super::sensor_ids(args.sensors);
    super::import(&config, &ids, &[], None).await?;
    config.clickhouse_url = Some(ch.url());
    let flush = config.clickhouse_flush;
    let server = super::start(config).await?;
    let feed = Feed::new(&server.base, &ids);
    let ch_url = ch.url();
    let shipped = || async { ch_count(&ch_url, "readings").await.unwrap_or(0) };
    let mut r = Report::new("history");

    // 1. Drain a backlog.
    ch.stop();
    let t = Instant::now();
    feed.send(0, Some(args.backlog), None).await;
    let backlog = feed.accepted();
    let ingest_down = backlog as f64 / t.elapsed().as_secs_f64();
    eprintln!("history: {backlog} readings spooled ({ingest_down:.0}/s); starting ClickHouse");
    ch.resume().await?;
    let up = Instant::now();
    let mut first = None;
    loop {
        let n = shipped().await;
        if n > 0 && first.is_none() {
            first = Some(up.elapsed());
        }
        if n >= backlog {
            break;
        }
        anyhow::ensure!(
            up.elapsed() < Duration::from_secs(900),
            "drain took over 15 min"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = up.elapsed();
    let first = first.unwrap_or(drained);
    // Events ship in the same shipments as the readings that made them, and before them
    // (`ClickHouse::insert`), so every reading in means every event in.
    let rows = shipped().await + ch_count(&ch_url, "events").await.unwrap_or(0);
    let drain_rate = rows as f64 / (drained - first).as_secs_f64().max(1e-3);
    r.add("backlog_readings", backlog as f64, "readings");
    r.add("backlog_history_rows", rows as f64, "rows");
    r.add(
        "ingest_while_clickhouse_down_per_s",
        ingest_down.round(),
        "readings/s",
    );
    r.add("first_shipment_after_up_s", first.as_secs_f64(), "s");
    r.add("drain_s", drained.as_secs_f64(), "s");
    r.add("shipped_rows_per_s", drain_rate.round(), "rows/s");
    let direct = direct_insert_rate(&ch, backlog as usize).await?;
    r.add(
        "baseline_direct_insert_rows_per_s",
        direct.round(),
        "rows/s",
    );
    r.add("ratio_to_direct_insert", drain_rate / direct, "x");

    // 2. An outage under steady load.
    let base = shipped().await;
    let before_accepted = feed.accepted();
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (feed, stop) = (feed.clone(), stop.clone());
        tokio::spawn(async move { feed.send(args.rate, None, Some(stop)).await })
    };
    tokio::time::sleep(args.before).await;
    let a0 = feed.accepted();
    let shipped_at_stop = shipped().await;
    ch.stop();
    let down = Instant::now();
    eprintln!(
        "history: ClickHouse down for {:?} at {} readings/s",
        args.outage, args.rate
    );
    tokio::time::sleep(args.outage).await;
    let during = (feed.accepted() - a0) as f64 / down.elapsed().as_secs_f64();
    let owed = feed.accepted() - before_accepted + base;
    let spool_at_restart = owed.saturating_sub(shipped_at_stop);
    ch.resume().await?;
    let up = Instant::now();
    eprintln!("history: ClickHouse up; {spool_at_restart} readings to catch up");
    while shipped().await < owed {
        anyhow::ensure!(
            up.elapsed() < Duration::from_secs(900),
            "catch-up took over 15 min"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let catch_up = up.elapsed();
    stop.store(true, Ordering::Relaxed);
    load.await?;
    let steady = (a0 - before_accepted) as f64 / args.before.as_secs_f64();
    r.add("outage_s", args.outage.as_secs_f64(), "s");
    r.add("ingest_before_outage_per_s", steady.round(), "readings/s");
    r.add("ingest_during_outage_per_s", during.round(), "readings/s");
    r.add("ingest_ratio_during_to_before", during / steady, "x");
    r.add(
        "spool_readings_at_restart",
        spool_at_restart as f64,
        "readings",
    );
    r.add("catch_up_s", catch_up.as_secs_f64(), "s");
    server.stop().await?;
    if let Some(pg) = pg {
        pg.drop().await?;
    }
    r.notes.push(format!(
        "Store: {}; ClickHouse {} (a private server this bench starts and kills). {} sensors, \
         {REQUEST} readings per request, 10 % of readings change state (each change adds an \
         event row). Drain: readings accepted while ClickHouse was down, then shipped in \
         batches of up to {BATCH} rows per table; the rate counts from the first shipped row. \
         Catch-up: from ClickHouse answering again until every reading accepted before that \
         is in ClickHouse, with --rate still arriving; clickhouse_flush {:?}.",
        if args.database_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite (synchronous=full)"
        },
        ch.query("SELECT version()").await.unwrap_or_default(),
        args.sensors,
        flush,
    ));
    Ok(r)
}

async fn ch_count(url: &str, table: &str) -> Option<u64> {
    super::clickhouse_server::query(url, &format!("SELECT count() FROM latch.{table}"))
        .await
        .ok()?
        .parse()
        .ok()
}

/// Rows per second the same client code inserts straight into ClickHouse.
async fn direct_insert_rate(ch: &LocalClickHouse, rows: usize) -> anyhow::Result<f64> {
    let client = ClickHouse::new(&Target::parse(&ch.url(), "latch_baseline")?);
    client.ensure_schema().await?;
    let sensors = super::sensor_ids(1000);
    let now = time::now_ms();
    let batches: Vec<HistoryBatch> = (0..rows)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(|chunk| HistoryBatch {
            readings: chunk
                .iter()
                .map(|&i| Stored {
                    id: i as i64,
                    row: ReadingRecord {
                        sensor_id: sensors[i % sensors.len()],
                        data: i % 3 == 0,
                        ts: now + i as i64,
                        received_at: now + i as i64,
                        late: false,
                        signals: Default::default(),
                    },
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    let t = Instant::now();
    for b in &batches {
        client.insert(b).await?;
    }
    Ok(rows as f64 / t.elapsed().as_secs_f64())
}

/// Readings posted over HTTP by a few concurrent senders.
#[derive(Clone)]
struct Feed {
    url: String,
    http: reqwest::Client,
    ids: Arc<Vec<SensorId>>,
    accepted: Arc<AtomicU64>,
}

impl Feed {
    fn new(base: &str, ids: &[SensorId]) -> Self {
        Self {
            url: format!("{base}/v1/readings"),
            http: reqwest::Client::new(),
            ids: Arc::new(ids.to_vec()),
            accepted: Arc::new(AtomicU64::new(0)),
        }
    }

    fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Sends at `rate` readings/s (0: as fast as accepted) until `count` more were sent or
    /// `stop` is set.
    async fn send(&self, rate: u64, count: Option<u64>, stop: Option<Arc<AtomicBool>>) {
        let sent = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for worker in 0..SENDERS {
            let (this, sent, stop) = (self.clone(), sent.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let mine: Vec<String> = this
                    .ids
                    .iter()
                    .skip(worker)
                    .step_by(SENDERS)
                    .map(|i| i.to_string())
                    .collect();
                let mut bodies = super::Bodies::new(mine, worker as u64 + 1, 0.1);
                let per_worker = rate as f64 / SENDERS as f64;
                let t0 = Instant::now();
                let mut turn = 0u64;
                loop {
                    if stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)) {
                        return;
                    }
                    if let Some(c) = count
                        && sent.fetch_add(REQUEST as u64, Ordering::Relaxed) >= c
                    {
                        return;
                    }
                    if per_worker > 0.0 {
                        let due =
                            t0 + Duration::from_secs_f64(turn as f64 * REQUEST as f64 / per_worker);
                        tokio::time::sleep_until(due.into()).await;
                    }
                    turn += 1;
                    let body = bodies.body(REQUEST);
                    let resp = this
                        .http
                        .post(&this.url)
                        .header("content-type", "application/json")
                        .body(body)
                        .send()
                        .await;
                    if let Ok(r) = resp
                        && r.status().as_u16() == 202
                        && let Ok(v) = r.json::<serde_json::Value>().await
                    {
                        this.accepted
                            .fetch_add(v["accepted"].as_u64().unwrap_or(0), Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}
