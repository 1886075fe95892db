//! The store traits of what operators work: alarms (opened and resolved by the group
//! commit, read and acknowledged here) and the schedules silences and arming name.

use async_trait::async_trait;

use super::{AlarmFilter, Page, PageRequest, Result, StoredSchedule, rules};
use crate::domain::alarm::Alarm;
use crate::domain::{Millis, SensorId};

/// Alarms as operators work them ([`crate::domain::alarm`]): the group commit opens and
/// resolves them ([`super::Runtime::commit`]); these read them and take one.
#[async_trait]
pub trait Alarms: Send + Sync {
    /// Newest first by id.
    async fn list_alarms(&self, filter: AlarmFilter, page: PageRequest) -> Result<Page<Alarm>>;
    /// The alarm and the ids of the notifications that name it, in outbox order.
    async fn get_alarm(&self, id: String) -> Result<Option<(Alarm, Vec<String>)>>;
    /// The alarms not resolved, counted by kind and state (the gauges).
    async fn alarm_totals(&self) -> Result<crate::domain::alarm::AlarmTotals>;
    /// Acknowledges it ([`rules::alarms::acknowledge`]).
    async fn ack_alarm(
        &self,
        id: String,
        ack: rules::alarms::Ack,
        now: Millis,
    ) -> Result<rules::alarms::Acked>;
    /// Runs the escalation round ([`rules::escalations::escalate`]); answers the
    /// notifications made that are to be sent.
    async fn escalate(&self, now: Millis) -> Result<Vec<crate::domain::NotificationRef>>;
}

/// Weekly schedules ([`crate::domain::schedule`]), kept whole as the API writes them.
#[async_trait]
pub trait Schedules: Send + Sync {
    /// 409 (`Conflict`) when its id is taken.
    async fn create_schedule(&self, s: StoredSchedule) -> Result<()>;
    async fn get_schedule(&self, id: String) -> Result<Option<StoredSchedule>>;
    /// By id.
    async fn list_schedules(&self, page: PageRequest) -> Result<Page<StoredSchedule>>;
    /// Writes its fields and `updated_at`; `false` if there is no such schedule.
    async fn replace_schedule(&self, s: StoredSchedule) -> Result<bool>;
    async fn delete_schedule(&self, id: String) -> Result<bool>;
    /// The sensors armed by schedule `id`, in id order, at most `limit`.
    async fn sensors_armed_by(&self, id: String, limit: u32) -> Result<Vec<SensorId>>;
}
