//! Sensor identity and the registry record of a sensor.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest sensor id the contract allows.
pub const MAX_ID_LEN: usize = 16;

/// A validated sensor id: 1 to 16 ASCII letters and digits.
///
/// Packed into a `u128` (6 bits a character, first character in the highest bits, 0 marks
/// the end) rather than held as a `String`: the engine keeps one per tracked sensor in
/// memory, and a `Copy` 16-byte key with no heap allocation is what lets millions of sensors
/// fit in a few dozen bytes each. The packing keeps the string's sort order (digits <
/// upper case < lower case, a prefix before its extensions), so ordering by the packed value
/// is ordering by the id text.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SensorId(u128);

/// Why a string is not a sensor id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SensorIdError {
    #[error("sensor id must not be empty")]
    Empty,
    #[error("sensor id must be at most 16 characters, got {0}")]
    TooLong(usize),
    #[error("sensor id may hold only ASCII letters and digits, found {0:?} at position {1}")]
    BadChar(char, usize),
}

fn code(b: u8) -> Option<u128> {
    match b {
        b'0'..=b'9' => Some((b - b'0') as u128 + 1),
        b'A'..=b'Z' => Some((b - b'A') as u128 + 11),
        b'a'..=b'z' => Some((b - b'a') as u128 + 37),
        _ => None,
    }
}

fn letter(c: u8) -> u8 {
    match c {
        1..=10 => b'0' + c - 1,
        11..=36 => b'A' + c - 11,
        _ => b'a' + c - 37,
    }
}

impl SensorId {
    /// Parses and validates an id.
    pub fn parse(s: &str) -> Result<Self, SensorIdError> {
        if s.is_empty() {
            return Err(SensorIdError::Empty);
        }
        let chars = s.chars().count();
        if chars > MAX_ID_LEN {
            return Err(SensorIdError::TooLong(chars));
        }
        let mut packed: u128 = 0;
        for (i, ch) in s.chars().enumerate() {
            let c = u8::try_from(ch)
                .ok()
                .and_then(code)
                .ok_or(SensorIdError::BadChar(ch, i))?;
            packed |= c << (6 * (MAX_ID_LEN - 1 - i));
        }
        Ok(Self(packed))
    }

    /// Rebuilds an id from [`SensorId::packed`]; only for values that came from it.
    pub(crate) fn from_packed(packed: u128) -> Self {
        Self(packed)
    }

    /// The raw packed value, for compact in-memory indexes and hashing.
    pub fn packed(self) -> u128 {
        self.0
    }

    /// Writes the id's characters into `buf` and returns the used part.
    pub fn as_bytes(self, buf: &mut [u8; MAX_ID_LEN]) -> &[u8] {
        let mut n = 0;
        for (i, slot) in buf.iter_mut().enumerate() {
            let c = ((self.0 >> (6 * (MAX_ID_LEN - 1 - i))) & 63) as u8;
            if c == 0 {
                break;
            }
            *slot = letter(c);
            n += 1;
        }
        &buf[..n]
    }
}

impl fmt::Display for SensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; MAX_ID_LEN];
        // The bytes are ASCII by construction.
        f.write_str(std::str::from_utf8(self.as_bytes(&mut buf)).unwrap_or("?"))
    }
}

impl fmt::Debug for SensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SensorId({self})")
    }
}

impl FromStr for SensorId {
    type Err = SensorIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for SensorId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SensorId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Whether latch currently hears from a sensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Connection {
    /// Never reported.
    Unknown,
    /// Reported within its heartbeat timeout.
    Online,
    /// Silent for longer than its heartbeat timeout.
    Lost,
}

impl Connection {
    pub fn as_str(self) -> &'static str {
        match self {
            Connection::Unknown => "unknown",
            Connection::Online => "online",
            Connection::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "unknown" => Some(Connection::Unknown),
            "online" => Some(Connection::Online),
            "lost" => Some(Connection::Lost),
            _ => None,
        }
    }
}

/// Where a reading came in: its sensor's liveness follows that way's link (a broker
/// connection that is down is not the sensor's silence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Http,
    Amqp,
    Mqtt,
}

impl Source {
    /// Every source, in the order of [`Source::index`].
    pub const ALL: [Source; 3] = [Source::Http, Source::Amqp, Source::Mqtt];

    pub fn as_str(self) -> &'static str {
        match self {
            Source::Http => "http",
            Source::Amqp => "amqp",
            Source::Mqtt => "mqtt",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "http" => Some(Source::Http),
            "amqp" => Some(Source::Amqp),
            "mqtt" => Some(Source::Mqtt),
            _ => None,
        }
    }

    /// 0, 1, 2: a slot in per-source tables.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A registered sensor as the registry keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sensor {
    pub id: SensorId,
    pub address: String,
    /// Overrides the service-wide heartbeat timeout for this sensor.
    pub heartbeat_timeout_s: Option<u32>,
    /// Overrides the service-wide debounce window for this sensor.
    pub debounce_s: Option<u32>,
    /// The site it is installed in, if any.
    pub site_id: Option<String>,
    pub created_at: crate::domain::time::Millis,
    /// Battery threshold in percent: a reading at or below it is `sensor.battery_low`
    /// (0: off).
    pub battery_low_pct: u8,
    /// What its states mean to people.
    pub labels: Labels,
    /// How long each state may hold before `sensor.state_held`.
    pub hold_alarms: crate::domain::hold::HoldAlarms,
    /// How many changes within how long are flapping; `None`: never.
    pub flap: Option<crate::domain::flap::Flap>,
    /// The schedule its state is news out of (or in); `None`: never.
    pub armed: Option<crate::domain::armed::Armed>,
}

/// Longest label of a state, in characters.
pub const LABEL_MAX_CHARS: usize = 32;

/// What a sensor's states mean to people (`{"0": "closed", "1": "open"}`): its
/// notifications carry them as `label` and `previous_label`. Either may be left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Labels {
    /// The label of state 0.
    #[serde(rename = "0", default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 32)]
    pub zero: Option<String>,
    /// The label of state 1.
    #[serde(rename = "1", default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 32)]
    pub one: Option<String>,
}

impl Labels {
    /// The label of state `data`, if it has one.
    pub fn of(&self, data: bool) -> Option<&str> {
        match data {
            false => self.zero.as_deref(),
            true => self.one.as_deref(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.zero.is_none() && self.one.is_none()
    }

    /// Checks each label: not empty, at most [`LABEL_MAX_CHARS`] characters.
    pub fn validate(&self) -> Result<(), String> {
        for (key, label) in [("0", &self.zero), ("1", &self.one)] {
            if let Some(l) = label {
                if l.is_empty() {
                    return Err(format!("labels.{key} must not be empty"));
                }
                if l.chars().count() > LABEL_MAX_CHARS {
                    return Err(format!(
                        "labels.{key} must be at most {LABEL_MAX_CHARS} characters"
                    ));
                }
            }
        }
        Ok(())
    }

    /// As the stores keep it: JSON text, `None` for no labels.
    pub fn to_column(&self) -> Option<String> {
        (!self.is_empty()).then(|| serde_json::to_string(self).expect("labels serialize"))
    }

    /// From [`Labels::to_column`]'s text (what cannot be read is no labels).
    pub fn from_column(text: Option<&str>) -> Self {
        text.and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or_default()
    }
}

/// A sensor's door-alarm settings, as a replace writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SensorAlarms {
    /// See [`Sensor::battery_low_pct`].
    pub battery_low_pct: u8,
    pub labels: Labels,
    /// See [`Sensor::hold_alarms`].
    pub hold_alarms: crate::domain::hold::HoldAlarms,
    /// See [`Sensor::flap`].
    pub flap: Option<crate::domain::flap::Flap>,
    /// See [`Sensor::armed`].
    pub armed: Option<crate::domain::armed::Armed>,
}

impl Default for SensorAlarms {
    fn default() -> Self {
        Self {
            battery_low_pct: crate::domain::signals::DEFAULT_BATTERY_LOW_PCT,
            labels: Labels::default(),
            hold_alarms: Default::default(),
            flap: None,
            armed: None,
        }
    }
}

/// The current state of a sensor, as the API reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SensorStatus {
    pub data: Option<bool>,
    pub changed_at: Option<crate::domain::time::Millis>,
    pub last_seen_at: Option<crate::domain::time::Millis>,
    pub connection: Connection,
    /// How its last reading came in.
    pub last_source: Option<Source>,
    /// Its battery, tamper flag and fault as last reported.
    pub signals: crate::domain::signals::SignalState,
    /// How far its state has held (its hold alarms' progress), if it has any.
    pub hold: Option<crate::domain::hold::Hold>,
    /// Whether it flaps now.
    pub flapping: bool,
}

impl Default for SensorStatus {
    fn default() -> Self {
        Self {
            data: None,
            changed_at: None,
            last_seen_at: None,
            connection: Connection::Unknown,
            last_source: None,
            signals: Default::default(),
            hold: None,
            flapping: false,
        }
    }
}

/// A new state waiting out its sensor's debounce window: what notifying it needs once it
/// has held, kept with the sensor's state so a restart or a takeover keeps the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Debounce {
    /// The state last notified (the notification's `previous`).
    pub from: Option<bool>,
    /// Device time of the reading that began the state now held (the notification's
    /// `occurred_at`).
    pub at: crate::domain::time::Millis,
    /// Our clock when that reading arrived: the window counts from here.
    pub since: crate::domain::time::Millis,
    /// Readings within the window whose value differed from the reading before.
    pub flips: u32,
}

/// A sensor's state as the engine holds it in memory and the store hands it back at start.
/// Here, below both, so that neither depends on the other for it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SensorState {
    pub data: Option<bool>,
    pub changed_at: Option<crate::domain::time::Millis>,
    /// Device time of the last applied (not late) reading.
    pub last_ts: Option<crate::domain::time::Millis>,
    /// Our clock when the last reading arrived: liveness counts this, not the device's.
    pub last_seen_at: Option<crate::domain::time::Millis>,
    pub connection: Connection,
    pub heartbeat_timeout_s: Option<u32>,
    /// Its own debounce window in seconds (registry data, like the timeout).
    pub debounce_s: Option<u32>,
    /// How the last reading came in.
    pub last_source: Option<Source>,
    /// A change waiting out the debounce window; `data` is already the new value.
    pub debounce: Option<Debounce>,
    /// While lost: when it was declared lost. `None` also when memory does not keep it
    /// (no reminders configured): a commit then keeps the stored one.
    pub lost_since: Option<crate::domain::time::Millis>,
    /// While lost: `sensor.still_lost` reminders sent; `None` as for `lost_since`.
    pub reminders: Option<u32>,
    /// Its battery threshold (registry data, like the timeout).
    pub battery_low_pct: u8,
    /// Its battery, tamper flag and fault, and whether its battery is low.
    pub signals: crate::domain::signals::SignalState,
    /// Its hold alarms (registry data, like the timeout).
    pub hold_alarms: crate::domain::hold::HoldAlarms,
    /// How far its state has held, while it has hold alarms or a `state_held` is open.
    pub hold: Option<crate::domain::hold::Hold>,
    /// Its `flap` (registry data, like the timeout).
    pub flap: Option<crate::domain::flap::Flap>,
    /// Its count of changes and whether it flaps, while it has a `flap`.
    pub flapping: Option<crate::domain::flap::FlapState>,
}

impl SensorState {
    pub fn new(heartbeat_timeout_s: Option<u32>) -> Self {
        Self {
            data: None,
            changed_at: None,
            last_ts: None,
            last_seen_at: None,
            connection: Connection::Unknown,
            heartbeat_timeout_s,
            debounce_s: None,
            last_source: None,
            debounce: None,
            lost_since: None,
            reminders: None,
            battery_low_pct: crate::domain::signals::DEFAULT_BATTERY_LOW_PCT,
            signals: Default::default(),
            hold_alarms: Default::default(),
            hold: None,
            flap: None,
            flapping: None,
        }
    }

    /// Whether a commit of this state writes nothing `before` (the sensor's committed
    /// state) does not hold already but when the sensor was last heard from (`last_ts`,
    /// `last_seen_at`): a repeated or late reading of a sensor online. The embedded store
    /// writes those two at most once a second ([`crate::store::StateUpdate::seen_only`]).
    pub fn only_seen_since(&self, before: &SensorState) -> bool {
        let written = |s: &SensorState| {
            (
                s.data,
                s.changed_at,
                s.connection,
                s.last_source,
                s.debounce,
                s.lost_since,
                s.reminders,
                s.signals,
                s.hold,
                s.flapping,
            )
        };
        written(self) == written(before)
    }

    /// Whether `stored` holds what a commit writes of this state (everything but the
    /// timeout and debounce window, which are registry data, and what memory does not
    /// keep: `changed_at`, and `lost_since` and `reminders` without reminders, which a
    /// commit then leaves as stored): how a commit whose answer was lost is found to have
    /// landed.
    pub fn same_committed(&self, stored: &SensorState) -> bool {
        let other = stored;
        let kept = |mine: Option<i64>, stored: Option<i64>| mine.is_none() || mine == stored;
        self.data == other.data
            && kept(self.changed_at, other.changed_at)
            && self.last_ts == other.last_ts
            && self.last_seen_at == other.last_seen_at
            && self.connection == other.connection
            && self.last_source == other.last_source
            && self.debounce == other.debounce
            && self.signals == other.signals
            && self.hold == other.hold
            && self.flapping == other.flapping
            && kept(self.lost_since, other.lost_since)
            && kept(
                self.reminders.map(i64::from),
                other.reminders.map(i64::from),
            )
    }
}

/// Longest install address, in characters (as JSON Schema's `maxLength` counts).
pub const ADDRESS_MAX_CHARS: usize = 1024;

/// Checks an install address: non-empty after trimming, and of a sane length.
pub fn validate_address(address: &str) -> Result<(), String> {
    if address.trim().is_empty() {
        return Err("address must not be empty".into());
    }
    if address.chars().count() > ADDRESS_MAX_CHARS {
        return Err(format!(
            "address must be at most {ADDRESS_MAX_CHARS} characters"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_commit_that_landed_is_recognised_whatever_memory_does_not_keep() {
        use super::{Connection, SensorState, Source};
        // What the engine wrote: memory keeps no `changed_at`, and without reminders no
        // `lost_since` either; the store kept both from before.
        let written = SensorState {
            data: Some(true),
            last_ts: Some(20),
            last_seen_at: Some(30),
            connection: Connection::Online,
            last_source: Some(Source::Amqp),
            ..SensorState::new(None)
        };
        let stored = SensorState {
            changed_at: Some(10),
            lost_since: Some(5),
            ..written
        };
        assert!(written.same_committed(&stored), "the commit landed");
        let before = SensorState {
            last_seen_at: Some(25),
            ..stored
        };
        assert!(
            !written.same_committed(&before),
            "the store holds the state before it"
        );
        let written_change = SensorState {
            changed_at: Some(20),
            ..written
        };
        assert!(
            !written_change.same_committed(&stored),
            "a change it wrote is not there"
        );
    }

    use super::*;

    #[test]
    fn contract_samples_are_valid_and_round_trip() {
        for s in [
            "xa7v9Dfadr7H",
            "0xA",
            "TestSensor",
            "0123456789aBcDeF",
            "z",
            "0",
        ] {
            let id = SensorId::parse(s).unwrap();
            assert_eq!(id.to_string(), s);
        }
    }

    #[test]
    fn bad_ids_are_rejected_with_a_reason() {
        assert_eq!(SensorId::parse(""), Err(SensorIdError::Empty));
        assert_eq!(
            SensorId::parse("0123456789aBcDeFx"),
            Err(SensorIdError::TooLong(17))
        );
        assert_eq!(
            SensorId::parse("ab cd"),
            Err(SensorIdError::BadChar(' ', 2))
        );
        assert_eq!(SensorId::parse("a-b"), Err(SensorIdError::BadChar('-', 1)));
        assert_eq!(SensorId::parse("café"), Err(SensorIdError::BadChar('é', 3)));
        assert_eq!(SensorId::parse("a_b"), Err(SensorIdError::BadChar('_', 1)));
    }

    #[test]
    fn packed_order_is_string_order() {
        let mut ids = vec![
            "b",
            "a",
            "ab",
            "B",
            "9",
            "0",
            "aa",
            "Z",
            "z",
            "a0",
            "zzzzzzzzzzzzzzzz",
        ];
        let mut packed: Vec<SensorId> = ids.iter().map(|s| SensorId::parse(s).unwrap()).collect();
        ids.sort();
        packed.sort();
        let back: Vec<String> = packed.iter().map(|p| p.to_string()).collect();
        assert_eq!(back, ids);
    }

    #[test]
    fn case_matters() {
        assert_ne!(
            SensorId::parse("abc").unwrap(),
            SensorId::parse("ABC").unwrap()
        );
    }
}
