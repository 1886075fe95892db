//! `latch bench holds`: a fleet whose sensors all have a hold alarm, many doors left open at
//! once (issue #72): is every `sensor.state_held` made on time, and to whom.
//!
//! N sensors are imported with one hold alarm each (data 1 held `after_s`, no reminders)
//! and linked to one client that takes `sensor.state_held` only, so the fleet's first
//! readings make no webhooks. Each sensor then gets one reading over HTTP, in requests of
//! [`CHUNK`]: the first `open` with 1 (left open), the rest with 0. Every open sensor's
//! alarm falls due `after_s` after latch received its reading, all within the time the
//! open readings took to post. The figures: how late the last `state_held` is made (seen
//! in latch's metrics, polled) and answered by the receiver, measured from the latest due
//! time the bench can bound (the last open request's answer + `after_s`); each alarm's own
//! lag as the store recorded it (made − due); and that exactly the open sensors got one.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Keep, Receiver, Report, percentile, reached, rss_bytes, trim_heap};
use latch::domain::hold::{HoldAlarm, HoldAlarms};
use latch::domain::{Client, EventKind, Sensor, SensorId, time};

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Sensors in the fleet, each with the hold alarm.
    #[arg(long, default_value_t = 1_000_000)]
    pub sensors: usize,
    /// Sensors left open (the first ones): each makes one `sensor.state_held`.
    #[arg(long, default_value_t = 100_000)]
    pub open: usize,
    /// The alarm's `after_s`: how long a sensor holds 1 before its `state_held` (whole
    /// seconds).
    #[arg(long, default_value = "30s", value_parser = latch::config::parse_duration)]
    pub after: Duration,
}

/// Readings a request while feeding the fleet.
const CHUNK: usize = 10_000;

/// How often the bench reads latch's count of `state_held` made.
const POLL: Duration = Duration::from_millis(50);

/// The metric latch counts the door alarms it commits in, and this one's series.
const DOOR_ALARMS: &str = "latch_door_alarms_total";

/// `state_held` committed so far, from an exposition `text`.
fn held_made(text: &str) -> u64 {
    let kind = format!("type=\"{}\"", EventKind::StateHeld.as_str());
    text.lines()
        .filter(|l| l.starts_with(DOOR_ALARMS) && l[DOOR_ALARMS.len()..].starts_with('{'))
        .filter(|l| l.contains(&kind))
        .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// What the poller saw: when the first and the last `state_held` were counted (ms since
/// the epoch), and each scrape's time (ms).
#[derive(Default)]
struct Seen {
    first: Option<i64>,
    last: Option<i64>,
    scrapes_ms: Vec<f64>,
}

/// Reads the count of `state_held` made every [`POLL`] until it reaches `target` more than
/// `before`, or `patience` passes.
async fn watch(
    http: reqwest::Client,
    url: String,
    before: u64,
    target: u64,
    patience: Duration,
) -> anyhow::Result<Seen> {
    let give_up = Instant::now() + patience;
    let mut seen = Seen::default();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let t = Instant::now();
        let text = http.get(&url).send().await?.text().await?;
        let now = time::now_ms();
        seen.scrapes_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        let n = held_made(&text).saturating_sub(before);
        if n > 0 && seen.first.is_none() {
            seen.first = Some(now);
        }
        if n >= target {
            seen.last = Some(now);
            return Ok(seen);
        }
        anyhow::ensure!(
            Instant::now() < give_up,
            "only {n} of {target} sensor.state_held made"
        );
    }
}

/// Registers the sensors, each with `alarms` and linked to `client`, through the store's
/// bulk import.
async fn import(
    config: &latch::config::Config,
    ids: &[SensorId],
    client: &Client,
    alarms: HoldAlarms,
) -> anyhow::Result<()> {
    let store = latch::store::connect(config).await?;
    store.create_client(client.clone()).await?;
    for chunk in ids.chunks(20_000) {
        let sensors = chunk
            .iter()
            .map(|id| Sensor {
                id: *id,
                address: "bench street 1".into(),
                heartbeat_timeout_s: None,
                debounce_s: None,
                site_id: None,
                created_at: time::now_ms(),
                battery_low_pct: latch::domain::signals::DEFAULT_BATTERY_LOW_PCT,
                labels: Default::default(),
                hold_alarms: alarms,
                flap: None,
                armed: None,
            })
            .collect();
        let links = chunk.iter().map(|id| (client.id.clone(), *id)).collect();
        store.import(sensors, links, time::now_ms()).await?;
    }
    Ok(())
}

/// What the store recorded, read after latch stopped.
struct Stored {
    /// `state_held` notifications: (sensor index, due, made, delivered).
    held: Vec<(usize, i64, i64, bool)>,
    /// Notifications of any other type.
    others: u64,
    /// `state_held` events, and those of sensors that were not left open.
    events: u64,
    events_closed: u64,
}

fn stored(db: &std::path::Path, open: usize) -> anyhow::Result<Stored> {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let kind = EventKind::StateHeld.as_str();
    // Ids are `b` and the sensor's index.
    let index = |id: &str| id[1..].parse::<usize>().unwrap_or(usize::MAX);
    let held = c
        .prepare(
            "SELECT sensor_id, occurred_at, created_at, status FROM notifications WHERE kind = ?1",
        )?
        .query_map([kind], |r| {
            Ok((
                index(&r.get::<_, String>(0)?),
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)? == "delivered",
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let others: i64 = c.query_row(
        "SELECT COUNT(*) FROM notifications WHERE kind <> ?1",
        [kind],
        |r| r.get(0),
    )?;
    let mut events = 0;
    let mut events_closed = 0;
    for table in ["events", "events_journal"] {
        let ids = c
            .prepare(&format!("SELECT sensor_id FROM {table} WHERE kind = ?1"))?
            .query_map([kind], |r| r.get::<_, String>(0))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        events += ids.len() as u64;
        events_closed += ids.iter().filter(|id| index(id) >= open).count() as u64;
    }
    Ok(Stored {
        held,
        others: others as u64,
        events,
        events_closed,
    })
}

pub async fn run(args: Args) -> anyhow::Result<Report> {
    anyhow::ensure!(
        (1..=args.sensors).contains(&args.open),
        "--open must be from 1 to --sensors"
    );
    anyhow::ensure!(
        args.after.subsec_nanos() == 0 && args.after.as_secs() >= 1,
        "--after must be whole seconds, at least 1"
    );
    let after_s = u32::try_from(args.after.as_secs())?;
    let after_ms = i64::from(after_s) * 1000;
    let alarms = HoldAlarms::from_list(&[HoldAlarm {
        data: 1,
        after_s,
        remind_every_s: None,
    }])
    .map_err(anyhow::Error::msg)?;

    let (dir, _tmp) = super::data_dir(None)?;
    let receiver = Receiver::start_keeping(Keep::Stats).await?;
    // `state_held` only: the fleet's first readings (a million `state_changed`) make no
    // notification for it at all.
    let client = Client {
        events: Some(vec![EventKind::StateHeld.as_str().to_string()]),
        ..super::client(&receiver.url)
    };
    let ids = super::sensor_ids(args.sensors);
    let t = Instant::now();
    import(&super::config(&dir), &ids, &client, alarms).await?;
    let import_secs = t.elapsed().as_secs_f64();

    let mut config = super::config(&dir);
    // Nobody goes lost while the bench runs.
    config.heartbeat_timeout = Duration::from_secs(24 * 3600);
    let rss_empty = super::rss_of_an_empty_latch().await?;
    let t = Instant::now();
    let server = super::start(config).await?;
    let start_secs = t.elapsed().as_secs_f64();
    let http = reqwest::Client::new();
    let url = format!("{}/v1/readings", server.base);
    let metrics = format!("{}/metrics", server.base);
    let before = held_made(&http.get(&metrics).send().await?.text().await?);

    let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let t = Instant::now();
    // No open reading was received before this: no alarm is due before it + after_s.
    let first_sent = time::now_ms();
    let first_due_bound = first_sent + after_ms;
    let watching = tokio::spawn(watch(
        http.clone(),
        metrics.clone(),
        before,
        args.open as u64,
        args.after + Duration::from_secs(600 + args.sensors as u64 / 1_000),
    ));
    let base = server.base.clone();
    let at_first_due = tokio::spawn(async move {
        let wait = (first_due_bound - time::now_ms()).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let cpu = super::cpu_seconds();
        (cpu, super::Commits::read(&base).await)
    });
    // The last request with an open reading: when it was sent and answered.
    let mut last_open = None;
    for (c, chunk) in names.chunks(CHUNK).enumerate() {
        let items: Vec<_> = chunk
            .iter()
            .enumerate()
            .map(|(j, id)| json!({"sensor_id": id, "data": u8::from(c * CHUNK + j < args.open)}))
            .collect();
        let sent = time::now_ms();
        super::post_readings(&http, &url, &items).await?;
        if last_open.is_none() && (c + 1) * CHUNK >= args.open {
            last_open = Some((sent, time::now_ms()));
        }
    }
    drop(names);
    let feed_secs = t.elapsed().as_secs_f64();
    let fed_before_first_due = time::now_ms() < first_due_bound;
    let (last_open_sent, last_open_ack) = last_open.expect("at least one sensor is open");
    // Every open reading was received by then: every alarm is due by this.
    let last_due_bound = last_open_ack + after_ms;
    tokio::time::sleep(Duration::from_millis(500)).await;
    trim_heap();
    let rss_full = rss_bytes();
    let per_sensor = (rss_full.saturating_sub(rss_empty)) as f64 / args.sensors as f64;

    let seen = watching.await??;
    let cpu_at_last_made = super::cpu_seconds();
    let answered_at_last_made = receiver.events_of(EventKind::StateHeld.as_str());
    let commits_at_last_made = super::Commits::read(&server.base).await?;
    let (cpu_at_first_due, commits_at_first_due) = at_first_due.await?;
    let commits_at_first_due = commits_at_first_due?;
    let last_made = seen.last.expect("the watch ends with all made");
    let first_made = seen.first.unwrap_or(last_made);
    let all_answered = reached(
        || receiver.events_of(EventKind::StateHeld.as_str()),
        args.open as u64,
        Duration::from_secs(600 + args.open as u64 / 1_000),
        "sensor.state_held webhooks answered",
    )
    .await?;
    // A moment more: anything made beyond the open sensors' would show now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let made_total =
        held_made(&http.get(&metrics).send().await?.text().await?).saturating_sub(before);
    let fleet: serde_json::Value = http
        .get(format!("{}/v1/fleet", server.base))
        .send()
        .await?
        .json()
        .await?;
    let webhooks = receiver.events_of(EventKind::StateHeld.as_str());
    server.stop().await?;

    let st = stored(&dir.join("latch.db"), args.open)?;
    let sensors_held: HashSet<usize> = st.held.iter().map(|h| h.0).collect();
    let open_with = sensors_held.iter().filter(|&&i| i < args.open).count();
    let closed_with = sensors_held.len() - open_with;
    let mut lags: Vec<f64> = st.held.iter().map(|h| (h.2 - h.1) as f64).collect();
    lags.sort_by(f64::total_cmp);
    let due_min = st.held.iter().map(|h| h.1).min().unwrap_or(0);
    let due_max = st.held.iter().map(|h| h.1).max().unwrap_or(0);
    let made_min = st.held.iter().map(|h| h.2).min().unwrap_or(0);
    let made_max = st.held.iter().map(|h| h.2).max().unwrap_or(0);
    let mut scrapes = seen.scrapes_ms.clone();
    scrapes.sort_by(f64::total_cmp);
    let s = |ms: i64| ms as f64 / 1000.0;

    let mut r = Report::new("holds");
    r.add("sensors", args.sensors as f64, "sensors");
    r.add("open", args.open as f64, "sensors");
    r.add("after_s", f64::from(after_s), "s");
    r.add("import_seconds", import_secs, "s");
    r.add("start_seconds", start_secs, "s");
    r.add("feed_seconds", feed_secs, "s");
    r.add(
        "feed_readings_per_s",
        (args.sensors as f64 / feed_secs).round(),
        "readings/s",
    );
    r.add("open_feed_seconds", s(last_open_ack - first_sent), "s");
    r.add(
        "last_open_request_ms",
        (last_open_ack - last_open_sent) as f64,
        "ms",
    );
    r.add("rss_empty_mib", rss_empty as f64 / 1048576.0, "MiB");
    r.add("rss_tracking_mib", rss_full as f64 / 1048576.0, "MiB");
    r.add("bytes_per_sensor", per_sensor.round(), "bytes");
    r.add(
        "last_made_after_last_due_bound_s",
        s(last_made - last_due_bound),
        "s",
    );
    r.add(
        "last_answered_after_last_due_bound_s",
        s(all_answered - last_due_bound),
        "s",
    );
    r.add("made_spread_seen_s", s(last_made - first_made), "s");
    r.add("due_spread_stored_s", s(due_max - due_min), "s");
    r.add("made_spread_stored_s", s(made_max - made_min), "s");
    r.add(
        "last_made_after_last_due_stored_s",
        s(made_max - due_max),
        "s",
    );
    r.add("lag_p50_ms", percentile(&lags, 50.0), "ms");
    r.add("lag_p99_ms", percentile(&lags, 99.0), "ms");
    r.add("lag_max_ms", lags.last().copied().unwrap_or(f64::NAN), "ms");
    r.add(
        "cpu_seconds_first_due_to_last_made",
        cpu_at_last_made - cpu_at_first_due,
        "s",
    );
    let window_s = s(last_made - first_due_bound).max(1e-3);
    r.add(
        "commits_first_due_to_last_made",
        commits_at_last_made.count - commits_at_first_due.count,
        "commits",
    );
    r.add(
        "commit_busy_share_first_due_to_last_made",
        (commits_at_last_made.seconds - commits_at_first_due.seconds) / window_s,
        "x",
    );
    r.add(
        "webhooks_answered_at_last_made",
        answered_at_last_made as f64,
        "webhooks",
    );
    r.add("metrics_scrape_p50_ms", percentile(&scrapes, 50.0), "ms");
    r.add(
        "metrics_scrape_max_ms",
        scrapes.last().copied().unwrap_or(f64::NAN),
        "ms",
    );
    r.add("state_held_made", made_total as f64, "events");
    r.add("state_held_webhooks", webhooks as f64, "webhooks");
    r.add(
        "duplicate_webhooks",
        receiver.duplicates() as f64,
        "requests",
    );
    r.add(
        "fleet_held",
        fleet["held"].as_f64().unwrap_or(f64::NAN),
        "sensors",
    );
    r.add("state_held_events_stored", st.events as f64, "events");
    r.add(
        "state_held_notifications",
        st.held.len() as f64,
        "notifications",
    );
    r.add(
        "state_held_delivered",
        st.held.iter().filter(|h| h.3).count() as f64,
        "notifications",
    );
    r.add("open_sensors_with_state_held", open_with as f64, "sensors");
    r.add(
        "closed_sensors_with_state_held",
        (closed_with as u64).max(st.events_closed) as f64,
        "sensors",
    );
    r.add("other_notifications", st.others as f64, "notifications");
    let expected = args.open as u64;
    let checks = [
        (made_total == expected, "state_held_made"),
        (webhooks == expected, "state_held_webhooks"),
        (receiver.duplicates() == 0, "duplicate_webhooks"),
        (fleet["held"] == expected, "fleet_held"),
        (st.held.len() as u64 == expected, "state_held_notifications"),
        (st.held.iter().all(|h| h.3), "state_held_delivered"),
        (open_with == args.open, "open_sensors_with_state_held"),
        (
            closed_with == 0 && st.events_closed == 0,
            "closed_sensors_with_state_held",
        ),
        (st.others == 0, "other_notifications"),
    ];
    let failed: Vec<&str> = checks.iter().filter(|c| !c.0).map(|c| c.1).collect();
    r.add("checks_failed", failed.len() as f64, "checks");
    r.notes.push(format!(
        "{} sensors, each with one hold alarm (data 1 held {after_s} s, no reminders) and \
         linked to one client that takes sensor.state_held only; heartbeat timeout 24 h; \
         SQLite synchronous as latch's default. Each sensor gets one reading over HTTP, in \
         requests of {CHUNK} one at a time: the first {} with 1 (left open), the rest with \
         0. An open sensor's alarm falls due after_s after latch received its reading, so \
         every one is due between the first request's send + after_s and the answer to the \
         last request with an open reading (open_feed_seconds after that send) + after_s: \
         the last due bound. bytes_per_sensor = (RSS after the feed − RSS of an empty latch) \
         / sensors, in one process after malloc_trim, SQLite's page cache included. \
         last_made_after_last_due_bound_s: from the last due bound to when the bench first \
         saw latch's count of state_held committed ({DOOR_ALARMS}{{type=\"sensor.state_held\"}} \
         from /metrics, read every {} ms) reach the open sensors: the last alarm's true lag \
         lies between this and this + last_open_request_ms (that request's time in flight). \
         last_answered_after_last_due_bound_s: from the same bound to the receiver's answer \
         to the last state_held webhook (one client, in this process). made_spread_seen_s: \
         from the first state_held counted to the last. The *_stored figures and lag_* are \
         read from the store after latch stopped: each notification's due time (occurred_at) \
         and the start of the commit that made it (created_at); lag = made − due for each \
         alarm, and due_spread_stored_s says over how long the alarms fell due. \
         cpu_seconds_first_due_to_last_made: this process's CPU time (latch, the receiver, \
         the bench's polling) from the first due bound to the last state_held counted{}; \
         commits_* over the same span, from latch's metrics: its group commits, and the \
         seconds spent in them over the span's seconds (near 1: the writer committed back to \
         back; claims and recorded deliveries use the same writer and are not counted). \
         webhooks_answered_at_last_made: state_held webhooks the receiver had answered when \
         the last was counted made. \
         metrics_scrape_*: each /metrics read's time (what the polling costs latch). \
         Checks: every open sensor got exactly one state_held notification, delivered, and \
         the receiver answered one webhook each; no sensor left closed got a state_held \
         notification or event; no other notification was made; GET /v1/fleet counts the \
         open sensors as held. checks_failed counts those that did not hold{}.",
        args.sensors,
        args.open,
        POLL.as_millis(),
        if fed_before_first_due {
            ""
        } else {
            " (the feed ran past the first due bound: its CPU is counted too)"
        },
        if failed.is_empty() {
            String::new()
        } else {
            format!(" (failed: {})", failed.join(", "))
        },
    ));
    Ok(r)
}
