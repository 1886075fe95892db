//! Clients as the API makes, changes and deletes them: created (some on a deleted client's
//! receiver) and linked, deleted, their batching, rate limits and subscriptions changed.

use std::collections::BTreeMap;

use latch::domain::EventKind;
use latch::domain::client::{Batch, Client, effective_batch, generate_secret, wants};
use latch::store::Registry;

use super::{MAX_CLIENTS, Workload, latch_rng};
use crate::log::SimClient;

impl Workload {
    /// A client is created as the API creates one (the store, then the entry node's
    /// dispatcher told its rate limit and batching), with settings drawn, and linked to
    /// some sensors one call each. A call whose answer never came may have landed: what
    /// the run knows is what the store holds after it.
    pub(super) async fn add_client(&mut self) {
        if self.clients.len() >= MAX_CLIENTS {
            return;
        }
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let id = format!("c{}", self.next_client);
        self.next_client += 1;
        let w = &self.world;
        // An operator re-creates a deleted client: a new id on the same receiver. The
        // checks go by client id, so the old client's requests still in flight there and
        // its history never count as the new one's.
        let url = match self.gone.is_empty() || !w.chance(0.3) {
            true => format!("https://{id}.example/hook"),
            false => self.gone[w.between(0, self.gone.len() as u64) as usize].clone(),
        };
        let client = Client {
            id: id.clone(),
            name: id.clone(),
            url,
            secret: generate_secret(),
            created_at: engine.now(),
            rate_limit: w.chance(0.2).then(|| w.between(1, 20) as u32),
            events: w
                .chance(0.3)
                .then(|| vec!["sensor.state_changed".to_string()]),
            batch: w.chance(0.3).then(|| Batch {
                max_events: w.between(1, 6) as u32,
                max_wait_ms: w.between(0, 800) as u32,
            }),
            ..Client::default()
        };
        let result = self
            .audited(
                "POST",
                "clients",
                store.create_client(client.clone()),
                |_| true,
            )
            .await;
        if result.is_ok() {
            dispatcher.set_rate_limit(&client.id, client.rate_limit);
            dispatcher.set_batch(&client.id, effective_batch(client.batch, &client.url));
        }
        let made = self.model.read(|t| t.clients().any(|c| c.client.id == id));
        self.world.trace(format!(
            "create client {id} via {node} at {}: batch {:?} rate {:?} events {:?}: {:?}{}",
            client.url,
            client.batch,
            client.rate_limit,
            client.events,
            result.err().map(|e| e.to_string()),
            if made { "" } else { ", not made" }
        ));
        if !made {
            return;
        }
        let mut sim = SimClient {
            id: id.clone(),
            healthy: false,
            links: BTreeMap::new(),
        };
        for si in 0..self.sensors.len() {
            if !self.world.chance(0.6) {
                continue;
            }
            let sensor = self.sensors[si].id;
            let now = self.world.now();
            let resource = format!("clients/{id}/sensors/{sensor}");
            let stored = self
                .model
                .read(|t| t.links().any(|(c, s)| c == id && s == sensor));
            let call = store.link(id.clone(), sensor, now);
            let result = self.audited("PUT", &resource, call, |_| !stored).await;
            let linked = self
                .model
                .read(|t| t.links().any(|(c, s)| c == id && s == sensor));
            self.world.trace(format!(
                "{} {id}/{sensor}: {:?}",
                if linked { "link" } else { "unlink" },
                result.err().map(|e| e.to_string())
            ));
            if linked {
                sim.links.insert(sensor, now);
            }
        }
        self.clients.push(sim);
    }

    /// A client is deleted as the API deletes one (`App::delete_client`): the store
    /// cancels its pending notifications and its links, then the entry node's dispatcher
    /// withdraws what it claimed for the client but has not sent (other nodes' claims
    /// read the registry). Never the healthy one (the yardstick of isolation).
    pub(super) async fn delete_client(&mut self) {
        let faultable: Vec<usize> = (0..self.clients.len())
            .filter(|&i| !self.clients[i].healthy)
            .collect();
        if faultable.is_empty() {
            return;
        }
        let ci = faultable[self.world.between(0, faultable.len() as u64) as usize];
        let Some(node) = self.entry() else { return };
        let Some((engine, store, dispatcher)) = self.nodes.entry(&node) else {
            return;
        };
        let id = self.clients[ci].id.clone();
        let url = self.model.read(|t| {
            t.clients()
                .find(|c| c.client.id == id)
                .map(|c| c.client.url.clone())
        });
        let call = store.delete_client(id.clone(), engine.now());
        let result = self
            .audited("DELETE", &format!("clients/{id}"), call, |gone| *gone)
            .await;
        if matches!(result, Ok(true)) {
            dispatcher.client_gone(&id);
        }
        let gone = !self.model.read(|t| t.clients().any(|c| c.client.id == id));
        self.world.trace(format!(
            "delete client {id} via {node}: {:?}{}",
            result.err().map(|e| e.to_string()),
            if gone { "" } else { ", still there" }
        ));
        if gone {
            self.clients.remove(ci);
            self.gone.extend(url);
        }
    }

    /// Reads a client, changes it with `f` and writes it back, then tells the entry node's
    /// dispatcher as the API does. `healthy_too`: the change may be drawn for a healthy
    /// client (one its own settings do not slow down).
    pub(super) async fn change_client(
        &mut self,
        healthy_too: bool,
        f: impl FnOnce(&mut Client, &mut latch_rng::Draw),
    ) -> Option<String> {
        let node = self.entry()?;
        let (_, store, dispatcher) = self.nodes.entry(&node)?;
        let ci = self.world.between(0, self.clients.len() as u64) as usize;
        if !healthy_too && self.clients[ci].healthy {
            return None;
        }
        let id = self.clients[ci].id.clone();
        let Ok(Some(mut client)) = store.get_client(id.clone()).await else {
            return None;
        };
        let mut draw = latch_rng::Draw(self.world.clone());
        f(&mut client, &mut draw);
        let call = store.replace_client(client.clone());
        let resource = format!("clients/{id}");
        if self
            .audited("PUT", &resource, call, |found| *found)
            .await
            .is_ok()
        {
            self.world.trace(format!(
                "client {id}: batch {:?} rate {:?} events {:?}",
                client.batch, client.rate_limit, client.events
            ));
            dispatcher.set_rate_limit(&client.id, client.rate_limit);
            dispatcher.set_batch(&client.id, effective_batch(client.batch, &client.url));
        }
        Some(id)
    }

    pub(super) async fn batching(&mut self) {
        self.change_client(true, |c, d| {
            c.batch = d.chance(0.6).then(|| Batch {
                max_events: d.between(1, 6) as u32,
                max_wait_ms: d.between(0, 800) as u32,
            });
        })
        .await;
    }

    /// A rate limit, never of the healthy client: its deliveries are the yardstick of
    /// isolation, and a limit of its own delays them by design.
    pub(super) async fn rate(&mut self) {
        self.change_client(false, |c, d| {
            c.rate_limit = d.chance(0.5).then(|| d.between(1, 20) as u32);
        })
        .await;
    }

    /// A client's subscription changes. A call whose answer never came may have landed:
    /// what the run knows is what the store holds after it.
    pub(super) async fn subscription(&mut self) {
        let now = self.world.now();
        let changed = self
            .change_client(true, |c, d| {
                c.events = d.chance(0.5).then(|| {
                    let mut e = vec!["sensor.state_changed".to_string()];
                    if d.chance(0.5) {
                        e.push("sensor.connection_lost".into());
                        e.push("sensor.connection_restored".into());
                    }
                    e
                });
            })
            .await;
        let Some(id) = changed else { return };
        let takes = self.model.read(|t| {
            t.clients
                .get(&id)
                .is_some_and(|c| wants(&c.client.events, EventKind::SiteConnectionRestored))
        });
        self.log
            .lock()
            .unwrap()
            .subscriptions
            .push((id, now, takes));
    }
}
