//! The group commit's tables and what the engine loads. The commit's sequence is latch's
//! own (`store::rules::commit`); here are its table operations as both backends' statements
//! write them (`store/sqlite/commit.rs`, `store/postgres/commit.rs`, with the registry reads
//! of both `registry.rs`): the fence (every partition still held at its epoch), the rows of
//! sensors still registered (a batch for a sensor deleted meanwhile writes nothing of it),
//! one notification per event and linked client that wants its type, and the supersede
//! statement.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use async_trait::async_trait;

use latch::domain::client::wants;
use latch::domain::policy::{self, Queued};
use latch::domain::{Event, EventKind, Millis, NotificationRef, SensorId, Status};
use latch::store::rules::{self, commit::Made, commit::Newer};
use latch::store::{CommitBatch, Error, Fence, Result, Runtime, SensorRuntime, StateUpdate};

use super::node::NodeStore;
use super::tables::{Cx, StateRow, Tables};

impl Tables {
    /// The partitions of `fence` no longer held at their epoch, sorted (`commit::fenced`).
    pub(super) fn fenced(&self, fence: &[Fence]) -> Vec<u32> {
        let mut lost: Vec<u32> = fence
            .iter()
            .filter(|f| {
                let held = self
                    .cluster
                    .partitions
                    .get(f.partition as usize)
                    .filter(|p| p.owner.is_some())
                    .map(|p| p.epoch);
                held != Some(f.epoch)
            })
            .map(|f| f.partition)
            .collect();
        lost.sort_unstable();
        lost.dedup();
        lost
    }

    /// One state update over the stored row, as the backends' upsert writes it:
    /// `changed_at` and `last_source` kept when not given, `lost_since` and `reminders`
    /// kept while lost when not given and cleared once not lost.
    fn write_state(&mut self, s: &StateUpdate) {
        let old = self.states.get(&s.sensor_id).copied();
        let lost = s.connection == latch::domain::Connection::Lost;
        let row = StateRow {
            data: s.data,
            changed_at: s.changed_at.or(old.and_then(|o| o.changed_at)),
            last_ts: s.last_ts,
            last_seen_at: s.last_seen_at,
            connection: s.connection,
            last_source: s.last_source.or(old.and_then(|o| o.last_source)),
            debounce: s.debounce,
            lost_since: lost
                .then(|| s.lost_since.or(old.and_then(|o| o.lost_since)))
                .flatten(),
            reminders: lost
                .then(|| s.reminders.or(old.and_then(|o| o.reminders)))
                .flatten(),
            signals: s.signals,
            hold: s.hold,
            flapping: s.flapping,
        };
        self.states.insert(s.sensor_id, row);
    }

    /// The rows of a commit batch of sensors still registered (`CommitTables::write_rows`);
    /// answers the places of the events written.
    fn write_rows(&mut self, cx: &Cx, batch: &CommitBatch, now: Millis) -> Vec<usize> {
        let known = |t: &Tables, id: SensorId| t.sensors.contains_key(&id);
        let by = self.audit.commit_begins(now, cx.node.clone());
        for r in &batch.readings {
            if known(self, r.sensor_id) {
                self.next.reading += 1;
                self.readings.insert(self.next.reading, *r);
                self.audit
                    .committed_reading(self.next.reading, *r, by.clone());
            }
        }
        for k in &batch.keyed {
            self.idempotency_applied
                .push((k.key.to_string(), k.positions.clone(), now));
        }
        if self.shared {
            // PostgreSQL upserts one state per sensor, the batch's last: an upsert may not
            // touch a row twice.
            let mut last: BTreeMap<SensorId, usize> = BTreeMap::new();
            for (i, s) in batch.states.iter().enumerate() {
                last.insert(s.sensor_id, i);
            }
            let mut idx: Vec<usize> = last.into_values().collect();
            idx.sort_unstable();
            for i in idx {
                if known(self, batch.states[i].sensor_id) {
                    self.write_state(&batch.states[i]);
                }
            }
        } else {
            // SQLite updates each in turn.
            for s in &batch.states {
                if known(self, s.sensor_id) {
                    self.write_state(s);
                }
            }
        }
        let mut written = Vec::new();
        for (k, e) in batch.events.iter().enumerate() {
            if known(self, e.sensor_id) {
                self.next.event += 1;
                self.events.insert(self.next.event, e.clone());
                self.audit
                    .committed_event(self.next.event, e.clone(), by.clone());
                written.push(k);
            }
        }
        written
    }

    /// The supersede rule as both backends' `UPDATE … SET status = 'superseded'` applies
    /// it: the sensor's pending state notifications older than `first` whose lease is
    /// unset or ran out. (Every client linked to the sensor got a newer one in the same
    /// commit, so per sensor is per lane for them; a silence's end makes one for one
    /// `client`, whose lane alone it supersedes in.) The rule itself is the policy's, so a
    /// change to it reaches the model as it must reach both statements.
    pub(super) fn supersede_older(
        &mut self,
        cx: &Cx,
        sensor: SensorId,
        client: Option<&str>,
        first: i64,
        now: Millis,
    ) {
        let newer = Queued {
            seq: first,
            kind: EventKind::StateChanged,
        };
        let mut doomed: Vec<i64> = self
            .lanes
            .range((sensor, String::new())..)
            .take_while(|((s, _), _)| *s == sensor)
            // Every linked client's lane (one reached by escalation is not linked).
            .filter(|((s, c), _)| match client {
                Some(client) => c == client,
                None => self.links.contains(&(*s, c.clone())),
            })
            .flat_map(|(_, seqs)| seqs.range(..first))
            .copied()
            .filter(|seq| {
                let r = &self.notifications[seq];
                let n = &r.notification;
                let older = Queued {
                    seq: n.seq,
                    kind: n.kind,
                };
                let leased = r.lease_until.is_some_and(|until| until >= now);
                n.status == Status::Pending && policy::supersedes(newer, older, leased)
            })
            .collect();
        doomed.sort_unstable();
        for seq in doomed {
            self.set_status(cx, seq, Status::Superseded, now);
        }
    }

    /// Sensors created, changed or deleted after change `after`, each with its state now
    /// (`None`: deleted), and the newest change (`ClusterStore::registry_changes` in `postgres/cluster.rs`).
    pub(super) fn registry_changes(
        &self,
        after: i64,
    ) -> (i64, Vec<(SensorId, Option<SensorRuntime>)>) {
        if !self.shared {
            // One process per store: its engine saw every change itself.
            return (after, Vec::new());
        }
        let later = self.changes.range(after.saturating_add(1)..);
        let newest = later.clone().map(|(&seq, _)| seq).max().unwrap_or(after);
        let ids: BTreeSet<SensorId> = later.clone().map(|(_, (id, _, _))| *id).collect();
        let deleted: BTreeSet<SensorId> = later
            .filter(|(_, (_, _, deleted))| *deleted)
            .map(|(_, (id, _, _))| *id)
            .collect();
        let changed = ids.into_iter().map(|id| (id, self.runtime(id))).collect();
        (newest, latch::store::with_lives_ended(changed, &deleted))
    }
}

#[async_trait]
impl Runtime for NodeStore {
    async fn load_runtime(&self) -> Result<Vec<SensorRuntime>> {
        self.run("load_runtime", false, |t, _| Ok(t.states())).await
    }

    async fn load_states(&self, ids: Vec<SensorId>) -> Result<Vec<SensorRuntime>> {
        self.run("load_states", false, |t, _| {
            Ok(ids.iter().filter_map(|&id| t.runtime(id)).collect())
        })
        .await
    }

    async fn commit(&self, batch: CommitBatch, now: Millis) -> Result<Vec<NotificationRef>> {
        self.run("commit", true, |t, cx| {
            rules::now_or_never(rules::commit::commit(
                &mut CommitTables { t, cx },
                &batch,
                now,
            ))
        })
        .await
    }
}

/// A group commit's tables in the model ([`rules::commit`]): the sequence is latch's own.
struct CommitTables<'a> {
    t: &'a mut Tables,
    cx: &'a Cx,
}

super::alarms::alarm_tables!(CommitTables<'_>);

impl rules::armed::ArmedTables for CommitTables<'_> {
    /// As both stores join `sensors`, `schedules` and the unresolved alarms.
    async fn armed(&mut self, sensors: &[SensorId]) -> Result<Vec<rules::armed::ArmedRow>> {
        let t = &*self.t;
        Ok(sensors
            .iter()
            .filter_map(|id| {
                let s = t.sensors.get(id)?;
                let open = t.alarms.values().any(|a| {
                    a.sensor_id == Some(*id)
                        && a.kind == latch::domain::alarm::AlarmKind::OutOfSchedule
                        && a.resolved_at.is_none()
                });
                if s.armed.is_none() && !open {
                    return None;
                }
                let armed = s.armed.clone().and_then(|a| {
                    let schedule = t.schedules.get(&a.schedule_id)?.schedule.clone();
                    Some((a, schedule))
                });
                Some(rules::armed::ArmedRow {
                    sensor_id: *id,
                    armed,
                })
            })
            .collect())
    }

    async fn describe(&mut self, bodies: &[(i64, String)]) -> Result<()> {
        for (seq, body) in bodies {
            if let Some(n) = self.t.notifications.get_mut(seq) {
                n.notification.body = Some(body.clone());
                self.t.audit.retold(*seq, Some(body.clone()));
            }
        }
        Ok(())
    }
}

impl rules::commit::CommitTables for CommitTables<'_> {
    async fn fenced(&mut self, fence: &[Fence]) -> Result<Vec<u32>> {
        if !self.t.shared && !fence.is_empty() {
            // SQLite stays one node: no leases to check a fence against.
            return Err(Error::Backend("cluster fencing needs PostgreSQL".into()));
        }
        Ok(self.t.fenced(fence))
    }

    async fn write_rows(&mut self, batch: &CommitBatch, now: Millis) -> Result<Vec<usize>> {
        Ok(self.t.write_rows(self.cx, batch, now))
    }

    async fn hold_for_sites(&mut self, events: &[&Event], now: Millis) -> Result<HashSet<usize>> {
        let mut t = super::sites::SiteTables {
            t: self.t,
            cx: self.cx,
        };
        rules::sites::hold_for_sites(&mut t, events, now).await
    }

    async fn fan_out(
        &mut self,
        events: &[&Event],
        held: &HashSet<usize>,
        alarm_ids: &[Option<String>],
        now: Millis,
    ) -> Result<Vec<Made>> {
        let mut made = Vec::new();
        for (k, e) in events.iter().enumerate() {
            if held.contains(&k) {
                continue;
            }
            let t = &mut *self.t;
            let clients: Vec<String> = t
                .clients_of(e.sensor_id)
                .filter(|c| {
                    // A link whose client is missing (LEFT JOIN) wants every type.
                    t.clients
                        .get(*c)
                        .is_none_or(|row| wants(&row.client.events, e.kind))
                })
                .cloned()
                .collect();
            for client_id in clients {
                let alarm_id = alarm_ids.get(k).cloned().flatten();
                let n = t.make_pending(self.cx, client_id, e, None, alarm_id, now);
                made.push(Made {
                    event: k,
                    seq: n.seq,
                    id: n.id,
                    client_id: n.client_id,
                });
            }
        }
        Ok(made)
    }

    async fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> Result<()> {
        for n in newer {
            self.t
                .supersede_older(self.cx, n.sensor, n.client, n.seq, now);
        }
        Ok(())
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        self.t.silence_new(self.cx, seqs, now)
    }
}
