//! `latch bench`: the load generator. Each scenario starts latch in-process on a fresh data
//! folder, prepares the fleet through the store's bulk import, drives load over real HTTP,
//! measures a baseline in the same run, prints a table and one JSON line, and records the
//! figures with the command line in `BENCHMARKS.md`.

pub mod broker;
pub mod changes;
pub mod clickhouse_server;
pub mod cluster;
mod cluster_amqp;
pub mod deliver;
pub mod deliver_broker;
pub mod fleet;
pub mod history;
pub mod holds;
pub mod ingest;
mod mtls;
pub mod pg_cost;
pub mod postgres_server;
pub mod rate;
pub mod restart;
pub mod retention;
pub mod silences;
pub mod sites;
pub mod soak;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use latch::config::Config;
use latch::domain::{Client, Sensor, SensorId, time};
pub use latch_testkit::{Keep, PgSchema, Receiver, Server};

/// A result row: name, value, unit.
pub type Row = (String, f64, &'static str);

/// What a scenario reports.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub scenario: &'static str,
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn new(scenario: &'static str) -> Self {
        Self {
            scenario,
            ..Default::default()
        }
    }

    pub fn add(&mut self, name: impl Into<String>, value: f64, unit: &'static str) {
        self.rows.push((name.into(), value, unit));
    }

    pub fn get(&self, name: &str) -> Option<f64> {
        self.rows.iter().find(|r| r.0 == name).map(|r| r.1)
    }

    fn table(&self) -> String {
        let mut s = String::from("| metric | value | unit |\n|---|---:|---|\n");
        for (n, v, u) in &self.rows {
            let v = if v.fract() == 0.0 && v.abs() < 1e15 {
                format!("{v:.0}")
            } else {
                format!("{v:.3}")
            };
            s.push_str(&format!("| {n} | {v} | {u} |\n"));
        }
        s
    }

    fn json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .rows
            .iter()
            .map(|(n, v, _)| (n.clone(), serde_json::json!(v)))
            .collect();
        serde_json::json!({"scenario": self.scenario, "results": map}).to_string()
    }

    /// Prints the table and the JSON line; records them in `file` unless `None`.
    pub fn publish(&self, command: &str, file: Option<&Path>) -> anyhow::Result<()> {
        println!("\n{}", self.table());
        for n in &self.notes {
            println!("{n}");
        }
        println!("{}", self.json());
        if let Some(file) = file {
            record(file, self, command)?;
            println!("recorded in {}", file.display());
        }
        Ok(())
    }
}

/// Cores and memory of this machine, for the record.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!("{cores} cores, {:.1} GiB", mem_kb as f64 / 1024.0 / 1024.0)
}

/// Replaces (or appends) the scenario's section of `BENCHMARKS.md`.
fn record(file: &Path, r: &Report, command: &str) -> anyhow::Result<()> {
    // One section per distinct command: re-running a command replaces its figures.
    let key = command
        .split_whitespace()
        .filter(|w| !w.starts_with("--record") && !w.ends_with(".md"))
        .collect::<Vec<_>>()
        .join(" ");
    let begin = format!("<!-- bench:{key} -->");
    let end = format!("<!-- /bench:{key} -->");
    let mut section = format!(
        "{begin}\n## {}\n\n`{command}` — {} — {} (debug assertions: {})\n\n{}",
        r.scenario,
        time::format(time::now_ms()),
        machine(),
        cfg!(debug_assertions),
        r.table()
    );
    for n in &r.notes {
        section.push_str(&format!("\n{n}\n"));
    }
    section.push_str(&format!("\n{end}"));
    let current = std::fs::read_to_string(file).unwrap_or_else(|_| {
        "# Benchmarks\n\nFigures measured by `latch bench`; each section says the command, \
         when, and on what machine. Ratios compare with a baseline measured in the same run.\n"
            .to_string()
    });
    let updated = match (current.find(&begin), current.find(&end)) {
        (Some(a), Some(b)) if b > a => {
            format!("{}{section}{}", &current[..a], &current[b + end.len()..])
        }
        _ => format!("{}\n{section}\n", current.trim_end()),
    };
    std::fs::write(file, updated)?;
    Ok(())
}

/// JSON bodies of readings for one load worker: its sensors in turn, a share of the
/// readings flipping their sensor's state (a fixed xorshift sequence, so runs compare).
pub struct Bodies {
    ids: Vec<String>,
    state: Vec<bool>,
    next: usize,
    rng: u64,
    change_ratio: f64,
}

impl Bodies {
    pub fn new(ids: Vec<String>, seed: u64, change_ratio: f64) -> Self {
        Self {
            state: vec![false; ids.len()],
            ids,
            next: 0,
            rng: seed.max(1),
            change_ratio,
        }
    }

    /// A JSON array of `n` readings.
    pub fn body(&mut self, n: usize) -> String {
        let mut body = String::with_capacity(n * 40);
        body.push('[');
        for j in 0..n {
            let i = self.next % self.ids.len().max(1);
            self.next += 1;
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            if (self.rng % 10_000) as f64 / 10_000.0 < self.change_ratio {
                self.state[i] = !self.state[i];
            }
            if j > 0 {
                body.push(',');
            }
            body.push_str(&format!(
                r#"{{"sensor_id":"{}","data":{}}}"#,
                self.ids[i],
                u8::from(self.state[i])
            ));
        }
        body.push(']');
        body
    }
}

/// Prints `count` once a second to stderr while a scenario runs (abort the task to stop).
pub fn progress(
    scenario: &'static str,
    what: &'static str,
    count: impl Fn() -> u64 + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut last = 0u64;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = count();
            eprintln!(
                "{scenario}: {now} {what} ({}/s now, {:.0}/s overall)",
                now - last,
                now as f64 / started.elapsed().as_secs_f64()
            );
            last = now;
        }
    })
}

/// Posts readings to `url` (`/v1/readings`) and fails unless latch accepted them (202).
pub async fn post_readings(
    http: &reqwest::Client,
    url: &str,
    items: &[serde_json::Value],
) -> anyhow::Result<()> {
    let r = http.post(url).json(items).send().await?;
    anyhow::ensure!(
        r.status().as_u16() == 202,
        "readings refused: {}",
        r.status()
    );
    Ok(())
}

/// Polls `count` until it reaches `target`, returning when (ms since the epoch); fails
/// with "only n of target {what}" after `patience`.
pub async fn reached(
    count: impl Fn() -> u64,
    target: u64,
    patience: Duration,
    what: &str,
) -> anyhow::Result<i64> {
    let give_up = Instant::now() + patience;
    loop {
        let n = count();
        if n >= target {
            return Ok(time::now_ms());
        }
        anyhow::ensure!(Instant::now() < give_up, "only {n} of {target} {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Percentile `p` (0–100) of sorted values.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Sum of every series of a Prometheus metric `name` in an exposition `text`.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum()
}

/// Quantile `q` (as the exporter writes it: `0.5`, `0.99`, `1`) of a Prometheus summary
/// `name` in an exposition `text`; `None` when it is not there or has no samples.
pub fn metric_quantile(text: &str, name: &str, q: &str) -> Option<f64> {
    let series = format!("{name}{{quantile=\"{q}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite())
}

/// This process's CPU time so far (latch, receiver and bench clients alike), in seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// Resident memory of this process, in bytes.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Hands freed heap back to the OS, so RSS measures what is live.
/// This process's RSS with an empty latch running in it (after handing freed heap back to
/// the OS): the baseline a bench's memory per sensor is measured from.
pub async fn rss_of_an_empty_latch() -> anyhow::Result<u64> {
    trim_heap();
    let empty = tempfile::tempdir()?;
    let s = start(config(empty.path())).await?;
    trim_heap();
    let r = rss_bytes();
    s.stop().await?;
    Ok(r)
}

pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Starts latch in this process; a start on a large fleet may take minutes.
pub async fn start(config: Config) -> anyhow::Result<Server> {
    Server::start(config, Duration::from_secs(600)).await
}

/// Bench settings of latch: a data folder of its own, quiet logs, and its receivers on
/// loopback let through the SSRF guard.
pub fn config(dir: &Path) -> Config {
    let mut c = Config::for_data_dir(dir);
    c.log = "warn".into();
    c.delivery_allow_nets = vec!["127.0.0.0/8".parse().expect("a network")];
    c
}

/// `n` sensor ids `b0000000`, `b0000001`, …
pub fn sensor_ids(n: usize) -> Vec<SensorId> {
    (0..n)
        .map(|i| SensorId::parse(&format!("b{i:07}")).expect("valid id"))
        .collect()
}

/// Registers sensors (and links each to `clients`) straight into the store `config`
/// names, in chunks so the import's own memory stays small.
/// Creates `sites` sites (`site00000`, …) for [`import_sited`].
pub async fn create_sites(config: &Config, sites: usize) -> anyhow::Result<()> {
    let store = latch::store::connect(config).await?;
    let now = time::now_ms();
    for s in 0..sites {
        store
            .create_site(latch::domain::site::Site {
                id: format!("site{s:05}"),
                name: None,
                address: None,
                gateway_sensor_id: None,
                created_at: now,
                updated_at: now,
            })
            .await?;
    }
    Ok(())
}

pub async fn import(
    config: &Config,
    ids: &[SensorId],
    clients: &[Client],
    timeout_s: Option<u32>,
) -> anyhow::Result<()> {
    import_sited(config, ids, clients, timeout_s, 0).await
}

/// [`import`], the sensors in `sites` sites made by [`create_sites`] (consecutive ids
/// together, equal shares; 0: none).
pub async fn import_sited(
    config: &Config,
    ids: &[SensorId],
    clients: &[Client],
    timeout_s: Option<u32>,
    sites: usize,
) -> anyhow::Result<()> {
    let per_site = ids.len().div_ceil(sites.max(1));
    let store = latch::store::connect(config).await?;
    for cl in clients {
        store.create_client(cl.clone()).await?;
    }
    for (c, chunk) in ids.chunks(20_000).enumerate() {
        let sensors = chunk
            .iter()
            .enumerate()
            .map(|(j, id)| Sensor {
                id: *id,
                address: "bench street 1".into(),
                heartbeat_timeout_s: timeout_s,
                debounce_s: None,
                site_id: (sites > 0).then(|| format!("site{:05}", (c * 20_000 + j) / per_site)),
                created_at: time::now_ms(),
                battery_low_pct: latch::domain::signals::DEFAULT_BATTERY_LOW_PCT,
                labels: Default::default(),
                hold_alarms: Default::default(),
                flap: None,
                armed: None,
            })
            .collect();
        let links = chunk
            .iter()
            .flat_map(|id| clients.iter().map(move |c| (c.id.clone(), *id)))
            .collect();
        store.import(sensors, links, time::now_ms()).await?;
    }
    Ok(())
}

/// Bench settings on `dir`, on a fresh schema of the PostgreSQL database at `database_url`
/// when one is given (drop it with [`PgSchema::drop`] at the end).
pub async fn store_config(
    dir: &Path,
    database_url: Option<&str>,
) -> anyhow::Result<(Config, Option<PgSchema>)> {
    let pg = match database_url {
        Some(base) => Some(PgSchema::create(base, "latch_bench").await?),
        None => None,
    };
    let mut c = config(dir);
    // Named after the schema, so that [`pg_cost`] tells latch's backends apart.
    c.database_url = pg
        .as_ref()
        .map(|p| format!("{}&application_name={}", p.url, p.schema()));
    // A shared store seals clients' secrets under a key from outside the data folder
    // (latch refuses to start without one): a fresh one for the run's fresh schema.
    if pg.is_some() {
        c.secret_key = Some(latch::secrets::SecretKeys(vec![
            latch::secrets::generate_key(),
        ]));
    }
    Ok((c, pg))
}

/// A client of a bench receiver.
pub fn client(url: &str) -> Client {
    Client {
        id: latch::domain::client::new_client_id(),
        name: "bench".into(),
        url: url.into(),
        secret: latch::domain::client::generate_secret(),
        created_at: time::now_ms(),
        ..Client::default()
    }
}

/// Runs `f` on `workers` tasks until `until` passes; returns what each returned.
pub async fn workers<T, F, Fut>(workers: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let handles: Vec<_> = (0..workers).map(|w| tokio::spawn(f(w))).collect();
    let mut out = Vec::with_capacity(workers);
    for h in handles {
        out.push(h.await.expect("bench worker panicked"));
    }
    out
}

/// A temp data folder for a run, removed afterwards; `--keep` leaves it.
pub fn data_dir(base: Option<PathBuf>) -> anyhow::Result<(PathBuf, Option<tempfile::TempDir>)> {
    match base {
        Some(p) => {
            std::fs::create_dir_all(&p)?;
            Ok((p, None))
        }
        None => {
            let t = tempfile::Builder::new().prefix("latch-bench-").tempdir()?;
            Ok((t.path().to_path_buf(), Some(t)))
        }
    }
}

/// Group commits latch made so far, from its metrics (read outside the timed part of a run:
/// a scrape renders every family in the measured process).
pub struct Commits {
    pub count: f64,
    pub readings: f64,
    /// Seconds spent committing.
    pub seconds: f64,
}

impl Commits {
    pub async fn read(base: &str) -> anyhow::Result<Self> {
        let text = reqwest::get(format!("{base}/metrics"))
            .await?
            .text()
            .await?;
        Ok(Self {
            count: metric_sum(&text, "latch_commit_readings_count"),
            readings: metric_sum(&text, "latch_commit_readings_sum"),
            seconds: metric_sum(&text, "latch_commit_seconds_sum"),
        })
    }

    /// Adds the commits, readings a commit, and the share of the run's `secs` spent in
    /// one (near 1: the commits ran back to back, and bound the run).
    pub fn report(&self, r: &mut Report, secs: f64) {
        r.add("commits", self.count, "commits");
        r.add(
            "readings_per_commit",
            (self.readings / self.count.max(1.0)).round(),
            "readings",
        );
        r.add("commit_busy_share", self.seconds / secs, "x");
    }
}

/// `latch bench cluster`, by how the readings enter: over HTTP ([`cluster::run`]) or
/// through RabbitMQ's consistent-hash exchange ([`cluster_amqp::run`]).
pub async fn cluster_any(args: cluster::Args) -> anyhow::Result<Report> {
    match args.via.as_str() {
        "amqp" => cluster_amqp::run(args).await,
        _ => cluster::run(args).await,
    }
}
