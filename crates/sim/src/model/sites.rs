//! Sites: `store/{sqlite,postgres}/sites.rs` and `site_rounds.rs`. The holds and the
//! decisions are latch's own (`store::rules::sites`); here are the site tables' operations
//! and the API's reads and writes of sites.

use async_trait::async_trait;

use latch::domain::Event;
use std::collections::{HashMap, HashSet};

use latch::domain::site::decide::{HeldEvent, Linked, Member, Rules, SiteState};
use latch::domain::site::{Site, SiteCounts, SiteTotals};
use latch::domain::{Connection, Millis, NotificationRef, SensorId};
use latch::store::rules::sites::SiteOf;
use latch::store::rules::{self};
use latch::store::{Decided, Error, Page, PageRequest, Result, SensorView, Sites};

use super::node::NodeStore;
use super::registry::{after, page_of};
use super::tables::{Cx, Tables};

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
}

/// Sites' tables in the model ([`rules::sites`]): the sequence is latch's own.
pub(super) struct SiteTables<'a> {
    pub t: &'a mut Tables,
    pub cx: &'a Cx,
}

super::alarms::alarm_tables!(SiteTables<'_>);

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
            None,
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
        self.t.silence_new(self.cx, seqs, now)
    }

    async fn write_state(&mut self, site: &str, state: &SiteState) -> Result<()> {
        self.t.site_states.insert(site.to_string(), state.clone());
        Ok(())
    }
}

#[async_trait]
impl Sites for NodeStore {
    async fn create_site(&self, site: Site) -> Result<()> {
        self.audited(
            "create_site",
            Some(site.id.clone()),
            |t, _| {
                if t.sites.contains_key(&site.id) {
                    return Err(Error::Conflict(format!("site {} already exists", site.id)));
                }
                t.sites.insert(site.id.clone(), site);
                Ok(())
            },
            |_, r| Some(r),
        )
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
        filter: latch::store::SensorFilter,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.run("site_sensors", false, |t, _| {
            let rows = t
                .sensors
                .values()
                .filter(|s| s.site_id.as_deref() == Some(site_id.as_str()))
                .filter(|s| after(&s.id.to_string(), &page))
                .filter_map(|s| t.sensor_view(s.id))
                .filter(|(_, st)| filter.keeps(st));
            Ok(page_of(rows, &page, |(s, _)| s.id.to_string()))
        })
        .await
    }

    async fn site_totals(&self) -> Result<SiteTotals> {
        self.run("site_totals", false, |t, _| Ok(t.site_totals()))
            .await
    }

    async fn replace_site(&self, site: Site) -> Result<bool> {
        self.audited(
            "replace_site",
            None,
            |t, _| {
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
            },
            |ok, r| ok.then_some(r),
        )
        .await
    }

    async fn decide_sites(&self, rules: Rules, now: Millis) -> Result<Decided> {
        self.run("decide_sites", true, |t, cx| {
            Ok(t.decide_sites(cx, rules, now))
        })
        .await
    }

    async fn delete_site(&self, id: String, now: Millis) -> Result<Option<Vec<NotificationRef>>> {
        self.audited(
            "delete_site",
            None,
            |t, cx| {
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
                // Its alarm ends with it, as both backends' delete resolves it.
                for a in t.alarms.values_mut() {
                    if a.site_id.as_deref() == Some(id.as_str())
                        && a.state != latch::domain::alarm::AlarmState::Resolved
                    {
                        a.state = latch::domain::alarm::AlarmState::Resolved;
                        a.resolved_at = Some(now.max(a.opened_at));
                    }
                }
                Ok(t.sites.remove(&id).is_some().then_some(made))
            },
            |v, r| v.is_some().then_some(r),
        )
        .await
    }
}
