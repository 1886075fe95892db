//! Weekly schedules, kept for silences and sensors' arming to name.

use super::{App, Error, Result};
use crate::domain::schedule::Schedule;
use crate::store::{Page, PageRequest, StoredSchedule};

impl App {
    pub async fn create_schedule(&self, schedule: Schedule) -> Result<StoredSchedule> {
        let now = self.now();
        let s = StoredSchedule {
            schedule,
            created_at: now,
            updated_at: now,
        };
        self.0.store.create_schedule(s.clone()).await?;
        Ok(s)
    }

    pub async fn schedule(&self, id: String) -> Result<Option<StoredSchedule>> {
        Ok(self.0.store.get_schedule(id).await?)
    }

    pub async fn schedules(&self, page: PageRequest) -> Result<Page<StoredSchedule>> {
        Ok(self.0.store.list_schedules(page).await?)
    }

    /// Writes `schedule` over the one of its id; `None` if there is none. The silences
    /// that follow it are placed again by it ([`super::silences::place`]): one between
    /// windows moves to the new next window; one inside a window keeps that window to its
    /// stored end, and the round that reconciles that end moves it by the new schedule.
    pub async fn replace_schedule(
        &self,
        schedule: Schedule,
        created_at: crate::domain::Millis,
    ) -> Result<Option<StoredSchedule>> {
        let now = self.now();
        let s = StoredSchedule {
            schedule,
            created_at,
            updated_at: now,
        };
        if !self.0.store.replace_schedule(s.clone()).await? {
            return Ok(None);
        }
        let following = self
            .0
            .store
            .silences_following(s.schedule.id.clone())
            .await?;
        for mut silence in following {
            if super::silences::place(&mut silence, &s.schedule, now) {
                silence.updated_at = now;
                // `false`: ended meanwhile, nothing to place.
                self.0.store.update_silence(silence).await?;
            }
        }
        Ok(Some(s))
    }

    /// What follows schedule `id`, for the answer to its deletion: a silence no caller
    /// ended, or a sensor it arms; `None` when nothing does. The one place that says whether a schedule is in
    /// use: whatever else comes to follow schedules adds its check here.
    pub async fn schedule_in_use(&self, id: &str) -> Result<Option<String>> {
        let silences = self.0.store.silences_following(id.to_string()).await?;
        if let Some(s) = silences.first() {
            return Ok(Some(match silences.len() {
                1 => format!("silence {}", s.id),
                n => format!("silence {} and {} more", s.id, n - 1),
            }));
        }
        let armed = self.0.store.sensors_armed_by(id.to_string(), 2).await?;
        Ok(armed.first().map(|s| match armed.len() {
            1 => format!("sensor {s} (armed)"),
            _ => format!("sensor {s} and others (armed)"),
        }))
    }

    /// Deletes a schedule nothing follows ([`App::schedule_in_use`]; 409 `schedule_in_use`
    /// otherwise). `false` if there is none.
    pub async fn delete_schedule(&self, id: String) -> Result<bool> {
        if let Some(user) = self.schedule_in_use(&id).await? {
            return Err(Error::ScheduleInUse(format!(
                "schedule {id:?} is in use by {user}: end or change that first"
            )));
        }
        Ok(self.0.store.delete_schedule(id).await?)
    }
}
