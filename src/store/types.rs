//! The values the store traits take and give: pages, time ranges, history rows, filters.

use async_trait::async_trait;

use super::{Error, ReadingRecord, Result};
use crate::domain::sensor::SensorState;
use crate::domain::{
    Attempt, Event, EventKind, Millis, Notification, NotificationRef, SensorId, Status,
};
use crate::domain::{Sensor, SensorStatus, policy};

/// A page request: at most `limit` items after the (decoded) cursor `after`.
#[derive(Debug, Clone, Default)]
pub struct PageRequest {
    pub limit: u32,
    pub after: Option<String>,
}

/// A schedule as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchedule {
    pub schedule: crate::domain::schedule::Schedule,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl StoredSchedule {
    /// The stored body: the schedule as the API writes it.
    pub fn body(&self) -> String {
        serde_json::to_string(&self.schedule).expect("a schedule serializes")
    }

    /// Read back from its columns; a body that no longer reads is a backend error.
    pub fn of(body: &str, created_at: Millis, updated_at: Millis) -> Result<Self> {
        let v: serde_json::Value = serde_json::from_str(body)
            .map_err(|e| Error::Backend(format!("a stored schedule: {e}")))?;
        let schedule = crate::domain::schedule::Schedule::parse(v)
            .map_err(|e| Error::Backend(format!("a stored schedule: {e}")))?;
        Ok(Self {
            schedule,
            created_at,
            updated_at,
        })
    }
}

/// Which alarms `GET /v1/alarms` lists (every field that is set must match).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlarmFilter {
    pub state: Option<crate::domain::alarm::AlarmState>,
    pub kind: Option<crate::domain::alarm::AlarmKind>,
    pub sensor_id: Option<SensorId>,
    pub site_id: Option<String>,
}

/// A page of results; `next` is the raw cursor of the next page, if there is one.
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

impl<T> Page<T> {
    /// Builds a page from up to `limit + 1` fetched rows: the extra row only proves there
    /// is a next page, whose cursor is the key of the last row kept.
    pub fn from_rows(mut rows: Vec<T>, limit: u32, key: impl Fn(&T) -> String) -> Self {
        let limit = limit as usize;
        let next = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(key)
        } else {
            None
        };
        Page { items: rows, next }
    }
}

/// A half-open time range `[from, to)`; either end may be open.
#[derive(Debug, Clone, Copy, Default)]
pub struct TimeRange {
    pub from: Option<Millis>,
    pub to: Option<Millis>,
}

/// A history row with the id the store gave it. Ids are never reused, so a row keeps its
/// identity when it ships to ClickHouse: the id orders ties and removes duplicates.
#[derive(Debug, Clone, PartialEq)]
pub struct Stored<T> {
    pub id: i64,
    pub row: T,
}

/// A webhook attempt as history keeps it: with what it was about, so it can be queried by
/// sensor or client without the outbox.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub id: i64,
    pub client_id: String,
    pub sensor_id: String,
    /// The event kind the notification carried.
    pub kind: String,
    pub attempt: Attempt,
}

/// History rows taken from the spool for one shipment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryBatch {
    pub readings: Vec<Stored<ReadingRecord>>,
    pub events: Vec<Stored<Event>>,
    pub attempts: Vec<AttemptRecord>,
    /// Audit records: kept in the store too (`GET /v1/audit` reads them there), marked
    /// shipped as attempts are.
    pub audit: Vec<crate::domain::audit::Entry>,
}

impl HistoryBatch {
    pub fn len(&self) -> usize {
        self.readings.len() + self.events.len() + self.attempts.len() + self.audit.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where shipped history goes (ClickHouse). The store calls it between taking rows from the
/// spool and letting go of them, so a row leaves the spool only once the sink has it.
#[async_trait]
pub trait HistorySink: Send + Sync {
    /// Keeps the batch durably, or fails and leaves it to be shipped again.
    async fn insert(&self, batch: &HistoryBatch) -> std::result::Result<(), String>;
}

/// What the engine needs of a sensor at start: its id and its state (the one type for a
/// sensor's state in memory, [`SensorState`]).
pub type SensorRuntime = (SensorId, SensorState);

/// Filters of the notification list, and its order.
#[derive(Debug, Clone, Default)]
pub struct NotificationFilter {
    pub client_id: Option<String>,
    pub sensor_id: Option<SensorId>,
    pub status: Option<Status>,
    /// Only notifications of this type.
    pub kind: Option<EventKind>,
    /// Only a site's notifications, of this site (`notifications.site_id`).
    pub site_id: Option<String>,
    /// Only those created within this range.
    pub created: TimeRange,
    /// Newest first (by outbox order, descending); the cursor then pages towards older.
    pub newest_first: bool,
}

/// Which failed notifications a bulk replay sends again.
#[derive(Debug, Clone)]
pub struct ReplayFilter {
    pub client_id: String,
    pub sensor_id: Option<SensorId>,
    /// Only those created at or after this time.
    pub since: Option<Millis>,
}

/// Sensor with its current status, as the API shows it.
pub type SensorView = (Sensor, SensorStatus);

/// Which sensors a list keeps: by connection, and by what they last reported of their
/// battery (strictly below) and tamper flag (a sensor that never reported one is not
/// tampered).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SensorFilter {
    pub connection: Option<crate::domain::Connection>,
    pub battery_below: Option<u8>,
    pub tamper: Option<bool>,
    /// Whether a `sensor.state_held` of its state is open.
    pub held: Option<bool>,
    /// Whether it flaps now.
    pub flapping: Option<bool>,
    /// Whether a `sensor.battery_low` is open.
    pub battery_low: Option<bool>,
}

/// The filters of a [`SensorFilter`] beyond its connection, as SQL over `st` (the sensor's
/// state row), the same on both stores: its five parameters, from `first` on, are
/// `battery_below`, `tamper`, `held`, `flapping`, `battery_low`, each written by
/// `param(index, type)` (`?5`; `$5::int4`).
pub(crate) fn filter_sql(first: usize, param: impl Fn(usize, &str) -> String) -> String {
    let (b, t, h, f, l) = (
        param(first, "int4"),
        param(first + 1, "bool"),
        param(first + 2, "bool"),
        param(first + 3, "bool"),
        param(first + 4, "bool"),
    );
    format!(
        " AND ({b} IS NULL OR st.battery < {b}) \
         AND ({t} IS NULL OR COALESCE(st.tamper, false) = {t}) \
         AND ({h} IS NULL OR (COALESCE(st.held_sent, 0) > 0) = {h}) \
         AND ({f} IS NULL OR COALESCE(st.flapping, false) = {f}) \
         AND ({l} IS NULL OR COALESCE(st.battery_low, false) = {l})"
    )
}

impl SensorFilter {
    /// Only by connection.
    pub fn connection(connection: Option<crate::domain::Connection>) -> Self {
        Self {
            connection,
            ..Self::default()
        }
    }

    /// Whether a sensor whose status is `status` is listed: what the backends' statements
    /// say, for a store that filters in memory (the simulation's model).
    pub fn keeps(&self, status: &SensorStatus) -> bool {
        self.connection.is_none_or(|c| status.connection == c)
            && self
                .battery_below
                .is_none_or(|b| status.signals.battery.is_some_and(|x| x < b))
            && self
                .tamper
                .is_none_or(|t| status.signals.tamper.unwrap_or(false) == t)
            && self
                .held
                .is_none_or(|h| status.hold.is_some_and(|x| x.sent > 0) == h)
            && self.flapping.is_none_or(|f| status.flapping == f)
            && self
                .battery_low
                .is_none_or(|l| status.signals.battery_low == l)
    }
}

/// How many registered sensors are in each connection state, and how many have a door
/// alarm open (the console's fleet page).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    pub online: u64,
    pub lost: u64,
    /// Registered, never reported.
    pub unknown: u64,
    /// A `sensor.state_held` of their state is open.
    pub held: u64,
    /// A `sensor.battery_low` is open.
    pub battery_low: u64,
    /// Flapping now.
    pub flapping: u64,
}

/// [`ConnectionCounts`]' query, the same on both stores: a row per connection with its
/// count and its counts of held, low-battery and flapping sensors.
pub(crate) const COUNT_SENSORS: &str = "SELECT st.connection, COUNT(*), \
     COUNT(*) FILTER (WHERE st.held_sent > 0), COUNT(*) FILTER (WHERE st.battery_low), \
     COUNT(*) FILTER (WHERE st.flapping) \
     FROM sensor_state st JOIN sensors s ON s.id = st.sensor_id GROUP BY st.connection";

impl ConnectionCounts {
    /// From the count of registered sensors and the counts of their state rows by
    /// connection (as stored): whatever has no state row never reported.
    pub(crate) fn from_rows(
        total: i64,
        rows: impl IntoIterator<Item = (String, i64, [i64; 3])>,
    ) -> Self {
        let mut counts = Self::default();
        let mut reported = 0;
        for (conn, n, [held, low, flapping]) in rows {
            counts.held += held as u64;
            counts.battery_low += low as u64;
            counts.flapping += flapping as u64;
            match crate::domain::Connection::parse(&conn) {
                Some(crate::domain::Connection::Online) => counts.online = n as u64,
                Some(crate::domain::Connection::Lost) => counts.lost = n as u64,
                _ => continue,
            }
            reported += n;
        }
        counts.unknown = (total - reported).max(0) as u64;
        counts
    }
}

/// An MQTT publish that committed and was not acknowledged ([`super::Sessions`]): the
/// broker resends it with the same packet id, topic and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unacked {
    pub pkid: u16,
    pub topic: Vec<u8>,
    pub payload: Vec<u8>,
}

/// Why a notification cannot be retried, when it cannot ([`policy::retry_refusal`], as the
/// store's error).
pub(crate) fn retry_refusal(n: &Notification, newer_state_sent: bool) -> Option<Error> {
    policy::retry_refusal(n, newer_state_sent).map(|r| Error::Conflict(r.to_string()))
}

/// The dispatcher's view of a stored notification.
pub(crate) fn notification_ref(n: &Notification) -> NotificationRef {
    NotificationRef::of(n)
}

/// A history cursor made of a time and a row id, `"{ms}:{id}"`.
pub(crate) fn split_cursor(c: &str) -> Result<(i64, i64)> {
    let (a, b) = c.split_once(':').ok_or(Error::BadCursor)?;
    Ok((
        a.parse().map_err(|_| Error::BadCursor)?,
        b.parse().map_err(|_| Error::BadCursor)?,
    ))
}

/// Rows to fetch for a page: one more than asked proves there is a next page.
pub(crate) fn limit_plus_one(p: &PageRequest) -> i64 {
    p.limit as i64 + 1
}
