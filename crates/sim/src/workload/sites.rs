//! Buildings that go dark, and maintenance windows over them.

use latch::domain::Millis;
use latch::domain::schedule::Schedule;

use super::Workload;

/// The schedule scheduled silences follow: two one-minute windows a day, the first begun
/// when a run starts (`crate::START` is 17:46:40 UTC), the second a minute after it ends,
/// so a run of a hundred seconds sees a silence in a window, pending, then moved on to the
/// next window by the round that reconciled the first.
pub const SILENCE_HOURS: &str = "maintenance";

/// [`SILENCE_HOURS`] as the API takes it.
pub fn silence_hours() -> Schedule {
    Schedule::parse(serde_json::json!({
        "id": SILENCE_HOURS, "name": "the run's maintenance windows", "tz": "UTC",
        "weekly": [{"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                    "from": "17:46", "to": "17:47"},
                   {"days": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"],
                    "from": "17:48", "to": "17:49"}]
    }))
    .expect("a valid schedule")
}

impl Workload {
    /// A building goes dark: every sensor of a site falls silent, past its timeout and the
    /// site's grace.
    pub(super) fn dark_site(&mut self) {
        let now = self.world.now();
        let until = now + self.timeout + 4_000 + self.world.between(500, 10_000) as Millis;
        let Some(site) = self.drawn_site() else {
            return;
        };
        let members = self.members(&site);
        self.world
            .trace(format!("site {site} goes dark until {until}"));
        for s in self.sensors.iter_mut().filter(|s| members.contains(&s.id)) {
            s.silent_until = s.silent_until.max(until);
        }
    }

    /// A maintenance window, as the API makes one: for a client, the site, or losses
    /// only, from now for a few seconds; or an active one ended now.
    pub(super) async fn maintenance(&mut self) {
        use latch::domain::EventKind;
        use latch::domain::silence::{Match, Silence};
        use latch::store::Silences;
        let Some(node) = self.entry() else { return };
        let Some((engine, store, _)) = self.nodes.entry(&node) else {
            return;
        };
        let now = engine.now();
        if self.world.chance(0.3) {
            let active = self.model.read(|t| {
                t.silences
                    .values()
                    .find(|s| s.starts_at <= now && now < s.ends_at)
                    .cloned()
            });
            if let Some(s) = active {
                // Ended early, or extended (past notification retention, now and then); one
                // that follows a schedule keeps its times and is ended (`App::end_silence`).
                let changed = match s.schedule_id {
                    Some(_) => {
                        let ends_at = s.ends_at.min(now);
                        Silence {
                            starts_at: s.starts_at.min(ends_at),
                            ends_at,
                            ended_at: Some(now),
                            updated_at: now,
                            ..s.clone()
                        }
                    }
                    None => Silence {
                        ends_at: match self.world.chance(0.5) {
                            true => now,
                            false => s.ends_at + self.world.between(1_000, 10_000) as Millis,
                        },
                        updated_at: now,
                        ..s.clone()
                    },
                };
                let ends_at = changed.ends_at;
                let call = store.update_silence(changed);
                let result = self
                    .audited("PATCH", &format!("silences/{}", s.id), call, |found| *found)
                    .await;
                self.world.trace(format!(
                    "silence {} now ends at {ends_at}: {result:?}",
                    s.id
                ));
            }
            return;
        }
        let sites: Vec<String> = self.model.read(|t| t.sites.keys().cloned().collect());
        let matcher = match self.world.between(0, 4) {
            0 if !self.clients.is_empty() => Match {
                client_id: Some(
                    self.clients[self.world.between(0, self.clients.len() as u64) as usize]
                        .id
                        .clone(),
                ),
                ..Match::default()
            },
            1 if !sites.is_empty() => Match {
                site_id: Some(sites[self.world.between(0, sites.len() as u64) as usize].clone()),
                ..Match::default()
            },
            2 => Match {
                sensor_ids: Some(
                    self.sensors
                        .iter()
                        .filter(|_| self.world.chance(0.4))
                        .map(|s| s.id)
                        .chain(std::iter::once(self.sensors[0].id))
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                ),
                ..Match::default()
            },
            _ => Match {
                types: Some(vec![
                    EventKind::ConnectionLost,
                    EventKind::SiteConnectionLost,
                ]),
                ..Match::default()
            },
        };
        // A quarter follow the maintenance schedule, placed as `App::create_silence` places
        // them: its window now, or the next.
        let (starts_at, ends_at, schedule_id) = match self.world.chance(0.25) {
            true => {
                let (a, b) = latch::domain::silence::window_after(&silence_hours(), now)
                    .unwrap_or((now, now));
                (a, b, Some(SILENCE_HOURS.to_string()))
            }
            false => (now, now + self.world.between(2_000, 15_000) as Millis, None),
        };
        let s = Silence {
            id: self.world.clock.ulid().to_string(),
            matcher,
            starts_at,
            ends_at,
            comment: "planned work".into(),
            created_at: now,
            updated_at: now,
            reconciled_at: None,
            schedule_id,
            ended_at: None,
        };
        let result = self
            .audited("POST", "silences", store.create_silence(s.clone()), |_| {
                true
            })
            .await;
        self.world.trace(format!(
            "silence {} via {node} until {}: {:?} {result:?}",
            s.id, s.ends_at, s.matcher
        ));
    }
}
