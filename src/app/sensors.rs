//! Sensors registered, changed and deleted: the store first, then the engine, then the
//! node of the cluster that serves the sensor.

use super::{App, Error, Result};
use crate::domain::sensor::SensorAlarms;
use crate::domain::{Sensor, SensorId};
use crate::engine::Settings;
use crate::store::SensorView;

impl App {
    /// Registers a sensor stamped now; the engine tracks it from then on.
    pub async fn create_sensor(
        &self,
        id: SensorId,
        address: String,
        heartbeat_timeout_s: Option<u32>,
        debounce_s: Option<u32>,
        site_id: Option<String>,
        alarms: SensorAlarms,
    ) -> Result<Sensor> {
        self.check_site(site_id.as_deref()).await?;
        self.check_armed(&alarms).await?;
        let settings = Settings::new(heartbeat_timeout_s, debounce_s, &alarms);
        let battery_low_pct = alarms.battery_low_pct;
        let sensor = Sensor {
            id,
            address,
            heartbeat_timeout_s,
            debounce_s,
            site_id,
            created_at: self.now(),
            battery_low_pct,
            labels: alarms.labels,
            hold_alarms: alarms.hold_alarms,
            flap: alarms.flap,
            armed: alarms.armed,
        };
        self.0.store.create_sensor(sensor.clone()).await?;
        self.0.engine.upsert_sensor(id, settings).await?;
        self.registry_changed(id).await;
        Ok(sensor)
    }

    /// Replaces a sensor's settings (`None`: no such sensor); what a site it leaves held
    /// back of it goes out as the store made it.
    pub async fn replace_sensor(
        &self,
        id: SensorId,
        address: String,
        heartbeat_timeout_s: Option<u32>,
        debounce_s: Option<u32>,
        site_id: Option<String>,
        alarms: SensorAlarms,
    ) -> Result<Option<SensorView>> {
        self.check_site(site_id.as_deref()).await?;
        self.check_armed(&alarms).await?;
        let settings = Settings::new(heartbeat_timeout_s, debounce_s, &alarms);
        let Some((view, made)) = self
            .0
            .store
            .replace_sensor(
                id,
                address,
                heartbeat_timeout_s,
                debounce_s,
                site_id,
                alarms,
                self.now(),
            )
            .await?
        else {
            return Ok(None);
        };
        // What a site it left held back of it.
        self.0.dispatcher.deliver_served(made);
        self.0.engine.upsert_sensor(id, settings).await?;
        self.registry_changed(id).await;
        Ok(Some(view))
    }

    /// Deletes a sensor with its links, state and history (`false`: no such sensor).
    pub async fn delete_sensor(&self, id: SensorId) -> Result<bool> {
        // The store first: when it fails, the sensor is still whole (registered, tracked,
        // its readings accepted) and the caller can simply try again. A reading the engine
        // applies between the two steps is kept nowhere: a commit stores rows of
        // registered sensors only.
        if !self.0.history.delete_sensor(id, self.now()).await? {
            return Ok(false);
        }
        // From here on its readings are rejected as unknown: they queue behind this removal.
        if let Err(e) = self.0.engine.remove_sensor(id).await {
            // Only when the engine is stopping, and then it takes no readings at all.
            tracing::warn!(sensor = %id, error = %e, "Deleted sensor not removed from the engine.");
        }
        self.registry_changed(id).await;
        Ok(true)
    }

    /// An armed sensor names a schedule that exists.
    async fn check_armed(&self, alarms: &SensorAlarms) -> Result<()> {
        if let Some(a) = &alarms.armed
            && self
                .0
                .store
                .get_schedule(a.schedule_id.clone())
                .await?
                .is_none()
        {
            return Err(Error::Invalid(format!(
                "armed.schedule_id: no schedule {:?}",
                a.schedule_id
            )));
        }
        Ok(())
    }

    /// In a cluster, the node serving `id` reads the change now.
    async fn registry_changed(&self, id: SensorId) {
        if let Some(c) = &self.0.cluster {
            c.registry_changed(id).await;
        }
    }
}
