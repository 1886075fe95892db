//! `latch bench cluster`: N `latch serve` processes on one PostgreSQL schema against one
//! node on another, in the same run.
//!
//! Ingest: readings/s through all nodes, each request to the next node (so most readings
//! are forwarded to their partition's owner). Delivery: webhooks/s for state changes
//! entering every node. Both against one node alone (the ratio). Then the takeover: one
//! node killed with SIGKILL, the time until every partition has a live owner again and a
//! reading of a sensor of the killed node's partitions is accepted.
//!
//! The nodes are real processes (this binary, `serve`), so a kill is a kill; on 127.0.0.1.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use super::{Bodies, Keep, PgSchema, Receiver, Report};
use latch::domain::SensorId;

/// The key every node of a bench cluster seals clients' secrets with (`LATCH_SECRET_KEY`).
const SECRET_KEY: &str = "YmVuY2gtY2x1c3Rlci1zZWNyZXQta2V5LTMyYnl0ZXM=";

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Nodes of the cluster (one more process each).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The PostgreSQL database; each run takes fresh schemas of it and drops them.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub database_url: String,
    /// Partitions of the cluster's schema.
    #[arg(long, default_value_t = 64)]
    pub partitions: u32,
    /// The nodes' partition lease (the takeover waits for it to run out).
    #[arg(long, default_value = "5s", value_parser = latch::config::parse_duration)]
    pub lease: Duration,
    /// Sensors the ingest phase reports for (no client linked).
    #[arg(long, default_value_t = 10_000)]
    pub sensors: usize,
    /// Readings sent in each ingest phase.
    #[arg(long, default_value_t = 100_000)]
    pub readings: usize,
    /// Readings per request.
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// Concurrent producers.
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// State changes of the delivery phase, each of its own sensor (none superseded).
    #[arg(long, default_value_t = 10_000)]
    pub changes: usize,
    /// Longest wait for the webhooks of a delivery phase, and for a takeover.
    #[arg(long, default_value = "120s", value_parser = latch::config::parse_duration)]
    pub drain: Duration,
    /// How readings enter: `http` (requests rotated over the nodes, then the delivery and
    /// takeover phases) or `amqp` (published to the consistent-hash exchange, routing key
    /// = sensor id; ingest only).
    #[arg(long, default_value = "http")]
    pub via: String,
    /// RabbitMQ to use with `--via amqp` (the consistent-hash exchange plugin enabled).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
}

/// One `latch serve` child process, killed when dropped.
struct Node {
    child: tokio::process::Child,
    base: String,
}

impl Node {
    fn spawn(dir: &Path, url: &str, args: &Args, env: &[(&str, String)]) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = tokio::process::Command::new(std::env::current_exe()?)
            .arg("serve")
            .env("LATCH_LISTEN", format!("127.0.0.1:{port}"))
            .env("LATCH_DATA_DIR", dir)
            .env("LATCH_DATABASE_URL", url)
            .env(
                "LATCH_CLUSTER_LEASE",
                format!("{}ms", args.lease.as_millis()),
            )
            .env("LATCH_CLUSTER_PARTITIONS", args.partitions.to_string())
            .env("LATCH_CLUSTER_SECRET", "bench-cluster-secret")
            // Every node seals clients' secrets with the same key.
            .env("LATCH_SECRET_KEY", SECRET_KEY)
            .env("LATCH_DELIVERY_ALLOW_NETS", "127.0.0.0/8")
            .env("LATCH_LOG", "error")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting latch serve")?;
        Ok(Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
        })
    }

    async fn ready(&self, http: &reqwest::Client) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = http
                .get(format!("{}/readyz", self.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "{} not ready in 60s", self.base);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Nodes on one fresh schema, with the fleet imported (`latch bench rate` starts them too).
pub(super) struct Group {
    nodes: Vec<Node>,
    schema: PgSchema,
    _dir: tempfile::TempDir,
}

impl Group {
    pub(super) async fn start(
        n: usize,
        args: &Args,
        ingest: &[SensorId],
        deliver: &[SensorId],
        receiver: &Receiver,
        http: &reqwest::Client,
    ) -> anyhow::Result<Self> {
        Self::start_env(n, args, ingest, deliver, receiver, http, &[]).await
    }

    /// As [`Group::start`], with more `LATCH_*` settings on every node.
    pub(super) async fn start_env(
        n: usize,
        args: &Args,
        ingest: &[SensorId],
        deliver: &[SensorId],
        receiver: &Receiver,
        http: &reqwest::Client,
        env: &[(&str, String)],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("latch-bench-cluster-")
            .tempdir()?;
        let schema = PgSchema::create(&args.database_url, "latch_bench").await?;
        let mut config = super::config(dir.path());
        config.database_url = Some(schema.url.clone());
        config.cluster_partitions = Some(args.partitions);
        config.secret_key =
            Some(latch::secrets::SecretKeys::parse(SECRET_KEY).map_err(anyhow::Error::msg)?);
        super::import(&config, ingest, &[], None).await?;
        super::import(&config, deliver, &[super::client(&receiver.url)], None).await?;
        let mut nodes = Vec::new();
        for i in 0..n {
            let d: PathBuf = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&d)?;
            nodes.push(Node::spawn(&d, &schema.url, args, env)?);
        }
        for node in &nodes {
            node.ready(http).await?;
        }
        let group = Self {
            nodes,
            schema,
            _dir: dir,
        };
        group.spread(args, http).await?;
        Ok(group)
    }

    /// Waits until every partition is held and spread evenly over the nodes, then one lease
    /// more: the nodes route by the leases from their next round, and nothing is moving
    /// while the figures are taken.
    async fn spread(&self, args: &Args, http: &reqwest::Client) -> anyhow::Result<()> {
        let (n, p) = (self.nodes.len() as u64, u64::from(args.partitions));
        let deadline = Instant::now() + args.drain;
        loop {
            let v: Value = http
                .get(format!("{}/v1/cluster", self.nodes[0].base))
                .send()
                .await?
                .json()
                .await?;
            let counts: Vec<u64> = v["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["partitions"].as_u64())
                .filter(|&c| c > 0)
                .collect();
            if counts.len() as u64 == n
                && counts.iter().sum::<u64>() == p
                && counts.iter().all(|&c| c == p / n || c == p.div_ceil(n))
            {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "partitions not spread over {n} nodes: {v}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(args.lease).await;
        Ok(())
    }

    pub(super) fn bases(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.base.clone()).collect()
    }

    pub(super) async fn stop(self) -> anyhow::Result<()> {
        for mut n in self.nodes {
            n.child.start_kill().ok();
            n.child.wait().await?;
        }
        self.schema.drop().await?;
        Ok(())
    }
}

/// The figures of one group (one node, or the cluster).
#[derive(Default)]
struct Run {
    /// Readings of the ingest phase accepted, refused, and accepted per second.
    accepted: u64,
    refused: u64,
    ingest_rate: f64,
    /// State changes of the delivery phase accepted; webhooks received, and per second.
    changes: u64,
    delivered: u64,
    webhook_rate: f64,
    forwarded: f64,
    /// Refusals by code (`503` for a whole request), both phases.
    refusals: BTreeMap<String, u64>,
    /// The first message of each refusal code.
    samples: BTreeMap<String, String>,
}

impl Run {
    /// Counts what a `POST /v1/readings` answer accepted and refused.
    fn answer(&mut self, status: u16, body: &Value, sent: usize) -> u64 {
        if status != 202 {
            *self.refusals.entry(status.to_string()).or_default() += sent as u64;
            self.samples
                .entry(status.to_string())
                .or_insert_with(|| body["error"]["message"].as_str().unwrap_or("").to_string());
            return 0;
        }
        for r in body["rejected"].as_array().into_iter().flatten() {
            let code = r["code"].as_str().unwrap_or("?").to_string();
            *self.refusals.entry(code.clone()).or_default() += 1;
            self.samples
                .entry(code)
                .or_insert_with(|| r["error"].as_str().unwrap_or("").to_string());
        }
        body["accepted"].as_u64().unwrap_or(0)
    }
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    anyhow::ensure!(args.nodes >= 2, "--nodes is at least 2");
    // `--via amqp` is `cluster_amqp::run` ([`super::cluster_any`]).
    anyhow::ensure!(
        args.via == "http",
        "--via must be http or amqp, not {:?}",
        args.via
    );
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let all = super::sensor_ids(args.sensors + args.changes);
    let (ingest_ids, deliver_ids) = all.split_at(args.sensors);
    let mut r = Report::new("cluster");
    r.add("nodes", args.nodes as f64, "nodes");
    r.add("partitions", f64::from(args.partitions), "partitions");

    let mut runs = Vec::new();
    for n in [1, args.nodes] {
        let receiver = Receiver::start_keeping(Keep::Counts).await?;
        let group = Group::start(n, &args, ingest_ids, deliver_ids, &receiver, &http).await?;
        eprintln!("cluster: {n} node(s) ready");
        let mut run = Run::default();
        ingest(&args, &group.bases(), ingest_ids, &http, &mut run).await?;
        deliver(
            &args,
            &group.bases(),
            deliver_ids,
            &receiver,
            &http,
            &mut run,
        )
        .await?;
        run.forwarded = sum_metric(
            &http,
            &group.bases(),
            "latch_cluster_forwarded_readings_total",
        )
        .await;
        if n == args.nodes {
            let (owned, accepted) = takeover(&args, &group, ingest_ids, &http).await?;
            r.add("takeover_owned_seconds", owned, "s");
            r.add("takeover_reading_accepted_seconds", accepted, "s");
        }
        group.stop().await?;
        runs.push(run);
    }
    let (one, many) = (&runs[0], &runs[1]);
    for (label, f) in [("single", one), ("cluster", many)] {
        r.add(
            format!("{label}_readings_accepted"),
            f.accepted as f64,
            "readings",
        );
        r.add(
            format!("{label}_readings_refused"),
            f.refused as f64,
            "readings",
        );
        r.add(
            format!("{label}_ingest_per_s"),
            f.ingest_rate.round(),
            "readings/s",
        );
        r.add(
            format!("{label}_changes_accepted"),
            f.changes as f64,
            "readings",
        );
        r.add(
            format!("{label}_webhooks_delivered"),
            f.delivered as f64,
            "webhooks",
        );
        r.add(
            format!("{label}_webhooks_per_s"),
            f.webhook_rate.round(),
            "webhooks/s",
        );
        r.add(
            format!("{label}_forwarded_readings"),
            f.forwarded,
            "readings",
        );
        if !f.refusals.is_empty() {
            r.notes.push(format!(
                "{label}: refused {:?}, e.g. {:?}",
                f.refusals, f.samples
            ));
        }
    }
    r.add("ingest_ratio", many.ingest_rate / one.ingest_rate, "x");
    r.add("delivery_ratio", many.webhook_rate / one.webhook_rate, "x");
    r.notes.push(format!(
        "PostgreSQL, {} latch serve processes on one schema against 1 on another, same \
         run and fleet: {} sensors for ingest ({} readings, {} per request, {} workers, \
         each request to the next node), {} state changes each of its own sensor for \
         delivery. Takeover: kill -9 of one node, lease {:?}; owned = every partition \
         held by a live node again, accepted = a reading of one of its sensors accepted \
         through a survivor.",
        args.nodes, args.sensors, args.readings, args.batch, args.workers, args.changes, args.lease
    ));
    Ok(r)
}

/// Sends `args.readings` readings through `bases` in turn, each request to the next node.
async fn ingest(
    args: &Args,
    bases: &[String],
    ids: &[SensorId],
    http: &reqwest::Client,
    run: &mut Run,
) -> anyhow::Result<()> {
    let requests = args.readings.div_ceil(args.batch.max(1));
    let next = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let count = accepted.clone();
    let progress = super::progress("cluster", "readings accepted", move || {
        count.load(Ordering::Relaxed)
    });
    let started = Instant::now();
    let workers = args.workers.max(1);
    let results = super::workers(workers, |w| {
        // Each worker its own share of the sensors, so none reorders another's readings.
        let mine: Vec<String> = ids
            .iter()
            .skip(w)
            .step_by(workers)
            .map(ToString::to_string)
            .collect();
        let (http, bases, next) = (http.clone(), bases.to_vec(), next.clone());
        let (accepted, batch) = (accepted.clone(), args.batch);
        async move {
            let mut bodies = Bodies::new(mine, w as u64 + 1, 0.1);
            let mut part = Run::default();
            loop {
                let k = next.fetch_add(1, Ordering::Relaxed) as usize;
                if k >= requests {
                    return Ok::<_, anyhow::Error>(part);
                }
                let resp = http
                    .post(format!("{}/v1/readings", bases[k % bases.len()]))
                    .header("content-type", "application/json")
                    .body(bodies.body(batch))
                    .send()
                    .await?;
                let status = resp.status().as_u16();
                let body: Value = resp.json().await.unwrap_or(Value::Null);
                anyhow::ensure!(
                    status == 202 || status == 503,
                    "readings answered {status}: {body}"
                );
                let ok = part.answer(status, &body, batch);
                accepted.fetch_add(ok, Ordering::Relaxed);
                part.accepted += ok;
                part.refused += batch as u64 - ok;
            }
        }
    })
    .await;
    progress.abort();
    let secs = started.elapsed().as_secs_f64();
    for part in results {
        let part = part?;
        run.accepted += part.accepted;
        run.refused += part.refused;
        for (code, n) in part.refusals {
            *run.refusals.entry(code).or_default() += n;
        }
        for (code, m) in part.samples {
            run.samples.entry(code).or_insert(m);
        }
    }
    run.ingest_rate = run.accepted as f64 / secs;
    Ok(())
}

/// One state change per sensor of `ids`, through `bases` in turn, 500 to a request; the
/// webhooks per second until the receiver has one per accepted change (or `args.drain`
/// passed).
async fn deliver(
    args: &Args,
    bases: &[String],
    ids: &[SensorId],
    receiver: &Receiver,
    http: &reqwest::Client,
    run: &mut Run,
) -> anyhow::Result<()> {
    let before = receiver.ok();
    let started = Instant::now();
    for (k, chunk) in ids.chunks(500).enumerate() {
        let items: Vec<Value> = chunk
            .iter()
            .map(|id| json!({"sensor_id": id.to_string(), "data": 1}))
            .collect();
        let resp = http
            .post(format!("{}/v1/readings", bases[k % bases.len()]))
            .json(&items)
            .send()
            .await?;
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        run.changes += run.answer(status, &body, items.len());
    }
    let deadline = Instant::now() + args.drain;
    while receiver.ok() - before < run.changes && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run.delivered = receiver.ok() - before;
    run.webhook_rate = run.delivered as f64 / started.elapsed().as_secs_f64();
    Ok(())
}

/// Kills the last node; seconds until every partition is held by a survivor, and until a
/// reading of a sensor the killed node owned is accepted through one.
async fn takeover(
    args: &Args,
    group: &Group,
    ids: &[SensorId],
    http: &reqwest::Client,
) -> anyhow::Result<(f64, f64)> {
    let bases = group.bases();
    let (victim, survivors) = bases.split_last().context("nodes")?;
    // A sensor the victim owns: a reading of it posted to the victim is forwarded nowhere.
    let mut probe = None;
    for id in ids.iter().take(256) {
        let before = sum_metric(http, &bases, "latch_cluster_forwarded_readings_total").await;
        let body = json!([{"sensor_id": id.to_string(), "data": 0}]);
        let resp = http
            .post(format!("{victim}/v1/readings"))
            .json(&body)
            .send()
            .await?;
        anyhow::ensure!(resp.status().as_u16() == 202, "probe refused");
        if sum_metric(http, &bases, "latch_cluster_forwarded_readings_total").await == before {
            probe = Some(id.to_string());
            break;
        }
    }
    let probe = probe.context("no sensor of the killed node's partitions found")?;
    let pid = group
        .nodes
        .last()
        .and_then(|n| n.child.id())
        .context("victim pid")?;
    let killed = Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -KILL {pid}");
    let deadline = killed + args.lease * 3 + args.drain;
    let mut owned = None;
    let mut accepted = None;
    let mut k = 0usize;
    while owned.is_none() || accepted.is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "no takeover within {:?}",
            deadline - killed
        );
        let via = &survivors[k % survivors.len()];
        k += 1;
        if owned.is_none()
            && let Ok(resp) = http.get(format!("{via}/v1/cluster")).send().await
            && let Ok(v) = resp.json::<Value>().await
        {
            let held: u64 = v["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["address"] != victim.as_str())
                .filter_map(|n| n["partitions"].as_u64())
                .sum();
            if held == u64::from(args.partitions) {
                owned = Some(killed.elapsed().as_secs_f64());
            }
        }
        if accepted.is_none() {
            let body = json!([{"sensor_id": probe, "data": k % 2}]);
            if let Ok(resp) = http
                .post(format!("{via}/v1/readings"))
                .json(&body)
                .send()
                .await
                && let Ok(v) = resp.json::<Value>().await
                && v["accepted"] == 1
            {
                accepted = Some(killed.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((owned.unwrap_or_default(), accepted.unwrap_or_default()))
}

/// Sum of a metric over the nodes that answer.
pub(super) async fn sum_metric(http: &reqwest::Client, bases: &[String], name: &str) -> f64 {
    let mut sum = 0.0;
    for base in bases {
        if let Ok(resp) = http.get(format!("{base}/metrics")).send().await
            && let Ok(text) = resp.text().await
        {
            sum += super::metric_sum(&text, name);
        }
    }
    sum
}
