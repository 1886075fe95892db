//! `latch bench deliver`: state changes in, webhooks out.
//!
//! Every reading flips its sensor, and the sensors are many, so each change is delivered
//! rather than superseded. Latency is from `occurred_at` (the reading's receive time) to
//! the receiver. Baseline: a bare client in this process posting the same signed bodies to
//! the same receiver at latch's per-client concurrency, with no store — the ceiling of
//! latch's delivery on this machine. `--receiver` delivers to a receiver outside the
//! process (nginx, `scripts/bench-receiver`), and `--backlog` times the delivery of a
//! backlog alone, with its CPU a webhook; with `--auth` too, the backlog of a client with a
//! header and authentication (or a client certificate) is delivered after the plain one's,
//! each kind's in turn, in the same run. `--to
//! mqtt|amqp` delivers to a broker destination instead ([`super::deliver_broker`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use super::changes::Args;
use super::changes::{drain, ended_mark, outbox_counts, send_changes};
use super::{Keep, Receiver, Report, percentile};

pub async fn run(args: Args) -> anyhow::Result<Report> {
    match args.to.as_str() {
        "http" => {}
        "mqtt" | "amqp" => return super::deliver_broker::run(args).await,
        other => anyhow::bail!("--to takes http, mqtt or amqp, not {other:?}"),
    }
    let kinds = &args.auth;
    if !kinds.is_empty() {
        anyhow::ensure!(
            args.backlog && args.receiver.is_none(),
            "--auth measures backlogs: it needs --backlog and the in-process receivers"
        );
    }
    let (dir, _tmp) = super::data_dir(None)?;
    // In-process receivers, or the one outside named by `--receiver`.
    let mut receivers = Vec::new();
    // With `--auth`: the plain client's, then one for each kind, in order; an `mtls`
    // client's is an HTTPS receiver that demands its certificate.
    let mut certificates = Vec::new();
    let urls: Vec<String> = match &args.receiver {
        Some(url) => vec![url.clone()],
        None => {
            let wanted = if kinds.is_empty() {
                args.clients
            } else {
                1 + kinds.len()
            };
            for i in 0..wanted {
                // Client i is the plain one (i = 0) or kind i - 1's; without `--auth`, all plain.
                let r = if i > 0 && kinds.get(i - 1).is_some_and(|k| k == "mtls") {
                    let (r, tls) = super::mtls::receiver().await?;
                    certificates.push(tls);
                    r
                } else {
                    Receiver::start_keeping(Keep::Stats).await?
                };
                r.fail_per_10k((args.fail_ratio * 10_000.0) as u64);
                receivers.push(r);
            }
            receivers.iter().map(|r| r.url.clone()).collect()
        }
    };
    let mut clients: Vec<_> = urls.iter().map(|u| super::client(u)).collect();
    let mut certificates = certificates.into_iter();
    for (i, kind) in kinds.iter().enumerate() {
        let tls = if kind == "mtls" {
            certificates.next()
        } else {
            None
        };
        clients[i + 1].receiver = authenticated(kind, tls).await?;
    }
    if args.backlog {
        // Held back to one request a second while the changes come in.
        for c in &mut clients {
            c.rate_limit = Some(1);
        }
    }
    let ids = super::sensor_ids(args.sensors);
    let (mut config, pg) = super::store_config(&dir, args.database_url.as_deref()).await?;
    super::import(&config, &ids, &clients, None).await?;
    let concurrency = config.delivery_client_concurrency as usize;
    config.retry_base = Duration::from_millis(100);
    config.retry_max_delay = Duration::from_secs(2);
    let from = ended_mark();
    let server = super::start(config).await?;
    let http = reqwest::Client::new();
    let url = format!("{}/v1/readings", server.base);
    let metrics_url = format!("{}/metrics", server.base);

    // Every 250 ms: the dispatcher's backlog (notifications held in its lanes) and the
    // webhooks delivered so far, read in this process (`latch::delivery::progress`), not
    // by a `/metrics` scrape that would cost latch CPU the run charges to it.
    let base = latch::delivery::progress::delivered_total();
    let peak = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let (peak, count) = (peak.clone(), count.clone());
        let receivers = receivers.clone();
        tokio::spawn(async move {
            loop {
                let n = latch::delivery::progress::pending_now();
                peak.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
                count.store(
                    delivered(&receivers, base),
                    std::sync::atomic::Ordering::Relaxed,
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };
    let progress = super::progress("deliver", "webhooks delivered", move || {
        count.load(std::sync::atomic::Ordering::Relaxed)
    });
    let started = Instant::now();
    let send_secs = send_changes(&args, &http, &url, ids, started).await?;
    let pass = args.changes.saturating_sub(1) / args.sensors.max(1);
    let expected = (args.changes * clients.len()) as u64;
    // With `--backlog`, every notification is in the outbox now: once the readings have
    // been moved into the archive (every second), the clients are enabled and only their
    // delivery runs from here.
    if args.backlog {
        tokio::time::sleep(2 * latch::history::archiver::EVERY).await;
    }
    // The phase's bounds on stderr, for a profiler to start and stop on.
    if args.backlog {
        eprintln!("deliver: backlog phase begins");
    }
    // The backlog's clients let go, all at once, or with `--auth` one after the other:
    // each phase's seconds, CPU and webhooks.
    let groups: Vec<Vec<usize>> = if kinds.is_empty() {
        vec![(0..clients.len()).collect()]
    } else {
        (0..clients.len()).map(|i| vec![i]).collect()
    };
    let mut phases: Vec<Phase> = Vec::new();
    // PostgreSQL's cost of the backlog's delivery (every phase): before, and its backends'
    // CPU after.
    let pg_cost = match (&pg, args.backlog) {
        (Some(pg), true) => {
            let c = super::pg_cost::PgCost::connect(pg).await?;
            let before = c.sample().await?;
            Some((c, before))
        }
        _ => None,
    };
    if args.backlog {
        for group in &groups {
            let (started, cpu) = (Instant::now(), super::cpu_seconds());
            let before = delivered(&receivers, base);
            for &i in group {
                let c = &clients[i];
                // Absent receiver settings are kept: only the limit is lifted.
                let body = serde_json::json!({"name": c.name, "url": c.url, "rate_limit": null});
                let r = http
                    .put(format!("{}/v1/clients/{}", server.base, c.id))
                    .json(&body)
                    .send()
                    .await?;
                anyhow::ensure!(
                    r.status().is_success(),
                    "rate limit not lifted: {}",
                    r.status()
                );
            }
            if groups.len() > 1 {
                let of: Vec<Receiver> = group.iter().map(|&i| receivers[i].clone()).collect();
                let want = (args.changes * group.len()) as u64;
                let deadline = Instant::now() + args.drain;
                while of.iter().map(Receiver::ok).sum::<u64>() < want {
                    anyhow::ensure!(Instant::now() < deadline, "a backlog did not drain in time");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            } else {
                drain(&http, &server.base, from, expected, args.drain).await?;
            }
            phases.push(Phase {
                secs: started.elapsed().as_secs_f64(),
                cpu: super::cpu_seconds() - cpu,
                delivered: delivered(&receivers, base).saturating_sub(before),
            });
        }
    }
    drain(&http, &server.base, from, expected, args.drain).await?;
    if args.backlog {
        eprintln!("deliver: backlog phase ends");
    }
    let pg_cost = match pg_cost {
        Some((c, before)) => {
            let cpu_end = c.sample().await?;
            tokio::time::sleep(super::pg_cost::STATS_SETTLE).await;
            let rows_end = c.sample().await?;
            Some(super::pg_cost::Cost::between(&before, &cpu_end, &rows_end))
        }
        None => None,
    };
    let total_secs = started.elapsed().as_secs_f64();
    progress.abort();
    sampler.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let lanes = (args.sensors.min(args.changes) * clients.len()) as f64;
    // What bounds ingest of changes: each group commit's time and size.
    let text = http.get(&metrics_url).send().await?.text().await?;
    let commits = super::metric_sum(&text, "latch_commit_seconds_count");
    let commit_ms =
        1000.0 * super::metric_sum(&text, "latch_commit_seconds_sum") / commits.max(1.0);
    let delivered_n = delivered(&receivers, base);
    let requests: u64 = if receivers.is_empty() {
        super::metric_sum(&text, "latch_delivery_attempts_total") as u64
    } else {
        receivers.iter().map(Receiver::requests).sum()
    };
    let counts = outbox_counts(&server.base, &http).await?;
    server.stop().await?;
    if let Some(pg) = pg {
        pg.drop().await?;
    }

    let mut lat: Vec<f64> = receivers.iter().flat_map(Receiver::latencies).collect();
    lat.sort_by(f64::total_cmp);
    let duplicates: u64 = receivers.iter().map(Receiver::duplicates).sum();
    // The honest ceiling: a bare client in this process posting the same signed bodies to
    // the same receiver with latch's per-client concurrency, and no store. Connections
    // opened and the receiver warm before it is timed.
    for r in &receivers {
        r.fail_per_10k(0);
    }
    bare_client(&urls[0], concurrency, args.baseline_requests / 4).await?;
    eprintln!("deliver: bare client begins");
    let bare = bare_client(&urls[0], concurrency, args.baseline_requests).await?;
    eprintln!("deliver: bare client ends");
    let rate = match phases.first() {
        Some(p) => p.delivered as f64 / p.secs,
        None => delivered_n as f64 / total_secs,
    };

    let mut r = Report::new("deliver");
    r.add("changes_sent", args.changes as f64, "changes");
    r.add("notifications_expected", expected as f64, "notifications");
    r.add("delivered", delivered_n as f64, "notifications");
    r.add("failed", counts.0 as f64, "notifications");
    r.add("superseded", counts.1 as f64, "notifications");
    r.add("pending_left", counts.2 as f64, "notifications");
    r.add("webhook_requests", requests as f64, "requests");
    if !receivers.is_empty() {
        r.add("duplicate_deliveries", duplicates as f64, "notifications");
    }
    r.add("send_seconds", send_secs, "s");
    // Delivery cannot outrun this: the changes as fast as latch accepted them.
    r.add(
        "changes_accepted_per_s",
        (args.changes as f64 / send_secs).round(),
        "changes/s",
    );
    r.add("group_commits", commits, "commits");
    r.add("commit_mean_ms", (commit_ms * 10.0).round() / 10.0, "ms");
    if let Some(p) = phases.first() {
        r.add("backlog_seconds", p.secs, "s");
    }
    r.add("delivered_per_s", rate.round(), "webhooks/s");
    if let Some(p) = phases.first() {
        let us = p.cpu_us();
        r.add("cpu_us_per_webhook", us.round(), "µs");
        r.add("bare_cpu_us_per_request", bare.cpu_us.round(), "µs");
        r.add("cpu_ratio_to_bare", us / bare.cpu_us, "x");
        for (kind, a) in kinds.iter().zip(&phases[1..]) {
            r.add(format!("{kind}_backlog_seconds"), a.secs, "s");
            r.add(
                format!("{kind}_delivered_per_s"),
                (a.delivered as f64 / a.secs).round(),
                "webhooks/s",
            );
            r.add(
                format!("{kind}_cpu_us_per_webhook"),
                a.cpu_us().round(),
                "µs",
            );
            r.add(format!("{kind}_cpu_ratio_to_plain"), a.cpu_us() / us, "x");
            r.add(
                format!("{kind}_rate_ratio_to_plain"),
                (a.delivered as f64 / a.secs) / rate,
                "x",
            );
        }
    }
    if let Some(c) = &pg_cost {
        let webhooks = phases.iter().map(|p| p.delivered).sum::<u64>().max(1) as f64;
        let latch_us = 1e6 * phases.iter().map(|p| p.cpu).sum::<f64>() / webhooks;
        r.add(
            "pg_cpu_us_per_webhook",
            (1e6 * c.cpu / webhooks).round(),
            "µs",
        );
        r.add(
            "pg_cpu_ratio_to_latch",
            1e6 * c.cpu / webhooks / latch_us,
            "x",
        );
        let [ins, upd, del] = c.rows();
        let per = |n: i64| n as f64 / webhooks;
        r.add("pg_rows_written_per_webhook", per(ins + upd + del), "rows");
        r.add("pg_rows_inserted_per_webhook", per(ins), "rows");
        r.add("pg_rows_updated_per_webhook", per(upd), "rows");
        r.add("pg_rows_deleted_per_webhook", per(del), "rows");
        r.notes.push(format!(
            "PostgreSQL rows a webhook by table (inserted/updated/deleted): {}.",
            c.tables
                .iter()
                .map(|(t, [i, u, d])| format!("{t} {:.2}/{:.2}/{:.2}", per(*i), per(*u), per(*d)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        match &c.statements {
            Some(statements) => {
                let ms: f64 = statements.iter().map(|s| s.ms).sum();
                r.add(
                    "pg_statement_us_per_webhook",
                    (1e3 * ms / webhooks).round(),
                    "µs",
                );
                r.notes.push(format!(
                    "PostgreSQL statement time a webhook (pg_stat_statements, planning and execution), the largest: {}.",
                    statements
                        .iter()
                        .take(6)
                        .map(|s| format!(
                            "{:.1} µs in {} calls of `{}`",
                            1e3 * s.ms / webhooks,
                            s.calls,
                            s.text
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                ));
            }
            None => r.notes.push(
                "PostgreSQL statement time not read: the server does not load pg_stat_statements."
                    .into(),
            ),
        }
    }
    r.add("pending_peak", peak as f64, "notifications");
    r.add(
        "pending_peak_per_lane",
        (100.0 * peak as f64 / lanes).round() / 100.0,
        "notifications",
    );
    if !lat.is_empty() {
        r.add("latency_p50_ms", percentile(&lat, 50.0), "ms");
        r.add("latency_p99_ms", percentile(&lat, 99.0), "ms");
        r.add("latency_p999_ms", percentile(&lat, 99.9), "ms");
    }
    r.add(
        "bare_client_requests_per_s",
        bare.rate.round(),
        "requests/s",
    );
    r.add("ratio_to_bare", rate / bare.rate, "x");
    r.notes.push(format!(
        "Store: {}. {} sensors x {} clients, {} changes from {} senders, rate {}, fail ratio {}; \
         receiver: {}. {}Baseline: a bare client in this process (reqwest, no store) posting \
         the same signed bodies to the same receiver, {} at once (latch's per-client \
         concurrency); CPU is this process's (user + system), receiver included when it is \
         in process. Passes over the fleet: {}.",
        if args.database_url.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        },
        args.sensors,
        clients.len(),
        args.changes,
        args.senders.max(1),
        if args.rate == 0 {
            "max".to_string()
        } else {
            format!("{}/s", args.rate)
        },
        args.fail_ratio,
        match &args.receiver {
            Some(u) => format!("{u} (outside this process)"),
            None => "in process; latency from occurred_at (receive time of the reading) to the receiver".into(),
        },
        match (kinds.is_empty(), args.backlog) {
            (false, _) => format!(
                "Backlog: the changes ingested while every client was limited to a request a \
                 second, then the plain client's backlog delivered alone, then, one after the \
                 other, each of the clients with a header and authentication ({}) alone (rate \
                 and CPU of each phase; oauth2: a token from an endpoint in this process; mtls: \
                 a client certificate, to an HTTPS receiver in this process that demands it; \
                 none: plain, the control). ",
                kinds.join(", ")
            ),
            (true, true) => "Backlog: the changes ingested while the client was limited to a request a second, then the limit lifted and the backlog delivered alone (rate and CPU of that phase). ".to_string(),
            (true, false) => String::new(),
        } + if pg_cost.is_some() {
            "PostgreSQL's cost of the backlog's delivery: pg_cpu is the CPU time (user + system, from /proc) of latch's backends, told apart by their application_name; rows are those of the bench schema's tables in pg_stat_user_tables, read 11 s after the delivery ended, when every backend has reported them. "
        } else {
            ""
        },
        concurrency,
        pass + 1
    ));
    Ok(r)
}

/// Webhooks answered 2xx so far: counted by the in-process receivers or, with a receiver
/// outside, the notifications latch delivered since `base` (its count when the run began).
fn delivered(receivers: &[Receiver], base: u64) -> u64 {
    if !receivers.is_empty() {
        return receivers.iter().map(Receiver::ok).sum();
    }
    latch::delivery::progress::delivered_total() - base
}

/// One backlog's delivery: its seconds, this process's CPU seconds, and the webhooks.
struct Phase {
    secs: f64,
    cpu: f64,
    delivered: u64,
}

impl Phase {
    fn cpu_us(&self) -> f64 {
        1e6 * self.cpu / self.delivered.max(1) as f64
    }
}

/// The receiver settings of the authenticated client of `--auth KIND`: a header, and the
/// authentication (for `oauth2`, a token endpoint in this process, asked once an hour;
/// for `mtls`, the client certificate `tls`, in place of an authorization header).
async fn authenticated(
    kind: &str,
    tls: Option<latch::domain::receiver::Tls>,
) -> anyhow::Result<latch::domain::receiver::Receiver> {
    use latch::domain::receiver::{Auth, Receiver};
    let headers = vec![("X-Api-Key".into(), "bench-api-key".into())];
    let auth = match kind {
        "mtls" => {
            let tls = tls.ok_or_else(|| anyhow::anyhow!("no client certificate for mtls"))?;
            return Ok(Receiver {
                headers,
                auth: None,
                tls: Some(tls),
            });
        }
        // The control: a second plain client, measured second, shows what the order alone
        // costs.
        "none" => return Ok(Receiver::default()),
        "bearer" => Auth::Bearer {
            token: "bench-bearer-token".into(),
        },
        "basic" => Auth::Basic {
            username: "bench".into(),
            password: "bench-password".into(),
        },
        "oauth2" => {
            let token_url = latch_testkit::token_endpoint("bench-oauth-token").await?;
            Auth::OAuth2 {
                token_url,
                client_id: "bench".into(),
                client_secret: "bench-secret".into(),
                scope: None,
                audience: None,
            }
        }
        other => {
            anyhow::bail!("--auth takes bearer, basic, oauth2, mtls or none, not {other:?}")
        }
    };
    Ok(Receiver {
        headers,
        auth: Some(auth),
        tls: None,
    })
}

/// What the bare client achieved.
struct Bare {
    rate: f64,
    /// This process's CPU a request.
    cpu_us: f64,
}

/// Posts `total` signed notifications to `url` from `concurrency` tasks, as latch would
/// (its payload, its signature, its headers, a client built as latch builds its own) but
/// with nothing stored: the most latch's delivery could reach here.
async fn bare_client(url: &str, concurrency: usize, total: usize) -> anyhow::Result<Bare> {
    use latch::delivery::attempt::{payload, signatures};
    use latch::domain::notification::{Detail, Status, new_notification_id};
    use latch::domain::{EventKind, Notification, Sendable, time};

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(concurrency)
        .pool_idle_timeout(Duration::from_secs(90))
        .tcp_nodelay(true)
        .build()?;
    let client = super::client(url);
    let now = time::now_ms();
    let template = Arc::new(Sendable {
        notification: Notification {
            id: String::new(),
            seq: 0,
            client_id: client.id.clone(),
            sensor_id: latch::domain::SensorId::parse("b0000000").expect("an id"),
            kind: EventKind::StateChanged,
            data: Some(true),
            previous: Some(false),
            occurred_at: now,
            last_seen_at: None,
            detail: Detail::default(),
            status: Status::Pending,
            attempts: 0,
            next_attempt_at: None,
            created_at: now,
            updated_at: now,
            batch_id: None,
            body: None,
            alarm_id: None,
        },
        url: url.to_string(),
        secret: client.secret.clone(),
        previous_secret: None,
        address: "bench street 1".into(),
        labels: Default::default(),
        rate_limit: None,
        batch: None,
        receiver: Default::default(),
        unopened: None,
    });
    let (started, cpu) = (Instant::now(), super::cpu_seconds());
    let per = total.div_ceil(concurrency);
    super::workers(concurrency, |_| {
        let (http, template) = (http.clone(), template.clone());
        async move {
            for _ in 0..per {
                let mut s = (*template).clone();
                s.notification.id = new_notification_id();
                let body = payload(&s);
                let ts = time::now_ms() / 1000;
                let Ok(sig) = signatures(&s.secret, None, &s.notification.id, ts, &body) else {
                    continue;
                };
                let resp = http
                    .post(&s.url)
                    .timeout(Duration::from_secs(10))
                    .header("content-type", "application/json")
                    .header("user-agent", concat!("latch/", env!("CARGO_PKG_VERSION")))
                    .header("webhook-id", &s.notification.id)
                    .header("webhook-timestamp", ts.to_string())
                    .header("webhook-signature", sig)
                    .body(body)
                    .send()
                    .await;
                if let Ok(resp) = resp {
                    let _ = resp.bytes().await;
                }
            }
        }
    })
    .await;
    let n = (per * concurrency) as f64;
    Ok(Bare {
        rate: n / started.elapsed().as_secs_f64(),
        cpu_us: 1e6 * (super::cpu_seconds() - cpu) / n,
    })
}
