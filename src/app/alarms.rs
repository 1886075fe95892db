//! Alarms as operators work them: read, and taken (acknowledged). The group commit opens
//! and resolves them; an acknowledgement's `alarm.acknowledged` notifications go to the
//! dispatcher as a replay's do.

use super::{App, Result};
use crate::domain::alarm::Alarm;
use crate::store::rules::alarms::{Ack, Acked};
use crate::store::{AlarmFilter, Page, PageRequest};

impl App {
    pub async fn alarms(&self, filter: AlarmFilter, page: PageRequest) -> Result<Page<Alarm>> {
        Ok(self.0.store.list_alarms(filter, page).await?)
    }

    /// The alarm and the ids of the notifications that name it.
    pub async fn alarm(&self, id: String) -> Result<Option<(Alarm, Vec<String>)>> {
        Ok(self.0.store.get_alarm(id).await?)
    }

    /// Acknowledges an alarm: its reminders stop, and every client told of it hears who
    /// took it.
    pub async fn ack_alarm(&self, id: String, ack: Ack) -> Result<Acked> {
        let acked = self.0.store.ack_alarm(id, ack, self.now()).await?;
        if let Acked::Taken(_, made) = &acked {
            self.0.dispatcher.deliver(made.clone());
        }
        Ok(acked)
    }
}
