//! `latch bench rate`: what one client with a `rate_limit` receives from N `latch serve`
//! processes on one PostgreSQL schema, against one node alone on another, in the same run.
//!
//! The client is linked to every sensor of the fleet, which spreads over every node's
//! partitions; every sensor changes twice a second, through each node in turn, so every
//! node always has far more of the client's notifications waiting than its limit lets
//! through. Over `--window` from the first webhook: the webhooks per second, the busiest
//! second, and the cluster's rate against the single node's (1.0: the limit holds for the
//! cluster as for one node; N: each node applied it on its own).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::cluster::Group;
use super::{Receiver, Report};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Nodes of the cluster (one more process each).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The PostgreSQL database; each run takes fresh schemas of it and drops them.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    pub database_url: String,
    /// The client's `rate_limit`, requests per second.
    #[arg(long, default_value_t = 50)]
    pub rate_limit: u32,
    /// How long the webhooks are counted, from the first.
    #[arg(long, default_value = "60s", value_parser = latch::config::parse_duration)]
    pub window: Duration,
    /// Sensors of the fleet, all linked to the client.
    #[arg(long, default_value_t = 600)]
    pub sensors: usize,
    /// Partitions of the cluster's schema.
    #[arg(long, default_value_t = 64)]
    pub partitions: u32,
}

/// What one group delivered to the client.
struct Counted {
    per_s: f64,
    busiest_second: usize,
    pending_after: u64,
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    anyhow::ensure!(args.nodes >= 2, "--nodes is at least 2");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let ids = super::sensor_ids(args.sensors);
    let group_args = super::cluster::Args {
        nodes: args.nodes,
        database_url: args.database_url.clone(),
        partitions: args.partitions,
        lease: Duration::from_secs(5),
        sensors: 0,
        readings: 0,
        batch: 1,
        workers: 1,
        changes: args.sensors,
        drain: Duration::from_secs(120),
        via: "http".into(),
        amqp_url: String::new(),
    };
    let mut r = Report::new("rate");
    r.add("nodes", args.nodes as f64, "nodes");
    r.add("rate_limit", f64::from(args.rate_limit), "requests/s");
    r.add("window", args.window.as_secs_f64(), "s");
    let mut counted = Vec::new();
    for n in [1, args.nodes] {
        let receiver = Receiver::start().await;
        let group = Group::start(n, &group_args, &[], &ids, &receiver, &http).await?;
        eprintln!("rate: {n} node(s) ready");
        let c = count(&args, &group.bases(), &ids, &receiver, &http).await?;
        group.stop().await?;
        counted.push(c);
    }
    for (label, c) in [("single", &counted[0]), ("cluster", &counted[1])] {
        r.add(
            format!("{label}_webhooks_per_s"),
            round1(c.per_s),
            "webhooks/s",
        );
        r.add(
            format!("{label}_busiest_second"),
            c.busiest_second as f64,
            "webhooks",
        );
        r.add(
            format!("{label}_pending_after"),
            c.pending_after as f64,
            "notifications",
        );
    }
    r.add(
        "cluster_to_single",
        (counted[1].per_s / counted[0].per_s * 1000.0).round() / 1000.0,
        "x",
    );
    r.notes.push(format!(
        "PostgreSQL, {} latch serve processes on one schema against 1 on another, same run: \
         one client with rate_limit {}/s linked to {} sensors, every sensor changing twice a \
         second through each node in turn; webhooks counted over {:?} from the first \
         (pending_after: the backlog left, so the limit and not the work bounded them).",
        args.nodes, args.rate_limit, args.sensors, args.window
    ));
    Ok(r)
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

/// Gives the client its limit, keeps every sensor changing, and counts the webhooks over
/// the window.
async fn count(
    args: &Args,
    bases: &[String],
    ids: &[latch::domain::SensorId],
    receiver: &Receiver,
    http: &reqwest::Client,
) -> anyhow::Result<Counted> {
    let clients: Value = http
        .get(format!("{}/v1/clients", bases[0]))
        .send()
        .await?
        .json()
        .await?;
    let client = &clients["items"][0];
    let id = client["id"].as_str().unwrap_or_default();
    let resp = http
        .put(format!("{}/v1/clients/{id}", bases[bases.len() - 1]))
        .json(&json!({"name": client["name"], "url": client["url"], "rate_limit": args.rate_limit}))
        .send()
        .await?;
    anyhow::ensure!(resp.status().is_success(), "rate_limit: {}", resp.status());
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    let (producer_http, producer_bases) = (http.clone(), bases.to_vec());
    let producer = tokio::spawn(async move {
        for round in 0usize.. {
            for (k, chunk) in ids.chunks(500).enumerate() {
                let items: Vec<Value> = chunk
                    .iter()
                    .map(|id| json!({"sensor_id": id, "data": round % 2}))
                    .collect();
                let to = &producer_bases[(round + k) % producer_bases.len()];
                let _ = producer_http
                    .post(format!("{to}/v1/readings"))
                    .json(&items)
                    .send()
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let first = loop {
        if let Some(g) = receiver.received().first() {
            break g.at;
        }
        anyhow::ensure!(Instant::now() < deadline, "no webhook within 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    tokio::time::sleep_until((first + args.window).into()).await;
    let pending: Value = http
        .get(format!("{}/v1/fleet", bases[0]))
        .send()
        .await?
        .json()
        .await?;
    producer.abort();
    let mut seconds = vec![0usize; args.window.as_secs().max(1) as usize];
    let mut total = 0;
    for g in receiver.received() {
        let since = g.at.duration_since(first);
        if since < args.window {
            total += 1;
            if let Some(s) = seconds.get_mut(since.as_secs() as usize) {
                *s += 1;
            }
        }
    }
    Ok(Counted {
        per_s: total as f64 / args.window.as_secs_f64(),
        busiest_second: seconds.into_iter().max().unwrap_or(0),
        pending_after: pending["notifications_pending"].as_u64().unwrap_or(0),
    })
}
