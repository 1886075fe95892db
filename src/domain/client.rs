//! Clients: who gets notified, where (see [`super::destination`]), and with which signing
//! secret.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;

use super::notification::{CLIENT_TEST, EventKind};
use super::time::Millis;

/// Prefix of Standard Webhooks secrets.
pub const SECRET_PREFIX: &str = "whsec_";

/// Longest client name, in characters (as JSON Schema's `maxLength` counts).
pub const NAME_MAX_CHARS: usize = 256;
pub use super::destination::URL_MAX_CHARS;

/// A registered client. `Debug` shows neither secret nor a broker URL's password.
#[derive(Clone, PartialEq, Default)]
pub struct Client {
    /// Generated ULID: sortable by creation time, safe in URLs.
    pub id: String,
    pub name: String,
    pub url: String,
    /// `whsec_<base64 key>`, the key being what HMAC-SHA256 signs with.
    pub secret: String,
    pub created_at: Millis,
    /// The secret a rotation replaced: requests are signed with it too until
    /// `previous_secret_until`, so receivers can switch keys without dropping any.
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<Millis>,
    /// Set when latch stopped sending to the client ([`DisabledReason`]); its pending
    /// notifications wait until it is enabled again.
    pub disabled_at: Option<Millis>,
    pub disabled_reason: Option<DisabledReason>,
    /// Requests per second latch sends it at most; `None`: only the concurrency limits.
    pub rate_limit: Option<u32>,
    /// The notification types it wants; `None`: all, including kinds added later.
    /// Notifications of other types are never made for it.
    pub events: Option<Vec<String>>,
    /// Several notifications in one request ([`Batch`]); `None`: one request each.
    pub batch: Option<Batch>,
    /// Headers, authentication and a client certificate for its requests.
    pub receiver: super::receiver::Receiver,
    /// Who is next when it leaves an alarm untaken; `None`: nobody.
    pub escalation: Option<super::escalation::Escalation>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("url", &super::destination::redact(&self.url))
            .field("secret", &"[redacted]")
            .field("previous_secret_until", &self.previous_secret_until)
            .field("disabled_at", &self.disabled_at)
            .field("rate_limit", &self.rate_limit)
            .field("events", &self.events)
            .field("batch", &self.batch)
            .field("receiver", &self.receiver)
            .finish_non_exhaustive()
    }
}

/// A client's batching: its notifications go out several to a request, `{"id", "type":
/// "batch", "events": [...]}`, each event exactly the notification it would have been sent
/// alone. A batch holds at most one notification of each (client, sensor) lane, so per
/// sensor order holds within and across batches; one batch is in flight per client (per
/// node, in a cluster).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// At most this many notifications in one request.
    pub max_events: u32,
    /// How long the first notification of a batch waits for others to join it; a batch
    /// that fills goes at once.
    pub max_wait_ms: u32,
}

/// Most notifications in one batch.
pub const BATCH_MAX_EVENTS: u32 = 1000;
/// Longest a batch waits to fill, in milliseconds.
pub const BATCH_MAX_WAIT_MS: u32 = 10_000;

/// Checks a client's batching: its bounds.
pub fn validate_batch(batch: Option<Batch>) -> Result<(), String> {
    let Some(b) = batch else {
        return Ok(());
    };
    if !(1..=BATCH_MAX_EVENTS).contains(&b.max_events) {
        return Err(format!(
            "batch.max_events must be 1 to {BATCH_MAX_EVENTS}, got {}",
            b.max_events
        ));
    }
    if b.max_wait_ms > BATCH_MAX_WAIT_MS {
        return Err(format!(
            "batch.max_wait_ms must be 0 to {BATCH_MAX_WAIT_MS}, got {}",
            b.max_wait_ms
        ));
    }
    Ok(())
}

/// The batching a client's notifications go out with: its `batch` for a webhook; none for
/// a broker destination, whose topic or routing key names one sensor (a batch has none),
/// and which gets one message a notification whatever `batch` says.
pub fn effective_batch(batch: Option<Batch>, url: &str) -> Option<Batch> {
    batch.filter(|_| !super::destination::is_broker(url))
}

/// Checks a client's `events`: each a notification type, none twice (`client.test` is
/// allowed, and sent on request whatever the list says).
pub fn validate_events(events: &[String]) -> Result<(), String> {
    for (i, e) in events.iter().enumerate() {
        if EventKind::parse(e).is_none() && e != CLIENT_TEST {
            let known: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
            return Err(format!(
                "events[{i}]: {e:?} is not a notification type; use {}, or {CLIENT_TEST}",
                known.join(", ")
            ));
        }
        if events[..i].contains(e) {
            return Err(format!("events[{i}]: {e:?} is listed twice"));
        }
    }
    Ok(())
}

/// `events` as a store column: the types joined by commas (no type holds one); `None`
/// (all) stays NULL, and an empty list is the empty string.
pub fn events_column(events: &Option<Vec<String>>) -> Option<String> {
    events.as_ref().map(|e| e.join(","))
}

/// [`events_column`] read back.
pub fn events_from_column(column: Option<String>) -> Option<Vec<String>> {
    column.map(|c| {
        c.split(',')
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect()
    })
}

/// Whether a client with these `events` wants notifications of `kind`.
pub fn wants(events: &Option<Vec<String>>, kind: EventKind) -> bool {
    events
        .as_ref()
        .is_none_or(|e| e.iter().any(|t| t == kind.as_str()))
}

/// Why a client was disabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DisabledReason {
    /// It answered `410 Gone`: the receiver asked never to be tried again.
    Gone,
    /// Every attempt failed for `endpoint_disable_after`.
    Failing,
}

impl DisabledReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DisabledReason::Gone => "gone",
            DisabledReason::Failing => "failing",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gone" => Some(DisabledReason::Gone),
            "failing" => Some(DisabledReason::Failing),
            _ => None,
        }
    }
}

/// A client disabled by recording attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disabled {
    pub client_id: String,
    pub reason: DisabledReason,
}

/// How a client's endpoint has been answering, from its attempts and notifications.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Health {
    pub last_success_at: Option<Millis>,
    pub last_failure_at: Option<Millis>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// Failed attempts since the last delivered one.
    pub consecutive_failures: u64,
    /// Over the last hour: delivered attempts / attempts; `None` without attempts.
    pub success_ratio_1h: Option<f64>,
    pub latency_p50_ms_1h: Option<u32>,
    pub latency_p99_ms_1h: Option<u32>,
    /// Its notifications pending and failed (dead letters).
    pub pending: u64,
    pub failed: u64,
    /// The last hour in [`HEALTH_SERIES_BUCKETS`] slices, oldest first: for a chart of
    /// how its endpoint has been answering lately.
    pub series_1h: Vec<HealthSlice>,
}

/// One slice of [`Health::series_1h`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HealthSlice {
    /// Start of the slice.
    pub at: Millis,
    pub attempts: u64,
    pub failed: u64,
    /// Median attempt duration; `None` without attempts.
    pub latency_p50_ms: Option<u32>,
}

/// The window of the ratio and latency figures of [`Health`].
pub const HEALTH_WINDOW_MS: Millis = 3_600_000;
/// Slices of [`Health::series_1h`]: five minutes each.
pub const HEALTH_SERIES_BUCKETS: usize = 12;

impl Health {
    /// Fills the last hour's figures from its attempts up to `now`, each
    /// `(at, delivered, duration_ms)`.
    pub fn set_window(&mut self, attempts: &[(Millis, bool, u32)], now: Millis) {
        let slice = HEALTH_WINDOW_MS / HEALTH_SERIES_BUCKETS as Millis;
        let start = now - HEALTH_WINDOW_MS;
        let mut durations: Vec<Vec<u32>> = vec![Vec::new(); HEALTH_SERIES_BUCKETS];
        self.series_1h = (0..HEALTH_SERIES_BUCKETS)
            .map(|i| HealthSlice {
                at: start + i as Millis * slice,
                ..HealthSlice::default()
            })
            .collect();
        for (at, ok, d) in attempts {
            let i = ((at - start).max(0) / slice).min(HEALTH_SERIES_BUCKETS as Millis - 1);
            let b = &mut self.series_1h[i as usize];
            b.attempts += 1;
            b.failed += u64::from(!ok);
            durations[i as usize].push(*d);
        }
        for (b, mut ms) in self.series_1h.iter_mut().zip(durations) {
            ms.sort_unstable();
            b.latency_p50_ms = (!ms.is_empty()).then(|| percentile(&ms, 50));
        }
        if attempts.is_empty() {
            return;
        }
        let ok = attempts.iter().filter(|(_, ok, _)| *ok).count();
        self.success_ratio_1h = Some(ok as f64 / attempts.len() as f64);
        let mut ms: Vec<u32> = attempts.iter().map(|(_, _, d)| *d).collect();
        ms.sort_unstable();
        self.latency_p50_ms_1h = Some(percentile(&ms, 50));
        self.latency_p99_ms_1h = Some(percentile(&ms, 99));
    }
}

/// The nearest-rank percentile `p` of sorted, non-empty `values`.
fn percentile(values: &[u32], p: usize) -> u32 {
    let rank = (p * values.len()).div_ceil(100).max(1);
    values[rank.min(values.len()) - 1]
}

/// Highest `rate_limit`, requests per second.
pub const RATE_LIMIT_MAX: u32 = 10_000;

/// Checks a client's rate limit.
pub fn validate_rate_limit(rate: Option<u32>) -> Result<(), String> {
    match rate {
        Some(r) if !(1..=RATE_LIMIT_MAX).contains(&r) => Err(format!(
            "rate_limit must be 1 to {RATE_LIMIT_MAX} requests per second, got {r}"
        )),
        _ => Ok(()),
    }
}

/// A new client id.
pub fn new_client_id() -> String {
    ulid::Ulid::new().to_string()
}

/// A fresh secret with a 24-byte random key, as Standard Webhooks suggests.
pub fn generate_secret() -> String {
    let mut key = [0u8; 24];
    rand::thread_rng().fill_bytes(&mut key);
    format!("{SECRET_PREFIX}{}", STANDARD.encode(key))
}

/// The HMAC key inside a `whsec_` secret.
pub fn secret_key(secret: &str) -> Result<Vec<u8>, String> {
    let b64 = secret
        .strip_prefix(SECRET_PREFIX)
        .ok_or_else(|| format!("secret must start with {SECRET_PREFIX:?}"))?;
    let key = STANDARD
        .decode(b64)
        .map_err(|_| "secret must be \"whsec_\" followed by base64".to_string())?;
    if !(16..=64).contains(&key.len()) {
        return Err(format!(
            "secret key must be 16 to 64 bytes long, got {}",
            key.len()
        ));
    }
    Ok(key)
}

/// Checks a client's display name.
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("name must not be empty".into());
    }
    if name.chars().count() > NAME_MAX_CHARS {
        return Err(format!("name must be at most {NAME_MAX_CHARS} characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_secrets_decode() {
        let s = generate_secret();
        assert!(s.starts_with("whsec_"));
        assert_eq!(secret_key(&s).unwrap().len(), 24);
        assert_ne!(generate_secret(), s);
    }

    #[test]
    fn bad_secrets_are_explained() {
        assert!(secret_key("abc").unwrap_err().contains("whsec_"));
        assert!(secret_key("whsec_!!!").unwrap_err().contains("base64"));
        assert!(secret_key("whsec_AAAA").unwrap_err().contains("16 to 64"));
    }

    #[test]
    fn health_window_figures() {
        let now = 10 * HEALTH_WINDOW_MS;
        let mut h = Health::default();
        h.set_window(&[], now);
        assert_eq!(h.success_ratio_1h, None);
        assert_eq!(h.series_1h.len(), HEALTH_SERIES_BUCKETS);
        assert!(
            h.series_1h
                .iter()
                .all(|b| b.attempts == 0 && b.latency_p50_ms.is_none())
        );
        // 100 attempts spread over the hour, a quarter failed.
        let attempts: Vec<(Millis, bool, u32)> = (1..=100)
            .map(|d| (now - HEALTH_WINDOW_MS + d as Millis * 35_000, d % 4 != 0, d))
            .collect();
        h.set_window(&attempts, now);
        assert_eq!(h.success_ratio_1h, Some(0.75));
        assert_eq!(h.latency_p50_ms_1h, Some(50));
        assert_eq!(h.latency_p99_ms_1h, Some(99));
        let s = &h.series_1h;
        assert_eq!(s[0].at, now - HEALTH_WINDOW_MS);
        assert_eq!(s.iter().map(|b| b.attempts).sum::<u64>(), 100);
        assert_eq!(s.iter().map(|b| b.failed).sum::<u64>(), 25);
        // The first slice (5 min) holds attempts 1 to 8 (35 s apart).
        assert_eq!((s[0].attempts, s[0].latency_p50_ms), (8, Some(4)));
        h.set_window(&[(now - 1, true, 7)], now);
        assert_eq!(
            (h.latency_p50_ms_1h, h.latency_p99_ms_1h),
            (Some(7), Some(7))
        );
        assert_eq!(h.series_1h[HEALTH_SERIES_BUCKETS - 1].attempts, 1);
    }

    #[test]
    fn batches_are_bounded_and_only_for_webhooks() {
        let b = |max_events, max_wait_ms| {
            Some(Batch {
                max_events,
                max_wait_ms,
            })
        };
        assert!(validate_batch(None).is_ok());
        assert!(validate_batch(b(1, 0)).is_ok());
        assert!(validate_batch(b(1000, 10_000)).is_ok());
        assert!(validate_batch(b(0, 0)).unwrap_err().contains("max_events"));
        assert!(
            validate_batch(b(1001, 0))
                .unwrap_err()
                .contains("1 to 1000")
        );
        assert!(
            validate_batch(b(10, 10_001))
                .unwrap_err()
                .contains("max_wait_ms")
        );
        assert_eq!(
            effective_batch(b(10, 0), "https://example.com/hook"),
            b(10, 0)
        );
        assert_eq!(
            effective_batch(b(10, 0), "mqtt://broker/doors/{sensor_id}"),
            None
        );
    }

    #[test]
    fn rate_limits() {
        assert!(validate_rate_limit(None).is_ok());
        assert!(validate_rate_limit(Some(1)).is_ok());
        assert!(validate_rate_limit(Some(0)).is_err());
        assert!(validate_rate_limit(Some(RATE_LIMIT_MAX + 1)).is_err());
    }

    #[test]
    fn events_are_known_types_once_and_round_trip_as_a_column() {
        let list = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(validate_events(&list(&["sensor.connection_lost", "client.test"])).is_ok());
        assert!(validate_events(&[]).is_ok());
        let e = validate_events(&list(&["sensor.lost"])).unwrap_err();
        assert!(
            e.contains("events[0]") && e.contains("sensor.still_lost"),
            "{e}"
        );
        assert!(
            validate_events(&list(&["sensor.state_changed", "sensor.state_changed"]))
                .unwrap_err()
                .contains("twice")
        );
        for events in [None, Some(vec![]), Some(list(&["sensor.state_changed"]))] {
            assert_eq!(events_from_column(events_column(&events)), events);
        }
        assert!(wants(&None, EventKind::StillLost));
        assert!(!wants(&Some(vec![]), EventKind::StateChanged));
        assert!(wants(
            &Some(list(&["sensor.connection_lost"])),
            EventKind::ConnectionLost
        ));
        assert!(!wants(
            &Some(list(&["sensor.connection_lost"])),
            EventKind::StillLost
        ));
    }
}
