//! `latch bench retention`: a year of running, squeezed into minutes.
//!
//! Two latches run side by side in this process under the same steady load (readings at a
//! fixed rate, a share of them changes, each change a webhook to a local receiver): one with
//! retention shortened to `--retention` (a minute by default), one keeping everything. The
//! same machine, the same noise, the same minutes: what the first stores on disk should
//! level off once retention is reached while the second's grows, and ingest latency of one
//! against the other is what pruning costs (a ratio measured in the same run). The second
//! also gives the bytes each reading and each notification costs, by table.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Bodies, Keep, Receiver, Report};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// How long to run.
    #[arg(long, default_value = "10m", value_parser = latch::config::parse_duration)]
    pub duration: Duration,
    /// Retention (readings and notifications alike) of the pruned latch.
    #[arg(long, default_value = "1m", value_parser = latch::config::parse_duration)]
    pub retention: Duration,
    /// Readings per second into each latch.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Share of readings that change their sensor's state (each a notification).
    #[arg(long, default_value_t = 0.25)]
    pub changes: f64,
    /// Sensors the readings go to in rotation.
    #[arg(long, default_value_t = 2_000)]
    pub sensors: usize,
    /// Run on PostgreSQL (a fresh schema each, of this database) instead of SQLite.
    #[arg(long)]
    pub database_url: Option<String>,
}

/// One latch of the run, its load and what was measured of it.
struct Side {
    server: super::Server,
    dir: std::path::PathBuf,
    pg: Option<super::PgSchema>,
    _tmp: Option<tempfile::TempDir>,
    _receiver: Receiver,
    readings: Arc<AtomicU64>,
    latencies: Arc<std::sync::Mutex<Vec<f64>>>,
}

async fn side(
    args: &Args,
    retention: Duration,
    ids: &[latch::domain::SensorId],
) -> anyhow::Result<Side> {
    let (dir, tmp) = super::data_dir(None)?;
    let receiver = Receiver::start_keeping(Keep::Counts).await?;
    let client = super::client(&receiver.url);
    let (mut config, pg) = super::store_config(&dir, args.database_url.as_deref()).await?;
    config.retention_readings = retention;
    config.retention_notifications = retention;
    // Nothing goes lost while the load runs.
    config.heartbeat_timeout = Duration::from_secs(86_400);
    super::import(&config, ids, &[client], None).await?;
    let server = super::start(config).await?;
    Ok(Side {
        server,
        dir,
        pg,
        _tmp: tmp,
        _receiver: receiver,
        readings: Arc::default(),
        latencies: Arc::default(),
    })
}

/// Paces `rate` readings a second into `side` in batches every 100 ms until `until`.
fn load(side: &Side, args: &Args, seed: u64, until: Instant) -> tokio::task::JoinHandle<()> {
    let url = format!("{}/v1/readings", side.server.base);
    let ids: Vec<String> = super::sensor_ids(args.sensors)
        .iter()
        .map(|i| i.to_string())
        .collect();
    let mut bodies = Bodies::new(ids, seed, args.changes);
    let batch = (args.rate / 10).max(1) as usize;
    let (count, latencies) = (side.readings.clone(), side.latencies.clone());
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while Instant::now() < until {
            tick.tick().await;
            let body = bodies.body(batch);
            let started = Instant::now();
            let ok = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .is_ok_and(|r| r.status().as_u16() == 202);
            if ok {
                latencies
                    .lock()
                    .unwrap()
                    .push(started.elapsed().as_secs_f64() * 1e3);
                count.fetch_add(batch as u64, Ordering::Relaxed);
            }
        }
    })
}

/// Bytes by concern: readings (history rows and their indexes), notifications (events,
/// the outbox, attempts and their indexes), and in all (SQLite: the database file, its
/// write-ahead log aside, which stays at the size of its checkpoints; PostgreSQL: every
/// table of the schema with its indexes and TOAST).
#[derive(Debug, Default, Clone, Copy)]
struct Bytes {
    readings: f64,
    notifications: f64,
    total: f64,
    /// Notifications stored (delivered and superseded ones alike).
    rows: f64,
}

async fn bytes(side: &Side) -> anyhow::Result<Bytes> {
    match &side.pg {
        Some(pg) => {
            let (c, conn) = tokio_postgres::connect(&pg.url, tokio_postgres::NoTls).await?;
            tokio::spawn(conn);
            // Partitioned tables hold nothing themselves: their partitions are summed.
            let size = |tables: &str| {
                format!(
                    "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::float8 FROM pg_class c \
                     LEFT JOIN pg_inherits i ON i.inhrelid = c.oid \
                     WHERE c.relnamespace = current_schema()::regnamespace AND c.relkind = 'r' \
                       AND COALESCE(i.inhparent::regclass::text, c.relname::text) IN ({tables})"
                )
            };
            let one = |sql: String| {
                let c = &c;
                async move { anyhow::Ok(c.query_one(&sql, &[]).await?.get::<_, f64>(0)) }
            };
            Ok(Bytes {
                readings: one(size("'readings'")).await?,
                notifications: one(size(
                    "'events', 'notifications', 'notifications_pending', 'attempts'",
                ))
                .await?,
                total: one(size(
                    "SELECT relname::text FROM pg_class WHERE relnamespace = current_schema()::regnamespace",
                ))
                .await?,
                rows: one("SELECT count(*)::float8 FROM notifications".into()).await?,
            })
        }
        None => {
            let path = side.dir.join("latch.db");
            // The readings' archive is a file of its own (in latch.db in folders older
            // than that): its size counts with the readings.
            let archive = side.dir.join("archive.db");
            let archive_bytes = match std::fs::metadata(&archive) {
                Ok(m) => m.len() as f64,
                Err(_) => 0.0,
            };
            let total = std::fs::metadata(&path)?.len() as f64 + archive_bytes;
            let c = rusqlite::Connection::open_with_flags(
                &path,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )?;
            // Pages by table and index (SQLite's dbstat; free pages are in none).
            let by = |names: &[&str]| -> anyhow::Result<f64> {
                let list = names
                    .iter()
                    .map(|n| format!("'{n}'"))
                    .collect::<Vec<_>>()
                    .join(",");
                Ok(c.query_row(
                    &format!(
                        "SELECT COALESCE(SUM(d.pgsize), 0) FROM dbstat d JOIN sqlite_master m \
                         ON m.name = d.name WHERE m.tbl_name IN ({list})"
                    ),
                    [],
                    |r| r.get::<_, i64>(0),
                )? as f64)
            };
            Ok(Bytes {
                readings: by(&["readings", "readings_archive"])? + archive_bytes,
                notifications: by(&["events", "notifications", "attempts"])?,
                total,
                rows: c.query_row("SELECT count(*) FROM notifications", [], |r| {
                    r.get::<_, i64>(0)
                })? as f64,
            })
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    let ids = super::sensor_ids(args.sensors);
    let pruned = side(&args, args.retention, &ids).await?;
    let kept = side(&args, Duration::ZERO, &ids).await?;
    let until = Instant::now() + args.duration;
    let loads = [load(&pruned, &args, 7, until), load(&kept, &args, 7, until)];
    let store = if args.database_url.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    let mut samples: Vec<(f64, Bytes, Bytes)> = Vec::new();
    let started = Instant::now();
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(30).min(until - Instant::now())).await;
        let (p, k) = (bytes(&pruned).await?, bytes(&kept).await?);
        let t = started.elapsed().as_secs_f64() / 60.0;
        eprintln!(
            "retention: {t:.1} min, pruned {:.1} MB, kept {:.1} MB",
            p.total / 1e6,
            k.total / 1e6
        );
        samples.push((t, p, k));
    }
    for l in loads {
        l.await?;
    }
    let mut r = Report::new("retention");
    r.notes.push(format!(
        "{store}; {} readings/s into each latch, {:.0} % of them changes (a webhook each), \
         {} sensors, {:.0} min; one latch with retention {:?}, one keeping everything. \
         Bytes on disk every 30 s (pruned / kept, MB): {}",
        args.rate,
        args.changes * 100.0,
        args.sensors,
        args.duration.as_secs_f64() / 60.0,
        args.retention,
        samples
            .iter()
            .map(|(t, p, k)| format!("{t:.1} min {:.1}/{:.1}", p.total / 1e6, k.total / 1e6))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let half = samples.len() / 2;
    if let (Some(mid), Some(end)) = (samples.get(half.saturating_sub(1)), samples.last()) {
        r.add("pruned: bytes at half time", mid.1.total, "bytes");
        r.add("pruned: bytes at the end", end.1.total, "bytes");
        r.add(
            "pruned: growth over the second half",
            end.1.total / mid.1.total.max(1.0),
            "×",
        );
        r.add(
            "kept: growth over the second half",
            end.2.total / mid.2.total.max(1.0),
            "×",
        );
    }
    let lat = |s: &Side| {
        let mut l = s.latencies.lock().unwrap().clone();
        l.sort_by(f64::total_cmp);
        (super::percentile(&l, 50.0), super::percentile(&l, 99.0))
    };
    let ((p50, p99), (k50, k99)) = (lat(&pruned), lat(&kept));
    r.add("ingest p50, pruning on", p50, "ms");
    r.add("ingest p99, pruning on", p99, "ms");
    r.add("ingest p50, pruning off", k50, "ms");
    r.add("ingest p99, pruning off", k99, "ms");
    r.add("ingest p99 on / off", p99 / k99, "×");
    let readings = kept.readings.load(Ordering::Relaxed) as f64;
    let notes = samples.last().map_or(0.0, |(_, _, k)| k.rows);
    if let Some((_, _, k)) = samples.last() {
        r.add(
            "bytes per reading (kept)",
            k.readings / readings.max(1.0),
            "bytes",
        );
        r.add(
            "bytes per notification with its event and attempt (kept)",
            k.notifications / notes.max(1.0),
            "bytes",
        );
    }
    r.add("readings into each", readings, "");
    r.add("notifications stored (kept)", notes, "");
    if let Some((_, p, _)) = samples.last() {
        r.add("notifications stored (pruned)", p.rows, "");
    }
    for s in [pruned, kept] {
        s.server.stop().await?;
        if let Some(pg) = s.pg {
            pg.drop().await?;
        }
    }
    Ok(r)
}
