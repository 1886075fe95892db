//! `latch bench retention`: a year of running, squeezed into minutes.
//!
//! Two latches run side by side in this process under the same steady load (readings at a
//! fixed rate, a share of them changes, each change a webhook to a local receiver): one with
//! retention shortened to `--retention` (a minute by default), one keeping everything. The
//! same machine, the same noise, the same minutes: what the first stores on disk should
//! level off once retention is reached while the second's grows, and ingest latency of one
//! against the other is what pruning costs (a ratio measured in the same run). The second
//! also gives the bytes each reading and each notification costs, by table.
//!
//! On SQLite every file of the pruned latch's data folder is measured at each sample
//! (`latch.db`, `archive.db`, their write-ahead logs, with the free pages inside each
//! database), so a folder that grows says which file grows. `--dead-sensors` adds a client
//! whose endpoint refuses every connection, on sensors of its own, as a fleet with a client
//! gone away has: its notifications stay pending and its attempts pile up. `--alone` runs
//! the pruned latch only, for rates two latches could not hold on this machine together.

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
    /// Sensors of a second client whose endpoint refuses every connection (readings go
    /// to them too, at the same rate a sensor).
    #[arg(long, default_value_t = 0)]
    pub dead_sensors: usize,
    /// How often a batch of readings is posted (each `rate × every` readings).
    #[arg(long, default_value = "100ms", value_parser = latch::config::parse_duration)]
    pub every: Duration,
    /// How often the files are measured.
    #[arg(long, default_value = "30s", value_parser = latch::config::parse_duration)]
    pub sample: Duration,
    /// Run the pruned latch only, without the one keeping everything.
    #[arg(long)]
    pub alone: bool,
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
    let (ids, dead) = ids.split_at(args.sensors);
    let (mut config, pg) = super::store_config(&dir, args.database_url.as_deref()).await?;
    config.retention_readings = retention;
    config.retention_notifications = retention;
    // Nothing goes lost while the load runs.
    config.heartbeat_timeout = Duration::from_secs(86_400);
    super::import(&config, ids, &[client], None).await?;
    if !dead.is_empty() {
        super::import(&config, dead, &[super::client(&refused_url()?)], None).await?;
    }
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

/// A URL on this machine where nothing listens: every attempt to it is refused.
fn refused_url() -> anyhow::Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(format!("http://127.0.0.1:{port}/gone"))
}

/// Readings per batch.
fn batch(args: &Args) -> usize {
    ((args.rate as f64 * args.every.as_secs_f64()).round() as usize).max(1)
}

/// Paces `rate` readings a second into `side` in batches every `--every` until `until`.
fn load(side: &Side, args: &Args, seed: u64, until: Instant) -> tokio::task::JoinHandle<()> {
    let url = format!("{}/v1/readings", side.server.base);
    let ids: Vec<String> = super::sensor_ids(args.sensors + args.dead_sensors)
        .iter()
        .map(|i| i.to_string())
        .collect();
    let mut bodies = Bodies::new(ids, seed, args.changes);
    let batch = batch(args);
    let every = args.every;
    let (count, latencies) = (side.readings.clone(), side.latencies.clone());
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let mut tick = tokio::time::interval(every);
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
/// the outbox, attempts and their indexes), and in all (SQLite: every file of the data
/// folder, write-ahead logs included; PostgreSQL: every table of the schema with its
/// indexes and TOAST).
#[derive(Debug, Default, Clone, Copy)]
struct Bytes {
    readings: f64,
    notifications: f64,
    total: f64,
    /// Notifications stored (delivered and superseded ones alike).
    rows: f64,
}

/// The files of an embedded store's data folder that grow, in the order they are shown.
const FILES: [&str; 4] = ["latch.db", "latch.db-wal", "archive.db", "archive.db-wal"];

/// One look at a data folder: each of [`FILES`]' size, the free pages inside the two
/// databases (bytes SQLite would reuse before it grows the file), and the whole folder.
#[derive(Debug, Default, Clone, Copy)]
struct Files {
    sizes: [f64; 4],
    /// Free bytes inside `latch.db` and `archive.db`.
    free: [f64; 2],
    folder: f64,
}

impl Files {
    fn read(dir: &std::path::Path) -> Self {
        let size = |name: &str| std::fs::metadata(dir.join(name)).map_or(0.0, |m| m.len() as f64);
        let folder = std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len() as f64)
                    .sum()
            })
            .unwrap_or(0.0);
        Self {
            sizes: FILES.map(size),
            free: ["latch.db", "archive.db"].map(|f| free_bytes(&dir.join(f)).unwrap_or(0.0)),
            folder,
        }
    }

    /// `latch.db 12.3 (free 1.0) + -wal 4.0 + archive.db …` in MB.
    fn show(&self) -> String {
        let mb = |b: f64| b / 1e6;
        format!(
            "latch.db {:.1} (free {:.1}), -wal {:.1}; archive.db {:.1} (free {:.1}), -wal {:.1}; folder {:.1}",
            mb(self.sizes[0]),
            mb(self.free[0]),
            mb(self.sizes[1]),
            mb(self.sizes[2]),
            mb(self.free[1]),
            mb(self.sizes[3]),
            mb(self.folder)
        )
    }
}

/// Bytes on SQLite's free list in the database at `path` (a short read of its header).
fn free_bytes(path: &std::path::Path) -> Option<f64> {
    if !path.exists() {
        return None;
    }
    let c = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .ok()?;
    let free: i64 = c
        .query_row("PRAGMA freelist_count", [], |r| r.get(0))
        .ok()?;
    let page: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0)).ok()?;
    Some((free * page) as f64)
}

/// What the store holds, by concern: read once, at the end (on SQLite a scan of every
/// page, whose read would keep the log from being checkpointed while it runs).
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
            let archive_bytes = Files::read(&side.dir).sizes[2];
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
                notifications: by(&["events", "events_journal", "notifications", "attempts"])?,
                total: Files::read(&side.dir).folder,
                rows: c.query_row("SELECT count(*) FROM notifications", [], |r| {
                    r.get::<_, i64>(0)
                })? as f64,
            })
        }
    }
}

/// Bytes on disk now: on SQLite the data folder's files (cheap: no page is read), on
/// PostgreSQL the schema's relations.
async fn on_disk(side: &Side) -> anyhow::Result<(f64, Option<Files>)> {
    match side.pg {
        Some(_) => Ok((bytes(side).await?.total, None)),
        None => {
            let f = Files::read(&side.dir);
            Ok((f.folder, Some(f)))
        }
    }
}

/// One sample: minutes since the start, and each latch's bytes on disk.
struct Sample {
    t: f64,
    pruned: f64,
    files: Option<Files>,
    kept: Option<f64>,
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    let ids = super::sensor_ids(args.sensors + args.dead_sensors);
    let pruned = side(&args, args.retention, &ids).await?;
    let kept = if args.alone {
        None
    } else {
        Some(side(&args, Duration::ZERO, &ids).await?)
    };
    let until = Instant::now() + args.duration;
    let mut loads = vec![load(&pruned, &args, 7, until)];
    if let Some(k) = &kept {
        loads.push(load(k, &args, 7, until));
    }
    let store = if args.database_url.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    let mut samples: Vec<Sample> = Vec::new();
    let started = Instant::now();
    while Instant::now() < until {
        tokio::time::sleep(args.sample.min(until - Instant::now())).await;
        let (p, files) = on_disk(&pruned).await?;
        let k = match &kept {
            Some(k) => Some(on_disk(k).await?.0),
            None => None,
        };
        let t = started.elapsed().as_secs_f64();
        eprintln!(
            "retention: {t:.0} s, {} readings, pruned {:.1} MB{}{}",
            pruned.readings.load(Ordering::Relaxed),
            p / 1e6,
            k.map_or(String::new(), |k| format!(", kept {:.1} MB", k / 1e6)),
            files.map_or(String::new(), |f| format!(" ({})", f.show()))
        );
        samples.push(Sample {
            t,
            pruned: p,
            files,
            kept: k,
        });
    }
    for l in loads {
        l.await?;
    }
    let secs = started.elapsed().as_secs_f64();
    let mut r = Report::new("retention");
    let dead = if args.dead_sensors > 0 {
        format!(
            ", and {} more sensors linked to a client whose endpoint refuses every connection",
            args.dead_sensors
        )
    } else {
        String::new()
    };
    r.notes.push(format!(
        "{store}; {} readings/s offered into each latch ({} a request every {:?}), {:.0} % of \
         them changes (a webhook each), {} sensors{dead}, {:.0} s; one latch with retention \
         {:?}{}. Bytes on disk every {:?} (MB; pruned{}): {}",
        args.rate,
        batch(&args),
        args.every,
        args.changes * 100.0,
        args.sensors,
        secs,
        args.retention,
        if args.alone {
            " alone"
        } else {
            ", one keeping everything"
        },
        args.sample,
        if args.alone { "" } else { " / kept" },
        samples
            .iter()
            .map(|s| format!(
                "{:.0} s {:.1}{}",
                s.t,
                s.pruned / 1e6,
                s.kept.map_or(String::new(), |k| format!("/{:.1}", k / 1e6))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if samples.iter().any(|s| s.files.is_some()) {
        r.notes.push(format!(
            "The pruned latch's data folder by file (MB; free: pages inside the database \
             SQLite reuses before the file grows): {}",
            samples
                .iter()
                .filter_map(|s| Some(format!("{:.0} s: {}", s.t, s.files?.show())))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    let retention_s = args.retention.as_secs_f64();
    let half = samples.len() / 2;
    if let (Some(mid), Some(end)) = (samples.get(half.saturating_sub(1)), samples.last()) {
        r.add("pruned: bytes at half time", mid.pruned, "bytes");
        r.add("pruned: bytes at the end", end.pruned, "bytes");
        r.add(
            "pruned: growth over the second half",
            end.pruned / mid.pruned.max(1.0),
            "×",
        );
        if let (Some(m), Some(e)) = (mid.kept, end.kept) {
            r.add("kept: growth over the second half", e / m.max(1.0), "×");
        }
        // The plateau: the largest the folder was over the last five retention periods
        // against the largest before them (once retention has been reached twice).
        let tail_from = end.t - 5.0 * retention_s;
        let before: Vec<f64> = samples
            .iter()
            .filter(|s| s.t >= 2.0 * retention_s && s.t < tail_from)
            .map(|s| s.pruned)
            .collect();
        let tail = samples
            .iter()
            .filter(|s| s.t >= tail_from)
            .map(|s| s.pruned)
            .fold(0.0, f64::max);
        if let Some(b) = before.into_iter().reduce(f64::max) {
            r.add(
                "pruned: largest over the last five retention periods / largest before",
                tail / b.max(1.0),
                "×",
            );
        }
        // The same of the two databases alone: their logs are cut back at each checkpoint,
        // so a sample shows the log anywhere between its limit and its next checkpoint.
        let dbs = |s: &Sample| s.files.map(|f| f.sizes[0] + f.sizes[2]);
        let before = samples
            .iter()
            .filter(|s| s.t >= 2.0 * retention_s && s.t < tail_from)
            .filter_map(dbs)
            .reduce(f64::max);
        let tail = samples
            .iter()
            .filter(|s| s.t >= tail_from)
            .filter_map(dbs)
            .reduce(f64::max);
        if let (Some(b), Some(t)) = (before, tail) {
            r.add(
                "pruned: latch.db + archive.db, largest over the last five retention periods / largest before",
                t / b.max(1.0),
                "×",
            );
        }
        if let Some(f) = end.files {
            for (name, size) in FILES.iter().zip(f.sizes) {
                r.add(format!("pruned: {name} at the end"), size, "bytes");
            }
            let max = |i: usize| {
                samples
                    .iter()
                    .filter_map(|s| Some(s.files?.sizes[i]))
                    .fold(0.0, f64::max)
            };
            for (i, name) in FILES.iter().enumerate() {
                r.add(format!("pruned: {name} at most"), max(i), "bytes");
            }
        }
    }
    let lat = |s: &Side| {
        let mut l = s.latencies.lock().unwrap().clone();
        l.sort_by(f64::total_cmp);
        (super::percentile(&l, 50.0), super::percentile(&l, 99.0))
    };
    let (p50, p99) = lat(&pruned);
    r.add("ingest p50, pruning on", p50, "ms");
    r.add("ingest p99, pruning on", p99, "ms");
    if let Some(k) = &kept {
        let (k50, k99) = lat(k);
        r.add("ingest p50, pruning off", k50, "ms");
        r.add("ingest p99, pruning off", k99, "ms");
        r.add("ingest p99 on / off", p99 / k99, "×");
    }
    let into_pruned = pruned.readings.load(Ordering::Relaxed) as f64;
    r.add("readings into the pruned latch", into_pruned, "");
    r.add(
        "readings per second (pruned)",
        (into_pruned / secs).round(),
        "readings/s",
    );
    if let Some(k) = &kept {
        let readings = k.readings.load(Ordering::Relaxed) as f64;
        let b = bytes(k).await?;
        r.add(
            "bytes per reading (kept)",
            b.readings / readings.max(1.0),
            "bytes",
        );
        r.add(
            "bytes per notification with its event and attempt (kept)",
            b.notifications / b.rows.max(1.0),
            "bytes",
        );
        r.add("readings into the kept latch", readings, "");
        r.add("notifications stored (kept)", b.rows, "");
    }
    r.add(
        "notifications stored (pruned)",
        bytes(&pruned).await?.rows,
        "",
    );
    for s in std::iter::once(pruned).chain(kept) {
        s.server.stop().await?;
        if let Some(pg) = s.pg {
            pg.drop().await?;
        }
    }
    Ok(r)
}
