//! `latch bench ingest`: readings over HTTP batches, accepted durably.
//!
//! Baseline: inserting the same history rows into SQLite directly, in transactions of the
//! same size — the floor of what durable ingest into the embedded store can cost.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Report, percentile};

/// Request bodies each worker prepares and sends in turn.
const PRESET_BODIES: usize = 32;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Registered sensors readings are spread over.
    #[arg(long, default_value_t = 10_000)]
    pub sensors: usize,
    /// Readings per HTTP request.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Concurrent HTTP clients.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Readings to send in all; 0 for as many as `--duration` allows.
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Readings per second to send at; 0 for as fast as accepted.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// How long to drive load (at most, with `--count`).
    #[arg(long, default_value = "10s", value_parser = latch::config::parse_duration)]
    pub duration: Duration,
    /// Share of readings that change their sensor's state.
    #[arg(long, default_value_t = 0.1)]
    pub change_ratio: f64,
    /// SQLite sync mode: full or normal.
    #[arg(long, default_value = "full")]
    pub sync: String,
    /// Run on PostgreSQL (a fresh schema of this database) instead of SQLite.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Drive a latch already running here (e.g. `http://127.0.0.1:8080`) instead of one
    /// in process; the bench's sensors are registered through its API first.
    #[arg(long)]
    pub url: Option<String>,
    /// Ship history to a private ClickHouse server this bench starts (in-process latch).
    #[arg(long)]
    pub clickhouse: bool,
    /// How readings arrive: http, amqp or mqtt.
    #[arg(long, default_value = "http")]
    pub via: String,
    /// Messages to send through a broker (`--via amqp|mqtt`).
    #[arg(long, default_value_t = 100_000)]
    pub messages: usize,
    /// RabbitMQ to use with `--via amqp`.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
    /// MQTT broker to use with `--via mqtt`.
    #[arg(long, default_value = "mqtt://127.0.0.1:1883")]
    pub mqtt_url: String,
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    match args.via.as_str() {
        "http" => {}
        "amqp" => {
            return super::broker::amqp(
                &args.amqp_url,
                args.sensors,
                args.messages,
                args.change_ratio,
            )
            .await;
        }
        "mqtt" => {
            return super::broker::mqtt(
                &args.mqtt_url,
                args.sensors,
                args.messages,
                args.change_ratio,
            )
            .await;
        }
        other => anyhow::bail!("--via must be http, amqp or mqtt, not {other:?}"),
    }
    let (dir, _tmp) = super::data_dir(None)?;
    let ids = super::sensor_ids(args.sensors);
    let (mut config, pg) = super::store_config(&dir, args.database_url.as_deref()).await?;
    let mut clickhouse = None;
    // In process, or a latch already running at --url (its sensors registered over the API).
    let (server, base) = match &args.url {
        Some(base) => {
            register(base, &ids).await?;
            (None, base.trim_end_matches('/').to_string())
        }
        None => {
            super::import(&config, &ids, &[], None).await?;
            if args.clickhouse {
                let ch = super::clickhouse_server::LocalClickHouse::start(&dir.join("ch")).await?;
                config.clickhouse_url = Some(ch.url());
                clickhouse = Some(ch);
            }
            config.sqlite_synchronous = match args.sync.as_str() {
                "normal" => latch::store::sqlite::Synchronous::Normal,
                _ => latch::store::sqlite::Synchronous::Full,
            };
            let server = super::start(config).await?;
            let base = server.base.clone();
            (Some(server), base)
        }
    };
    let url = format!("{base}/v1/readings");
    let http = reqwest::Client::new();
    let accepted = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ids = Arc::new(ids);
    let w = args.workers;
    // Workers build their bodies, then all start together with the clock.
    let ready = Arc::new(tokio::sync::Barrier::new(w + 1));
    let stopper = stop.clone();
    let duration = args.duration;
    let go = ready.clone();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let clock = tokio::spawn(async move {
        go.wait().await;
        let _ = started_tx.send(Instant::now());
        tokio::time::sleep(duration).await;
        stopper.store(true, Ordering::Relaxed);
    });
    let counted = accepted.clone();
    let sent = Arc::new(AtomicU64::new(0));
    let progress = super::progress("ingest", "readings accepted", move || {
        counted.load(Ordering::Relaxed)
    });
    let results = super::workers(w, |worker| {
        let (http, url, accepted, stop, ids, ready) = (
            http.clone(),
            url.clone(),
            accepted.clone(),
            stop.clone(),
            ids.clone(),
            ready.clone(),
        );
        let (batch, ratio) = (args.batch, args.change_ratio);
        let (count, rate, sent) = (args.count, args.rate as f64 / w as f64, sent.clone());
        async move {
            // Each worker owns every w-th sensor, so it knows their states.
            let mine: Vec<String> = ids
                .iter()
                .skip(worker)
                .step_by(w)
                .map(|i| i.to_string())
                .collect();
            // Request bodies are made before the clock starts and sent in turn, so the
            // load generator's own JSON work does not eat the cores latch is measured on.
            let mut maker = super::Bodies::new(mine, worker as u64 + 1, ratio);
            let bodies: Vec<String> = (0..PRESET_BODIES).map(|_| maker.body(batch)).collect();
            ready.wait().await;
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut turn = 0usize;
            let t0 = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if count > 0 && sent.fetch_add(batch as u64, Ordering::Relaxed) >= count {
                    break;
                }
                if rate > 0.0 {
                    // This worker's share of the rate: a request once its `batch` readings
                    // are due, as a device fleet would have produced them.
                    let due = t0 + Duration::from_secs_f64((turn + 1) as f64 * batch as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let body = bodies[turn % bodies.len()].clone();
                turn += 1;
                let t = Instant::now();
                let req = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body);
                match req.send().await {
                    Ok(r) if r.status().as_u16() == 202 => {
                        let body: serde_json::Value = r.json().await.unwrap_or_default();
                        accepted
                            .fetch_add(body["accepted"].as_u64().unwrap_or(0), Ordering::Relaxed);
                        lat.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }
    })
    .await;
    // Workers end at the duration or, with --count, when all is sent.
    let elapsed = started_rx.await?.elapsed().as_secs_f64();
    clock.abort();
    progress.abort();
    // Where a batch's time went, from latch's own metrics, read after the load and
    // before the stop (a scrape renders every family in the measured process).
    let stages = match reqwest::get(format!("{base}/metrics")).await {
        Ok(r) => Some(r.text().await?),
        Err(_) => None,
    };
    if let Some(server) = server {
        server.stop().await?;
    }
    // Counted after the stop's last shipment; the server then goes, so the baseline below
    // has the machine to itself.
    let in_clickhouse = match clickhouse.take() {
        Some(ch) => Some(
            ch.query("SELECT count() FROM latch.readings")
                .await?
                .parse()?,
        ),
        None => None,
    };
    let mut lat: Vec<f64> = results.iter().flat_map(|(l, _)| l.clone()).collect();
    let errors: u64 = results.iter().map(|(_, e)| e).sum();
    lat.sort_by(f64::total_cmp);
    let total = accepted.load(Ordering::Relaxed);
    let rate = total as f64 / elapsed;

    let rows = (total as usize).clamp(10_000, 2_000_000);
    let mut r = Report::new("ingest");
    if let Some(n) = in_clickhouse {
        r.add("readings_in_clickhouse_at_stop", n, "readings");
    }
    r.add("readings_accepted", total as f64, "readings");
    r.add("readings_per_s", rate.round(), "readings/s");
    r.add("request_p50_ms", percentile(&lat, 50.0), "ms");
    r.add("request_p99_ms", percentile(&lat, 99.0), "ms");
    r.add("request_errors", errors as f64, "requests");
    if let Some(text) = &stages {
        add_stages(&mut r, text, elapsed);
    }
    match &pg {
        Some(pg) => {
            let baseline = raw_postgres_rate(&pg.url, args.batch, rows).await?;
            r.add(
                "baseline_raw_postgres_rows_per_s",
                baseline.round(),
                "rows/s",
            );
            r.add("ratio_to_raw_postgres", rate / baseline, "x");
        }
        None => {
            let baseline = raw_sqlite_rate(args.batch, rows, &args.sync)?;
            r.add("baseline_raw_sqlite_rows_per_s", baseline.round(), "rows/s");
            r.add("ratio_to_raw_sqlite", rate / baseline, "x");
        }
    }
    r.notes.push(format!(
        "Store: {}{}. {} sensors, batches of {}, {} workers, {:.0} % changes, sqlite \
         synchronous={}; baseline: the same rows inserted into the same database directly, \
         one transaction (one multi-row statement on PostgreSQL) per {} rows. stage_*: latch's \
         own metrics over the run (its last minute, when longer): a batch's wait for its \
         group commit to start, a write's wait for SQLite's one writer, the group commit, the \
         moves of readings into the archive and the WAL checkpoints.",
        if pg.is_some() { "PostgreSQL" } else { "SQLite" },
        if in_clickhouse.is_some() {
            ", history shipped to ClickHouse (a private server) as it arrives"
        } else {
            ""
        },
        args.sensors,
        args.batch,
        args.workers,
        args.change_ratio * 100.0,
        args.sync,
        args.batch
    ));
    if let Some(pg) = pg {
        pg.drop().await?;
    }
    Ok(r)
}

/// The stages a batch goes through, each as p50 and p99 (or max, for the rare ones) in ms,
/// from latch's summaries (the exporter's window: the last minute, so the run itself for
/// runs shorter than that). A stage latch does not record (another store) is left out.
fn add_stages(r: &mut Report, text: &str, elapsed: f64) {
    let commits = super::Commits {
        count: super::metric_sum(text, "latch_commit_readings_count"),
        readings: super::metric_sum(text, "latch_commit_readings_sum"),
        seconds: super::metric_sum(text, "latch_commit_seconds_sum"),
    };
    commits.report(r, elapsed);
    // Frequent stages by p50 and p99; the archive's moves and the checkpoints, a few a
    // run, by p50 and their longest.
    let stages: [(&str, &str, [&str; 2]); 5] = [
        (
            "latch_commit_queue_seconds",
            "stage_commit_queue",
            ["0.5", "0.99"],
        ),
        (
            "latch_store_writer_wait_seconds",
            "stage_writer_wait",
            ["0.5", "0.99"],
        ),
        ("latch_commit_seconds", "stage_commit", ["0.5", "0.99"]),
        (
            "latch_history_archive_seconds",
            "stage_archive_move",
            ["0.5", "1"],
        ),
        (
            "latch_wal_checkpoint_seconds",
            "stage_wal_checkpoint",
            ["0.5", "1"],
        ),
    ];
    for (family, row, qs) in stages {
        let count = super::metric_sum(text, &format!("{family}_count"));
        if count == 0.0 {
            continue;
        }
        for q in qs {
            if let Some(v) = super::metric_quantile(text, family, q) {
                let name = match q {
                    "0.5" => "p50",
                    "0.99" => "p99",
                    _ => "max",
                };
                r.add(format!("{row}_{name}_ms"), (v * 1e5).round() / 100.0, "ms");
            }
        }
        if qs[1] == "1" {
            r.add(format!("{row}_count"), count, "times");
        }
    }
}

/// Rows/s of plain SQLite inserts of reading rows (same schema and index), one
/// transaction per `batch`.
fn raw_sqlite_rate(batch: usize, rows: usize, sync: &str) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let c = rusqlite::Connection::open(dir.path().join("raw.db"))?;
    c.pragma_update(None, "journal_mode", "WAL")?;
    c.pragma_update(
        None,
        "synchronous",
        if sync == "normal" { "NORMAL" } else { "FULL" },
    )?;
    c.execute_batch(
        "CREATE TABLE readings (id INTEGER PRIMARY KEY, sensor_id TEXT NOT NULL, ts INTEGER NOT NULL, \
         received_at INTEGER NOT NULL, data INTEGER NOT NULL, late INTEGER NOT NULL);
         CREATE INDEX readings_by_sensor_ts ON readings (sensor_id, ts);",
    )?;
    let ids: Vec<String> = super::sensor_ids(10_000)
        .iter()
        .map(|i| i.to_string())
        .collect();
    let started = Instant::now();
    let mut done = 0;
    let mut c = c;
    while done < rows {
        let tx = c.transaction()?;
        {
            let mut st = tx.prepare_cached(
                "INSERT INTO readings (sensor_id, ts, received_at, data, late) VALUES (?1, ?2, ?3, ?4, 0)",
            )?;
            for i in 0..batch {
                let n = done + i;
                st.execute(rusqlite::params![
                    ids[n % ids.len()],
                    n as i64,
                    n as i64,
                    (n % 2) as i64
                ])?;
            }
        }
        tx.commit()?;
        done += batch;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

/// Rows/s of plain PostgreSQL inserts of reading rows into a table like latch's (same
/// columns and index, unpartitioned), one `UNNEST` statement and transaction per `batch`.
async fn raw_postgres_rate(url: &str, batch: usize, rows: usize) -> anyhow::Result<f64> {
    let (mut c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    c.batch_execute(
        "CREATE TABLE raw_readings (id BIGINT GENERATED ALWAYS AS IDENTITY, sensor_id TEXT NOT NULL, \
         ts BIGINT NOT NULL, received_at BIGINT NOT NULL, data BOOLEAN NOT NULL, late BOOLEAN NOT NULL); \
         CREATE INDEX ON raw_readings (sensor_id, ts, id);",
    )
    .await?;
    let ids: Vec<String> = super::sensor_ids(10_000)
        .iter()
        .map(|i| i.to_string())
        .collect();
    let started = Instant::now();
    let mut done = 0;
    while done < rows {
        let n: Vec<usize> = (done..done + batch).collect();
        let sid: Vec<&str> = n.iter().map(|k| ids[k % ids.len()].as_str()).collect();
        let ts: Vec<i64> = n.iter().map(|&k| k as i64).collect();
        let data: Vec<bool> = n.iter().map(|k| k % 2 == 0).collect();
        let late = vec![false; batch];
        let tx = c.transaction().await?;
        tx.execute(
            "INSERT INTO raw_readings (sensor_id, ts, received_at, data, late) \
             SELECT * FROM UNNEST($1::text[], $2::int8[], $2::int8[], $3::bool[], $4::bool[])",
            &[&sid, &ts, &data, &late],
        )
        .await?;
        tx.commit().await?;
        done += batch;
    }
    Ok(done as f64 / started.elapsed().as_secs_f64())
}

/// Registers `ids` on a running latch through its API (existing ones are fine).
async fn register(base: &str, ids: &[latch::domain::SensorId]) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let base = base.trim_end_matches('/').to_string();
    let per = ids.len().div_ceil(16).max(1);
    let chunks: Vec<Vec<String>> = ids
        .chunks(per)
        .map(|c| c.iter().map(|i| i.to_string()).collect())
        .collect();
    let results = super::workers(chunks.len(), |k| {
        let (http, base, chunk) = (http.clone(), base.clone(), chunks[k].clone());
        async move {
            for id in chunk {
                let r = http
                    .post(format!("{base}/v1/sensors"))
                    .json(&serde_json::json!({"id": id, "address": "bench street 1"}))
                    .send()
                    .await?;
                anyhow::ensure!(
                    r.status().is_success() || r.status().as_u16() == 409,
                    "registering {id} failed: {}",
                    r.status()
                );
            }
            Ok(())
        }
    })
    .await;
    results.into_iter().collect()
}
