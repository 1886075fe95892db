//! A sensor's registry settings as the engine takes them with a registry change.

use crate::domain::sensor::SensorState;

/// A sensor's registry settings that its rules read: its own timeout and debounce window
/// (`None`: the service's), its battery threshold, its hold alarms and its flap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    pub heartbeat_timeout_s: Option<u32>,
    pub debounce_s: Option<u32>,
    pub battery_low_pct: u8,
    pub hold_alarms: crate::domain::hold::HoldAlarms,
    pub flap: Option<crate::domain::flap::Flap>,
}

impl Default for Settings {
    /// A new sensor's: the service's timeout and debounce window, the default battery
    /// threshold, no hold alarms.
    fn default() -> Self {
        Self::of(&SensorState::new(None))
    }
}

impl Settings {
    /// A sensor's own timeout and debounce window with its door-alarm settings.
    pub fn new(
        heartbeat_timeout_s: Option<u32>,
        debounce_s: Option<u32>,
        alarms: &crate::domain::sensor::SensorAlarms,
    ) -> Self {
        Self {
            heartbeat_timeout_s,
            debounce_s,
            battery_low_pct: alarms.battery_low_pct,
            hold_alarms: alarms.hold_alarms,
            flap: alarms.flap,
        }
    }

    /// The settings a state carries.
    pub fn of(s: &SensorState) -> Self {
        Self {
            heartbeat_timeout_s: s.heartbeat_timeout_s,
            debounce_s: s.debounce_s,
            battery_low_pct: s.battery_low_pct,
            hold_alarms: s.hold_alarms,
            flap: s.flap,
        }
    }

    /// A new sensor's state with these settings (it never reported).
    pub fn new_state(&self) -> SensorState {
        SensorState {
            debounce_s: self.debounce_s,
            battery_low_pct: self.battery_low_pct,
            hold_alarms: self.hold_alarms,
            flap: self.flap,
            ..SensorState::new(self.heartbeat_timeout_s)
        }
    }
}
