//! What the `latch bench deliver` runs share, whichever destination they deliver to: their
//! arguments, the state changes they send, and the waits on the outbox afterwards.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Sensors changed in rotation (as many as changes: each change is its own lane, so
    /// none is superseded).
    #[arg(long, default_value_t = 50_000)]
    pub sensors: usize,
    /// Clients each sensor is linked to (each with its own receiver).
    #[arg(long, default_value_t = 1)]
    pub clients: usize,
    /// State changes to send.
    #[arg(long, default_value_t = 50_000)]
    pub changes: usize,
    /// Changes per second to send at; 0 for as fast as accepted.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Share of webhook requests the receivers fail with 500.
    #[arg(long, default_value_t = 0.0)]
    pub fail_ratio: f64,
    /// Run on PostgreSQL (a fresh schema of this database) instead of SQLite.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Requests of changes in flight at once (each sender owns a share of the sensors, so
    /// a sensor's changes stay in order). With one, delivery cannot outrun one request's
    /// commit at a time.
    #[arg(long, default_value_t = 1)]
    pub senders: usize,
    /// Requests of the bare-client baseline.
    #[arg(long, default_value_t = 20_000)]
    pub baseline_requests: usize,
    /// Deliver to this receiver (e.g. nginx from `scripts/bench-receiver`) instead of
    /// in-process ones, with one client: the process's CPU is then latch's and the bench's
    /// alone, not a receiver's. Latency is not measured there.
    #[arg(long)]
    pub receiver: Option<String>,
    /// Ingest every change while the client is limited to a request a second, then lift
    /// the limit and time the delivery of the backlog alone: its rate and the CPU it costs a webhook, with no
    /// ingest running beside it.
    #[arg(long)]
    pub backlog: bool,
    /// With `--backlog`: beside the plain client, one more for each kind named (a list,
    /// `bearer,mtls`), each on a receiver of its own, with a header and that
    /// authentication: `bearer`, `basic`, `oauth2` (client credentials from a token
    /// endpoint in this process), `mtls` (a client certificate, to an HTTPS receiver in
    /// this process that demands one), or `none` (plain: the control). Each client's
    /// backlog is then delivered alone in turn, so the CPU a webhook of each is measured
    /// in one run.
    #[arg(long, value_delimiter = ',')]
    pub auth: Vec<String>,
    /// How long to wait for the outbox to drain after the last change.
    #[arg(long, default_value = "120s", value_parser = latch::config::parse_duration)]
    pub drain: Duration,
    /// Where the notifications go: `http` (local receivers), or one `mqtt` or `amqp`
    /// destination on the broker below, beside a bare publisher to it in the same run.
    #[arg(long, default_value = "http")]
    pub to: String,
    /// The MQTT broker of `--to mqtt`.
    #[arg(long, default_value = "mqtt://127.0.0.1:1883")]
    pub mqtt_url: String,
    /// The RabbitMQ of `--to amqp` (its vhost in the path).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
}

/// Sends `args.changes` state changes to latch's `/v1/readings` at `url`: batches of 500
/// (smaller when paced), every pass over the sensors flipping each one; each of the
/// `senders` owns every `senders`-th sensor, so a sensor's changes stay in order. Returns
/// the seconds it took from `started`.
pub async fn send_changes(
    args: &Args,
    http: &reqwest::Client,
    url: &str,
    ids: Vec<latch::domain::SensorId>,
    started: Instant,
) -> anyhow::Result<f64> {
    // Paced runs send small batches (100 a second), so a batch's burst does not count as
    // delivery latency.
    let batch = if args.rate > 0 {
        (args.rate as usize / 100).clamp(1, 500)
    } else {
        500
    }
    .min(args.changes.max(1));
    let senders = args.senders.max(1);
    let ids = Arc::new(ids);
    let sent = super::workers(senders, |w| {
        let (http, url, ids, args) = (http.clone(), url.to_string(), ids.clone(), args.clone());
        async move {
            let mine: Vec<usize> = (0..args.changes)
                .filter(|k| (k % args.sensors) % senders == w)
                .collect();
            let rate = args.rate as f64 / senders as f64;
            let mut sent = 0usize;
            for chunk in mine.chunks(batch) {
                let items: Vec<_> = chunk
                    .iter()
                    .map(|&k| {
                        let data = (k / args.sensors).is_multiple_of(2);
                        json!({"sensor_id": ids[k % args.sensors].to_string(), "data": u8::from(data)})
                    })
                    .collect();
                super::post_readings(&http, &url, &items).await?;
                sent += chunk.len();
                if args.rate > 0 {
                    let due = started + Duration::from_secs_f64(sent as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
            }
            anyhow::Ok(sent)
        }
    })
    .await;
    for s in sent {
        s?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// The notifications ended so far in this process, for [`drain`] to count from.
pub fn ended_mark() -> u64 {
    latch::delivery::progress::ended_total()
}

/// Waits until every one of `expected` notifications has ended (delivered, failed,
/// superseded, cancelled) since `from` ([`ended_mark`] when the latch started) and the store
/// has recorded it, or `limit` passed. The count is read in this process: a `/metrics`
/// scrape every 50 ms would cost latch CPU the run charges to it.
pub async fn drain(
    http: &reqwest::Client,
    base: &str,
    from: u64,
    expected: u64,
    limit: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if ended_mark().saturating_sub(from) >= expected || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The dispatcher counts an outcome when the attempt ends; the store records it a
    // moment later, off its loop. A run ends once every outcome is recorded, so its time
    // and CPU include the recording and `pending_left` counts what is really left.
    let pending = format!("{base}/v1/notifications?status=pending&limit=1");
    while Instant::now() < deadline {
        let v: serde_json::Value = http.get(&pending).send().await?.json().await?;
        if v["items"].as_array().is_none_or(|a| a.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// (failed, superseded, pending) notifications in the outbox.
pub async fn outbox_counts(base: &str, http: &reqwest::Client) -> anyhow::Result<(u64, u64, u64)> {
    let mut out = [0u64; 3];
    for (i, status) in ["failed", "superseded", "pending"].iter().enumerate() {
        let mut cursor: Option<String> = None;
        loop {
            let mut u = format!("{base}/v1/notifications?status={status}&limit=1000");
            if let Some(c) = &cursor {
                u.push_str(&format!("&cursor={c}"));
            }
            let v: serde_json::Value = http.get(&u).send().await?.json().await?;
            out[i] += v["items"].as_array().map_or(0, |a| a.len() as u64);
            match v["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => break,
            }
        }
    }
    Ok((out[0], out[1], out[2]))
}
