//! Silences (maintenance windows): made, extended and ended by callers; reconciled at
//! their end by the rounds every node runs ([`super::rounds`]; the store lets one take
//! each). A silence may follow a schedule instead of its own times: it holds the
//! schedule's current or next window, which the round moves on at each window's end.

use super::{App, Error, Result};
use crate::domain::Millis;
use crate::domain::schedule::Schedule;
use crate::domain::silence::{Match, Silence, SilenceState, check_times, window_after};

/// When a new silence applies.
#[derive(Debug, Clone)]
pub enum When {
    /// From `starts_at` (now when absent) to `ends_at`, once.
    Times {
        starts_at: Option<Millis>,
        ends_at: Millis,
    },
    /// In every window of the schedule of this id.
    Schedule(String),
}

/// A change to a silence: its end, its comment, and its start while it has not begun; or
/// the schedule it follows (not with times).
#[derive(Debug, Clone, Default)]
pub struct SilenceChange {
    pub starts_at: Option<Millis>,
    pub ends_at: Option<Millis>,
    pub schedule_id: Option<String>,
    pub comment: Option<String>,
}

/// Places a silence that follows `schedule` at the schedule's window from `now` on — the
/// one `now` is in, or the next; an empty window at `now` when none comes, so it is pending
/// until a change to the schedule places it again. A window the silence has begun already
/// and not had reconciled is left as it is: it stays active to its stored end, is
/// reconciled then, and the round moves it on by the schedule as it is by then (a change to
/// a schedule never cuts a window short, nor stretches one).
pub(super) fn place(s: &mut Silence, schedule: &Schedule, now: Millis) -> bool {
    if s.starts_at <= now && s.reconciled_at.is_none() {
        return false;
    }
    let (starts_at, ends_at) = window_after(schedule, now).unwrap_or((now, now));
    let moved = (starts_at, ends_at) != (s.starts_at, s.ends_at);
    (s.starts_at, s.ends_at) = (starts_at, ends_at);
    // As the store writes it: a window that ends later is reconciled at its end.
    s.reconciled_at = None;
    moved
}

impl App {
    /// Makes a silence. Its match must name something, and what it names must exist, as
    /// must the schedule it follows.
    pub async fn create_silence(
        &self,
        matcher: Match,
        when: When,
        comment: String,
    ) -> Result<Silence> {
        let now = self.now();
        let (starts_at, ends_at, schedule_id) = match when {
            When::Times { starts_at, ends_at } => {
                let starts_at = starts_at.unwrap_or(now);
                check_times(starts_at, ends_at, now).map_err(Error::Invalid)?;
                (starts_at, ends_at, None)
            }
            When::Schedule(id) => {
                let schedule = self.followed(&id).await?;
                let (a, b) = window_after(&schedule, now).unwrap_or((now, now));
                (a, b, Some(id))
            }
        };
        self.check_match(&matcher).await?;
        let s = Silence {
            id: self.0.engine.clock().ulid().to_string(),
            matcher,
            starts_at,
            ends_at,
            comment,
            created_at: now,
            updated_at: now,
            reconciled_at: None,
            schedule_id,
            ended_at: None,
        };
        self.0.store.create_silence(s.clone()).await?;
        Ok(s)
    }

    /// The schedule a silence is to follow: 422 `unknown_schedule` when there is none.
    async fn followed(&self, id: &str) -> Result<Schedule> {
        match self.0.store.get_schedule(id.to_string()).await? {
            Some(s) => Ok(s.schedule),
            None => Err(Error::UnknownSchedule(format!(
                "schedule_id: no schedule {id:?}"
            ))),
        }
    }

    async fn check_match(&self, m: &Match) -> Result<()> {
        if m.is_empty() {
            return Err(Error::Invalid(
                "match must name at least one of site_id, sensor_ids, client_id, types".into(),
            ));
        }
        if let Some(site) = &m.site_id {
            self.check_site(Some(site)).await?;
        }
        if let Some(client) = &m.client_id
            && self.0.store.get_client(client.clone()).await?.is_none()
        {
            return Err(Error::Invalid(format!(
                "match.client_id: no client {client:?}"
            )));
        }
        if let Some(ids) = &m.sensor_ids {
            if ids.is_empty() {
                return Err(Error::Invalid("match.sensor_ids is empty".into()));
            }
            if let Some(id) = self.0.store.first_missing_sensor(ids.clone()).await? {
                return Err(Error::Invalid(format!("match.sensor_ids: no sensor {id}")));
            }
        }
        if m.types.as_ref().is_some_and(|t| t.is_empty()) {
            return Err(Error::Invalid("match.types is empty".into()));
        }
        Ok(())
    }

    /// Extends, shortens or re-comments a silence that has not ended, or has it follow a
    /// schedule (`None`: no such silence). The times of one that follows a schedule are
    /// the schedule's; a one-off silence may take a schedule before it begins.
    pub async fn update_silence(&self, id: String, c: SilenceChange) -> Result<Option<Silence>> {
        if c.schedule_id.is_some() {
            for (field, given) in [("starts_at", c.starts_at), ("ends_at", c.ends_at)] {
                if given.is_some() {
                    return Err(Error::Invalid(format!(
                        "{field}: give schedule_id or times, not both"
                    )));
                }
            }
        }
        let Some(mut s) = self.0.store.get_silence(id).await? else {
            return Ok(None);
        };
        let now = self.now();
        if s.state(now) != SilenceState::Ended {
            if let Some(schedule_id) = c.schedule_id {
                return self.reschedule(s, schedule_id, c.comment, now).await;
            }
            if s.schedule_id.is_some() && (c.starts_at.is_some() || c.ends_at.is_some()) {
                let field = if c.starts_at.is_some() {
                    "starts_at"
                } else {
                    "ends_at"
                };
                return Err(Error::Invalid(format!(
                    "{field}: a silence that follows a schedule takes its times from it; \
                     end it and make a one-off silence instead"
                )));
            }
        }
        match s.state(now) {
            SilenceState::Ended => {
                return Err(crate::store::Error::Conflict("the silence has ended".into()).into());
            }
            SilenceState::Active if c.starts_at.is_some_and(|t| t != s.starts_at) => {
                return Err(Error::Invalid(
                    "starts_at of an active silence cannot change".into(),
                ));
            }
            _ => {}
        }
        s.starts_at = c.starts_at.unwrap_or(s.starts_at);
        s.ends_at = c.ends_at.unwrap_or(s.ends_at);
        if let Some(comment) = c.comment {
            s.comment = comment;
        }
        if s.schedule_id.is_none() {
            check_times(s.starts_at, s.ends_at, now).map_err(Error::Invalid)?;
        }
        self.write_silence(s, now).await.map(Some)
    }

    /// Has silence `s` (not ended) follow schedule `schedule_id`, placed at its window.
    async fn reschedule(
        &self,
        mut s: Silence,
        schedule_id: String,
        comment: Option<String>,
        now: Millis,
    ) -> Result<Option<Silence>> {
        let schedule = self.followed(&schedule_id).await?;
        if s.schedule_id.is_none() && s.state(now) == SilenceState::Active {
            return Err(Error::Invalid(
                "schedule_id: an active one-off silence cannot take a schedule; end it and \
                 make another"
                    .into(),
            ));
        }
        s.schedule_id = Some(schedule_id);
        place(&mut s, &schedule, now);
        if let Some(comment) = comment {
            s.comment = comment;
        }
        self.write_silence(s, now).await.map(Some)
    }

    async fn write_silence(&self, mut s: Silence, now: Millis) -> Result<Silence> {
        s.updated_at = now;
        if !self.0.store.update_silence(s.clone()).await? {
            return Err(crate::store::Error::Conflict("the silence has ended".into()).into());
        }
        Ok(s)
    }

    /// Ends a silence now (one that has not begun ends without having applied). `false`:
    /// no such silence; an ended one is left as it is.
    pub async fn end_silence(&self, id: String) -> Result<bool> {
        let Some(mut s) = self.0.store.get_silence(id).await? else {
            return Ok(false);
        };
        let now = self.now();
        if s.state(now) == SilenceState::Ended {
            return Ok(true);
        }
        // A window that ended and waits for its reconciliation keeps its end.
        s.ends_at = s.ends_at.min(now);
        s.starts_at = s.starts_at.min(s.ends_at);
        s.ended_at = Some(now);
        s.updated_at = now;
        self.0.store.update_silence(s).await?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedules_change_moves_a_silence_between_windows_and_keeps_a_window_begun() {
        let t = |s: &str| crate::domain::time::parse(s).unwrap();
        let schedule = |from: &str, to: &str| {
            Schedule::parse(serde_json::json!({"id": "s", "name": "s", "tz": "UTC",
                "weekly": [{"days": ["tue"], "from": from, "to": to}]}))
            .unwrap()
        };
        let mut s = Silence {
            id: "x".into(),
            matcher: Match::default(),
            starts_at: t("2026-12-01T18:00:00Z"),
            ends_at: t("2026-12-01T20:00:00Z"),
            comment: String::new(),
            created_at: 0,
            updated_at: 0,
            reconciled_at: None,
            schedule_id: Some("s".into()),
            ended_at: None,
        };
        // Between windows: moved to the new next one.
        let noon = schedule("12:00", "13:00");
        assert!(place(&mut s, &noon, t("2026-12-01T07:00:00Z")));
        assert_eq!(s.starts_at, t("2026-12-01T12:00:00Z"));
        // Inside it: kept to its end, whatever the schedule says now.
        let begun = s.clone();
        assert!(!place(
            &mut s,
            &schedule("14:00", "15:00"),
            t("2026-12-01T12:30:00Z")
        ));
        assert_eq!(s, begun);
        // Its end reconciled with none to come (a schedule of no windows): placed again.
        s.reconciled_at = Some(t("2026-12-01T13:00:06Z"));
        assert!(place(&mut s, &noon, t("2026-12-01T14:00:00Z")));
        assert_eq!(
            (s.starts_at, s.reconciled_at),
            (t("2026-12-08T12:00:00Z"), None)
        );
    }
}
