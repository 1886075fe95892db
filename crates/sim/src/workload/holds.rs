//! Hold alarms (issue #72, part 1) in the door alarms workload ([`crate::Options::signals`]):
//! some sensors are registered with them (a short `after_s`, sometimes reminders, for
//! one value or both), and now and then a sensor's are changed, set or removed as
//! `App::replace_sensor` does (the store, then the entry node's engine; a node serving the
//! sensor elsewhere follows the registry's change log), so alarms set on a state already
//! held are played too. Every write is logged ([`crate::log::Log::holds`]) for the checks.

use latch::domain::hold::{HoldAlarm, HoldAlarms};
use latch::domain::sensor::{Sensor, SensorAlarms};
use latch::domain::{Millis, SensorId};
use latch::engine::Settings;
use latch::store::Registry;

use super::Workload;

/// The schedule armed sensors are judged by: inside from the run's 20th second to its
/// 80th (17:47 to 17:48 UTC, every day), so changes fall both outside and inside it
/// (`checks/armed.rs` judges by that minute itself).
pub const ARMED_HOURS: &str = "hours";

/// [`ARMED_HOURS`] as the API takes it.
pub fn armed_hours() -> latch::domain::schedule::Schedule {
    latch::domain::schedule::Schedule::parse(serde_json::json!({
        "id": ARMED_HOURS, "name": "the run's hours", "tz": "UTC",
        "weekly": [{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                    "from": "17:47", "to": "17:48"}]
    }))
    .expect("a valid schedule")
}

impl Workload {
    /// Hold alarms drawn for a sensor: none a third of the time, else an alarm for 1 (the
    /// door left open), for 0, or for both, after 1 to 5 s, reminding every 1 to 5 s half
    /// of the time. Only the door alarms workload draws them.
    pub(super) fn drawn_holds(&self) -> HoldAlarms {
        let w = &self.world;
        if !self.signals || w.chance(0.35) {
            return HoldAlarms::default();
        }
        let alarm = |data: u8| HoldAlarm {
            data,
            after_s: w.between(1, 6) as u32,
            remind_every_s: w.chance(0.5).then(|| w.between(1, 6) as u32),
        };
        let list = match w.between(0, 4) {
            0 => vec![alarm(0)],
            1 | 2 => vec![alarm(1)],
            _ => vec![alarm(0), alarm(1)],
        };
        HoldAlarms::from_list(&list).expect("hold alarms within their bounds")
    }

    /// The flap of run sensor `i` (under `--signals`, every third flaps at 3 changes
    /// within 10 s): fixed by the sensor, so a sensor made again flaps as before.
    pub(super) fn flap_of(&self, i: usize) -> Option<latch::domain::flap::Flap> {
        (self.signals && i.is_multiple_of(3)).then_some(latch::domain::flap::Flap {
            changes: 3,
            window_s: 10,
        })
    }

    /// The arming of run sensor `i` (under `--signals`, every fourth: open (1) is news
    /// outside [`ARMED_HOURS`], or, every eighth, inside): fixed by the sensor.
    pub(super) fn armed_of(&self, i: usize) -> Option<latch::domain::armed::Armed> {
        use latch::domain::armed::{Armed, When};
        (self.signals && i % 4 == 1).then(|| Armed {
            schedule_id: ARMED_HOURS.into(),
            data: 1,
            when: match i % 8 {
                1 => When::Outside,
                _ => When::Inside,
            },
        })
    }

    /// The alarms a change of `sensor` writes when it keeps them: its own, as the store
    /// holds them (a change that left them out would remove them).
    pub(super) fn kept_alarms(sensor: &Sensor) -> SensorAlarms {
        SensorAlarms {
            battery_low_pct: sensor.battery_low_pct,
            labels: sensor.labels.clone(),
            hold_alarms: sensor.hold_alarms,
            flap: sensor.flap,
            armed: sensor.armed.clone(),
        }
    }

    /// Notes that a call from `began` to `ended` wrote `alarms` as `sensor`'s.
    pub(super) fn note_holds(
        &self,
        sensor: SensorId,
        alarms: HoldAlarms,
        began: Millis,
        ended: Millis,
    ) {
        self.log
            .lock()
            .unwrap()
            .holds
            .push(crate::log::HoldSetting {
                sensor,
                alarms,
                began,
                ended,
            });
    }

    /// A sensor's hold alarms change (set, changed or removed), the rest of it kept.
    pub(super) async fn set_holds(&mut self) {
        let i = self.world.between(0, self.sensors.len() as u64) as usize;
        let id = self.sensors[i].id;
        let hold_alarms = self.drawn_holds();
        self.write_holds(id, hold_alarms).await;
    }

    /// Once faults stop, the sensors' reminders stop too (their alarms stay): the
    /// sensors keep their states while the run settles, and a reminder made every few
    /// seconds would leave one pending however long it settled.
    pub async fn quiet_holds(&mut self) {
        if !self.signals {
            return;
        }
        let reminding: Vec<(SensorId, HoldAlarms)> = self.model.read(|t| {
            t.sensors
                .values()
                .filter(|s| {
                    s.hold_alarms
                        .to_list()
                        .iter()
                        .any(|a| a.remind_every_s.is_some())
                })
                .map(|s| (s.id, s.hold_alarms))
                .collect()
        });
        for (id, alarms) in reminding {
            let once: Vec<HoldAlarm> = alarms
                .to_list()
                .into_iter()
                .map(|a| HoldAlarm {
                    remind_every_s: None,
                    ..a
                })
                .collect();
            let once = HoldAlarms::from_list(&once).expect("hold alarms within their bounds");
            self.write_holds(id, once).await;
        }
    }

    /// Writes `hold_alarms` as sensor `id`'s through a running node, as
    /// `App::replace_sensor` does.
    async fn write_holds(&mut self, id: SensorId, hold_alarms: HoldAlarms) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let Some(sensor) = self.model.read(|t| t.sensors.get(&id).cloned()) else {
            return;
        };
        let began = self.world.now();
        let alarms = SensorAlarms {
            hold_alarms,
            ..Self::kept_alarms(&sensor)
        };
        let settings = Settings::new(sensor.heartbeat_timeout_s, sensor.debounce_s, &alarms);
        let call = store.replace_sensor(
            id,
            sensor.address.clone(),
            sensor.heartbeat_timeout_s,
            sensor.debounce_s,
            sensor.site_id.clone(),
            alarms,
            engine.now(),
        );
        let result = self
            .audited("PATCH", &format!("sensors/{id}"), call, Option::is_some)
            .await;
        // When the call ended: `None` if it surely wrote nothing.
        let (outcome, ended) = match result {
            Ok(Some((_, made))) => {
                dispatcher.deliver_served(made);
                let applied = engine.upsert_sensor(id, settings).await;
                let ended = match applied {
                    Ok(()) => self.world.now(),
                    Err(_) => Millis::MAX,
                };
                ("ok".to_string(), Some(ended))
            }
            Ok(None) => ("no such sensor".into(), None),
            Err(e) if e.maybe_written() => (e.to_string(), Some(Millis::MAX)),
            Err(e) => (e.to_string(), None),
        };
        self.world.trace(format!(
            "hold alarms of {id} via {node}: {}: {outcome}",
            describe(&hold_alarms)
        ));
        if let Some(ended) = ended {
            self.note_holds(id, hold_alarms, began, ended);
        }
    }
}

/// Hold alarms in a line of the trace: `1 after 3 s every 2 s, 0 after 5 s`, or `none`.
pub fn describe(alarms: &HoldAlarms) -> String {
    let list: Vec<String> = alarms
        .to_list()
        .iter()
        .map(|a| {
            let every = a
                .remind_every_s
                .map_or(String::new(), |e| format!(" every {e} s"));
            format!("{} after {} s{every}", a.data, a.after_s)
        })
        .collect();
    match list.is_empty() {
        true => "none".into(),
        false => list.join(", "),
    }
}
