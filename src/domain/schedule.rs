//! Weekly schedules (DESIGN §5, issue #73): the hours a building is staffed, written as a
//! person reads them off a wall clock — `mon`–`fri`, `08:00`–`18:00`, in `Europe/Berlin` —
//! and asked in latch's time, milliseconds UTC. A sensor armed outside a schedule and a
//! silence that follows one both ask the same three questions: is this instant inside
//! ([`Schedule::inside`]), when does that next change ([`Schedule::next_change`]), and
//! which stretch of time is it in ([`Schedule::window_at`]).
//!
//! **Wall clock first.** A window is kept in local time and turned into UTC instants day
//! by day with the zone's rules (chrono-tz, whose zone database is compiled in), so
//! "08:00" stays 08:00 across daylight-saving changes and a window's length in UTC is what
//! the clocks on the wall say it is: a 22:00–06:00 night is 7 hours when the clocks go
//! forward and 9 when they go back. Two wall-clock times need a rule:
//!
//! - **A time that does not exist** (the hour skipped in spring) is the first instant
//!   after the gap: 02:30 on 2026-03-29 in Europe/Berlin is 03:00 CEST (01:00 UTC). A
//!   window wholly inside the gap (02:10–02:50 that night) has no time that day and does
//!   not happen.
//! - **A time that happens twice** (the hour repeated in autumn) is its **earlier**
//!   instant, for `from` and for `to` alike: a window is read the first time the clock
//!   shows its times. 02:15–02:45 on 2026-10-25 in Berlin is 00:15–00:45 UTC (in CEST)
//!   and does not come again when the clock shows 02:15 once more. One rule for both ends
//!   keeps the mapping from wall clock to instants monotone, so windows that touch on the
//!   wall clock touch in UTC too and a window never ends before it starts.
//!
//! **A window belongs to the day it starts.** `from` > `to` runs past midnight into the
//! next day, and a date in `except` (a date in the schedule's zone) cancels the windows
//! that *start* on it: with `except: ["2026-12-25"]`, the night from the 24th to the 25th
//! happens whole and the one from the 25th to the 26th does not.
//!
//! Nothing here does I/O; the API stores a schedule as its JSON and reads it back with
//! [`Schedule::parse`].

use std::fmt;

use chrono::{DateTime, Datelike, LocalResult, NaiveDate, NaiveDateTime, TimeDelta, TimeZone};
use chrono_tz::Tz;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::site::{MAX_SITE_ID_LEN, SiteIdError, check_site_id};
use super::time::Millis;

#[cfg(test)]
mod tests;

/// The most windows a schedule may have: a week written one window per day and shift is a
/// few dozen.
pub const MAX_WINDOWS: usize = 64;
/// The most `except` dates: every day of a year.
pub const MAX_EXCEPT: usize = 366;
/// The longest `name`, in characters.
pub const MAX_NAME: usize = 200;

/// A weekly schedule, as the API takes and returns it:
/// `{id, name, tz, weekly: [{days, from, to}], except?}`.
///
/// Deserializing checks each value (a known zone, `HH:MM` times, dates, day names);
/// [`Schedule::parse`] also checks what spans fields (bounds, duplicates, empty windows,
/// the id), and is how a schedule should be read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Chosen by the caller, with a site id's rules: 1 to 64 ASCII letters, digits, `-`,
    /// `_` and `.`.
    pub id: String,
    /// For people: 1 to 200 characters, not blank.
    pub name: String,
    /// The IANA zone its times and dates are in, e.g. `Europe/Berlin`.
    #[serde(with = "zone")]
    #[schema(value_type = String, example = "Europe/Berlin")]
    pub tz: Tz,
    /// Its windows, each repeated every week on its days; overlapping and touching windows
    /// make one stretch of time. None at all is a schedule that is never inside (allowed,
    /// so that one can be written before its hours are known).
    #[schema(max_items = 64)]
    pub weekly: Vec<Window>,
    /// Dates (in `tz`) on which no window starts: holidays.
    #[serde(default, with = "dates")]
    #[schema(value_type = Vec<String>, max_items = 366, example = json!(["2026-12-25"]))]
    pub except: Vec<NaiveDate>,
}

/// One weekly window: `{days: ["mon", …], from: "08:00", to: "18:00"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// The days it starts on, each at most once.
    pub days: Vec<Day>,
    /// Wall-clock start, `00:00` to `23:59`.
    #[schema(value_type = String, example = "08:00")]
    pub from: Clock,
    /// Wall-clock end, exclusive, `00:00` to `23:59` or `24:00` (the end of the day).
    /// Before `from`, the window ends on the next day; equal to it, it is refused.
    #[schema(value_type = String, example = "18:00")]
    pub to: Clock,
}

/// A day of the week, as the API writes it: `mon` … `sun`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Day {
    pub fn of(d: chrono::Weekday) -> Self {
        use chrono::Weekday as W;
        match d {
            W::Mon => Self::Mon,
            W::Tue => Self::Tue,
            W::Wed => Self::Wed,
            W::Thu => Self::Thu,
            W::Fri => Self::Fri,
            W::Sat => Self::Sat,
            W::Sun => Self::Sun,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mon => "mon",
            Self::Tue => "tue",
            Self::Wed => "wed",
            Self::Thu => "thu",
            Self::Fri => "fri",
            Self::Sat => "sat",
            Self::Sun => "sun",
        }
    }
}

/// A wall-clock time of day to the minute, written `HH:MM`; `24:00` is the end of the day
/// (the next day's `00:00`), which only a window's `to` may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Clock(u16);

impl Clock {
    pub const MIDNIGHT: Clock = Clock(0);
    pub const END_OF_DAY: Clock = Clock(24 * 60);

    /// From hours and minutes; `None` past `24:00`.
    pub fn new(hour: u16, minute: u16) -> Option<Self> {
        (minute < 60 && (hour < 24 || (hour == 24 && minute == 0)))
            .then(|| Self(hour * 60 + minute))
    }

    /// Reads `HH:MM` (two digits each), `00:00` to `24:00`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad =
            || format!("must be a time HH:MM from 00:00 to 23:59 (or 24:00 as a `to`), got {s:?}");
        let b = s.as_bytes();
        if b.len() != 5 || b[2] != b':' || ![0, 1, 3, 4].iter().all(|&i| b[i].is_ascii_digit()) {
            return Err(bad());
        }
        let two = |i: usize| u16::from(b[i] - b'0') * 10 + u16::from(b[i + 1] - b'0');
        Self::new(two(0), two(3)).ok_or_else(bad)
    }

    /// Minutes after midnight, 0 to 1440.
    pub fn minutes(self) -> u16 {
        self.0
    }
}

impl fmt::Display for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.0 / 60, self.0 % 60)
    }
}

impl Serialize for Clock {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Clock {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Clock::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Why a schedule is refused: the field (`weekly[2].days`) and the reason, which the API
/// answers with 422.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Invalid {
    pub field: String,
    pub reason: String,
}

impl Invalid {
    fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl Schedule {
    /// Reads a schedule from its JSON (a request's body, a merge-patched one, a stored
    /// one) and checks it whole: the field named in the error is the one to fix.
    pub fn parse(body: serde_json::Value) -> Result<Self, Invalid> {
        let s: Schedule = serde_path_to_error::deserialize(body).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." { "schedule".into() } else { path };
            Invalid::new(field, e.into_inner().to_string())
        })?;
        s.check()?;
        Ok(s)
    }

    /// What serde cannot check alone: the id, the name, the bounds, days given twice,
    /// empty windows, `24:00` as a start and dates given twice.
    pub fn check(&self) -> Result<(), Invalid> {
        check_site_id(&self.id).map_err(|e| {
            let reason = match e {
                SiteIdError::Empty => "must not be empty".to_string(),
                SiteIdError::TooLong(n) => format!("is {n} characters long; at most {MAX_SITE_ID_LEN} are allowed"),
                SiteIdError::BadChar(c, i) => format!(
                    "has {c:?} at position {i}; only ASCII letters, digits, '-', '_' and '.' are allowed"
                ),
            };
            Invalid::new("id", reason)
        })?;
        let n = self.name.chars().count();
        if self.name.trim().is_empty() || n > MAX_NAME {
            return Err(Invalid::new(
                "name",
                format!("must be 1 to {MAX_NAME} characters, not blank (got {n})"),
            ));
        }
        if self.weekly.len() > MAX_WINDOWS {
            return Err(Invalid::new(
                "weekly",
                format!("at most {MAX_WINDOWS} windows, got {}", self.weekly.len()),
            ));
        }
        for (i, w) in self.weekly.iter().enumerate() {
            if w.days.is_empty() {
                return Err(Invalid::new(
                    format!("weekly[{i}].days"),
                    "must name at least one day (mon, tue, wed, thu, fri, sat, sun)",
                ));
            }
            for (j, d) in w.days.iter().enumerate() {
                if w.days[..j].contains(d) {
                    return Err(Invalid::new(
                        format!("weekly[{i}].days[{j}]"),
                        format!("{:?} is given twice", d.as_str()),
                    ));
                }
            }
            if w.from == Clock::END_OF_DAY {
                return Err(Invalid::new(
                    format!("weekly[{i}].from"),
                    "24:00 is the end of a day, only a `to`; a window from midnight starts at 00:00",
                ));
            }
            if w.from == w.to {
                return Err(Invalid::new(
                    format!("weekly[{i}]"),
                    format!(
                        "from and to are both {}, an empty window; a whole day is 00:00 to 24:00",
                        w.from
                    ),
                ));
            }
        }
        if self.except.len() > MAX_EXCEPT {
            return Err(Invalid::new(
                "except",
                format!("at most {MAX_EXCEPT} dates, got {}", self.except.len()),
            ));
        }
        for (i, d) in self.except.iter().enumerate() {
            if self.except[..i].contains(d) {
                return Err(Invalid::new(
                    format!("except[{i}]"),
                    format!("{d} is given twice"),
                ));
            }
        }
        Ok(())
    }

    /// Whether `at` is inside one of its windows.
    pub fn inside(&self, at: Millis) -> bool {
        let Some(d) = self.local_date(at) else {
            return false;
        };
        // The day before for a window past midnight; two days around, for zones whose
        // clocks went back across midnight (a window of tomorrow may start before a
        // second pass through today's last hour).
        let mut spans = Vec::new();
        for k in -2..=1 {
            if let Some(day) = shift(d, k) {
                self.starting_on(day, &mut spans);
            }
        }
        spans.iter().any(|&(s, e)| s <= at && at < e)
    }

    /// The first instant strictly after `after` at which [`Schedule::inside`] changes;
    /// `None` when it never does (no window ever happens, or they cover every hour of the
    /// week from `after` on).
    pub fn next_change(&self, after: Millis) -> Option<Millis> {
        if self.weekly.is_empty() {
            return None;
        }
        let d = self.local_date(after)?;
        let first = shift(d, -2)?;
        // Past its last `except` date a schedule repeats every week (in wall-clock time),
        // so three weeks without a change mean there is none: a gap between windows can
        // only vanish on a night the clocks go forward, never three weeks running.
        let limit = shift(self.except.iter().copied().fold(d, NaiveDate::max), 21)?;
        let mut days = 8;
        loop {
            let last = shift(d, days)?.min(limit);
            // Windows of later days start no earlier than their first midnight, so an edge
            // before it is final.
            let sure_before = self.instant(shift(last, 1)?, Clock::MIDNIGHT)?;
            let edge = self
                .spans(first, last)
                .into_iter()
                .flat_map(|(s, e)| [s, e])
                .find(|&b| b > after && b < sure_before);
            if edge.is_some() || last >= limit {
                return edge;
            }
            days *= 2;
        }
    }

    /// The stretch of time `[start, end)` in UTC that contains `at`, windows that overlap
    /// or touch made one (a Friday 22:00–24:00 and a Saturday 00:00–06:00 are one night);
    /// `None` when `at` is outside. A stretch that never ends (or never began: windows
    /// that cover every hour of every week past the last `except` date) ends at
    /// [`Millis::MAX`] (begins at [`Millis::MIN`]).
    pub fn window_at(&self, at: Millis) -> Option<(Millis, Millis)> {
        if !self.inside(at) {
            return None;
        }
        let end = self.next_change(at).unwrap_or(Millis::MAX);
        Some((self.started(at).unwrap_or(Millis::MIN), end))
    }

    /// The start of the stretch that contains `at` (which is inside); `None` when it began
    /// before anything the schedule can tell apart from forever.
    fn started(&self, at: Millis) -> Option<Millis> {
        let d = self.local_date(at)?;
        let last = shift(d, 1)?;
        let limit = shift(self.except.iter().copied().fold(d, NaiveDate::min), -21)?;
        let mut days = 8;
        loop {
            let first = shift(d, -days)?.max(limit);
            // Windows of earlier days end before the midnight after `first` (the latest
            // ends at 24:00 or past midnight into `first`), so a start after it is final.
            let sure_after = self.instant(shift(first, 1)?, Clock::MIDNIGHT)?;
            let start = self
                .spans(first, last)
                .into_iter()
                .find(|&(s, e)| s <= at && at < e)
                .map(|(s, _)| s)
                .filter(|&s| s > sure_after);
            if start.is_some() || first <= limit {
                return start;
            }
            days *= 2;
        }
    }

    /// The windows that start on local dates `first` to `last`, in UTC, in order, those
    /// that overlap or touch merged.
    fn spans(&self, first: NaiveDate, last: NaiveDate) -> Vec<(Millis, Millis)> {
        let mut all = Vec::new();
        for day in first.iter_days().take_while(|d| *d <= last) {
            self.starting_on(day, &mut all);
        }
        all.sort_unstable();
        let mut merged: Vec<(Millis, Millis)> = Vec::with_capacity(all.len());
        for (s, e) in all {
            match merged.last_mut() {
                Some(m) if s <= m.1 => m.1 = m.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }

    /// The windows that start on local date `day`, as UTC `[start, end)`; one that the
    /// clocks going forward leave no time does not happen.
    fn starting_on(&self, day: NaiveDate, out: &mut Vec<(Millis, Millis)>) {
        if self.except.contains(&day) {
            return;
        }
        let today = Day::of(day.weekday());
        for w in self.weekly.iter().filter(|w| w.days.contains(&today)) {
            let end_day = if w.from > w.to {
                day.succ_opt()
            } else {
                Some(day)
            };
            let (Some(start), Some(end)) = (
                self.instant(day, w.from),
                end_day.and_then(|e| self.instant(e, w.to)),
            ) else {
                continue;
            };
            if start < end {
                out.push((start, end));
            }
        }
    }

    /// The UTC instant of wall-clock `at` on local date `day`: the earlier of two when the
    /// clocks went back, the first after the gap when they went forward past it.
    fn instant(&self, day: NaiveDate, at: Clock) -> Option<Millis> {
        let wall = day
            .and_hms_opt(0, 0, 0)?
            .checked_add_signed(TimeDelta::minutes(i64::from(at.minutes())))?;
        match self.tz.from_local_datetime(&wall) {
            LocalResult::Single(t) => Some(t.timestamp_millis()),
            LocalResult::Ambiguous(a, b) => Some(a.min(b).timestamp_millis()),
            LocalResult::None => after_gap(self.tz, wall),
        }
    }

    fn local_date(&self, at: Millis) -> Option<NaiveDate> {
        DateTime::from_timestamp_millis(at).map(|t| t.with_timezone(&self.tz).date_naive())
    }
}

/// The first instant at which the clocks of `tz` show `wall` or later, for a `wall` they
/// skip: the end of the gap. Found by bisection over whole seconds (zones change at whole
/// seconds) within 18 hours either side of `wall` read as UTC, which holds every offset
/// there is; the wall clock can only rise past a time it skips at the gap that skips it.
fn after_gap(tz: Tz, wall: NaiveDateTime) -> Option<Millis> {
    let shown = |s: i64| DateTime::from_timestamp(s, 0).map(|t| t.with_timezone(&tz).naive_local());
    let n = wall.and_utc().timestamp();
    let (mut lo, mut hi) = (n - 18 * 3600, n + 18 * 3600);
    if !(shown(lo)? < wall && shown(hi)? >= wall) {
        return None;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if shown(mid)? >= wall {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi.checked_mul(1000)
}

fn shift(d: NaiveDate, days: i64) -> Option<NaiveDate> {
    d.checked_add_signed(TimeDelta::try_days(days)?)
}

/// `tz` as its IANA name.
mod zone {
    use chrono_tz::Tz;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(tz: &Tz, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(tz.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tz, D::Error> {
        let name = String::deserialize(d)?;
        name.parse::<Tz>().map_err(|_| {
            serde::de::Error::custom(format!(
                "unknown time zone {name:?}; give an IANA name such as \"Europe/Berlin\" or \"America/New_York\""
            ))
        })
    }
}

/// `except` as `YYYY-MM-DD` strings, each checked on its own so an error names its index.
mod dates {
    use chrono::NaiveDate;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    struct Date(NaiveDate);

    impl<'de> Deserialize<'de> for Date {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let s = String::deserialize(d)?;
            NaiveDate::parse_from_str(&s, "%Y-%m-%d")
                .ok()
                .filter(|_| s.len() == 10)
                .map(Date)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!("must be a date YYYY-MM-DD, got {s:?}"))
                })
        }
    }

    pub fn serialize<S: Serializer>(v: &[NaiveDate], s: S) -> Result<S::Ok, S::Error> {
        v.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<NaiveDate>, D::Error> {
        Ok(Vec::<Date>::deserialize(d)?
            .into_iter()
            .map(|d| d.0)
            .collect())
    }
}
