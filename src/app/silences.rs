//! Silences (maintenance windows): made, extended and ended by callers; reconciled at
//! their end by the rounds every node runs ([`super::rounds`]; the store lets one take
//! each).

use super::{App, Error, Result};
use crate::domain::Millis;
use crate::domain::silence::{Match, Silence, SilenceState, check_times};

/// A change to a silence: its end, its comment, and its start while it has not begun.
#[derive(Debug, Clone, Default)]
pub struct SilenceChange {
    pub starts_at: Option<Millis>,
    pub ends_at: Option<Millis>,
    pub comment: Option<String>,
}

impl App {
    /// Makes a silence. Its match must name something, and what it names must exist.
    pub async fn create_silence(
        &self,
        matcher: Match,
        starts_at: Option<Millis>,
        ends_at: Millis,
        comment: String,
    ) -> Result<Silence> {
        let now = self.now();
        let starts_at = starts_at.unwrap_or(now);
        check_times(starts_at, ends_at, now).map_err(Error::Invalid)?;
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
        };
        self.0.store.create_silence(s.clone()).await?;
        Ok(s)
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

    /// Extends, shortens or re-comments a silence that has not ended (`None`: no such
    /// silence).
    pub async fn update_silence(&self, id: String, c: SilenceChange) -> Result<Option<Silence>> {
        let Some(mut s) = self.0.store.get_silence(id).await? else {
            return Ok(None);
        };
        let now = self.now();
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
        check_times(s.starts_at, s.ends_at, now).map_err(Error::Invalid)?;
        s.updated_at = now;
        if !self.0.store.update_silence(s.clone()).await? {
            return Err(crate::store::Error::Conflict("the silence has ended".into()).into());
        }
        Ok(Some(s))
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
        s.starts_at = s.starts_at.min(now);
        s.ends_at = now;
        s.updated_at = now;
        self.0.store.update_silence(s).await?;
        Ok(true)
    }
}
