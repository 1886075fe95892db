//! Buildings that go dark, and maintenance windows over them.

use latch::domain::Millis;

use super::Workload;

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
                // Ended early, or extended (past notification retention, now and then).
                let ends_at = match self.world.chance(0.5) {
                    true => now,
                    false => s.ends_at + self.world.between(1_000, 10_000) as Millis,
                };
                let call = store.update_silence(Silence {
                    ends_at,
                    updated_at: now,
                    ..s.clone()
                });
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
        let s = Silence {
            id: self.world.clock.ulid().to_string(),
            matcher,
            starts_at: now,
            ends_at: now + self.world.between(2_000, 15_000) as Millis,
            comment: "planned work".into(),
            created_at: now,
            updated_at: now,
            reconciled_at: None,
            schedule_id: None,
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
