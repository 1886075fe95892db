//! Escalation (issue #73, part 2): who is next when nobody takes an alarm. A client's
//! `escalation` (`{after_s, to}`) says that an alarm it was sent, still open and not
//! acknowledged `after_s` after that notification was delivered (or failed for good), goes
//! to client `to` as `alarm.escalated`, whose own `escalation` continues the chain.
//!
//! - **The timer** is a row written in the transaction that records the outcome, so it is
//!   durable; a round on any node makes its notification once (the row is marked made in
//!   the same transaction), like a site's decision.
//! - **An acknowledgement or a resolution stops the chain:** a timer fires only for an alarm
//!   still `open`, and none is started for one that is not.
//! - **A client reached by escalation** is told of the alarm's acknowledgement and
//!   resolution too, though it is not linked to the sensor.
//! - **Five levels at most**, and a circle is refused when an escalation is set.

use std::collections::HashMap;
use std::ops::RangeInclusive;

use serde::{Deserialize, Serialize};

use super::alarm::Alarm;

/// Bounds of `after_s`: a second to a week.
pub const AFTER_S: RangeInclusive<u32> = 1..=604_800;
/// The longest chain: escalations from the first client told.
pub const MAX_LEVELS: u32 = 5;

/// A client's `escalation`, as the API takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Escalation {
    /// Seconds after an alarm's notification to this client was delivered (or failed) at
    /// which, still open and not acknowledged, it goes to `to` (1–604800).
    #[schema(minimum = 1, maximum = 604800)]
    pub after_s: u32,
    /// The client it goes to next.
    pub to: String,
}

impl Escalation {
    pub fn validate(&self, own_id: Option<&str>) -> Result<(), String> {
        if !AFTER_S.contains(&self.after_s) {
            return Err(format!(
                "escalation.after_s must be from {} to {}, got {}",
                AFTER_S.start(),
                AFTER_S.end(),
                self.after_s
            ));
        }
        if Some(self.to.as_str()) == own_id {
            return Err("escalation.to: a client cannot escalate to itself".into());
        }
        Ok(())
    }

    /// As the stores keep it: JSON text, `None` for none.
    pub fn to_column(e: Option<&Escalation>) -> Option<String> {
        e.map(|e| serde_json::to_string(e).expect("an escalation serializes"))
    }

    /// From [`Escalation::to_column`]'s text (what cannot be read is none).
    pub fn from_column(text: Option<&str>) -> Option<Escalation> {
        text.and_then(|t| serde_json::from_str(t).ok())
    }
}

/// Whether the clients' escalations (by client id, `to` each) make a circle or a chain of
/// more than [`MAX_LEVELS`] steps; the message names the chain.
pub fn check_chains(escalations: &HashMap<String, String>) -> Result<(), String> {
    for start in escalations.keys() {
        let mut chain = vec![start.as_str()];
        let mut at = start.as_str();
        while let Some(next) = escalations.get(at) {
            if chain.contains(&next.as_str()) {
                chain.push(next);
                return Err(format!("escalation.to: a circle ({})", chain.join(" → ")));
            }
            chain.push(next);
            if chain.len() > MAX_LEVELS as usize + 1 {
                return Err(format!(
                    "escalation.to: a chain longer than {MAX_LEVELS} ({})",
                    chain.join(" → ")
                ));
            }
            at = next;
        }
    }
    Ok(())
}

/// An `alarm.escalated`'s own fields (DESIGN §4): the alarm, the level, the client it
/// escalated from.
pub fn escalated_body(a: &Alarm, level: u32, from: &str) -> String {
    let alarm = super::alarm::alarm_ref(a);
    serde_json::json!({"alarm": alarm, "level": level, "from": from}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn a_circle_and_a_chain_past_five_are_refused() {
        assert!(check_chains(&map(&[("a", "b"), ("b", "c")])).is_ok());
        let circle = check_chains(&map(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap_err();
        assert!(circle.contains("circle"), "{circle}");
        let five = map(&[("a", "b"), ("b", "c"), ("c", "d"), ("d", "e"), ("e", "f")]);
        assert!(check_chains(&five).is_ok(), "five steps are allowed");
        let mut six = five.clone();
        six.insert("f".into(), "g".into());
        let long = check_chains(&six).unwrap_err();
        assert!(long.contains("longer than 5"), "{long}");
    }

    #[test]
    fn after_s_is_bounded_and_a_client_is_not_its_own_next() {
        let e = |after_s, to: &str| Escalation {
            after_s,
            to: to.into(),
        };
        assert!(e(0, "b").validate(Some("a")).is_err());
        assert!(e(604_801, "b").validate(Some("a")).is_err());
        assert!(e(60, "a").validate(Some("a")).is_err());
        assert!(e(60, "b").validate(Some("a")).is_ok());
        let back = Escalation::from_column(Escalation::to_column(Some(&e(5, "b"))).as_deref());
        assert_eq!(back, Some(e(5, "b")));
    }
}
