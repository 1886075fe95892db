//! The column lists and row → domain mappers both backends share, so a column added to a
//! query is mapped once. The SQL around the lists stays in each backend: the dialects differ
//! in placeholders and arrays, not in which columns a sensor or a notification has.
//!
//! The mappers read through [`Cols`], which each backend's row type implements with its own
//! column types (SQLite stores booleans and counts as `INTEGER`; PostgreSQL as `bool`,
//! `int4` and `int8`).

use super::sealing;
use super::{AttemptRecord, ClaimRow, ReadingRecord, SensorRuntime, SensorView, Stored};
use crate::domain::client::{Batch, DisabledReason, events_from_column};
use crate::domain::flap::{Flap, FlapState};
use crate::domain::hold::{Hold, HoldAlarms};
use crate::domain::sensor::{Debounce, Labels, SensorState};
use crate::domain::signals::{Fault, SignalState, Signals};
use crate::domain::{
    Attempt, Client, Connection, Detail, Event, EventKind, Notification, NotificationRef, Sensor,
    SensorId, SensorStatus, Source, Status,
};

/// A sensor with its status: [`sensor_view`].
pub(crate) const SENSOR_COLS: &str = "s.id, s.address, s.heartbeat_timeout_s, s.created_at, \
     st.data, st.changed_at, st.last_seen_at, COALESCE(st.connection, 'unknown'), s.debounce_s, \
     st.last_source, s.site_id, s.battery_low_pct, s.labels, st.battery, st.battery_low, \
     st.tamper, st.fault, s.hold_alarms, st.held_since, st.held_sent, \
     COALESCE(st.flapping, false), s.flap, s.armed";

/// The sites' totals (`site::SiteTotals`): sites down, events held for the grace of the
/// sites up, and the start of the oldest grace running. `sites` is one row per building,
/// few enough to count every second; `site_held` holds only what waits for a decision.
pub(crate) const SITE_TOTALS: &str = "SELECT (SELECT COUNT(*) FROM sites WHERE down), \
     (SELECT COUNT(*) FROM site_held h JOIN sites si ON si.id = h.site_id WHERE NOT si.down), \
     (SELECT MIN(pending_since) FROM sites WHERE NOT down)";

/// What the engine keeps of a sensor: [`runtime`], over `sensors s` and [`RUNTIME_JOIN`].
pub(crate) const RUNTIME_COLS: &str = "s.id, s.heartbeat_timeout_s, st.data, st.changed_at, \
     st.last_ts, st.last_seen_at, COALESCE(st.connection, 'unknown'), s.debounce_s, \
     st.last_source, st.debounce_from, st.debounce_at, st.debounce_since, st.debounce_flips, \
     st.lost_since, st.reminders, s.battery_low_pct, st.battery, st.battery_low, st.tamper, \
     st.fault, s.hold_alarms, st.held_since, st.held_sent, s.flap, st.flap_start, st.flap_count, \
     st.flap_last, COALESCE(st.flapping, false), st.flap_told";
pub(crate) const RUNTIME_JOIN: &str = "LEFT JOIN sensor_state st ON st.sensor_id = s.id";

/// A client: [`client`].
pub(crate) const CLIENT_COLS: &str = "c.id, c.name, c.url, c.secret, c.created_at, \
     c.previous_secret, c.previous_secret_until, c.disabled_at, c.disabled_reason, c.rate_limit, \
     c.events, c.batch_max_events, c.batch_max_wait_ms, c.url_password, c.headers, c.auth, c.tls, \
     c.escalation";

/// A notification: [`notification`].
pub(crate) const NOTIF_COLS: &str = "n.id, n.seq, n.client_id, n.sensor_id, n.kind, n.data, \
     n.previous, n.occurred_at, n.last_seen_at, n.status, n.attempts, n.next_attempt_at, \
     n.created_at, n.updated_at, n.lost_since, n.reminder, n.flips_suppressed, n.batch_id, \
     n.body, n.battery, n.threshold, n.fault, n.window_s, n.alarm_id";
/// How many columns [`NOTIF_COLS`] has: where the columns after it begin.
const NOTIF_N: usize = 24;

/// What a claim reads after [`NOTIF_COLS`]: the lease and the registry now, over
/// [`CLAIM_FROM`]; the whole row maps with [`claim_row`].
/// Then, for a site's notification, whether a newer one of the same site reached the
/// client or waits for it (`notifications_site`, a few rows per client); for a sensor's
/// own, whether an older site notification for its client naming the sensor still waits
/// (`notification_sensors`, the sensor's site events); for a site's, whether an older
/// notification about the connection of a sensor it names waits; for a sensor's own
/// about its connection, whether a newer one about it was delivered; last, for a site's,
/// the sensors it names that a newer delivered notification told of (`ClaimRow`).
pub(crate) const CLAIM_COLS: &str = "n.lease_until, n.claimed_by, c.url, c.secret, s.address, (l.client_id IS NOT NULL OR (n.alarm_id IS NOT NULL \
      AND EXISTS (SELECT 1 FROM escalations e WHERE e.alarm_id = n.alarm_id \
      AND e.to_client = n.client_id AND e.made_at IS NOT NULL))), \
     c.previous_secret, c.previous_secret_until, c.disabled_at IS NOT NULL, c.rate_limit, \
     c.batch_max_events, c.batch_max_wait_ms, c.url_password, c.headers, c.auth, c.tls, \
     n.site_id IS NOT NULL AND EXISTS (SELECT 1 FROM notifications m \
      WHERE m.client_id = n.client_id AND m.site_id = n.site_id AND m.seq > n.seq \
      AND m.status IN ('pending', 'delivered')), \
     n.site_id IS NULL AND EXISTS (SELECT 1 FROM notification_sensors ns \
      WHERE ns.sensor_id = n.sensor_id AND ns.seq < n.seq AND EXISTS (SELECT 1 \
      FROM notifications m WHERE m.seq = ns.seq AND m.client_id = n.client_id \
      AND m.status = 'pending')), \
     n.site_id IS NOT NULL AND EXISTS (SELECT 1 FROM notification_sensors ns \
      WHERE ns.seq = n.seq AND EXISTS (SELECT 1 FROM notifications m \
      WHERE m.sensor_id = ns.sensor_id AND m.seq < n.seq AND m.client_id = n.client_id \
      AND m.status = 'pending' AND m.site_id IS NULL AND m.kind IN ('sensor.connection_lost', 'sensor.connection_restored', 'sensor.still_lost'))), \
     n.site_id IS NULL AND n.kind IN ('sensor.connection_lost', 'sensor.connection_restored', 'sensor.still_lost') AND (EXISTS (SELECT 1 FROM notifications o \
      WHERE o.sensor_id = n.sensor_id AND o.client_id = n.client_id AND o.seq > n.seq \
      AND o.status = 'delivered' AND o.site_id IS NULL AND o.kind IN ('sensor.connection_lost', 'sensor.connection_restored', 'sensor.still_lost')) \
      OR EXISTS (SELECT 1 FROM notification_sensors ns \
      WHERE ns.sensor_id = n.sensor_id AND ns.seq > n.seq AND EXISTS (SELECT 1 \
      FROM notifications m WHERE m.seq = ns.seq AND m.client_id = n.client_id \
      AND m.status = 'delivered'))), \
     CASE WHEN n.site_id IS NOT NULL THEN (SELECT string_agg(ns.sensor_id, ',') \
      FROM notification_sensors ns WHERE ns.seq = n.seq \
      AND (EXISTS (SELECT 1 FROM notifications o \
       WHERE o.sensor_id = ns.sensor_id AND o.client_id = n.client_id AND o.seq > n.seq \
       AND o.status = 'delivered' AND o.site_id IS NULL AND o.kind IN ('sensor.connection_lost', 'sensor.connection_restored', 'sensor.still_lost')) \
      OR EXISTS (SELECT 1 FROM notification_sensors ns2 \
       WHERE ns2.sensor_id = ns.sensor_id AND ns2.seq > n.seq AND EXISTS (SELECT 1 \
       FROM notifications m WHERE m.seq = ns2.seq AND m.client_id = n.client_id \
       AND m.status = 'delivered')))) END, \
     s.labels";
/// On a shared store (PostgreSQL, `$2` the claiming node), after [`CLAIM_COLS`] and with
/// [`CLAIM_LANE_FROM`] after [`CLAIM_FROM`]: the notification's lane in the store
/// ([`claim_lane`]), so a claim keeps order across nodes
/// ([`crate::domain::policy::claim_step`]). Ones this node leased are its own lane's,
/// already ordered (their results may not be recorded yet), so they do not count. Whether
/// a newer state was delivered or waits is read for states only (nothing else asks).
pub(crate) const CLAIM_LANE_COLS: &str = "lane.older_pending, lane.older_lease_until, \
     n.kind = 'sensor.state_changed' AND EXISTS (SELECT 1 FROM notifications o \
      WHERE o.sensor_id = n.sensor_id AND o.client_id = n.client_id \
      AND o.kind = 'sensor.state_changed' AND o.status = 'delivered' AND o.seq > n.seq), \
     n.kind = 'sensor.state_changed' AND lane.newer_state_pending, lane.newer_lease_until";

/// The other pending notifications of each claimed one's lane, in one pass over the lane's
/// index: of those this node did not lease, the older ones counted and their latest lease
/// and the newer ones' latest lease; and whether a newer state waits, whoever leased it.
/// (Separate subqueries walked the lane three times: 3 of the ~20 index pages a claimed
/// head read.)
pub(crate) const CLAIM_LANE_FROM: &str = "CROSS JOIN LATERAL (SELECT \
     count(*) FILTER (WHERE q.seq < n.seq AND o.claimed_by IS DISTINCT FROM $2) \
      AS older_pending, \
     max(o.lease_until) FILTER (WHERE q.seq < n.seq AND o.claimed_by IS DISTINCT FROM $2) \
      AS older_lease_until, \
     max(o.lease_until) FILTER (WHERE q.seq > n.seq AND o.claimed_by IS DISTINCT FROM $2) \
      AS newer_lease_until, \
     COALESCE(bool_or(o.kind = 'sensor.state_changed') FILTER (WHERE q.seq > n.seq), false) \
      AS newer_state_pending \
     FROM notifications_pending q JOIN notifications o ON o.seq = q.seq \
     WHERE q.sensor_id = n.sensor_id AND q.client_id = n.client_id AND q.seq <> n.seq \
     AND o.status = 'pending') lane";

pub(crate) const CLAIM_FROM: &str = "notifications n \
     LEFT JOIN clients c ON c.id = n.client_id \
     LEFT JOIN sensors s ON s.id = n.sensor_id \
     LEFT JOIN links l ON l.client_id = n.client_id AND l.sensor_id = n.sensor_id";

/// A reading of a known sensor: [`reading`].
pub(crate) const READING_COLS: &str = "id, data, ts, received_at, late, battery, tamper, fault";
/// How many columns [`READING_COLS`] has: where a column after it is.
pub(crate) const READING_N: usize = 8;

/// An event of a known sensor: [`event`].
pub(crate) const EVENT_COLS: &str =
    "id, kind, at, data, previous, last_seen_at, lost_since, reminder, flips_suppressed";
/// How many columns [`EVENT_COLS`] has: where a column after it is.
pub(crate) const EVENT_N: usize = 9;

/// An attempt: [`attempt`].
pub(crate) const ATTEMPT_COLS: &str = "notification_id, at, status_code, error, duration_ms";

/// `sites.retold` (`SiteState::retold`), on both stores: `,client@released,` per client.
pub(crate) fn retold_listed(retold: &[(String, i64)]) -> String {
    let items: Vec<String> = retold.iter().map(|(c, at)| format!("{c}@{at}")).collect();
    crate::domain::silence::Match::listed(&items)
}

/// The inverse of [`retold_listed`].
pub(crate) fn retold_from(s: &str) -> Vec<(String, i64)> {
    crate::domain::silence::Match::unlisted(s, |p| {
        let (c, at) = p.rsplit_once('@')?;
        Some((c.to_string(), at.parse().ok()?))
    })
}

/// Typed access to the columns of one result row, by position.
pub(crate) trait Cols {
    type Error;
    fn text(&self, i: usize) -> Result<String, Self::Error>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, Self::Error>;
    fn int(&self, i: usize) -> Result<i64, Self::Error>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>, Self::Error>;
    fn flag(&self, i: usize) -> Result<bool, Self::Error>;
    fn opt_flag(&self, i: usize) -> Result<Option<bool>, Self::Error>;
    /// An attempt count (`int4` in PostgreSQL).
    fn count(&self, i: usize) -> Result<u32, Self::Error>;
    /// A number of seconds, if set (`int4` in PostgreSQL).
    fn opt_count(&self, i: usize) -> Result<Option<u32>, Self::Error>;
    /// An HTTP status, if one came back (`int4` in PostgreSQL).
    fn opt_status_code(&self, i: usize) -> Result<Option<u16>, Self::Error>;
    /// A duration in milliseconds (`int8` in PostgreSQL).
    fn duration_ms(&self, i: usize) -> Result<u32, Self::Error>;
    /// A stored sensor id; one that no longer parses is a backend error.
    fn sensor_id(&self, i: usize) -> Result<SensorId, Self::Error>;
    /// The error for column `i` holding what latch could not have written.
    fn damaged(&self, i: usize, why: String) -> Self::Error;
}

fn connection(s: &str) -> Connection {
    Connection::parse(s).unwrap_or(Connection::Unknown)
}

fn kind(s: &str) -> EventKind {
    EventKind::parse(s).unwrap_or(EventKind::StateChanged)
}

/// [`SENSOR_COLS`] from column 0.
pub(crate) fn sensor_view<R: Cols>(r: &R) -> Result<SensorView, R::Error> {
    Ok((
        Sensor {
            id: r.sensor_id(0)?,
            address: r.text(1)?,
            heartbeat_timeout_s: r.opt_count(2)?,
            debounce_s: r.opt_count(8)?,
            site_id: r.opt_text(10)?,
            created_at: r.int(3)?,
            battery_low_pct: pct(r.count(11)?),
            labels: Labels::from_column(r.opt_text(12)?.as_deref()),
            hold_alarms: HoldAlarms::from_column(r.opt_text(17)?.as_deref()),
            flap: Flap::from_column(r.opt_text(21)?.as_deref()),
            armed: crate::domain::armed::Armed::from_column(r.opt_text(22)?.as_deref()),
        },
        SensorStatus {
            data: r.opt_flag(4)?,
            changed_at: r.opt_int(5)?,
            last_seen_at: r.opt_int(6)?,
            connection: connection(&r.text(7)?),
            last_source: r.opt_text(9)?.as_deref().and_then(Source::parse),
            signals: signal_state(r, 13)?,
            hold: hold(r, 18)?,
            flapping: r.flag(20)?,
        },
    ))
}

/// `st.flap_start, st.flap_count, st.flap_last, st.flapping, st.flap_told` from column
/// `first` on.
fn flap_state<R: Cols>(r: &R, first: usize) -> Result<Option<FlapState>, R::Error> {
    let (count, last, flapping, told) = (
        r.opt_count(first + 1)?.unwrap_or(0),
        r.opt_int(first + 2)?,
        r.flag(first + 3)?,
        r.opt_flag(first + 4)?,
    );
    Ok(r.opt_int(first)?.map(|start| FlapState {
        start,
        count,
        last: last.unwrap_or(start),
        told: flapping.then_some(told),
    }))
}

/// `st.held_since, st.held_sent` from column `first` on.
fn hold<R: Cols>(r: &R, first: usize) -> Result<Option<Hold>, R::Error> {
    let sent = r.opt_count(first + 1)?.unwrap_or(0);
    Ok(r.opt_int(first)?.map(|since| Hold { since, sent }))
}

/// A stored percentage (0–100 by the API's checks).
fn pct(v: u32) -> u8 {
    v.min(100) as u8
}

/// `st.battery, st.battery_low, st.tamper, st.fault` from column `first` on.
fn signal_state<R: Cols>(r: &R, first: usize) -> Result<SignalState, R::Error> {
    Ok(SignalState {
        battery: r.opt_count(first)?.map(pct),
        battery_low: r.opt_flag(first + 1)?.unwrap_or(false),
        tamper: r.opt_flag(first + 2)?,
        fault: fault(r, first + 3)?,
    })
}

/// A stored fault code.
fn fault<R: Cols>(r: &R, i: usize) -> Result<Option<Fault>, R::Error> {
    r.opt_text(i)?
        .map(|f| Fault::parse(&f).map_err(|e| r.damaged(i, e)))
        .transpose()
}

/// [`RUNTIME_COLS`] from column 0.
pub(crate) fn runtime<R: Cols>(r: &R) -> Result<SensorRuntime, R::Error> {
    Ok((
        r.sensor_id(0)?,
        SensorState {
            heartbeat_timeout_s: r.opt_count(1)?,
            data: r.opt_flag(2)?,
            changed_at: r.opt_int(3)?,
            last_ts: r.opt_int(4)?,
            last_seen_at: r.opt_int(5)?,
            connection: connection(&r.text(6)?),
            debounce_s: r.opt_count(7)?,
            last_source: r.opt_text(8)?.as_deref().and_then(Source::parse),
            debounce: match r.opt_int(11)? {
                Some(since) => Some(Debounce {
                    from: r.opt_flag(9)?,
                    at: r.opt_int(10)?.unwrap_or(since),
                    since,
                    flips: r.opt_count(12)?.unwrap_or(0),
                }),
                None => None,
            },
            lost_since: r.opt_int(13)?,
            reminders: r.opt_count(14)?,
            battery_low_pct: pct(r.count(15)?),
            signals: signal_state(r, 16)?,
            hold_alarms: HoldAlarms::from_column(r.opt_text(20)?.as_deref()),
            hold: hold(r, 21)?,
            flap: Flap::from_column(r.opt_text(23)?.as_deref()),
            flapping: flap_state(r, 24)?,
        },
    ))
}

/// [`CLIENT_COLS`] from column 0.
pub(crate) fn client<R: Cols>(r: &R) -> Result<Client, R::Error> {
    Ok(Client {
        id: r.text(0)?,
        name: r.text(1)?,
        url: sealing::url_column(r.text(2)?, r.opt_text(13)?),
        secret: r.text(3)?,
        created_at: r.int(4)?,
        previous_secret: r.opt_text(5)?,
        previous_secret_until: r.opt_int(6)?,
        disabled_at: r.opt_int(7)?,
        disabled_reason: r.opt_text(8)?.as_deref().and_then(DisabledReason::parse),
        rate_limit: r.opt_count(9)?,
        events: events_from_column(r.opt_text(10)?),
        batch: batch(r.opt_count(11)?, r.opt_count(12)?),
        receiver: sealing::receiver(r.opt_text(14)?, r.opt_text(15)?, r.opt_text(16)?)
            .map_err(|e| r.damaged(14, e))?,
        escalation: crate::domain::escalation::Escalation::from_column(r.opt_text(17)?.as_deref()),
    })
}

/// A client's batching from its two columns (both set, or none).
fn batch(max_events: Option<u32>, max_wait_ms: Option<u32>) -> Option<Batch> {
    Some(Batch {
        max_events: max_events?,
        max_wait_ms: max_wait_ms?,
    })
}

/// [`NOTIF_COLS`] from column 0.
pub(crate) fn notification<R: Cols>(r: &R) -> Result<Notification, R::Error> {
    Ok(Notification {
        id: r.text(0)?,
        seq: r.int(1)?,
        client_id: r.text(2)?,
        sensor_id: r.sensor_id(3)?,
        kind: kind(&r.text(4)?),
        data: r.opt_flag(5)?,
        previous: r.opt_flag(6)?,
        occurred_at: r.int(7)?,
        last_seen_at: r.opt_int(8)?,
        detail: Detail {
            lost_since: r.opt_int(14)?,
            reminder: r.opt_count(15)?,
            flips_suppressed: r.opt_count(16)?,
            battery: r.opt_count(19)?.map(pct),
            threshold: r.opt_count(20)?.map(pct),
            fault: fault(r, 21)?,
            window_s: r.opt_count(22)?,
        },
        status: Status::parse(&r.text(9)?).unwrap_or(Status::Pending),
        attempts: r.count(10)?,
        next_attempt_at: r.opt_int(11)?,
        created_at: r.int(12)?,
        updated_at: r.int(13)?,
        batch_id: r.opt_text(17)?,
        body: r.opt_text(18)?,
        alarm_id: r.opt_text(23)?,
    })
}

/// What the dispatcher takes of a pending notification ([`pending_ref`]): not its body
/// nor its payload, which a full sweep of a large backlog would otherwise read every minute
/// for nothing.
pub(crate) const REF_COLS: &str = "n.id, n.seq, n.client_id, n.sensor_id, n.kind, n.attempts, \
     COALESCE(n.next_attempt_at, n.created_at), n.batch_id";

/// [`REF_COLS`] from column 0: as [`NotificationRef::of`] makes it of the whole row.
pub(crate) fn pending_ref<R: Cols>(r: &R) -> Result<NotificationRef, R::Error> {
    Ok(NotificationRef {
        id: r.text(0)?,
        seq: r.int(1)?,
        client_id: r.text(2)?,
        sensor_id: r.sensor_id(3)?,
        kind: kind(&r.text(4)?),
        attempts: r.count(5)?,
        due_at: r.int(6)?,
        batch_id: r.opt_text(7)?,
    })
}

/// [`NOTIF_COLS`] then [`CLAIM_COLS`], from column 0.
pub(crate) fn claim_row<R: Cols>(r: &R) -> Result<ClaimRow, R::Error> {
    Ok(ClaimRow {
        notification: notification(r)?,
        lease_until: r.opt_int(NOTIF_N)?,
        claimed_by: r.opt_text(NOTIF_N + 1)?,
        url: r
            .opt_text(NOTIF_N + 2)?
            .map(|u| Ok(sealing::url_column(u, r.opt_text(NOTIF_N + 12)?)))
            .transpose()?,
        secret: r.opt_text(NOTIF_N + 3)?,
        address: r.opt_text(NOTIF_N + 4)?,
        linked: r.flag(NOTIF_N + 5)?,
        previous_secret: r.opt_text(NOTIF_N + 6)?,
        previous_secret_until: r.opt_int(NOTIF_N + 7)?,
        disabled: r.opt_flag(NOTIF_N + 8)?.unwrap_or(false),
        rate_limit: r.opt_count(NOTIF_N + 9)?,
        batch: batch(r.opt_count(NOTIF_N + 10)?, r.opt_count(NOTIF_N + 11)?),
        receiver: sealing::receiver(
            r.opt_text(NOTIF_N + 13)?,
            r.opt_text(NOTIF_N + 14)?,
            r.opt_text(NOTIF_N + 15)?,
        )
        .map_err(|e| r.damaged(NOTIF_N + 13, e))?,
        newer_site_event: r.flag(NOTIF_N + 16)?,
        older_site_event: r.flag(NOTIF_N + 17)?,
        older_own_event: r.flag(NOTIF_N + 18)?,
        newer_connection_told: r.flag(NOTIF_N + 19)?,
        overtaken: r
            .opt_text(NOTIF_N + 20)?
            .map(|ids| {
                ids.split(',')
                    .map(|id| {
                        SensorId::parse(id).map_err(|e| r.damaged(NOTIF_N + 20, e.to_string()))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?
            .unwrap_or_default(),
        labels: Labels::from_column(r.opt_text(NOTIF_N + 21)?.as_deref()),
        // One node's lanes hold every lane whole; a shared store reads it ([`claim_lane`]).
        lane: Default::default(),
    })
}

/// [`CLAIM_LANE_COLS`] after [`claim_row`]'s columns.
pub(crate) fn claim_lane<R: Cols>(r: &R) -> Result<crate::domain::policy::LaneInStore, R::Error> {
    Ok(crate::domain::policy::LaneInStore {
        older_pending: r.int(NOTIF_N + 22)? as u32,
        older_lease_until: r.opt_int(NOTIF_N + 23)?,
        newer_state_delivered: r.flag(NOTIF_N + 24)?,
        newer_state_pending: r.flag(NOTIF_N + 25)?,
        newer_lease_until: r.opt_int(NOTIF_N + 26)?,
    })
}

/// [`READING_COLS`] from column 0, of `sensor_id`.
pub(crate) fn reading<R: Cols>(
    r: &R,
    sensor_id: SensorId,
) -> Result<Stored<ReadingRecord>, R::Error> {
    Ok(Stored {
        id: r.int(0)?,
        row: ReadingRecord {
            sensor_id,
            data: r.flag(1)?,
            ts: r.int(2)?,
            received_at: r.int(3)?,
            late: r.flag(4)?,
            signals: Signals {
                battery: r.opt_count(5)?.map(pct),
                tamper: r.opt_flag(6)?,
                fault: Signals::fault_from_column(r.opt_text(7)?.as_deref()),
            },
        },
    })
}

/// [`EVENT_COLS`] from column 0, of `sensor_id`.
pub(crate) fn event<R: Cols>(r: &R, sensor_id: SensorId) -> Result<Stored<Event>, R::Error> {
    Ok(Stored {
        id: r.int(0)?,
        row: Event {
            sensor_id,
            kind: kind(&r.text(1)?),
            at: r.int(2)?,
            data: r.opt_flag(3)?,
            previous: r.opt_flag(4)?,
            last_seen_at: r.opt_int(5)?,
            detail: Detail {
                lost_since: r.opt_int(6)?,
                reminder: r.opt_count(7)?,
                flips_suppressed: r.opt_count(8)?,
                ..Detail::default()
            },
        },
    })
}

/// [`ATTEMPT_COLS`] from column `first` on.
pub(crate) fn attempt<R: Cols>(r: &R, first: usize) -> Result<Attempt, R::Error> {
    Ok(Attempt {
        notification_id: r.text(first)?,
        at: r.int(first + 1)?,
        status_code: r.opt_status_code(first + 2)?,
        error: r.opt_text(first + 3)?,
        duration_ms: r.duration_ms(first + 4)?,
    })
}

/// A spooled attempt: its id, [`ATTEMPT_COLS`], then the client, sensor and kind of its
/// notification.
pub(crate) fn attempt_record<R: Cols>(r: &R) -> Result<AttemptRecord, R::Error> {
    Ok(AttemptRecord {
        id: r.int(0)?,
        attempt: attempt(r, 1)?,
        client_id: r.text(6)?,
        sensor_id: r.text(7)?,
        kind: r.text(8)?,
    })
}

/// SQLite keeps booleans as integers and range-checks what it narrows.
impl Cols for rusqlite::Row<'_> {
    type Error = rusqlite::Error;
    fn text(&self, i: usize) -> rusqlite::Result<String> {
        self.get(i)
    }
    fn opt_text(&self, i: usize) -> rusqlite::Result<Option<String>> {
        self.get(i)
    }
    fn int(&self, i: usize) -> rusqlite::Result<i64> {
        self.get(i)
    }
    fn opt_int(&self, i: usize) -> rusqlite::Result<Option<i64>> {
        self.get(i)
    }
    fn flag(&self, i: usize) -> rusqlite::Result<bool> {
        Ok(self.get::<_, i64>(i)? != 0)
    }
    fn opt_flag(&self, i: usize) -> rusqlite::Result<Option<bool>> {
        Ok(self.get::<_, Option<i64>>(i)?.map(|v| v != 0))
    }
    fn count(&self, i: usize) -> rusqlite::Result<u32> {
        self.get(i)
    }
    fn opt_count(&self, i: usize) -> rusqlite::Result<Option<u32>> {
        self.get(i)
    }
    fn opt_status_code(&self, i: usize) -> rusqlite::Result<Option<u16>> {
        self.get(i)
    }
    fn duration_ms(&self, i: usize) -> rusqlite::Result<u32> {
        self.get(i)
    }
    fn sensor_id(&self, i: usize) -> rusqlite::Result<SensorId> {
        let s: String = self.get(i)?;
        SensorId::parse(&s).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
    }
    fn damaged(&self, i: usize, why: String) -> rusqlite::Error {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, why.into())
    }
}

/// PostgreSQL has the types; a column of another type than asked is a bug in our SQL, so
/// these use `get`, which panics on it, as the mappers always did.
impl Cols for tokio_postgres::Row {
    type Error = super::Error;
    fn text(&self, i: usize) -> super::Result<String> {
        Ok(self.get(i))
    }
    fn opt_text(&self, i: usize) -> super::Result<Option<String>> {
        Ok(self.get(i))
    }
    fn int(&self, i: usize) -> super::Result<i64> {
        Ok(self.get(i))
    }
    fn opt_int(&self, i: usize) -> super::Result<Option<i64>> {
        Ok(self.get(i))
    }
    fn flag(&self, i: usize) -> super::Result<bool> {
        Ok(self.get(i))
    }
    fn opt_flag(&self, i: usize) -> super::Result<Option<bool>> {
        Ok(self.get(i))
    }
    fn count(&self, i: usize) -> super::Result<u32> {
        Ok(self.get::<_, i32>(i) as u32)
    }
    fn opt_count(&self, i: usize) -> super::Result<Option<u32>> {
        Ok(self.get::<_, Option<i32>>(i).map(|v| v as u32))
    }
    fn opt_status_code(&self, i: usize) -> super::Result<Option<u16>> {
        Ok(self.get::<_, Option<i32>>(i).map(|c| c as u16))
    }
    fn duration_ms(&self, i: usize) -> super::Result<u32> {
        Ok(self.get::<_, i64>(i) as u32)
    }
    fn sensor_id(&self, i: usize) -> super::Result<SensorId> {
        let s: String = self.get(i);
        SensorId::parse(&s)
            .map_err(|e| super::Error::Backend(format!("stored sensor id {s:?}: {e}")))
    }
    fn damaged(&self, i: usize, why: String) -> super::Error {
        super::Error::Backend(format!("column {i}: {why}"))
    }
}

/// The alarms not resolved, grouped for [`crate::domain::alarm::AlarmTotals::of`] (the
/// partial index `alarms_unresolved` keeps it to them).
pub(crate) const ALARM_TOTALS: &str = "SELECT kind, state, count(*), min(opened_at) FROM alarms \
     WHERE state <> 'resolved' GROUP BY kind, state";

/// An alarm: [`alarm`].
pub(crate) const ALARM_COLS: &str = "a.id, a.kind, a.sensor_id, a.site_id, a.state, a.opened_at, \
     a.acknowledged_at, a.acknowledged_by, a.note, a.resolved_at";

/// [`ALARM_COLS`] from column 0.
pub(crate) fn alarm<R: Cols>(r: &R) -> Result<crate::domain::alarm::Alarm, R::Error> {
    use crate::domain::alarm::{AlarmKind, AlarmState};
    let kind = r.text(1)?;
    let state = r.text(4)?;
    Ok(crate::domain::alarm::Alarm {
        id: r.text(0)?,
        kind: AlarmKind::parse(&kind)
            .ok_or_else(|| r.damaged(1, format!("alarm kind {kind:?}")))?,
        sensor_id: match r.opt_text(2)? {
            Some(_) => Some(r.sensor_id(2)?),
            None => None,
        },
        site_id: r.opt_text(3)?,
        state: AlarmState::parse(&state)
            .ok_or_else(|| r.damaged(4, format!("alarm state {state:?}")))?,
        opened_at: r.int(5)?,
        acknowledged_at: r.opt_int(6)?,
        acknowledged_by: r.opt_text(7)?,
        note: r.opt_text(8)?,
        resolved_at: r.opt_int(9)?,
    })
}
