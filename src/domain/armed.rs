//! A sensor armed by a schedule (issue #73, part 3): a building is armed out of hours, so a
//! door opened at 2 a.m. is news of its own. A sensor's `armed` (`{schedule_id, data,
//! when}`) makes `sensor.state_out_of_schedule`, beside the `state_changed`, when its state
//! becomes `data` outside (or inside) the schedule's windows.
//!
//! The rule, written once here and run by the group commit over the stored schedule
//! ([`crate::store::rules::armed`]):
//! - **When** is the change's own time (`at`), read in the schedule's zone: a change made
//!   at 01:59 and committed at 02:01 is judged at 01:59.
//! - **Its alarm** (`out_of_schedule`) is resolved by the sensor's next state change: the
//!   state that was out of schedule is over. A change back to `data` out of hours opens
//!   the next one.
//! - **A sensor's first value** counts as becoming `data` (a door first heard open at
//!   night is news).

use serde::{Deserialize, Serialize};

use super::schedule::Schedule;
use super::time::Millis;

/// Whether the armed state is news outside the schedule's windows or inside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum When {
    /// Out of hours: the schedule holds the hours the building is open.
    Outside,
    /// In the hours the schedule holds (a night schedule).
    Inside,
}

/// A sensor's `armed`, as the API takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Armed {
    /// The schedule whose windows it is judged by; it must exist.
    pub schedule_id: String,
    /// The state that is news (0 or 1), e.g. 1 for a door open.
    #[schema(minimum = 0, maximum = 1)]
    pub data: u8,
    pub when: When,
}

impl Armed {
    pub fn validate(&self) -> Result<(), String> {
        if self.data > 1 {
            return Err(format!("armed.data must be 0 or 1, got {}", self.data));
        }
        if self.schedule_id.is_empty() {
            return Err("armed.schedule_id must not be empty".into());
        }
        Ok(())
    }

    /// Whether a change to `data` at `at` is out of schedule.
    pub fn trips(&self, schedule: &Schedule, data: bool, at: Millis) -> bool {
        data == (self.data == 1) && schedule.inside(at) == (self.when == When::Inside)
    }

    /// As the stores keep it: JSON text, `None` for none.
    pub fn to_column(armed: Option<&Armed>) -> Option<String> {
        armed.map(|a| serde_json::to_string(a).expect("armed serializes"))
    }

    /// From [`Armed::to_column`]'s text (what cannot be read is none).
    pub fn from_column(text: Option<&str>) -> Option<Armed> {
        text.and_then(|t| serde_json::from_str(t).ok())
    }
}

/// The own fields a `sensor.state_out_of_schedule` stores beside its sensor's: the
/// schedule it is out of (`{"id", "name"}`), as it was named then.
pub fn body(schedule: &Schedule) -> String {
    serde_json::json!({"id": schedule.id, "name": schedule.name}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn office() -> Schedule {
        Schedule::parse(serde_json::json!({
            "id": "office", "name": "Office hours", "tz": "Europe/Berlin",
            "weekly": [{"days": ["mon", "tue", "wed", "thu", "fri"], "from": "08:00", "to": "18:00"}]
        }))
        .unwrap()
    }

    fn at(rfc3339: &str) -> Millis {
        super::super::time::parse(rfc3339).unwrap()
    }

    #[test]
    fn a_door_opened_at_night_trips_and_one_opened_in_office_hours_does_not() {
        let armed = Armed {
            schedule_id: "office".into(),
            data: 1,
            when: When::Outside,
        };
        let s = office();
        // Tuesday 2026-12-01, 02:00 in Berlin is 01:00 UTC.
        assert!(armed.trips(&s, true, at("2026-12-01T01:00:00Z")));
        assert!(!armed.trips(&s, false, at("2026-12-01T01:00:00Z")));
        // 10:00 in Berlin.
        assert!(!armed.trips(&s, true, at("2026-12-01T09:00:00Z")));
        // 18:00 in Berlin: `to` is exclusive, so out of hours again.
        assert!(armed.trips(&s, true, at("2026-12-01T17:00:00Z")));
        let inside = Armed {
            when: When::Inside,
            ..armed
        };
        assert!(inside.trips(&s, true, at("2026-12-01T09:00:00Z")));
        assert!(!inside.trips(&s, true, at("2026-12-01T01:00:00Z")));
    }

    #[test]
    fn armed_reads_back_what_it_writes_and_refuses_a_bad_state() {
        let a = Armed {
            schedule_id: "office".into(),
            data: 0,
            when: When::Inside,
        };
        assert_eq!(
            Armed::from_column(Armed::to_column(Some(&a)).as_deref()),
            Some(a.clone())
        );
        assert_eq!(Armed::from_column(None), None);
        let bad = Armed { data: 2, ..a };
        assert!(bad.validate().unwrap_err().contains("armed.data"));
    }
}
