//! What happens to the fleet during a run, step by step, drawn from the seed: readings
//! (changes, repeats, late ones, silences), clients and links added and removed,
//! subscriptions, batches, rate limits, replays, retention rounds; and the faults — endpoints that slow
//! down, hang, fail or cut, nodes that join, stop, die, freeze and thaw, the store
//! failing or slow, a broker link going down.
//!
//! Registry changes are made as the API makes them: the store first, then what the
//! handler tells the engine and the dispatcher of the node the request entered.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latch::domain::client::{Client, generate_secret};
use latch::domain::signals::{Fault, Signals};
use latch::domain::{Millis, Reading, Sensor, SensorId, Source, Status};
use latch::engine::Settings;
use latch::history::retention::{self, Settings as RetentionSettings};
use latch::store::{Outbox, Registry, ReplayFilter, Retention, Sites};

use crate::faults::{Kind, StoreFaults};
use crate::log::{Log, SimClient};
use crate::nodes::{Nodes, State};
use crate::receivers::{Mode, Receivers};
use crate::world::World;

/// A sensor as the workload drives it.
#[derive(Debug, Clone)]
pub struct SimSensor {
    pub id: SensorId,
    /// What it reports now.
    pub data: bool,
    /// It says nothing until then.
    pub silent_until: Millis,
    /// How its readings come in.
    pub source: Source,
    /// The device time of its last reading.
    pub last_ts: Millis,
}

/// The run's moving parts.
pub struct Workload {
    pub world: Arc<World>,
    pub model: crate::model::ModelStore,
    pub nodes: Arc<Nodes>,
    pub receivers: Arc<Receivers>,
    pub faults: Arc<StoreFaults>,
    pub sensors: Vec<SimSensor>,
    pub clients: Vec<SimClient>,
    pub log: Arc<Mutex<Log>>,
    /// The heartbeat timeout and lease of the run's settings.
    pub timeout: Millis,
    pub lease: Millis,
    /// Whether the run is a cluster (nodes may join and leave).
    pub cluster: bool,
    /// A calm run: only the endpoints fail (no node, store or broker link faults), so the
    /// whole run is quiet time in which isolation and prompt liveness are asked for.
    pub calm: bool,
    /// Odd-numbered sensors debounce their changes for a second ([`crate::Options`]).
    pub debounce: bool,
    /// The door alarms workload ([`crate::Options::signals`]): readings carry battery,
    /// tamper and fault reports, and sensors have hold alarms.
    pub signals: bool,
    /// The number the next client created gets (`c{n}`): as the API's ids, never one a
    /// deleted client had.
    pub next_client: usize,
    /// The receivers (URLs) of clients deleted so far: a new client may take one over.
    pub gone: Vec<String>,
    /// The run's retention (short, so a run of a minute sees rows go).
    pub retention: RetentionSettings,
    /// Requests sent with an `Idempotency-Key`, kept for repeats, and the next key's number.
    pub keyed: Vec<(String, Vec<Reading>)>,
    pub next_key: usize,
}

mod audited;
mod clients;
pub(crate) mod holds;
mod keyed;
mod registry;
mod sites;
pub use registry::SITES;

/// The run's first site: every other sensor is in it at the start (its gateway,
/// sometimes, the first).
pub const SITE: &str = "bldg-1";

/// Clients a run holds at most: one created mid-run needs room to be.
const MAX_CLIENTS: usize = 7;

impl Workload {
    /// A node to send through: a running one, drawn.
    fn entry(&self) -> Option<String> {
        let running = self.nodes.in_state(State::Running);
        if running.is_empty() {
            return None;
        }
        let i = self.world.between(0, running.len() as u64) as usize;
        Some(running[i].clone())
    }

    fn trouble(&self, ms: Millis) {
        let now = self.world.now();
        self.log
            .lock()
            .unwrap()
            .troubled
            .push((now, now + ms + 2 * self.lease + 5_000));
    }

    /// Registers the fleet through the first node.
    pub async fn register(&mut self) -> anyhow::Result<()> {
        let node = self
            .entry()
            .ok_or_else(|| anyhow::anyhow!("no node runs"))?;
        let (engine, store, dispatcher) = self.nodes.entry(&node).expect("running");
        let now = self.world.now();
        let gateway = self.world.chance(0.5).then_some(self.sensors[0].id);
        store
            .create_site(latch::domain::site::Site {
                id: SITE.into(),
                name: Some("the building".into()),
                address: None,
                gateway_sensor_id: gateway,
                created_at: now,
                updated_at: now,
            })
            .await?;
        {
            use latch::store::Schedules;
            let mut schedules = vec![sites::silence_hours()];
            if self.signals {
                schedules.push(holds::armed_hours());
            }
            for schedule in schedules {
                store
                    .create_schedule(latch::store::StoredSchedule {
                        schedule,
                        created_at: now,
                        updated_at: now,
                    })
                    .await?;
            }
        }
        for (i, s) in self.sensors.iter().enumerate() {
            let debounce_s = (self.debounce && i % 2 == 1).then_some(1);
            let hold_alarms = self.drawn_holds();
            let sensor = Sensor {
                id: s.id,
                address: format!("{} street", s.id),
                heartbeat_timeout_s: None,
                debounce_s,
                site_id: (i % 2 == 0).then(|| SITE.to_string()),
                created_at: now,
                battery_low_pct: latch::domain::signals::DEFAULT_BATTERY_LOW_PCT,
                labels: Default::default(),
                hold_alarms,
                flap: self.flap_of(i),
                armed: self.armed_of(i),
            };
            let site = sensor.site_id.clone();
            let settings = Settings::new(None, debounce_s, &Self::kept_alarms(&sensor));
            store.create_sensor(sensor).await?;
            engine.upsert_sensor(s.id, settings).await?;
            if self.signals {
                self.world.trace(format!(
                    "{} hold alarms: {}",
                    s.id,
                    holds::describe(&hold_alarms)
                ));
            }
            let mut log = self.log.lock().unwrap();
            if let Some(a) = self.armed_of(i) {
                log.armed.insert(s.id, a);
            }
            log.holds.push(crate::log::HoldSetting {
                sensor: s.id,
                alarms: hold_alarms,
                began: now,
                ended: now,
            });
            log.memberships.push((s.id, site, now, now));
            log.settings.push(crate::log::Setting {
                sensor: s.id,
                timeout: self.timeout,
                debounce: Millis::from(debounce_s.unwrap_or(0)) * 1000,
                began: now,
                ended: now,
            });
        }
        // Under --signals, each of the first clients escalates to the next after 2 s: a
        // chain of two steps.
        let ids: Vec<String> = self.clients.iter().map(|c| c.id.clone()).collect();
        for (i, c) in self.clients.iter().enumerate() {
            let escalation = (self.signals && i < 2 && i + 1 < ids.len()).then(|| {
                latch::domain::escalation::Escalation {
                    after_s: 2,
                    to: ids[i + 1].clone(),
                }
            });
            if let Some(e) = &escalation {
                self.log
                    .lock()
                    .unwrap()
                    .escalations
                    .insert(c.id.clone(), e.clone());
            }
            let client = Client {
                id: c.id.clone(),
                name: c.id.clone(),
                url: format!("https://{}.example/hook", c.id),
                secret: generate_secret(),
                created_at: now,
                escalation,
                ..Client::default()
            };
            store.create_client(client).await?;
            for s in c.links.keys() {
                store.link(c.id.clone(), *s, now).await?;
            }
            if c.healthy {
                self.receivers.set_healthy(&c.id);
            }
        }
        let _ = dispatcher;
        Ok(())
    }

    /// One step of the workload, drawn by weight.
    pub async fn step(&mut self) {
        let roll = self.world.between(0, 100);
        match roll {
            0..40 => self.reading(false),
            40..44 => self.reading(true),
            44..49 => self.burst(),
            49..53 => self.silence(),
            53..60 => self.endpoint(),
            60..63 => self.toggle_link().await,
            63..65 => self.batching().await,
            65..66 => self.rate().await,
            66..67 => self.subscription().await,
            67..70 => self.replay().await,
            70..72 => self.enable().await,
            72..81 if self.calm => self.endpoint(),
            72..78 => self.node_fault().await,
            78..80 => self.store_fault(),
            80..81 => self.link(),
            81..83 => self.add_client().await,
            83..85 => self.delete_client().await,
            85..88 => self.retention().await,
            88..90 => self.dark_site(),
            90..92 => self.maintenance().await,
            92..95 => self.registry().await,
            95..98 if self.signals => self.set_holds().await,
            98..100 => self.acknowledge().await,
            _ => {}
        }
    }

    /// One reading of a sensor that is not silent: a change or a repeat (or a late one).
    fn reading(&mut self, late: bool) {
        let now = self.world.now();
        let awake: Vec<usize> = (0..self.sensors.len())
            .filter(|&i| self.sensors[i].silent_until <= now)
            .collect();
        if awake.is_empty() {
            return;
        }
        let i = awake[self.world.between(0, awake.len() as u64) as usize];
        if !late && self.world.chance(0.6) {
            self.sensors[i].data = !self.sensors[i].data;
        }
        let s = &mut self.sensors[i];
        let ts = if late {
            s.last_ts - 10_000
        } else {
            s.last_ts = now;
            now
        };
        let (id, data, source) = (s.id, if late { !s.data } else { s.data }, s.source);
        let reading = Reading {
            sensor_id: id,
            data,
            ts: Some(ts),
            signals: self.signals(),
        };
        self.send(vec![reading], source);
    }

    /// What a door sensor reports beside its state, now and then (issue #72): a battery
    /// that hovers around the default threshold, the tamper switch, a fault code or its
    /// clearing. Late readings carry them too, and must change none of them.
    fn signals(&self) -> Signals {
        if !self.signals || !self.world.chance(0.4) {
            return Signals::default();
        }
        const CODES: [&str; 2] = ["lock_jam", "motor_2"];
        Signals {
            battery: self
                .world
                .chance(0.6)
                .then(|| self.world.between(14, 29) as u8),
            tamper: self.world.chance(0.3).then(|| self.world.chance(0.5)),
            fault: self.world.chance(0.3).then(|| {
                self.world.chance(0.5).then(|| {
                    Fault::parse(CODES[self.world.between(0, 2) as usize]).expect("a valid code")
                })
            }),
        }
    }

    /// Many sensors change at once.
    fn burst(&mut self) {
        // Now and then a request sent with a key is sent again instead.
        if self.world.chance(0.25) && self.repeat_keyed() {
            return;
        }
        let now = self.world.now();
        let mut readings = Vec::new();
        for s in self.sensors.iter_mut().filter(|s| s.silent_until <= now) {
            s.data = !s.data;
            s.last_ts = now;
            readings.push(Reading {
                sensor_id: s.id,
                data: s.data,
                ts: Some(now),
                signals: Default::default(),
            });
        }
        if !readings.is_empty() {
            // Half the bursts go as a client of `POST /v1/readings` with an
            // `Idempotency-Key` sends them.
            if self.world.chance(0.5) {
                self.send_keyed_new(readings);
            } else {
                self.send(readings, Source::Http);
            }
        }
    }

    /// Sends readings through a running node; what is acknowledged is logged.
    fn send(&self, readings: Vec<Reading>, source: Source) {
        let Some(node) = self.entry() else { return };
        let Some((engine, _, _)) = self.nodes.entry(&node) else {
            return;
        };
        let world = self.world.clone();
        let log = self.log.clone();
        tokio::spawn(async move {
            let items: Vec<_> = readings.iter().cloned().map(Ok).collect();
            let at = engine.now();
            log.lock()
                .unwrap()
                .sent
                .extend(readings.iter().map(|r| (r.sensor_id, source, at)));
            let Ok(ticket) = engine.enqueue(items, at, source).await else {
                return;
            };
            let Ok(report) = ticket.wait().await else {
                return;
            };
            let refused: BTreeSet<usize> = report.rejected.iter().map(|(i, _)| *i).collect();
            let now = world.now();
            let mut log = log.lock().unwrap();
            for (i, r) in readings.iter().enumerate() {
                if !refused.contains(&i) {
                    log.acked.push((r.sensor_id, r.data, now));
                    log.heard.push((r.sensor_id, source, at));
                }
            }
            world.trace(format!(
                "readings via {node}: {} accepted, {} refused",
                report.accepted,
                refused.len()
            ));
        });
    }

    /// Every sensor reports its state again (no change): the run settles without silences.
    pub fn keep_alive(&mut self) {
        let now = self.world.now();
        let mut readings = Vec::new();
        for s in self.sensors.iter_mut() {
            s.silent_until = 0;
            s.last_ts = now;
            readings.push(Reading {
                sensor_id: s.id,
                data: s.data,
                ts: Some(now),
                signals: Default::default(),
            });
        }
        self.send(readings, Source::Http);
    }

    /// Every client's dead letters replayed.
    pub async fn replay_all(&mut self) {
        for i in 0..self.clients.len() {
            self.replay_client(i).await;
        }
    }

    /// A sensor goes silent for longer than its timeout (or a little shorter).
    fn silence(&mut self) {
        let i = self.world.between(0, self.sensors.len() as u64) as usize;
        let ms = self
            .world
            .between(self.timeout as u64 / 2, 2 * self.timeout as u64);
        let s = &mut self.sensors[i];
        s.silent_until = self.world.now() + ms as Millis;
        self.world
            .trace(format!("sensor {} silent for {ms} ms", s.id));
    }

    /// A faultable client's endpoint changes how it answers.
    fn endpoint(&mut self) {
        let faultable: Vec<&SimClient> = self.clients.iter().filter(|c| !c.healthy).collect();
        if faultable.is_empty() {
            return;
        }
        let c = faultable[self.world.between(0, faultable.len() as u64) as usize];
        let mode = match self.world.between(0, 10) {
            0..3 => Mode::Fast,
            3 => Mode::Slow,
            4 => Mode::Hang,
            5 => Mode::Status(500),
            6 => Mode::Status(503),
            7 => Mode::Throttle(self.world.between(1, 4)),
            8 => Mode::Cut,
            _ => Mode::Status(if self.world.chance(0.2) { 410 } else { 502 }),
        };
        self.receivers.set_mode(&c.id, mode);
    }

    /// A (client, sensor) link is made or removed. A call whose answer never came may
    /// have landed: what the run knows of the link is what the store holds after it.
    async fn toggle_link(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((_, store, _)) = self.nodes.entry(&node) else {
            return;
        };
        let ci = self.world.between(0, self.clients.len() as u64) as usize;
        let si = self.world.between(0, self.sensors.len() as u64) as usize;
        let sensor = self.sensors[si].id;
        let now = self.world.now();
        let (cid, had) = (
            self.clients[ci].id.clone(),
            self.clients[ci].links.contains_key(&sensor),
        );
        let resource = format!("clients/{cid}/sensors/{sensor}");
        // A link or unlink that finds it so already changes nothing, and is not recorded.
        let stored = self
            .model
            .read(|t| t.links.contains(&(sensor, cid.clone())));
        let result = if had {
            let call = store.unlink(cid.clone(), sensor);
            self.audited("DELETE", &resource, call, |_| stored).await
        } else {
            let call = store.link(cid.clone(), sensor, now);
            self.audited("PUT", &resource, call, |_| !stored).await
        };
        let c = &mut self.clients[ci];
        let linked = self
            .model
            .read(|t| t.links.contains(&(sensor, c.id.clone())));
        self.world.trace(format!(
            "{} {}/{sensor}: {:?}",
            if linked { "link" } else { "unlink" },
            c.id,
            result.err().map(|e| e.to_string())
        ));
        match linked {
            true => {
                c.links.entry(sensor).or_insert(now);
            }
            false => {
                if c.links.remove(&sensor).is_some() {
                    self.log
                        .lock()
                        .unwrap()
                        .unlinked
                        .push((c.id.clone(), sensor, now));
                }
            }
        }
    }

    /// A retention round, as the store's upkeep runs it on a node (`retention::round`),
    /// with the run's short retention; what it deleted is checked at once.
    pub async fn retention(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, _)) = self.nodes.entry(&node) else {
            return;
        };
        let now = engine.now();
        let from = self.world.now();
        let pruned = retention::round(&*store, None, self.retention, now).await;
        self.world.trace(format!(
            "retention via {node}: {} notifications, {} attempts, {} readings, {} events deleted",
            pruned.notifications, pruned.attempts, pruned.readings, pruned.events
        ));
        let before = |d: Option<Duration>| d.map(|d| now - d.as_millis() as Millis);
        let keep = Retention {
            history_before: before(self.retention.readings),
            notifications_before: before(self.retention.notifications),
            audit_unshipped_kept: false,
        };
        let log = self.log.lock().unwrap();
        crate::checks::retention(&self.world, &self.model, &log, keep, from, self.world.now());
    }

    /// An operator replays a client's dead letters.
    async fn replay(&mut self) {
        let ci = self.world.between(0, self.clients.len() as u64) as usize;
        self.replay_client(ci).await;
    }

    async fn replay_client(&mut self, ci: usize) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let filter = ReplayFilter {
            client_id: self.clients[ci].id.clone(),
            sensor_id: None,
            since: None,
        };
        let client = self.clients[ci].id.clone();
        let failed = self.model.read(|t| {
            t.notifications()
                .map(|r| &r.notification)
                .filter(|n| n.client_id == client && n.status == Status::Failed)
                .map(|n| n.id.clone())
                .collect::<Vec<_>>()
        });
        let call = store.retry_notifications(filter, engine.now());
        match self
            .audited("POST", "notifications/retry", call, |_| true)
            .await
        {
            Ok(refs) => {
                let ids: Vec<&str> = refs.iter().map(|r| r.id.as_str()).collect();
                self.note_replayed(&client, "", &ids);
                dispatcher.deliver(refs);
            }
            // Its answer lost, the replay may have been made all the same (simulation seed
            // 513263): what it put back to pending goes out with the client's next enable
            // or sweep, a replay as any other.
            Err(_) => {
                let back: Vec<String> = self.model.read(|t| {
                    failed
                        .into_iter()
                        .filter(|id| {
                            t.notification(id)
                                .is_some_and(|r| r.notification.status == Status::Pending)
                        })
                        .collect()
                });
                if !back.is_empty() {
                    let ids: Vec<&str> = back.iter().map(String::as_str).collect();
                    self.note_replayed(&client, " (answer lost)", &ids);
                }
            }
        }
    }

    /// Someone at the desk acknowledges an open alarm, through any node (issue #73): its
    /// reminders stop and the clients told of it hear of it.
    async fn acknowledge(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let open: Vec<String> = self.model.read(|t| {
            t.alarms
                .values()
                .filter(|a| a.state == latch::domain::alarm::AlarmState::Open)
                .map(|a| a.id.clone())
                .collect()
        });
        if open.is_empty() {
            return;
        }
        let id = open[self.world.between(0, open.len() as u64) as usize].clone();
        let ack = latch::store::rules::alarms::Ack {
            by: "night desk".into(),
            note: self.world.chance(0.5).then(|| "on it".to_string()),
        };
        let call = latch::store::Alarms::ack_alarm(&*store, id.clone(), ack, engine.now());
        let acked = self
            .audited("POST", &format!("alarms/{id}/ack"), call, |a| {
                matches!(a, latch::store::rules::alarms::Acked::Taken(..))
            })
            .await;
        if let Ok(latch::store::rules::alarms::Acked::Taken(_, made)) = acked {
            self.world.trace(format!(
                "alarm {id} acknowledged on {node}: {} told",
                made.len()
            ));
            dispatcher.deliver(made);
        }
    }

    /// Notifications `ids` of `client` were replayed: the receivers' checks let them come
    /// after newer ones.
    fn note_replayed(&self, client: &str, how: &str, ids: &[&str]) {
        for id in ids {
            self.receivers.replayed(id);
        }
        self.world
            .trace(format!("replay {client}{how}: {}", ids.join(" ")));
    }

    /// An operator enables every disabled client.
    pub async fn enable(&mut self) {
        let Some(node) = self.entry() else { return };
        let Some((_, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        // As the API does: the lanes resume whether or not this call enabled it (one whose
        // answer was lost may have).
        for c in &self.clients {
            let call = store.enable_client(c.id.clone());
            let enabled = self
                .audited(
                    "POST",
                    &format!("clients/{}/enable", c.id),
                    call,
                    // Only one that was disabled changed.
                    |was| *was == Some(true),
                )
                .await;
            if let Ok(Some(was)) = enabled
                && let Ok(pending) = store.load_client_pending(c.id.clone()).await
            {
                self.world
                    .trace(format!("enable {} (was disabled: {was})", c.id));
                self.receivers.enabled(&c.id);
                dispatcher.resume(&c.id, pending);
            }
        }
    }

    /// A node stops, dies, freezes, thaws, or a stopped one starts (joins).
    async fn node_fault(&mut self) {
        let names = self.nodes.names();
        let name = names[self.world.between(0, names.len() as u64) as usize].clone();
        let running = self.nodes.in_state(State::Running).len();
        let roll = self.world.between(0, 10);
        match self.nodes.state(&name) {
            State::Down => {
                self.trouble(0);
                self.nodes.start(&name).await;
            }
            State::Frozen => {
                self.trouble(0);
                self.nodes.thaw(&name);
            }
            State::Running if running > 1 || !self.cluster => {
                self.trouble(self.timeout);
                let life = self.nodes.life(&name);
                match roll {
                    0..4 => self.nodes.terminate(&name),
                    4..7 => {
                        self.log.lock().unwrap().unsure_lives.insert(life);
                        self.nodes.kill(&name)
                    }
                    _ => {
                        self.log.lock().unwrap().unsure_lives.insert(life);
                        self.nodes.freeze(&name);
                        let nodes = self.nodes.clone();
                        let ms = self.world.between(500, 3 * self.lease as u64);
                        tokio::spawn(async move {
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            nodes.thaw(&name);
                        });
                    }
                }
            }
            _ => {}
        }
    }

    /// The store fails or slows for a while.
    fn store_fault(&mut self) {
        let ms = self.world.between(500, 4_000);
        let kind = match self.world.between(0, 4) {
            0 => Kind::Unavailable(0.5),
            1 => Kind::Full(0.5),
            2 => Kind::InDoubt(0.3),
            _ => Kind::Slow(800),
        };
        self.trouble(ms as Millis);
        self.faults.open(kind, ms);
    }

    /// latch's link to the AMQP broker goes down for a while, then comes back.
    fn link(&mut self) {
        let ms = self.world.between(1_000, self.timeout as u64 * 2);
        self.trouble(ms as Millis);
        let nodes = self.nodes.clone();
        let world = self.world.clone();
        self.world.trace(format!("amqp link down for {ms} ms"));
        nodes.set_link(false);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            world.trace("amqp link up");
            nodes.set_link(true);
        });
    }
}

/// Draws for the closures that change a client.
mod latch_rng {
    use std::sync::Arc;

    use crate::world::World;

    pub struct Draw(pub Arc<World>);

    impl Draw {
        pub fn chance(&mut self, p: f64) -> bool {
            self.0.chance(p)
        }
        pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
            self.0.between(lo, hi)
        }
    }
}
