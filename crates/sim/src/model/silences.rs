//! Silences: `store/{sqlite,postgres}/silences.rs`. Applying a silence and reconciling an
//! ended one are latch's own (`store::rules::silences`); here are the silence tables'
//! operations and the API's reads and writes of silences.

use std::collections::HashSet;

use async_trait::async_trait;

use latch::domain::Event;
use latch::domain::schedule::Schedule;
use latch::domain::silence::{self, Silence, SilenceState, View};

use latch::domain::{Connection, Millis, Notification, NotificationRef, SensorId, Status};
use latch::store::rules::commit::Newer;
use latch::store::rules::silences::{LinkedSensor, Pair, Silenced};
use latch::store::rules::sites::SiteRetold;
use latch::store::rules::{self};
use latch::store::{Page, PageRequest, Result, Silences};

use super::node::NodeStore;
use super::registry::{after, page_of};
use super::tables::{Cx, Tables};

/// Whether silence `s` matches the pair (any type), as `matches_pair` of both backends.
fn matches_pair(t: &Tables, s: &Silence, client: &str, sensor: SensorId) -> bool {
    let m = &s.matcher;
    m.client_id.as_deref().is_none_or(|c| c == client)
        && m.sensor_ids
            .as_ref()
            .is_none_or(|ids| ids.contains(&sensor))
        && m.site_id.as_ref().is_none_or(|site| {
            t.sensors.get(&sensor).and_then(|x| x.site_id.as_ref()) == Some(site)
        })
}

fn active(s: &Silence, now: Millis) -> bool {
    s.starts_at <= now && s.ends_at > now
}

impl Tables {
    /// Marks silenced the new notifications (`seqs`) a silence active at `now` matches and
    /// notes their pairs (`rules::silences::apply`); answers their seqs.
    pub(super) fn silence_new(
        &mut self,
        cx: &Cx,
        seqs: &[i64],
        now: Millis,
    ) -> Result<HashSet<i64>> {
        rules::now_or_never(rules::silences::apply(
            &mut SilenceTables { t: self, cx },
            seqs,
            now,
        ))
    }

    /// The pairs silence `s` matches (by the sensor's site when noted, or now) that no
    /// other silence active at `now` holds (`matched_pair` of both backends).
    fn pairs_of(&self, s: &Silence, now: Millis) -> Vec<(String, SensorId)> {
        self.silenced_pairs
            .iter()
            .filter(|((c, x), (site, _, _))| {
                matches_pair(self, s, c, *x)
                    || (site.is_some()
                        && s.matcher.site_id == *site
                        && matches_pair(
                            self,
                            &Silence {
                                matcher: latch::domain::silence::Match {
                                    site_id: None,
                                    ..s.matcher.clone()
                                },
                                ..s.clone()
                            },
                            c,
                            *x,
                        ))
            })
            .filter(|((c, x), _)| {
                !self
                    .silences
                    .values()
                    .any(|o| o.id != s.id && active(o, now) && matches_pair(self, o, c, *x))
            })
            .map(|(pair, _)| pair.clone())
            .collect()
    }

    /// `SITE_WILL_TELL`: the sensor's site holds events of it its decision will release
    /// to `client`.
    fn site_will_tell(&self, client: &str, sensor: SensorId) -> bool {
        let Some(site) = self
            .sensors
            .get(&sensor)
            .and_then(|s| s.site_id.clone())
            .filter(|s| self.sites.contains_key(s))
        else {
            return false;
        };
        let st = self.site_states.get(&site).cloned().unwrap_or_default();
        let told = st.told.contains(&sensor) && st.told_clients.iter().any(|c| c == client);
        self.site_held.iter().any(|(h, (s, e))| {
            *s == site && e.sensor_id == sensor && (!st.down || *h > st.released || told)
        })
    }

    /// What `client` knows of `sensor` past `since` (`silences::view`).
    fn view(&self, client: &str, sensor: SensorId, since: i64) -> Option<View> {
        let lane: Vec<&Notification> = self
            .lanes
            .get(&(sensor, client.to_string()))
            .into_iter()
            .flatten()
            .filter_map(|seq| self.notifications.get(seq))
            .map(|r| &r.notification)
            .collect();
        let told = |n: &Notification| {
            n.seq > since && matches!(n.status, Status::Delivered | Status::Pending)
        };
        let own = lane.iter().rev().find(|n| told(n) && !n.kind.is_site());
        let after = own.map_or(since, |n| n.seq);
        // A site's event that named it, in whatever lane (`silence::site_view`).
        let by_site = self
            .notifications
            .range(after + 1..)
            .rev()
            .map(|(_, r)| &r.notification)
            .filter(|n| n.client_id == client && n.kind.is_site() && told(n))
            .find_map(|n| silence::site_view(n.kind, n.body.as_deref(), sensor));
        by_site.or_else(|| own.map(|n| View::after(n.kind, n.data)))
    }
}

impl Tables {
    /// Notes that silence `id` holds the window `[starts_at, ends_at)` from `since` on.
    fn held_window(&mut self, id: &str, starts_at: Millis, ends_at: Millis, since: Millis) {
        let held = self.silence_windows.entry(id.to_string()).or_default();
        match held.last_mut() {
            // Ended or extended: the same window, with its end changed.
            Some(w) if w.starts_at == starts_at || ends_at <= w.ends_at => {
                w.ends_at = w.ends_at.max(ends_at);
            }
            _ => held.push(super::tables::HeldWindow {
                starts_at,
                ends_at,
                since,
            }),
        }
    }
}

/// Silences' tables in the model ([`rules::silences`]): the sequence is latch's own.
struct SilenceTables<'a> {
    t: &'a mut Tables,
    cx: &'a Cx,
}

impl rules::silences::SilenceTables for SilenceTables<'_> {
    async fn mark_silenced(&mut self, seqs: &[i64], now: Millis) -> Result<Vec<Silenced>> {
        let t = &mut *self.t;
        let mut silenced = Vec::new();
        for seq in seqs {
            let Some(r) = t.notifications.get(seq) else {
                continue;
            };
            let n = &r.notification;
            if n.status != Status::Pending {
                continue;
            }
            if t.silences.values().any(|s| {
                active(s, now)
                    && matches_pair(t, s, &n.client_id, n.sensor_id)
                    && s.matcher.types.as_ref().is_none_or(|x| x.contains(&n.kind))
            }) {
                silenced.push(Silenced {
                    seq: *seq,
                    client_id: n.client_id.clone(),
                    sensor_id: n.sensor_id,
                    kind: n.kind,
                    body: n.body.clone(),
                    data: n.data,
                    previous: n.previous,
                });
            }
        }
        for s in &silenced {
            t.set_status(self.cx, s.seq, Status::Silenced, now);
        }
        Ok(silenced)
    }

    async fn note_pairs(&mut self, pairs: &[Pair]) -> Result<()> {
        for p in pairs {
            let site = self
                .t
                .sensors
                .get(&p.sensor_id)
                .and_then(|s| s.site_id.clone());
            self.t
                .silenced_pairs
                .entry((p.client_id.clone(), p.sensor_id))
                .or_insert((site, p.before, p.since));
        }
        Ok(())
    }

    async fn take_ended(&mut self, ended_by: Millis, now: Millis) -> Result<Vec<String>> {
        let ended: Vec<String> = self
            .t
            .silences
            .values()
            .filter(|s| s.ends_at <= ended_by && s.reconciled_at.is_none())
            .map(|s| s.id.clone())
            .collect();
        for id in &ended {
            self.t.silences.get_mut(id).expect("listed").reconciled_at = Some(now);
        }
        Ok(ended)
    }

    /// As the backends' join of `silences` and `schedules`.
    async fn follows(&mut self, id: &str) -> Result<Option<(Schedule, Millis)>> {
        let t = &*self.t;
        Ok(t.silences
            .get(id)
            .filter(|s| s.ended_at.is_none())
            .and_then(|s| {
                let schedule = t.schedules.get(s.schedule_id.as_ref()?)?;
                Some((schedule.schedule.clone(), s.ends_at))
            }))
    }

    async fn move_window(&mut self, id: &str, starts_at: Millis, ends_at: Millis) -> Result<()> {
        if let Some(s) = self.t.silences.get_mut(id) {
            s.starts_at = starts_at;
            s.ends_at = ends_at;
            s.reconciled_at = None;
            self.t.held_window(id, starts_at, ends_at, self.cx.now);
        }
        Ok(())
    }

    async fn take_pairs(&mut self, id: &str, now: Millis) -> Result<Vec<Pair>> {
        let Some(s) = self.t.silences.get(id).cloned() else {
            return Ok(Vec::new());
        };
        let pairs = self.t.pairs_of(&s, now);
        Ok(pairs
            .into_iter()
            .filter_map(|(client_id, sensor_id)| {
                let (_, before, since) = self
                    .t
                    .silenced_pairs
                    .remove(&(client_id.clone(), sensor_id))?;
                Some(Pair {
                    client_id,
                    sensor_id,
                    before,
                    since,
                })
            })
            .collect())
    }

    async fn site_of(&mut self, sensor: SensorId) -> Result<Option<String>> {
        Ok(self.t.sensors.get(&sensor).and_then(|x| x.site_id.clone()))
    }

    async fn retell_site(
        &mut self,
        site: &str,
        client: &str,
        now: Millis,
    ) -> Result<Option<SiteRetold>> {
        let mut t = super::sites::SiteTables {
            t: self.t,
            cx: self.cx,
        };
        rules::sites::retell(&mut t, site, client, now).await
    }

    async fn site_told(&mut self, r: &SiteRetold) -> Result<()> {
        let st = self.t.site_states.entry(r.site.clone()).or_default();
        if !st.told_clients.contains(&r.client) {
            st.told_clients.push(r.client.clone());
            st.retold.push((r.client.clone(), st.released));
        }
        Ok(())
    }

    async fn site_will_tell(&mut self, client: &str, sensor: SensorId) -> Result<bool> {
        Ok(self.t.site_will_tell(client, sensor))
    }

    async fn view(&mut self, client: &str, sensor: SensorId, since: i64) -> Result<Option<View>> {
        Ok(self.t.view(client, sensor, since))
    }

    async fn told_by_site(&mut self, client: &str, sensor: SensorId) -> Result<bool> {
        let t = &*self.t;
        Ok(t.sensors
            .get(&sensor)
            .and_then(|s| s.site_id.as_ref())
            .and_then(|site| t.site_states.get(site))
            .is_some_and(|st| {
                st.down && st.told.contains(&sensor) && st.told_clients.iter().any(|c| c == client)
            }))
    }

    /// As the backends' join of `links`, `clients` and `sensor_state`.
    async fn linked(&mut self, client: &str, sensor: SensorId) -> Result<Option<LinkedSensor>> {
        let t = &*self.t;
        if !t.linked(client, sensor) {
            return Ok(None);
        }
        let Some(c) = t.clients.get(client) else {
            return Ok(None);
        };
        let st = t.states.get(&sensor).copied();
        Ok(Some(LinkedSensor {
            data: st.and_then(|s| s.data),
            connection: st.map_or(Connection::Unknown, |s| s.connection),
            last_seen_at: st.and_then(|s| s.last_seen_at),
            events: c.client.events.clone(),
        }))
    }

    async fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        now: Millis,
    ) -> Result<NotificationRef> {
        Ok(self
            .t
            .make_pending(self.cx, client.to_string(), e, None, None, now))
    }

    async fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> Result<()> {
        for n in newer {
            self.t
                .supersede_older(self.cx, n.sensor, n.client, n.seq, now);
        }
        Ok(())
    }
}

#[async_trait]
impl Silences for NodeStore {
    async fn create_silence(&self, silence: Silence) -> Result<()> {
        self.audited(
            "create_silence",
            Some(silence.id.clone()),
            |t, cx| {
                t.held_window(&silence.id, silence.starts_at, silence.ends_at, cx.now);
                t.silences.insert(silence.id.clone(), silence);
                Ok(())
            },
            |_, r| Some(r),
        )
        .await
    }

    async fn get_silence(&self, id: String) -> Result<Option<Silence>> {
        self.run("get_silence", false, |t, _| {
            Ok(t.silences.get(&id).cloned())
        })
        .await
    }

    async fn list_silences(
        &self,
        state: Option<SilenceState>,
        now: Millis,
        page: PageRequest,
    ) -> Result<Page<Silence>> {
        self.run("list_silences", false, |t, _| {
            let rows = t
                .silences
                .values()
                .filter(|s| after(&s.id, &page))
                .filter(|s| state.is_none_or(|st| s.state(now) == st))
                .cloned();
            Ok(page_of(rows, &page, |s| s.id.clone()))
        })
        .await
    }

    async fn update_silence(&self, silence: Silence) -> Result<bool> {
        self.audited(
            "update_silence",
            None,
            |t, cx| {
                // As the backends' `UPDATE_RECONCILED`.
                let Some(s) = t
                    .silences
                    .get_mut(&silence.id)
                    .filter(|s| s.reconciled_at.is_none() || s.follows_schedule())
                else {
                    return Ok(false);
                };
                if silence.ends_at > s.ends_at {
                    s.reconciled_at = None;
                }
                s.starts_at = silence.starts_at;
                s.ends_at = silence.ends_at;
                s.comment = silence.comment;
                s.updated_at = silence.updated_at;
                s.schedule_id = silence.schedule_id;
                s.ended_at = silence.ended_at;
                t.held_window(&silence.id, silence.starts_at, silence.ends_at, cx.now);
                t.silence_written_at.insert(silence.id, cx.now);
                Ok(true)
            },
            |ok, r| ok.then_some(r),
        )
        .await
    }

    async fn silences_following(&self, schedule_id: String) -> Result<Vec<Silence>> {
        self.run("silences_following", false, |t, _| {
            Ok(t.silences
                .values()
                .filter(|s| s.schedule_id.as_ref() == Some(&schedule_id) && s.ended_at.is_none())
                .cloned()
                .collect())
        })
        .await
    }

    async fn reconcile_silences(
        &self,
        ended_by: Millis,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        self.run("reconcile_silences", true, |t, cx| {
            let made = rules::now_or_never(rules::silences::reconcile_ended(
                &mut SilenceTables { t, cx },
                ended_by,
                now,
            ))?;
            t.silence_made.extend(made.iter().map(|m| m.seq));
            Ok(made)
        })
        .await
    }
}
