//! `latch bench soak`: memory over millions of deliveries.
//!
//! Every reading flips its sensor, so each one makes a notification per linked client,
//! and each is delivered to a local receiver that only counts (it keeps nothing, so the
//! process's memory is latch's). Load is paced by a window of undelivered notifications:
//! pending work stays bounded, so memory may grow only with the work *done* — which is the
//! defect this looks for. RSS is read three times, each with the outbox drained (the same
//! pending work, none) and freed heap handed back to the OS: after a warm-up, halfway
//! through the rest, and at the end. The goal is flat after warm-up: under 5 % growth.
//!
//! `--passes P` runs the other shape of the load, as an operator's fleet sees it: P passes
//! of one change per sensor, each pass delivered before the next begins, RSS read after
//! every pass; the goal is then flat from a quarter of the run to its end. `--receiver`
//! delivers to a receiver outside the process (nginx, `scripts/bench-receiver`), so the
//! process's memory is latch's alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Keep, Receiver, Report};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Notifications to deliver in all, warm-up included.
    #[arg(long, default_value_t = 5_000_000)]
    pub notifications: u64,
    /// Notifications delivered before the first reading, for caches, pools and the
    /// allocator to reach their working size; 10 % of `--notifications` by default.
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Sensors changed in rotation.
    #[arg(long, default_value_t = 20_000)]
    pub sensors: usize,
    /// Clients each sensor is linked to (each with its own receiver).
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// Most notifications sent and not yet delivered. Kept below sensors × clients, so a
    /// sensor's next change is mostly sent after its previous one went out; one whose lane
    /// waited (a claim that came back later) is superseded instead, as latch should.
    #[arg(long, default_value_t = 10_000)]
    pub window: u64,
    /// Readings per request.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Run on PostgreSQL (a fresh schema of this database) instead of SQLite.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Run in this many passes of one change per sensor (`--sensors` changes a pass, times
    /// `--clients` notifications), each delivered before the next, RSS read after each;
    /// `--notifications` and `--warmup` are then not used.
    #[arg(long)]
    pub passes: Option<u64>,
    /// Deliver to this receiver outside the process (answering 2xx) instead of one in it;
    /// deliveries are then counted from latch's metrics.
    #[arg(long)]
    pub receiver: Option<String>,
    /// Longest wait for the outbox to drain at each reading.
    #[arg(long, default_value = "300s", value_parser = latch::config::parse_duration)]
    pub drain: Duration,
}

/// One RSS reading.
struct Reading {
    delivered: u64,
    /// `VmRSS`: all resident memory, the binary's own pages included.
    rss: u64,
    /// `RssAnon`: resident memory not backed by a file — the heap and stacks, where a
    /// leak shows. The rest is mostly code of the binary, paged in as it first runs.
    anon: u64,
    /// Of `anon`, what transparent huge pages back (`AnonHugePages`): 2 MiB resident for
    /// each, however little of it is in use.
    huge: u64,
    /// Held by SQLite's allocator (its page caches, mostly): bounded by `cache_size` per
    /// connection, so it grows during a warm-up and then stays.
    sqlite: u64,
    /// Bytes glibc's heap has handed out and not freed (`mallinfo2`): SQLite's and other
    /// C code's. Rust allocates from mimalloc (the `latch` binary's global allocator),
    /// which keeps no such count in a release build.
    heap: u64,
    /// The process's threads: Tokio's blocking pool grows and shrinks with the store's
    /// calls, and each thread that allocates holds allocator pages of its own.
    threads: u64,
    /// Bytes Rust code holds (allocated and not freed since the soak began counting):
    /// what latch keeps, whatever the allocator does with what it freed.
    live: i64,
}

/// Bytes in use in glibc's heap (C code's: Rust's allocations go to mimalloc).
fn heap_in_use() -> u64 {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: a read of the allocator's statistics, no arguments.
        let info = unsafe { libc::mallinfo2() };
        (info.uordblks + info.hblkhd) as u64
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        0
    }
}

/// Bytes SQLite's allocator holds in this process.
fn sqlite_bytes() -> u64 {
    // SAFETY: a read of SQLite's global memory statistic; thread-safe, no arguments.
    let used = unsafe { rusqlite::ffi::sqlite3_memory_used() };
    used.max(0) as u64
}

/// The process's threads now (`Threads:` of `/proc/self/status`).
fn threads() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// A `kB` field of `/proc/self/status`, in bytes.
fn status_bytes(field: &str) -> u64 {
    kb_field("/proc/self/status", field)
}

/// A `kB` field of a `/proc` file, in bytes.
fn kb_field(file: &str, field: &str) -> u64 {
    std::fs::read_to_string(file)
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// `live_heap` reads the bytes of Rust's heap in use: the `latch` binary's counting
/// allocator, which the caller switched on before the first allocation measured.
pub async fn run(args: Args, live_heap: fn() -> i64) -> anyhow::Result<Report> {
    let clients_n = args.clients.max(1) as u64;
    anyhow::ensure!(
        args.window < (args.sensors as u64) * clients_n,
        "--window must be below sensors × clients, or newer changes would supersede pending ones"
    );
    // Where to read RSS, by notifications sent (and then all delivered).
    let marks: Vec<u64> = match args.passes {
        Some(passes) => {
            anyhow::ensure!(passes >= 4, "--passes must be at least 4");
            let pass = args.sensors as u64 * clients_n;
            (1..=passes).map(|i| i * pass).collect()
        }
        None => {
            let changes = args.notifications / clients_n;
            anyhow::ensure!(changes > 0, "--notifications must be at least --clients");
            let total = changes * clients_n;
            let warmup = args.warmup.unwrap_or(total / 10).min(total);
            vec![warmup, warmup + (total - warmup) / 2, total]
        }
    };
    let total = *marks.last().expect("marks");
    // The readings compared: after the warm-up, halfway through the rest and at the end;
    // with passes, after a quarter of them, after half and after the last.
    let (start_at, middle_at) = match args.passes {
        Some(p) => ((p.div_ceil(4) - 1) as usize, (p.div_ceil(2) - 1) as usize),
        None => (0, 1),
    };
    // Whole batches fit the window.
    let batch = args
        .batch
        .clamp(1, (args.window / clients_n).max(1) as usize);

    let (dir, _tmp) = super::data_dir(None)?;
    let mut receivers = Vec::new();
    let urls: Vec<String> = match &args.receiver {
        Some(url) => vec![url.clone(); clients_n as usize],
        None => {
            for _ in 0..clients_n {
                receivers.push(Receiver::start_keeping(Keep::Counts).await?);
            }
            receivers.iter().map(|r| r.url.clone()).collect()
        }
    };
    let clients: Vec<_> = urls.iter().map(|u| super::client(u)).collect();
    let ids = super::sensor_ids(args.sensors);
    let (config, pg) = super::store_config(&dir, args.database_url.as_deref()).await?;
    super::import(&config, &ids, &clients, None).await?;
    let server = super::start(config).await?;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/readings", server.base);
    let metrics_url = format!("{}/metrics", server.base);
    // Deliveries so far: what the receivers in this process counted, or, with one outside,
    // latch's own count, scraped every 100 ms (each scrape folds the histograms, which a
    // latch nobody scrapes does every 5 s: the same work, sooner).
    let scraped = Arc::new(AtomicU64::new(0));
    let scraper = args.receiver.is_some().then(|| {
        let (http, url, scraped) = (http.clone(), metrics_url.clone(), scraped.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(r) = http.get(&url).send().await
                    && let Ok(text) = r.text().await
                {
                    scraped.store(status_sum(&text, "delivered") as u64, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
    let states = receivers.clone();
    let counted = scraped.clone();
    let requests = move || -> u64 {
        if states.is_empty() {
            counted.load(Ordering::Relaxed)
        } else {
            states.iter().map(Receiver::ok).sum()
        }
    };
    let progress = super::progress("soak", "webhooks delivered", requests.clone());

    let mut readings: Vec<Reading> = Vec::new();
    let started = Instant::now();
    let mut paused = Duration::ZERO;
    let mut sent_changes = 0u64;
    let mut body = String::with_capacity(batch * 40);
    for &mark in &marks {
        while sent_changes * clients_n < mark {
            let n = (batch as u64).min(mark.div_ceil(clients_n) - sent_changes);
            // Pace: wait for room in the window.
            let wait_until = Instant::now() + args.drain;
            while (sent_changes + n) * clients_n > requests() + args.window {
                anyhow::ensure!(
                    Instant::now() < wait_until,
                    "deliveries stalled: {} sent, {} delivered",
                    sent_changes * clients_n,
                    requests()
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            body.clear();
            body.push('[');
            for k in sent_changes..sent_changes + n {
                let sensor = &ids[(k % args.sensors as u64) as usize];
                let data = u8::from((k / args.sensors as u64).is_multiple_of(2));
                if k > sent_changes {
                    body.push(',');
                }
                body.push_str(&format!(r#"{{"sensor_id":"{sensor}","data":{data}}}"#));
            }
            body.push(']');
            let resp = http
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await?;
            anyhow::ensure!(
                resp.status().as_u16() == 202,
                "readings refused: {}",
                resp.status()
            );
            sent_changes += n;
        }
        // Drain, so every reading is taken with the same pending work: none. Watched at
        // the receivers only: a scrape of `/metrics` would fold the histograms (a latch
        // nobody scrapes is the case to measure), and an API read would fill the store's
        // reader caches, which nothing else in this run uses.
        let drain_started = Instant::now();
        let sent = sent_changes * clients_n;
        let deadline = drain_started + args.drain;
        let mut last = (requests(), Instant::now());
        while requests() < sent {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the outbox did not drain within {:?} ({sent} sent, {} delivered)",
                args.drain,
                requests()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
            // A change may supersede an older one whose lane waited (a retry, a claim
            // that came back later): the receivers never see that one. When they have
            // seen nothing new for a second, the store's own pending count decides.
            let now = (requests(), Instant::now());
            if now.0 != last.0 {
                last = now;
            } else if now.1 - last.1 >= Duration::from_secs(1) {
                let text = http.get(&metrics_url).send().await?.text().await?;
                if super::metric_sum(&text, "latch_notifications_pending") == 0.0 {
                    break;
                }
                last = now;
            }
        }
        // Idle a little longer than one metrics upkeep: the last results are recorded,
        // and what the upkeep folds away is gone at every reading alike.
        tokio::time::sleep(SETTLE).await;
        paused += drain_started.elapsed();
        super::trim_heap();
        let (rss, anon) = (status_bytes("VmRSS:"), status_bytes("RssAnon:"));
        let huge = kb_field("/proc/self/smaps_rollup", "AnonHugePages:");
        let (sqlite, heap, threads) = (sqlite_bytes(), heap_in_use(), threads());
        let live = live_heap();
        eprintln!(
            "soak: RSS {:.1} MiB ({:.1} MiB anonymous, {:.1} MiB of it huge pages; C heap in use {:.1} MiB, {:.1} MiB of it SQLite's; Rust heap live {:.1} MiB; {threads} threads) after {sent} notifications",
            rss as f64 / MIB,
            anon as f64 / MIB,
            huge as f64 / MIB,
            heap as f64 / MIB,
            sqlite as f64 / MIB,
            live as f64 / MIB,
        );
        readings.push(Reading {
            delivered: sent,
            rss,
            anon,
            huge,
            sqlite,
            heap,
            threads,
            live,
        });
    }
    let secs = started.elapsed().as_secs_f64();
    progress.abort();
    if let Some(s) = scraper {
        s.abort();
    }
    let text = http.get(&metrics_url).send().await?.text().await?;
    let ended = super::metric_sum(&text, "latch_notifications_total");
    let delivered = status_sum(&text, "delivered");
    let pending = super::metric_sum(&text, "latch_notifications_pending");
    let webhook_requests = if receivers.is_empty() {
        super::metric_sum(&text, "latch_delivery_attempts_total") as u64
    } else {
        requests()
    };
    server.stop().await?;
    if let Some(pg) = pg {
        pg.drop().await?;
    }

    let (start, middle) = (&readings[start_at], &readings[middle_at]);
    let end = readings.last().expect("readings");
    let growth = |a: u64, b: u64| (b as f64 / a as f64 - 1.0) * 100.0;
    let mut r = Report::new("soak");
    r.add("notifications", total as f64, "notifications");
    r.add("delivered", delivered, "notifications");
    r.add("ended_otherwise", ended - delivered, "notifications");
    r.add("pending_left", pending, "notifications");
    r.add("webhook_requests", webhook_requests as f64, "requests");
    r.add(
        "warmup_notifications",
        start.delivered as f64,
        "notifications",
    );
    r.add("rss_start_mib", round1(start.rss as f64 / MIB), "MiB");
    r.add(
        "middle_at_notifications",
        middle.delivered as f64,
        "notifications",
    );
    r.add("rss_middle_mib", round1(middle.rss as f64 / MIB), "MiB");
    r.add(
        "end_at_notifications",
        end.delivered as f64,
        "notifications",
    );
    r.add("rss_end_mib", round1(end.rss as f64 / MIB), "MiB");
    r.add(
        "rss_growth_start_to_end_pct",
        round1(growth(start.rss, end.rss)),
        "%",
    );
    r.add(
        "rss_growth_middle_to_end_pct",
        round1(growth(middle.rss, end.rss)),
        "%",
    );
    r.add("rss_anon_start_mib", round1(start.anon as f64 / MIB), "MiB");
    r.add(
        "rss_anon_middle_mib",
        round1(middle.anon as f64 / MIB),
        "MiB",
    );
    r.add("rss_anon_end_mib", round1(end.anon as f64 / MIB), "MiB");
    r.add(
        "anon_huge_pages_start_mib",
        round1(start.huge as f64 / MIB),
        "MiB",
    );
    r.add(
        "anon_huge_pages_end_mib",
        round1(end.huge as f64 / MIB),
        "MiB",
    );
    r.add(
        "rss_anon_growth_start_to_end_pct",
        round1(growth(start.anon, end.anon)),
        "%",
    );
    r.add(
        "heap_in_use_start_mib",
        round1(start.heap as f64 / MIB),
        "MiB",
    );
    r.add(
        "heap_in_use_middle_mib",
        round1(middle.heap as f64 / MIB),
        "MiB",
    );
    r.add("heap_in_use_end_mib", round1(end.heap as f64 / MIB), "MiB");
    r.add("threads_start", start.threads as f64, "threads");
    r.add("threads_end", end.threads as f64, "threads");
    r.add(
        "threads_most",
        readings.iter().map(|x| x.threads).max().unwrap_or(0) as f64,
        "threads",
    );
    r.add("sqlite_start_mib", round1(start.sqlite as f64 / MIB), "MiB");
    r.add("sqlite_end_mib", round1(end.sqlite as f64 / MIB), "MiB");
    let own = |x: &Reading| x.anon as f64 - x.sqlite as f64;
    r.add(
        "rss_anon_without_sqlite_growth_start_to_end_pct",
        round1((own(end) / own(start) - 1.0) * 100.0),
        "%",
    );
    let per_delivery =
        (end.anon as f64 - start.anon as f64) / (end.delivered - start.delivered).max(1) as f64;
    r.add(
        "rss_anon_bytes_per_delivery_after_warmup",
        round1(per_delivery),
        "B",
    );
    let mib = |b: f64| round1(b / MIB);
    r.add("rust_live_start_mib", mib(start.live as f64), "MiB");
    r.add("rust_live_end_mib", mib(end.live as f64), "MiB");
    // What neither latch's Rust code nor C code holds: pages the allocators keep.
    let kept = |x: &Reading| x.anon as f64 - x.live as f64 - x.heap as f64;
    r.add("allocators_keep_start_mib", mib(kept(start)), "MiB");
    r.add("allocators_keep_end_mib", mib(kept(end)), "MiB");
    r.add("seconds", round1(secs), "s");
    r.add(
        "delivered_per_s",
        (delivered / (secs - paused.as_secs_f64()).max(1e-3)).round(),
        "webhooks/s",
    );
    let store = if args.database_url.is_some() {
        "PostgreSQL"
    } else {
        "SQLite"
    };
    let receiver = match &args.receiver {
        Some(url) => format!("the receiver outside the process at {url} (answering 2xx)"),
        None => "a receiver in the process that only counts".into(),
    };
    let common = "RSS is VmRSS, and RssAnon without the binary's own pages, read after malloc_trim; \
                  C heap in use is glibc's (SQLite's and other C code's: Rust allocates from mimalloc).";
    match args.passes {
        Some(passes) => {
            let after_start = &readings[start_at..];
            let max = after_start.iter().map(|x| x.rss).max().unwrap_or(0);
            r.add("rss_max_from_start_mib", round1(max as f64 / MIB), "MiB");
            r.add(
                "rss_max_growth_from_start_pct",
                round1(growth(start.rss, max)),
                "%",
            );
            // One pass's RSS moves by a few % with what the allocator has not handed back
            // yet when it is read; the line fitted through every reading from the start
            // on says whether it climbs.
            let (at_start, at_end) = fitted(after_start.iter().map(|x| x.rss as f64));
            r.add(
                "rss_fitted_growth_start_to_end_pct",
                round1((at_end / at_start - 1.0) * 100.0),
                "%",
            );
            r.notes.push(format!(
                "Store: {store}. {passes} passes of one change for each of {} sensors, x {} clients \
                 ({} notifications a pass), each pass delivered (and 6 s idle) before the next, \
                 window {} undelivered, {batch} readings a request; delivered to {receiver}. {common} \
                 start is after pass {}, middle after pass {}, end after pass {passes}: the goal is \
                 under 5 % growth from start to end (rss_fitted_growth: of the least-squares line \
                 through every reading from start to end, which one reading's noise moves less). \
                 delivered_per_s leaves out the pauses. \
                 VmRSS / RssAnon / huge pages / C heap / Rust heap live (MiB) and threads after each \
                 pass: {}",
                args.sensors,
                clients_n,
                args.sensors as u64 * clients_n,
                args.window,
                start_at + 1,
                middle_at + 1,
                readings
                    .iter()
                    .enumerate()
                    .map(|(i, x)| format!(
                        "{} {:.1}/{:.1}/{:.1}/{:.1}/{:.1} {}t",
                        i + 1,
                        x.rss as f64 / MIB,
                        x.anon as f64 / MIB,
                        x.huge as f64 / MIB,
                        x.heap as f64 / MIB,
                        x.live as f64 / MIB,
                        x.threads
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        None => r.notes.push(format!(
            "Store: {store}. {} sensors x {} clients, window {} undelivered, {batch} readings a \
             request; every reading flips its sensor; delivered to {receiver}. {common} RSS is \
             read with the outbox drained after {} (warm-up), {} and {} notifications. Goal: \
             growth after warm-up under 5 %. delivered_per_s leaves out the three pauses \
             (drain, then 6 s idle) for the readings.",
            args.sensors, clients_n, args.window, start.delivered, middle.delivered, end.delivered,
        )),
    }
    Ok(r)
}

const MIB: f64 = 1024.0 * 1024.0;
/// Longer than the metrics upkeep interval (5 s).
const SETTLE: Duration = Duration::from_secs(6);

/// The least-squares line through `ys` (evenly spaced): its value at the first and at the
/// last of them.
fn fitted(ys: impl Iterator<Item = f64>) -> (f64, f64) {
    let ys: Vec<f64> = ys.collect();
    let n = ys.len() as f64;
    if ys.len() < 2 {
        let y = ys.first().copied().unwrap_or(0.0);
        return (y, y);
    }
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ys.iter().sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        let dx = i as f64 - mean_x;
        sxy += dx * (y - mean_y);
        sxx += dx * dx;
    }
    let slope = sxy / sxx;
    (mean_y - slope * mean_x, mean_y + slope * mean_x)
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// `latch_notifications_total` of one status in an exposition `text`.
fn status_sum(text: &str, status: &str) -> f64 {
    let series = format!("latch_notifications_total{{status=\"{status}\"}}");
    text.lines()
        .filter_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok())
        .sum()
}
