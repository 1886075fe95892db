//! Sites and silences: `store/{sqlite,postgres}/sites.rs` and `silences.rs`. A commit marks
//! `silenced` the notifications a silence active at its `now` matches and notes their
//! (client, sensor) pairs; an ended silence is reconciled once, each of its pairs that no
//! other active silence holds brought up to date by the domain's rule
//! (`silence::reconcile`).

use async_trait::async_trait;

use latch::domain::Event;
use latch::domain::silence::{self, Silence, SilenceState, View};
use std::collections::{HashMap, HashSet};

use latch::domain::site::decide::{HeldEvent, Linked, Member, Rules, SiteState};
use latch::domain::site::{Site, SiteCounts, SiteTotals};
use latch::domain::{Connection, Millis, Notification, NotificationRef, SensorId, Status};
use latch::store::rules::commit::Newer;
use latch::store::rules::silences::{LinkedSensor, Pair, Silenced, SiteRetold};
use latch::store::rules::sites::SiteOf;
use latch::store::rules::{self};
use latch::store::{Decided, Error, Page, PageRequest, Result, SensorView, Silences, Sites};

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
    fn decide_sites(&mut self, cx: &Cx, rules: Rules, now: Millis) -> Decided {
        // As the backends' `DUE`: those whose grace ran out or that a change asks to decide
        // first, then those with held events not released yet; on SQLite 500 a call.
        let mut due: Vec<(bool, String)> = self
            .sites
            .keys()
            .filter_map(|id| {
                let st = self.site_states.get(id).cloned().unwrap_or_default();
                let unreleased = self
                    .site_held
                    .iter()
                    .any(|(h, (s, _))| s == id && *h > st.released);
                let due = match st.pending_since {
                    Some(p) => st.down || p <= now - rules.grace,
                    None => unreleased,
                };
                due.then(|| (st.pending_since.is_none(), id.clone()))
            })
            .collect();
        due.sort();
        // PostgreSQL decides every due site in a call, SQLite up to 500 (a run sets fewer,
        // `ModelStore::decide_sites_per_call`).
        let per_call = match self.shared {
            true => usize::MAX,
            false => self.sites_per_call,
        };
        let due: Vec<String> = due.into_iter().take(per_call).map(|(_, id)| id).collect();
        let more = due.len() == per_call;
        let due: Vec<(Site, SiteState)> = due
            .into_iter()
            .map(|id| {
                let state = self.site_states.get(&id).cloned().unwrap_or_default();
                (self.sites[&id].clone(), state)
            })
            .collect();
        let decided = rules::now_or_never(rules::sites::decide_due(
            &mut SiteTables { t: self, cx },
            due,
            rules,
            now,
        ))
        .expect("the model's site tables never fail");
        Decided { more, ..decided }
    }

    /// The sensors of site `id`, by id (`site_rounds::members`).
    fn site_members(&self, id: &str) -> Vec<Member> {
        self.sensors
            .values()
            .filter(|s| s.site_id.as_deref() == Some(id))
            .map(|s| {
                let st = self.states.get(&s.id);
                Member {
                    id: s.id,
                    address: s.address.clone(),
                    connection: st.map_or(Connection::Unknown, |st| st.connection),
                    data: st.and_then(|st| st.data),
                    last_seen_at: st.and_then(|st| st.last_seen_at),
                }
            })
            .collect()
    }

    /// The clients linked to site `id`'s sensors, by id, each with its sensors of the site
    /// (`site_rounds::linked`).
    fn site_clients(&self, id: &str) -> Vec<Linked> {
        let members: Vec<SensorId> = self.site_members(id).iter().map(|m| m.id).collect();
        let mut clients: Vec<Linked> = Vec::new();
        for (sensor, client_id) in &self.links {
            if !members.contains(sensor) {
                continue;
            }
            let events = self
                .clients
                .get(client_id)
                .and_then(|c| c.client.events.clone());
            match clients.iter_mut().find(|c| c.client_id == *client_id) {
                Some(c) => c.sensors.push(*sensor),
                None => clients.push(Linked {
                    client_id: client_id.clone(),
                    events,
                    sensors: vec![*sensor],
                }),
            }
        }
        clients.sort_by(|a, b| a.client_id.cmp(&b.client_id));
        for c in &mut clients {
            c.sensors.sort();
        }
        clients
    }

    /// As `rows::SITE_TOTALS`.
    fn site_totals(&self) -> SiteTotals {
        let up = |site: &String| self.site_states.get(site).is_none_or(|s| !s.down);
        SiteTotals {
            down: self.site_states.values().filter(|s| s.down).count() as u64,
            held: self.site_held.values().filter(|(s, _)| up(s)).count() as u64,
            oldest_grace: self
                .site_states
                .values()
                .filter(|s| !s.down)
                .filter_map(|s| s.pending_since)
                .min(),
        }
    }

    fn site_counts(&self, site: &Site) -> SiteCounts {
        let lost = |id: &SensorId| {
            self.states
                .get(id)
                .is_some_and(|st| st.connection == Connection::Lost)
        };
        let members: Vec<SensorId> = self
            .sensors
            .values()
            .filter(|s| s.site_id.as_deref() == Some(site.id.as_str()))
            .map(|s| s.id)
            .collect();
        SiteCounts {
            sensors: members.len() as u64,
            lost: members.iter().filter(|id| lost(id)).count() as u64,
            gateway_lost: site.gateway_sensor_id.as_ref().is_some_and(lost),
            down: self.site_states.get(&site.id).is_some_and(|s| s.down),
            since: self.site_states.get(&site.id).and_then(|s| s.since),
        }
    }

    /// Marks silenced the new notifications (`seqs`) a silence active at `now` matches and
    /// notes their pairs (`rules::silences::apply`); answers their seqs.
    pub(super) fn silence_new(&mut self, cx: &Cx, seqs: &[i64], now: Millis) -> Vec<i64> {
        let silenced = rules::now_or_never(rules::silences::apply(
            &mut SilenceTables { t: self, cx },
            seqs,
            now,
        ))
        .expect("the model's silence tables never fail");
        let mut seqs: Vec<i64> = silenced.into_iter().collect();
        seqs.sort_unstable();
        seqs
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
        let mut t = SiteTables {
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
            .make_pending(self.cx, client.to_string(), e, None, now))
    }

    async fn supersede(&mut self, newer: &[Newer<'_>], now: Millis) -> Result<()> {
        for n in newer {
            self.t
                .supersede_older(self.cx, n.sensor, n.client, n.seq, now);
        }
        Ok(())
    }
}

/// Sites' tables in the model ([`rules::sites`]): the sequence is latch's own.
pub(super) struct SiteTables<'a> {
    pub t: &'a mut Tables,
    pub cx: &'a Cx,
}

impl rules::sites::SiteTables for SiteTables<'_> {
    async fn sites_of(&mut self, sensors: &[SensorId]) -> Result<HashMap<SensorId, SiteOf>> {
        let t = &*self.t;
        Ok(sensors
            .iter()
            .filter_map(|&sensor| {
                let site = t
                    .sensors
                    .get(&sensor)
                    .and_then(|s| s.site_id.clone())
                    .filter(|s| t.sites.contains_key(s))?;
                let state = t.site_states.get(&site).cloned().unwrap_or_default();
                let held = t
                    .site_held
                    .values()
                    .any(|(s, h)| *s == site && h.sensor_id == sensor);
                Some((sensor, SiteOf { site, state, held }))
            })
            .collect())
    }

    async fn hold(&mut self, held: &[(&str, &Event)], asked: &[&str], now: Millis) -> Result<()> {
        for (site, e) in held {
            self.t.next.held += 1;
            let id = self.t.next.held;
            self.t
                .site_held
                .insert(id, (site.to_string(), (*e).clone()));
        }
        for site in asked {
            let st = self.t.site_states.entry(site.to_string()).or_default();
            st.pending_since.get_or_insert(now);
        }
        Ok(())
    }

    async fn site(&mut self, id: &str) -> Result<Option<(Site, SiteState)>> {
        let state = self.t.site_states.get(id).cloned().unwrap_or_default();
        Ok(self.t.sites.get(id).map(|s| (s.clone(), state)))
    }

    async fn members(&mut self, site: &str) -> Result<Vec<Member>> {
        Ok(self.t.site_members(site))
    }

    async fn held_events(&mut self, site: &str) -> Result<(Vec<HeldEvent>, Option<i64>)> {
        let held: Vec<HeldEvent> = self
            .t
            .site_held
            .iter()
            .filter(|(_, (s, _))| s == site)
            .map(|(k, (_, event))| HeldEvent {
                id: *k,
                event: event.clone(),
            })
            .collect();
        let last = held.last().map(|h| h.id);
        Ok((held, last))
    }

    async fn linked(&mut self, site: &str) -> Result<Vec<Linked>> {
        Ok(self.t.site_clients(site))
    }

    async fn insert_one(
        &mut self,
        client: &str,
        e: &Event,
        body: Option<&str>,
        now: Millis,
    ) -> Result<NotificationRef> {
        Ok(self.t.make_pending(
            self.cx,
            client.to_string(),
            e,
            body.map(str::to_string),
            now,
        ))
    }

    async fn consume_held(&mut self, site: &str, last: i64) -> Result<()> {
        self.t
            .site_held
            .retain(|id, (s, _)| !(s == site && *id <= last));
        Ok(())
    }

    async fn silence_new(&mut self, seqs: &[i64], now: Millis) -> Result<HashSet<i64>> {
        Ok(self.t.silence_new(self.cx, seqs, now).into_iter().collect())
    }

    async fn write_state(&mut self, site: &str, state: &SiteState) -> Result<()> {
        self.t.site_states.insert(site.to_string(), state.clone());
        Ok(())
    }
}

#[async_trait]
impl Sites for NodeStore {
    async fn create_site(&self, site: Site) -> Result<()> {
        self.run("create_site", true, |t, _| {
            if t.sites.contains_key(&site.id) {
                return Err(Error::Conflict(format!("site {} already exists", site.id)));
            }
            t.sites.insert(site.id.clone(), site);
            Ok(())
        })
        .await
    }

    async fn get_site(&self, id: String) -> Result<Option<(Site, SiteCounts)>> {
        self.run("get_site", false, |t, _| {
            Ok(t.sites.get(&id).map(|s| (s.clone(), t.site_counts(s))))
        })
        .await
    }

    async fn list_sites(
        &self,
        down: Option<bool>,
        page: PageRequest,
    ) -> Result<Page<(Site, SiteCounts)>> {
        self.run("list_sites", false, |t, _| {
            let rows = t
                .sites
                .values()
                .filter(|s| after(&s.id, &page))
                .map(|s| (s.clone(), t.site_counts(s)))
                .filter(|(_, c)| down.is_none_or(|d| c.down == d));
            Ok(page_of(rows, &page, |(s, _)| s.id.clone()))
        })
        .await
    }

    async fn site_sensors(
        &self,
        site_id: String,
        connection: Option<Connection>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.run("site_sensors", false, |t, _| {
            let rows = t
                .sensors
                .values()
                .filter(|s| s.site_id.as_deref() == Some(site_id.as_str()))
                .filter(|s| after(&s.id.to_string(), &page))
                .filter_map(|s| t.sensor_view(s.id))
                .filter(|(_, st)| connection.is_none_or(|c| st.connection == c));
            Ok(page_of(rows, &page, |(s, _)| s.id.to_string()))
        })
        .await
    }

    async fn site_totals(&self) -> Result<SiteTotals> {
        self.run("site_totals", false, |t, _| Ok(t.site_totals()))
            .await
    }

    async fn replace_site(&self, site: Site) -> Result<bool> {
        self.run("replace_site", true, |t, _| {
            let Some(s) = t.sites.get_mut(&site.id) else {
                return Ok(false);
            };
            let created_at = s.created_at;
            let changed = s.gateway_sensor_id != site.gateway_sensor_id;
            let (gateway, at) = (site.gateway_sensor_id, site.updated_at);
            *s = Site { created_at, ..site };
            // As the backends' `CASE`: `moves::join` of the new gateway.
            if changed {
                let lost = gateway
                    .and_then(|g| t.states.get(&g))
                    .is_some_and(|st| st.connection == Connection::Lost);
                let st = t.site_states.entry(s.id.clone()).or_default();
                *st = latch::domain::site::moves::join(st, lost, at);
            }
            Ok(true)
        })
        .await
    }

    async fn decide_sites(&self, rules: Rules, now: Millis) -> Result<Decided> {
        self.run("decide_sites", true, |t, cx| {
            Ok(t.decide_sites(cx, rules, now))
        })
        .await
    }

    async fn delete_site(&self, id: String, now: Millis) -> Result<Option<Vec<NotificationRef>>> {
        self.run("delete_site", true, |t, cx| {
            let mut members = Vec::new();
            for s in t.sensors.values_mut() {
                if s.site_id.as_deref() == Some(id.as_str()) {
                    s.site_id = None;
                    members.push(s.id);
                }
            }
            let mut made = Vec::new();
            for m in members {
                made.extend(t.sensor_moved(cx, m, Some(&id), now));
            }
            t.site_held.retain(|_, (s, _)| *s != id);
            t.site_states.remove(&id);
            Ok(t.sites.remove(&id).is_some().then_some(made))
        })
        .await
    }
}

#[async_trait]
impl Silences for NodeStore {
    async fn create_silence(&self, silence: Silence) -> Result<()> {
        self.run("create_silence", true, |t, _| {
            t.silences.insert(silence.id.clone(), silence);
            Ok(())
        })
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
        self.run("update_silence", true, |t, cx| {
            let Some(s) = t
                .silences
                .get_mut(&silence.id)
                .filter(|s| s.reconciled_at.is_none())
            else {
                return Ok(false);
            };
            s.starts_at = silence.starts_at;
            s.ends_at = silence.ends_at;
            s.comment = silence.comment;
            s.updated_at = silence.updated_at;
            t.silence_written_at.insert(silence.id, cx.now);
            Ok(true)
        })
        .await
    }

    async fn reconcile_silences(
        &self,
        ended_by: Millis,
        now: Millis,
    ) -> Result<Vec<NotificationRef>> {
        self.run("reconcile_silences", true, |t, cx| {
            rules::now_or_never(rules::silences::reconcile_ended(
                &mut SilenceTables { t, cx },
                ended_by,
                now,
            ))
        })
        .await
    }
}
