//! A flapping contact (issue #72, part 3): a failing reed switch or a loose door flips so
//! often that a notification for each flip is noise. A sensor's `flap`
//! (`{changes, window_s}`) says how many changes within how long are flapping.
//!
//! The rule is written once here, pure, and the engine runs it over the events a reading,
//! a debounce window's end or a loss made ([`crate::engine::rules`]):
//!
//! - **What counts** is what would be notified: a `sensor.state_changed` (after its
//!   debounce window, so debounce hides the flips shorter than its window before they
//!   count; a sensor's first value is no change), a `sensor.connection_lost` and a
//!   `sensor.connection_restored` (a connection that comes and goes flaps too).
//! - **Counted in windows on latch's clock** that each begin at a change: when `changes`
//!   changes have come within `window_s` of the first of them, the sensor flaps. A change
//!   past the window begins the next one. So every `sensor.flapping` is true (there were
//!   that many changes within the window); a burst that straddles two windows is noticed
//!   at most one window late. (An exact sliding count would keep up to 100 times per
//!   sensor; this keeps three numbers.)
//! - **The change that crosses the threshold** is sent as `sensor.flapping` (with the
//!   state then) instead of its own `state_changed` (a loss or a restore that crosses it
//!   is sent as it is, then the `flapping`); while the sensor flaps, no `state_changed`
//!   goes out, and losses and restores still do.
//! - **It stops** once no change has come for `window_s`: `sensor.flapping_stopped`
//!   carries the state now and, as `previous`, the state the client was last told (the
//!   `flapping`'s), so the client's view is true again.
//!
//! The count and the flapping are part of the sensor's state, committed with the events
//! that moved them, so a restart or a partition move neither repeats nor forgets them.

use serde::{Deserialize, Serialize};

use super::time::Millis;

/// Bounds of `changes` and `window_s`.
pub const CHANGES: std::ops::RangeInclusive<u32> = 2..=100;
pub const WINDOW_S: std::ops::RangeInclusive<u32> = 10..=3600;

/// A sensor's `flap`, as the API takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Flap {
    /// Changes within `window_s` that are flapping (2–100).
    #[schema(minimum = 2, maximum = 100)]
    pub changes: u32,
    /// Seconds (10–3600): the window changes are counted in, and the quiet that ends a
    /// flapping.
    #[schema(minimum = 10, maximum = 3600)]
    pub window_s: u32,
}

impl Flap {
    pub fn validate(&self) -> Result<(), String> {
        if !CHANGES.contains(&self.changes) {
            return Err(format!(
                "flap.changes must be from {} to {}, got {}",
                CHANGES.start(),
                CHANGES.end(),
                self.changes
            ));
        }
        if !WINDOW_S.contains(&self.window_s) {
            return Err(format!(
                "flap.window_s must be from {} to {}, got {}",
                WINDOW_S.start(),
                WINDOW_S.end(),
                self.window_s
            ));
        }
        Ok(())
    }

    fn window_ms(&self) -> Millis {
        Millis::from(self.window_s) * 1000
    }

    /// As the stores keep it: JSON text, `None` for none.
    pub fn to_column(flap: Option<Flap>) -> Option<String> {
        flap.map(|f| serde_json::to_string(&f).expect("flap serializes"))
    }

    /// From [`Flap::to_column`]'s text (what cannot be read is none).
    pub fn from_column(text: Option<&str>) -> Option<Flap> {
        text.and_then(|t| serde_json::from_str::<Flap>(t).ok())
            .filter(|f| f.validate().is_ok())
    }
}

/// A sensor's count of changes and whether it flaps, kept while it has either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlapState {
    /// The first change of the window counting now (latch's clock).
    pub start: Millis,
    /// Changes counted in it.
    pub count: u32,
    /// The last change.
    pub last: Millis,
    /// While it flaps: the state its `sensor.flapping` told.
    pub told: Option<Option<bool>>,
}

impl FlapState {
    pub fn flapping(&self) -> bool {
        self.told.is_some()
    }
}

/// What a change does, once counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// Not flapping: notify it as it is.
    Pass,
    /// It crossed the threshold: it begins a flapping (`sensor.flapping`).
    Crossed,
    /// The sensor flaps: a state change is not notified.
    Flapping,
}

/// Counts a change at `at` (latch's clock) of a sensor now in state `data`.
pub fn count(flap: Flap, state: &mut Option<FlapState>, at: Millis, data: Option<bool>) -> Counted {
    let s = state.get_or_insert(FlapState {
        start: at,
        count: 0,
        last: at,
        told: None,
    });
    s.last = s.last.max(at);
    if s.flapping() {
        return Counted::Flapping;
    }
    if at - s.start > flap.window_ms() {
        s.start = at;
        s.count = 0;
    }
    s.count += 1;
    if s.count >= flap.changes {
        s.told = Some(data);
        return Counted::Crossed;
    }
    Counted::Pass
}

/// When a sensor's flapping stops for want of changes: `window_s` after the last one.
/// `None` when it does not flap (or has no `flap`).
pub fn due(flap: Option<Flap>, state: Option<FlapState>) -> Option<Millis> {
    let (flap, s) = (flap?, state?);
    s.flapping().then(|| s.last + flap.window_ms())
}

/// Ends a flapping that has been quiet for its window at `now`: returns the state the
/// client was last told (`previous` of `sensor.flapping_stopped`) and when it stopped.
/// The count starts afresh.
pub fn stop(
    flap: Option<Flap>,
    state: &mut Option<FlapState>,
    now: Millis,
) -> Option<(Option<bool>, Millis)> {
    let at = due(flap, *state)?;
    if now < at {
        return None;
    }
    let told = state.and_then(|s| s.told)?;
    *state = None;
    Some((told, at))
}

/// What setting a sensor's `flap` does to its count: none without one (a flapping under
/// way ends with it, silently: the next change is notified as any other); kept otherwise.
pub fn configured(flap: Option<Flap>, state: &mut Option<FlapState>) {
    if flap.is_none() {
        *state = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const F: Flap = Flap {
        changes: 3,
        window_s: 10,
    };

    #[test]
    fn bounds_are_checked() {
        assert!(F.validate().is_ok());
        let bad = |changes, window_s| Flap { changes, window_s }.validate().unwrap_err();
        assert!(bad(1, 10).contains("changes"));
        assert!(bad(101, 10).contains("changes"));
        assert!(bad(3, 9).contains("window_s"));
        assert!(bad(3, 3601).contains("window_s"));
        assert_eq!(
            Flap::from_column(Flap::to_column(Some(F)).as_deref()),
            Some(F)
        );
        assert_eq!(Flap::from_column(None), None);
    }

    #[test]
    fn the_change_that_crosses_the_threshold_begins_a_flapping() {
        let mut s = None;
        assert_eq!(count(F, &mut s, 0, Some(true)), Counted::Pass);
        assert_eq!(count(F, &mut s, 4_000, Some(false)), Counted::Pass);
        assert_eq!(count(F, &mut s, 10_000, Some(true)), Counted::Crossed);
        assert_eq!(s.unwrap().told, Some(Some(true)));
        assert_eq!(count(F, &mut s, 15_000, Some(false)), Counted::Flapping);
        assert_eq!(
            due(Some(F), s),
            Some(25_000),
            "a window after the last change"
        );
        assert_eq!(stop(Some(F), &mut s, 24_999), None);
        assert_eq!(stop(Some(F), &mut s, 30_000), Some((Some(true), 25_000)));
        assert_eq!(s, None, "counted afresh");
        assert_eq!(count(F, &mut s, 31_000, Some(true)), Counted::Pass);
    }

    #[test]
    fn changes_spread_wider_than_the_window_never_flap() {
        let mut s = None;
        for k in 0..20 {
            assert_eq!(
                count(F, &mut s, k * 6_000, Some(k % 2 == 0)),
                Counted::Pass,
                "{k}"
            );
        }
        assert_eq!(due(Some(F), s), None);
    }

    #[test]
    fn taking_the_flap_away_forgets_the_count() {
        let mut s = None;
        count(F, &mut s, 0, Some(true));
        configured(Some(F), &mut s);
        assert!(s.is_some());
        configured(None, &mut s);
        assert_eq!(s, None);
        assert_eq!(
            due(
                None,
                Some(FlapState {
                    start: 0,
                    count: 3,
                    last: 0,
                    told: Some(None)
                })
            ),
            None
        );
    }
}
