//! What a door sensor reports beside its state — its battery, its tamper switch, a fault
//! code — and what latch keeps of it per sensor. The rule that turns those reports into
//! alarms and their clearings is [`super::alarms`].

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A sensor's battery threshold when it sets none.
pub const DEFAULT_BATTERY_LOW_PCT: u8 = 20;
/// How far above the threshold a battery must be for `sensor.battery_ok`.
pub const BATTERY_OK_MARGIN: u8 = 5;
/// Longest fault code.
pub const MAX_FAULT_LEN: usize = 32;

/// A fault code: 1 to 32 of `a-z`, `0-9`, `_`. Held inline (not a `String`) so that a
/// reading and a sensor's state stay `Copy`, as the engine keeps them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fault {
    len: u8,
    bytes: [u8; MAX_FAULT_LEN],
}

impl Fault {
    /// Parses and checks a code.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("fault must not be empty (null clears it)".into());
        }
        if s.len() > MAX_FAULT_LEN {
            return Err(format!(
                "fault must be at most {MAX_FAULT_LEN} characters, got {}",
                s.chars().count()
            ));
        }
        if let Some(bad) = s
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'))
        {
            return Err(format!("fault may hold only a-z, 0-9 and _, found {bad:?}"));
        }
        let mut bytes = [0; MAX_FAULT_LEN];
        bytes[..s.len()].copy_from_slice(s.as_bytes());
        Ok(Self {
            len: s.len() as u8,
            bytes,
        })
    }

    pub fn as_str(&self) -> &str {
        // ASCII by construction.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or("")
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fault({})", self.as_str())
    }
}

impl Serialize for Fault {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Fault {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// What one reading says beside its state; `None` says nothing of that signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Signals {
    /// Battery charge in percent, 0–100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub battery: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tamper: Option<bool>,
    /// `Some(None)`: the reading cleared the fault (`"fault": null`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    pub fault: Option<Option<Fault>>,
}

/// A field that is present (`null` too) is `Some`; an absent one stays `None` by
/// `#[serde(default)]`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

impl Signals {
    pub fn is_empty(&self) -> bool {
        *self == Signals::default()
    }

    /// A reading's `fault` as the stores keep it in history: `None` when it said nothing,
    /// `""` for `null` (cleared), else the code.
    pub fn fault_column(&self) -> Option<String> {
        self.fault
            .map(|f| f.map(|c| c.to_string()).unwrap_or_default())
    }

    /// The inverse of [`Signals::fault_column`] (a code that no longer parses reads as
    /// cleared).
    pub fn fault_from_column(text: Option<&str>) -> Option<Option<Fault>> {
        text.map(|t| Fault::parse(t).ok())
    }
}

/// A sensor's signals as latch last took them: what its `status` shows, and the alarm
/// state the rule needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SignalState {
    /// The last battery reported.
    pub battery: Option<u8>,
    /// A `sensor.battery_low` went out and no `sensor.battery_ok` since.
    pub battery_low: bool,
    /// The tamper flag last reported.
    pub tamper: Option<bool>,
    /// The fault set now.
    pub fault: Option<Fault>,
}
