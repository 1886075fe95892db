//! Schedules: kept whole, as both backends keep them (`store/sqlite/schedules.rs`,
//! `store/postgres/schedules.rs`).

use async_trait::async_trait;

use latch::domain::SensorId;
use latch::store::{Error, Page, PageRequest, Result, Schedules, StoredSchedule};

use super::node::NodeStore;
use super::registry::{after, page_of};

#[async_trait]
impl Schedules for NodeStore {
    async fn create_schedule(&self, s: StoredSchedule) -> Result<()> {
        self.audited(
            "create_schedule",
            Some(s.schedule.id.clone()),
            |t, _| {
                let id = s.schedule.id.clone();
                if t.schedules.contains_key(&id) {
                    return Err(Error::Conflict(format!("schedule {id} already exists")));
                }
                t.schedules.insert(id, s);
                Ok(())
            },
            |_, r| Some(r),
        )
        .await
    }

    async fn get_schedule(&self, id: String) -> Result<Option<StoredSchedule>> {
        self.run("get_schedule", false, |t, _| {
            Ok(t.schedules.get(&id).cloned())
        })
        .await
    }

    async fn list_schedules(&self, page: PageRequest) -> Result<Page<StoredSchedule>> {
        self.run("list_schedules", false, |t, _| {
            let rows = t
                .schedules
                .values()
                .filter(|s| after(&s.schedule.id, &page))
                .cloned();
            Ok(page_of(rows, &page, |s| s.schedule.id.clone()))
        })
        .await
    }

    async fn replace_schedule(&self, s: StoredSchedule) -> Result<bool> {
        self.audited(
            "replace_schedule",
            None,
            |t, _| {
                Ok(match t.schedules.get_mut(&s.schedule.id) {
                    Some(old) => {
                        old.schedule = s.schedule;
                        old.updated_at = s.updated_at;
                        true
                    }
                    None => false,
                })
            },
            |ok, r| ok.then_some(r),
        )
        .await
    }

    async fn delete_schedule(&self, id: String) -> Result<bool> {
        self.audited(
            "delete_schedule",
            None,
            |t, _| Ok(t.schedules.remove(&id).is_some()),
            |ok, r| ok.then_some(r),
        )
        .await
    }

    async fn sensors_armed_by(&self, id: String, limit: u32) -> Result<Vec<SensorId>> {
        self.run("sensors_armed_by", false, |t, _| {
            Ok(t.sensors
                .values()
                .filter(|s| s.armed.as_ref().is_some_and(|a| a.schedule_id == id))
                .map(|s| s.id)
                .take(limit as usize)
                .collect())
        })
        .await
    }
}
