//! Weekly schedules, kept for silences and sensors' arming to name.

use super::{App, Result};
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

    /// Writes `schedule` over the one of its id; `None` if there is none.
    pub async fn replace_schedule(
        &self,
        schedule: Schedule,
        created_at: crate::domain::Millis,
    ) -> Result<Option<StoredSchedule>> {
        let s = StoredSchedule {
            schedule,
            created_at,
            updated_at: self.now(),
        };
        Ok(self.0.store.replace_schedule(s.clone()).await?.then_some(s))
    }

    pub async fn delete_schedule(&self, id: String) -> Result<bool> {
        Ok(self.0.store.delete_schedule(id).await?)
    }
}
