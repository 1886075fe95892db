//! Events in a sensor's life and the notifications they cause.

use serde::{Deserialize, Serialize};

use super::sensor::SensorId;
use super::time::Millis;

/// What happened to a sensor. Also the notification `type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub enum EventKind {
    #[serde(rename = "sensor.state_changed")]
    StateChanged,
    #[serde(rename = "sensor.connection_lost")]
    ConnectionLost,
    #[serde(rename = "sensor.connection_restored")]
    ConnectionRestored,
    /// A reminder while a sensor stays lost (only with `lost_reminder` set).
    #[serde(rename = "sensor.still_lost")]
    StillLost,
    /// A site went down: one for all of its lost sensors the client is linked to.
    #[serde(rename = "site.connection_lost")]
    SiteConnectionLost,
    /// A site came back: which of those sensors are back and which are still lost.
    #[serde(rename = "site.connection_restored")]
    SiteConnectionRestored,
    /// A sensor's battery fell to its `battery_low_pct` or below.
    #[serde(rename = "sensor.battery_low")]
    BatteryLow,
    /// A low battery is good again (at least 5 above the threshold).
    #[serde(rename = "sensor.battery_ok")]
    BatteryOk,
    #[serde(rename = "sensor.tamper")]
    Tamper,
    #[serde(rename = "sensor.tamper_cleared")]
    TamperCleared,
    /// A sensor reported a fault code (or a new one while one was set).
    #[serde(rename = "sensor.fault")]
    Fault,
    #[serde(rename = "sensor.fault_cleared")]
    FaultCleared,
    /// A sensor's state held past its `hold_alarms`' `after_s` (and each reminder after).
    #[serde(rename = "sensor.state_held")]
    StateHeld,
    /// A state that was held too long changed at last.
    #[serde(rename = "sensor.state_held_cleared")]
    StateHeldCleared,
    /// A sensor's state changed `changes` times within its `flap`'s window: no
    /// `state_changed` of it goes out until it stops.
    #[serde(rename = "sensor.flapping")]
    Flapping,
    /// A flapping sensor was quiet for its window: the state now.
    #[serde(rename = "sensor.flapping_stopped")]
    FlappingStopped,
    /// Someone acknowledged an alarm the client was told of ([`super::alarm`]).
    #[serde(rename = "alarm.acknowledged")]
    AlarmAcknowledged,
    /// An armed sensor's state became its `armed.data` outside (or inside) its schedule
    /// ([`super::armed`]): beside the `state_changed`.
    #[serde(rename = "sensor.state_out_of_schedule")]
    StateOutOfSchedule,
    /// An alarm left open and not acknowledged past the `escalation` of a client told of
    /// it, sent to the next client ([`super::escalation`]).
    #[serde(rename = "alarm.escalated")]
    AlarmEscalated,
}

/// The `type` of the notification `POST /v1/clients/{id}/test` sends: about no sensor,
/// so not an [`EventKind`]; sent whatever the client's `events` say.
pub const CLIENT_TEST: &str = "client.test";

/// The `type` of a batch's body: the envelope of several notifications (a client with
/// `batch` set), not a notification of its own, so neither an [`EventKind`] nor a type a
/// client's `events` may name.
pub const BATCH: &str = "batch";

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::StateChanged => "sensor.state_changed",
            EventKind::ConnectionLost => "sensor.connection_lost",
            EventKind::ConnectionRestored => "sensor.connection_restored",
            EventKind::StillLost => "sensor.still_lost",
            EventKind::SiteConnectionLost => "site.connection_lost",
            EventKind::SiteConnectionRestored => "site.connection_restored",
            EventKind::BatteryLow => "sensor.battery_low",
            EventKind::BatteryOk => "sensor.battery_ok",
            EventKind::Tamper => "sensor.tamper",
            EventKind::TamperCleared => "sensor.tamper_cleared",
            EventKind::Fault => "sensor.fault",
            EventKind::FaultCleared => "sensor.fault_cleared",
            EventKind::StateHeld => "sensor.state_held",
            EventKind::StateHeldCleared => "sensor.state_held_cleared",
            EventKind::Flapping => "sensor.flapping",
            EventKind::FlappingStopped => "sensor.flapping_stopped",
            EventKind::AlarmAcknowledged => "alarm.acknowledged",
            EventKind::StateOutOfSchedule => "sensor.state_out_of_schedule",
            EventKind::AlarmEscalated => "alarm.escalated",
        }
    }

    /// What a notification of this kind tells its receiver, in one line (`GET
    /// /v1/event-types`, and the console's choice of types).
    pub fn description(self) -> &'static str {
        match self {
            EventKind::StateChanged => {
                "A sensor reported a new state, or its first one; the notification says the one before."
            }
            EventKind::ConnectionLost => {
                "A sensor was silent past its heartbeat timeout: it is lost (with its last state and when it was last heard)."
            }
            EventKind::ConnectionRestored => "A lost sensor reported again.",
            EventKind::StillLost => {
                "A reminder that a sensor is still lost (only while LATCH_LOST_REMINDER is set)."
            }
            EventKind::SiteConnectionLost => {
                "A site went down: one notification naming the receiver's lost sensors of it, instead of one each."
            }
            EventKind::SiteConnectionRestored => {
                "A site came back: which of the receiver's sensors of it are back and which are still lost."
            }
            EventKind::BatteryLow => {
                "A sensor's battery fell to its battery_low_pct or below (once, until it is good again)."
            }
            EventKind::BatteryOk => {
                "A sensor's low battery is good again: at least 5 above its battery_low_pct."
            }
            EventKind::Tamper => "A sensor reported that it is being tampered with.",
            EventKind::TamperCleared => "A tampered sensor reported that the tampering ended.",
            EventKind::Fault => "A sensor reported a fault code, or a new one while one was set.",
            EventKind::FaultCleared => "A sensor reported that its fault is gone.",
            EventKind::StateHeld => {
                "A sensor's state held as long as its hold_alarms allow (a door left open), then each reminder while it holds on."
            }
            EventKind::StateHeldCleared => {
                "A state held too long changed at last: the value held, the state now, and how long it held."
            }
            EventKind::Flapping => {
                "A sensor changed as often as its flap allows within its window (a loose door, a failing switch): its state changes are not sent until it stops."
            }
            EventKind::FlappingStopped => {
                "A flapping sensor was quiet for its window: the state now, and the state last told."
            }
            EventKind::AlarmAcknowledged => {
                "Someone acknowledged an alarm this receiver was told of: who, their note, and the alarm (its reminders stop)."
            }
            EventKind::AlarmEscalated => {
                "An alarm nobody acknowledged within the escalation of a client told of it: the alarm, the level, and the client it came from."
            }
            EventKind::StateOutOfSchedule => {
                "An armed sensor's state became its armed state outside (or inside) its schedule (a door opened at night): beside the state_changed, with the schedule."
            }
        }
    }

    /// A sensor's own news of its connection: lost, still lost or back.
    pub fn is_connection(self) -> bool {
        matches!(
            self,
            EventKind::ConnectionLost | EventKind::ConnectionRestored | EventKind::StillLost
        )
    }

    /// News of a sensor's battery, tamper switch or fault ([`super::signals`]): carries
    /// neither `data` nor `previous`.
    pub fn is_signal(self) -> bool {
        matches!(
            self,
            EventKind::BatteryLow
                | EventKind::BatteryOk
                | EventKind::Tamper
                | EventKind::TamperCleared
                | EventKind::Fault
                | EventKind::FaultCleared
        )
    }

    /// News of a state held too long ([`super::hold`]).
    pub fn is_hold(self) -> bool {
        matches!(self, EventKind::StateHeld | EventKind::StateHeldCleared)
    }

    /// A site's notification (about a site, in the lane of one of its sensors).
    pub fn is_site(self) -> bool {
        matches!(
            self,
            EventKind::SiteConnectionLost | EventKind::SiteConnectionRestored
        )
    }

    /// A notification whose fields beyond `id`, `type` and `occurred_at` are stored with
    /// it (`Notification::body`): a site's, an alarm's.
    pub fn has_own_body(self) -> bool {
        self.is_site() || self.is_alarm()
    }

    /// News of an alarm itself, not of a sensor: acknowledged, escalated.
    pub fn is_alarm(self) -> bool {
        matches!(
            self,
            EventKind::AlarmAcknowledged | EventKind::AlarmEscalated
        )
    }

    /// The kinds that open a door alarm (`latch_door_alarms_total`).
    pub const DOOR_ALARMS: [EventKind; 6] = [
        EventKind::StateHeld,
        EventKind::BatteryLow,
        EventKind::Tamper,
        EventKind::Fault,
        EventKind::Flapping,
        EventKind::StateOutOfSchedule,
    ];

    /// Every kind, in the order the API lists them.
    pub const ALL: [EventKind; 19] = [
        EventKind::StateChanged,
        EventKind::ConnectionLost,
        EventKind::ConnectionRestored,
        EventKind::StillLost,
        EventKind::SiteConnectionLost,
        EventKind::SiteConnectionRestored,
        EventKind::BatteryLow,
        EventKind::BatteryOk,
        EventKind::Tamper,
        EventKind::TamperCleared,
        EventKind::Fault,
        EventKind::FaultCleared,
        EventKind::StateHeld,
        EventKind::StateHeldCleared,
        EventKind::Flapping,
        EventKind::FlappingStopped,
        EventKind::AlarmAcknowledged,
        EventKind::StateOutOfSchedule,
        EventKind::AlarmEscalated,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sensor.state_changed" => Some(EventKind::StateChanged),
            "sensor.connection_lost" => Some(EventKind::ConnectionLost),
            "sensor.connection_restored" => Some(EventKind::ConnectionRestored),
            "sensor.still_lost" => Some(EventKind::StillLost),
            "site.connection_lost" => Some(EventKind::SiteConnectionLost),
            "site.connection_restored" => Some(EventKind::SiteConnectionRestored),
            "sensor.battery_low" => Some(EventKind::BatteryLow),
            "sensor.battery_ok" => Some(EventKind::BatteryOk),
            "sensor.tamper" => Some(EventKind::Tamper),
            "sensor.tamper_cleared" => Some(EventKind::TamperCleared),
            "sensor.fault" => Some(EventKind::Fault),
            "sensor.fault_cleared" => Some(EventKind::FaultCleared),
            "sensor.state_held" => Some(EventKind::StateHeld),
            "sensor.state_held_cleared" => Some(EventKind::StateHeldCleared),
            "sensor.flapping" => Some(EventKind::Flapping),
            "sensor.flapping_stopped" => Some(EventKind::FlappingStopped),
            "alarm.acknowledged" => Some(EventKind::AlarmAcknowledged),
            "sensor.state_out_of_schedule" => Some(EventKind::StateOutOfSchedule),
            "alarm.escalated" => Some(EventKind::AlarmEscalated),
            _ => None,
        }
    }
}

/// An event as kept in a sensor's history.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub sensor_id: SensorId,
    pub kind: EventKind,
    pub at: Millis,
    pub data: Option<bool>,
    pub previous: Option<bool>,
    /// For lost/restored: when latch last heard from the sensor before this event.
    pub last_seen_at: Option<Millis>,
    /// What only some kinds carry.
    pub detail: Detail,
}

/// What only some kinds of event carry, kept in their history row and notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Detail {
    /// `sensor.still_lost`: when the sensor was declared lost; `sensor.state_held` and
    /// `sensor.state_held_cleared`: when the held state began (the same column: a since).
    pub lost_since: Option<Millis>,
    /// `sensor.still_lost`: 1 for the first reminder, then the number of reminder
    /// intervals the sensor has been lost; `sensor.state_held`: the same of its reminders.
    pub reminder: Option<u32>,
    /// `sensor.state_changed` after a debounce window: the readings within it whose value
    /// differed from the reading before, the notified one aside.
    pub flips_suppressed: Option<u32>,
    /// `sensor.battery_low`, `sensor.battery_ok`: the battery reported.
    pub battery: Option<u8>,
    /// `sensor.battery_low`: the sensor's `battery_low_pct` when it fell;
    /// `sensor.flapping`: its `flap.changes` (a threshold too).
    pub threshold: Option<u8>,
    /// `sensor.flapping`: its `flap.window_s`.
    pub window_s: Option<u32>,
    /// `sensor.fault`: the code reported.
    pub fault: Option<super::signals::Fault>,
}

/// Where a notification is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Waiting for its first or next attempt.
    Pending,
    Delivered,
    /// Dead letter: out of attempts, or the receiver answered 410 Gone.
    Failed,
    /// A newer state of the sensor made it pointless.
    Superseded,
    /// Its client was deleted or no longer owns the sensor.
    Cancelled,
    /// Made while a silence (maintenance window) matched it: kept, never sent, not a
    /// failure; the silence's end brings the client up to date instead.
    Silenced,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Delivered => "delivered",
            Status::Failed => "failed",
            Status::Superseded => "superseded",
            Status::Cancelled => "cancelled",
            Status::Silenced => "silenced",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(Status::Pending),
            "delivered" => Some(Status::Delivered),
            "failed" => Some(Status::Failed),
            "superseded" => Some(Status::Superseded),
            "cancelled" => Some(Status::Cancelled),
            "silenced" => Some(Status::Silenced),
            _ => None,
        }
    }
}

/// A notification as the outbox keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// ULID; the `webhook-id` on every attempt.
    pub id: String,
    /// Outbox order: strictly increasing in creation order, which is the order a lane sends in.
    pub seq: i64,
    pub client_id: String,
    pub sensor_id: SensorId,
    pub kind: EventKind,
    pub data: Option<bool>,
    pub previous: Option<bool>,
    pub occurred_at: Millis,
    pub last_seen_at: Option<Millis>,
    /// What only some kinds carry ([`Event::detail`]).
    pub detail: Detail,
    pub status: Status,
    /// Attempts made so far (reset by a manual retry; the attempt log keeps them all).
    pub attempts: u32,
    pub next_attempt_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// The batch it was last sent in (its client batches): a retry of that batch carries
    /// the same id.
    pub batch_id: Option<String>,
    /// A site's notification: its own fields (the site, the client's sensors of it), as
    /// the JSON object they are sent in; an `alarm.acknowledged`'s the same; `None` for a
    /// sensor's.
    pub body: Option<String>,
    /// The alarm it opens, reminds of or clears, or acknowledges ([`super::alarm`]).
    pub alarm_id: Option<String>,
}

/// One delivery attempt, as recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub notification_id: String,
    pub at: Millis,
    pub status_code: Option<u16>,
    pub error: Option<String>,
    pub duration_ms: u32,
}

impl Attempt {
    pub fn delivered(&self) -> bool {
        delivered(self.status_code, self.error.as_deref())
    }
}

/// Whether an attempt delivered its notification: a webhook answered 2xx; a broker
/// destination, which has no HTTP status, acknowledged it (no error). Both stores say the
/// same in SQL (`lifecycle::DELIVERED`).
pub fn delivered(status_code: Option<u16>, error: Option<&str>) -> bool {
    match status_code {
        Some(code) => (200..300).contains(&code),
        None => error.is_none(),
    }
}

/// A new notification id.
pub fn new_notification_id() -> String {
    ulid::Ulid::new().to_string()
}

#[cfg(test)]
mod tests {
    use super::delivered;

    #[test]
    fn a_2xx_or_a_brokers_acknowledgement_delivers() {
        assert!(delivered(Some(204), None));
        assert!(!delivered(Some(500), Some("HTTP 500")));
        assert!(!delivered(Some(302), Some("HTTP 302")));
        assert!(delivered(None, None), "a broker acknowledged it");
        assert!(!delivered(
            None,
            Some("timed out waiting for the broker's PUBACK")
        ));
    }
}
